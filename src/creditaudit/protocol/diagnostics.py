"""The protocol as data: each diagnostic is a self-describing class, the protocol a tuple of
them.

A :class:`ProtocolDiagnostic` declares what it is — ``name`` (its id, ``"a"``), ``label``
(``"residual-stream scale"``), ``statistic``, ``operator`` and ``unit`` of its threshold,
``value_format``, the ``threshold`` option, a ``hint`` — and computes its result from the
:class:`Evidence` of one evaluation set with its ``Options`` (the thresholds). Verdicts,
reports in every format, audit panels, threshold sensitivity and random-init summaries
iterate :func:`protocol`; a diagnostic another package registers through the
``creditaudit.diagnostics`` entry point joins them when a config lists it in
``diagnostics.protocol``.

The four built-ins (science.md §5):

=====  ===============================  =============================================  ==========
id     name                             statistic                                      fires when
=====  ===============================  =============================================  ==========
(a)    residual-stream scale            max_l ‖h_{l+1}‖/‖h_l‖ of median norms          > 50
(b)    reference validity               median per-sample ‖g_L‖ (1/128 scale)          < 1e-7
(c)    cross-batch direction stability  mean pairwise cos of K ≥ 8 batch-mean g at L//2 > 0.30
(d)    depth utility                    headline acc − frozen-blocks acc (pp)          < 2.0
=====  ===============================  =============================================  ==========
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from creditaudit.config import opt
from creditaudit.diagnostics.gradients import REFERENCE_FLOOR, max_block_growth
from creditaudit.errors import ConfigError
from creditaudit.protocol.checks import (
    CAUSE_FLOOR,
    CAUSE_LN,
    CAUSE_SATURATION,
    CAUSE_SATURATION_NO_LN,
    FIRED,
    NO_FROZEN_REASON,
    NOT_EVALUATED,
    PASSED,
    DiagnosticResult,
    block_growths,
    cross_batch_stability,
)
from creditaudit.registry import DIAGNOSTICS, Component

OPERATORS = (">", "<")


@dataclass
class Evidence:
    """What the diagnostics of one evaluation set may look at.

    ``hidden_norms[l]``/``grad_norms[l]``: median per-sample ‖h_l‖ and ‖g_l‖ (1/128 scale),
    l = 0 … L; ``g_L_zero_fraction``/``g_L_nonzero_median``: the share of samples whose
    g_L is exactly 0 and the median over the others; ``grads``: the per-sample gradient
    summaries ``(N, d)`` per layer and ``logits`` ``(N, C)`` (None when a record is judged
    again from its stored numbers); accuracies are fractions; ``terminal_ln``: whether the
    model ends in a LayerNorm (None = unknown).
    """

    hidden_norms: list[float]
    grad_norms: list[float]
    g_L_zero_fraction: float | None = None
    g_L_nonzero_median: float | None = None
    grads: list[Tensor] | None = None
    logits: Tensor | None = None
    labels: Tensor | None = None
    headline_acc: float | None = None
    frozen_acc: float | None = None
    terminal_ln: bool | None = None


class ProtocolDiagnostic(Component):
    """One diagnostic of the protocol (see the module docstring).

    Subclasses declare the class attributes and implement :meth:`evaluate`; ``default``:
    part of the protocol unless a config's ``diagnostics.protocol`` leaves it out (the
    built-ins; a plugin is added by listing it). The ``threshold`` option is what
    :meth:`fires` compares the statistic with, by ``operator``.
    """

    statistic: ClassVar[str] = ""
    operator: ClassVar[str] = ">"
    unit: ClassVar[str] = ""
    value_format: ClassVar[str] = ".3g"
    value_unit: ClassVar[str | None] = None  # the value's unit where it is not ``unit``
    threshold: ClassVar[str] = ""
    hint: ClassVar[str] = ""
    default: ClassVar[bool] = False

    @classmethod
    def evaluate(cls, evidence: Evidence, options: Any) -> DiagnosticResult:
        """The diagnostic's result on ``evidence`` with ``options`` (its thresholds)."""
        raise NotImplementedError

    # --- what every diagnostic shares ------------------------------------------------------
    @classmethod
    def limit(cls, options: Any) -> float:
        return float(getattr(options, cls.threshold))

    @classmethod
    def fires(cls, value: float, options: Any) -> bool:
        limit = cls.limit(options)
        return value > limit if cls.operator == ">" else value < limit

    @classmethod
    def result(cls, value: float | None, options: Any, status: str, reason: str,
               **details: Any) -> DiagnosticResult:
        return DiagnosticResult(cls.name, cls.label, value, cls.limit(options), status, reason,
                                details)

    @classmethod
    def judge(cls, value: float, options: Any, reason: str, **details: Any
              ) -> DiagnosticResult:
        """Fired or passed by comparing ``value`` with the threshold."""
        status = FIRED if cls.fires(value, options) else PASSED
        return cls.result(value, options, status, reason, **details)

    @classmethod
    def value_text(cls, value: float | None) -> str:
        """``694``, ``+1.23 pp``, ``—`` for a missing value."""
        if value is None:
            return "—"
        unit = cls.unit if cls.value_unit is None else cls.value_unit
        return f"{value:{cls.value_format}}{unit}"

    @classmethod
    def threshold_text(cls, threshold: float) -> str:
        """``> 50×``: when it fires."""
        return f"{cls.operator} {threshold:g}{cls.unit}"

    @classmethod
    def id_label(cls) -> str:
        return f"({cls.name})"


def _validate(cls: type, source: str) -> None:
    name = cls.name  # type: ignore[attr-defined]
    if not name.isidentifier():
        raise ConfigError(f"{source} ({name}): a diagnostic's name must be a Python "
                          "identifier (letters, digits, _): it is a config table "
                          "[diagnostics.NAME]")
    if cls.operator not in OPERATORS:  # type: ignore[attr-defined]
        raise ConfigError(f"{source} ({name}): operator must be one of {OPERATORS}")
    if cls.threshold not in cls.option_names():  # type: ignore[attr-defined]
        raise ConfigError(f"{source} ({name}): `threshold` must name one of its options "
                          f"({', '.join(cls.option_names()) or 'none declared'})")  # type: ignore[attr-defined]
    for attribute in ("statistic", "hint"):
        if not isinstance(getattr(cls, attribute), str) or not getattr(cls, attribute):
            raise ConfigError(f"{source} ({name}) needs a non-empty `{attribute}` string")
    if cls.evaluate.__func__ is ProtocolDiagnostic.evaluate.__func__:  # type: ignore[attr-defined]
        raise ConfigError(f"{source} ({name}) must implement evaluate()")


DIAGNOSTICS.configure(ProtocolDiagnostic, _validate)
register = DIAGNOSTICS.register


def protocol(names: Sequence[str] | None = None) -> tuple[type[ProtocolDiagnostic], ...]:
    """The diagnostics of a protocol, in listing order: those named (a config's
    ``diagnostics.protocol``), or the default ones (the four built-ins)."""
    if names is None:
        return tuple(cls for cls in DIAGNOSTICS.classes() if cls.default)
    classes = [DIAGNOSTICS.get(name) for name in names]
    order = {cls.name: i for i, cls in enumerate(DIAGNOSTICS.classes())}
    return tuple(sorted(classes, key=lambda cls: order.get(cls.name, len(order))))


def default_names() -> list[str]:
    return [cls.name for cls in protocol()]


# --- the four built-ins ---------------------------------------------------------------------
@dataclass
class GrowthOptions:
    growth: float = opt(50.0, "(a) fires when one block grows the median ‖h‖ by more than "
                        "this factor", min=0.0)


@dataclass
class ReferenceOptions:
    grad_floor: float = opt(REFERENCE_FLOOR, "(b) fires when the median ‖g_L‖ (1/128 scale) "
                            "is below this floor", min=0.0)


@dataclass
class StabilityOptions:
    stability: float = opt(0.30, "(c) fires when the mean pairwise cosine of batch-mean "
                           "gradients exceeds this", min=-1.0, max=1.0)
    stability_batches: int = opt(8, "(c) the fewest disjoint evaluation batches it accepts",
                                 min=2)
    stability_batch_size: int = opt(128, "(c) the size of those batches (the calibration "
                                    "used 128)", min=1)


@dataclass
class DepthOptions:
    margin_pp: float = opt(2.0, "(d) fires when headline − frozen-blocks accuracy is below "
                           "this margin (percentage points)")


@register
class ResidualStreamScale(ProtocolDiagnostic):
    name = "a"
    label = "residual-stream scale"
    statistic = "max_l ‖h_{l+1}‖/‖h_l‖ of median norms"
    operator, unit, value_format, threshold = ">", "×", ".3g", "growth"
    value_unit = ""  # a table's value column reads "694", its threshold column "> 50×"
    hint = ("the rule lets the residual stream grow without bound; a terminal LayerNorm hides "
            "the scale from the loss")
    Options = GrowthOptions
    default = True
    rank = 0

    @classmethod
    def evaluate(cls, evidence: Evidence, options: Any) -> DiagnosticResult:
        hidden = evidence.hidden_norms
        limit = cls.limit(options)
        if len(hidden) < 2:
            return cls.result(None, options, NOT_EVALUATED, "needs the state norms of at "
                              "least two states", block_growth=[], block=None)
        if not all(math.isfinite(v) for v in hidden):
            # NaN/Inf states mean the stream overflowed: the failure (a) exists to catch.
            return cls.result(math.inf, options, FIRED, "state norms are NaN/Inf: the "
                              "residual stream overflowed (diverged model)",
                              block_growth=block_growths(hidden), block=None)
        growths = block_growths(hidden)
        value = max_block_growth(list(hidden))
        block = growths.index(value) if growths else None
        details = {"block_growth": growths, "block": block}
        if cls.fires(value, options):
            return cls.result(value, options, FIRED,
                              f"block {block} grows the residual stream {value:.3g}× (> "
                              f"{limit:g}×); ‖h_L‖ = {hidden[-1]:.3g}", **details)
        where = f" at block {block}" if block is not None else ""
        return cls.result(value, options, PASSED,
                          f"largest block growth {value:.3g}×{where} (≤ {limit:g}×)", **details)


@register
class ReferenceValidity(ProtocolDiagnostic):
    name = "b"
    label = "reference validity"
    statistic = "median per-sample ‖g_L‖ (1/128 scale)"
    operator, unit, value_format, threshold = "<", "", ".3g", "grad_floor"
    hint = "the reference gradient sits at the numerical floor: cosines against it are noise"
    Options = ReferenceOptions
    default = True
    rank = 1

    @classmethod
    def threshold_text(cls, threshold: float) -> str:
        return f"{cls.operator} {threshold:.0e}"

    @classmethod
    def evaluate(cls, evidence: Evidence, options: Any) -> DiagnosticResult:
        floor = cls.limit(options)
        hidden = evidence.hidden_norms
        value = evidence.grad_norms[-1] if evidence.grad_norms else math.nan
        zero_fraction = evidence.g_L_zero_fraction
        nonzero_median = evidence.g_L_nonzero_median
        growth = ResidualStreamScale.limit(GrowthOptions())
        grew = (len(hidden) > 1 and hidden[0] > 0 and hidden[-1] / hidden[0] > growth)
        details: dict[str, Any] = {"zero_fraction": zero_fraction,
                                   "nonzero_median": nonzero_median,
                                   "terminal_ln": evidence.terminal_ln,
                                   "stream_grew": bool(grew), "cause": None}
        zero_text = "" if zero_fraction is None else f"{zero_fraction:.0%}"
        if not evidence.grad_norms:
            return cls.result(None, options, NOT_EVALUATED, "no gradient norms given", **details)
        if math.isnan(value):
            return cls.result(None, options, NOT_EVALUATED,
                              "‖g_L‖ is NaN (diverged model): no reference gradient", **details)
        if value >= floor:
            return cls.result(value, options, PASSED,
                              f"median ‖g_L‖ = {value:.3g} (≥ {floor:.0e}); {zero_text} of "
                              "samples have an exactly-zero gradient", **details)
        if zero_fraction is not None and zero_fraction >= 0.5:
            cause = CAUSE_SATURATION
        elif evidence.terminal_ln is False:
            # Without a terminal LN, g_L = W_headᵀ e / 128: it can only vanish when the
            # output error e = softmax − onehot does (a saturated softmax).
            cause = CAUSE_SATURATION_NO_LN
        elif evidence.terminal_ln or (evidence.terminal_ln is None and grew):
            cause = CAUSE_LN
        else:
            cause = CAUSE_FLOOR
        details["cause"] = cause
        median = "" if nonzero_median is None else f", non-zero median {nonzero_median:.3g}"
        return cls.result(value, options, FIRED,
                          f"median ‖g_L‖ = {value:.3g} (< {floor:.0e}): {cause}; zero "
                          f"fraction {zero_text}{median}", **details)


@register
class DirectionStability(ProtocolDiagnostic):
    name = "c"
    label = "cross-batch direction stability"
    statistic = "mean pairwise cos of K ≥ 8 batch-mean g at L//2"
    operator, unit, value_format, threshold = ">", "", ".3f", "stability"
    hint = ("batch-mean gradients share one direction: the drift sub-mode (bimodal: (c) tells "
            "sub-modes apart rather than detecting)")
    Options = StabilityOptions
    default = True
    rank = 2

    @classmethod
    def evaluate(cls, evidence: Evidence, options: Any) -> DiagnosticResult:
        limit, size = cls.limit(options), options.stability_batch_size
        layer = (len(evidence.grad_norms) - 1) // 2
        if evidence.grads is None:
            return cls.result(None, options, NOT_EVALUATED,
                              "needs the per-sample gradients of the evaluation set",
                              layer=layer, batch_size=size, n_batches=0)
        grad = evidence.grads[layer]
        full = grad.shape[0] // size
        details: dict[str, Any] = {"layer": layer, "batch_size": size, "n_batches": full}
        if full < options.stability_batches:
            return cls.result(None, options, NOT_EVALUATED,
                              f"needs {options.stability_batches} full batches of {size} "
                              f"evaluation samples, got {grad.shape[0]} samples ({full} "
                              "batches)", **details)
        if not bool(torch.isfinite(grad).all()):
            return cls.result(None, options, NOT_EVALUATED,
                              f"gradients at state {layer} are NaN/Inf (diverged model)",
                              **details)
        value, k = cross_batch_stability(grad, size)
        details["n_batches"] = k
        if k < options.stability_batches:
            return cls.result(None, options, NOT_EVALUATED,
                              f"only {k} of {full} batch-mean gradients at state {layer} are "
                              "non-zero", **details)
        if cls.fires(value, options):
            return cls.result(value, options, FIRED,
                              f"batch-mean gradients at state {layer} share one direction "
                              f"(mean pairwise cos {value:.3f} > {limit:g} over {k} batches): "
                              "drift sub-mode", **details)
        return cls.result(value, options, PASSED,
                          f"mean pairwise cos {value:.3f} at state {layer} over {k} batches "
                          f"(≤ {limit:g})", **details)


@register
class DepthUtility(ProtocolDiagnostic):
    name = "d"
    label = "depth utility"
    statistic = "headline acc − frozen-blocks acc (pp)"
    operator, unit, value_format, threshold = "<", " pp", "+.2f", "margin_pp"
    hint = "the trained blocks add too little over blocks frozen at initialisation"
    Options = DepthOptions
    default = True
    rank = 3

    @classmethod
    def evaluate(cls, evidence: Evidence, options: Any) -> DiagnosticResult:
        limit = cls.limit(options)
        headline, frozen = evidence.headline_acc, evidence.frozen_acc
        details = {"headline_acc": headline, "frozen_acc": frozen}
        if headline is None:
            return cls.result(None, options, NOT_EVALUATED, "no headline accuracy given",
                              **details)
        if frozen is None:
            return cls.result(None, options, NOT_EVALUATED, NO_FROZEN_REASON, **details)
        if math.isnan(headline) or math.isnan(frozen):
            return cls.result(None, options, NOT_EVALUATED, "an accuracy is NaN", **details)
        margin = 100.0 * (headline - frozen)
        if cls.fires(margin, options):
            return cls.result(margin, options, FIRED,
                              f"accuracy {headline:.3f} vs frozen blocks {frozen:.3f}: margin "
                              f"{margin:+.2f} pp (< {limit:g} pp), the trained blocks add too "
                              "little", **details)
        return cls.result(margin, options, PASSED,
                          f"accuracy {headline:.3f} vs frozen blocks {frozen:.3f}: margin "
                          f"{margin:+.2f} pp (≥ {limit:g} pp)", **details)


__all__ = ["Evidence", "ProtocolDiagnostic", "protocol", "default_names", "register",
           "ResidualStreamScale", "ReferenceValidity", "DirectionStability", "DepthUtility",
           "GrowthOptions", "ReferenceOptions", "StabilityOptions", "DepthOptions"]
