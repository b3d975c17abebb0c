"""The protocol as data: each diagnostic is a self-describing class, the protocol a tuple of
its instances, each holding its options.

A :class:`ProtocolDiagnostic` declares what it is — ``name`` (its id, ``"a"``), ``label``
(``"residual-stream scale"``), ``statistic``, ``operator`` and ``unit`` of its threshold,
``value_format``, the ``threshold`` option, a ``hint`` — and an instance, holding its
``Options`` (the thresholds), computes its result from the :class:`Evidence` of one
evaluation set. Verdicts, reports in every format, audit panels, threshold sensitivity and
random-init summaries iterate :func:`protocol`; a diagnostic another package registers through the
``creditaudit.diagnostics`` entry point joins them when a config lists it in
``diagnostics.protocol``.

The base class, the evidence and :func:`protocol` are in :mod:`.base`; below are the four
built-ins, whose ids, statistics and thresholds the package docstring tabulates (each class
declares its own, the one source every reader uses).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from creditaudit.descriptions import max_block_growth
from creditaudit.formatting import exact_exponent
from creditaudit.protocol.base import (
    OPERATORS,
    SCALES,
    Evidence,
    ProtocolDiagnostic,
    default_names,
    protocol,
    register,
)
from creditaudit.protocol.builtin_options import (
    DepthOptions,
    GrowthOptions,
    ReferenceOptions,
    StabilityOptions,
)
from creditaudit.protocol.checks import (
    CAUSE_FLOOR,
    CAUSE_LN,
    CAUSE_NO_PATH,
    CAUSE_SATURATION,
    CAUSE_SATURATION_NO_LN,
    CAUSE_WEAK_HEAD,
    FIRED,
    NO_FROZEN_REASON,
    NOT_EVALUATED,
    PASSED,
    SORTED_DISTANCE,
    SORTED_RATIO,
    DiagnosticResult,
    Thresholds,
    at_threshold,
    batch_class_mix,
    block_growths,
    cross_batch_stability,
    embed_growth,
    margin_pp,
    unsaturated_share,
)


# --- the four built-ins ---------------------------------------------------------------------
@register
class ResidualStreamScale(ProtocolDiagnostic[GrowthOptions]):
    """(a): the largest growth of the stream anywhere in the network.

    Each block's growth ‖h_{l+1}‖/‖h_l‖ sees blocks 0 … L−1; the segment before h_0 (an
    embedding, a stem, or whatever precedes the first named state of an adapted model) has
    no state before it, so its growth is measured over training instead: ‖h_0‖ against its
    value at initialisation (``Evidence.initial_hidden_norms``). Both are ratios of one
    norm, so the statistic is scale-free, and one threshold judges both: healthy BP runs
    grow ‖h_0‖ 1–3× over training, runs whose embedding grows without bound by 10²–10⁴.
    """

    name = "a"
    label = "residual-stream scale"
    statistic = "max growth of median ‖h‖: per block ‖h_{l+1}‖/‖h_l‖, ‖h_0‖ since init"
    operator, unit, value_format, threshold = ">", "×", ".3g", "growth"
    value_unit = ""  # a table's value column reads "694", its threshold column "> 50×"
    hint = ("the rule lets the residual stream grow without bound; a terminal LayerNorm hides "
            "the scale from the loss")
    default = True
    rank = 0
    short, scale, per_layer = "max stream growth", "log", True
    sensitivity = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0)
    needs = "runs whose states stay finite"

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        hidden = evidence.hidden_norms
        limit = self.limit()
        embed = embed_growth(hidden, evidence.initial_hidden_norms)
        if len(hidden) < 2 and embed is None:
            return self.result(None, NOT_EVALUATED, "needs the state norms of at "
                               "least two states, or of h_0 at initialisation",
                               block_growth=[], block=None, embed_growth=None)
        if not _finite(hidden):
            # NaN/Inf states mean the stream overflowed: the failure (a) exists to catch.
            return self.result(math.inf, FIRED, "state norms are NaN/Inf: the "
                               "residual stream overflowed (diverged model)",
                               block_growth=block_growths(hidden), block=None,
                               embed_growth=embed)
        growths = block_growths(hidden)
        largest = max_block_growth(list(hidden)) if len(hidden) > 1 else None
        block = growths.index(largest) if growths else None
        details = {"block_growth": growths, "block": block, "embed_growth": embed}
        value = max(v for v in (largest, embed) if v is not None)
        if embed is not None and (largest is None or embed > largest):
            where = f"‖h_0‖ grew {self.shown(embed)}× since initialisation (before the first state)"
        else:
            where = f"block {block} grows the residual stream {self.shown(value)}×"
        before = ("" if embed is None else f"; ‖h_0‖ {self.shown(embed)}× its initial value")
        if self.fires(value):
            return self.result(value, FIRED,
                               f"{where} (> {limit:g}×); ‖h_L‖ = {hidden[-1]:.3g}", **details)
        if largest is None:
            text = f"‖h_0‖ {self.shown(embed)}× its initial value (≤ {limit:g}×)"
        else:
            text = (f"largest block growth {self.shown(largest)}× at block {block}{before} "
                    f"(≤ {limit:g}×)")
        if embed is None:
            text += "; ‖h_0‖ at initialisation not known: the segment before h_0 is not judged"
        return self.result(value, PASSED, text, **details)


@register
class ReferenceValidity(ProtocolDiagnostic[ReferenceOptions]):
    name = "b"
    label = "reference validity"
    statistic = "median per-sample ‖g_L‖ (1/128 scale)"
    operator, unit, value_format, threshold = "<", "", ".3g", "grad_floor"
    hint = "the reference gradient sits at the numerical floor: cosines against it are noise"
    default = True
    rank = 1
    short, scale, per_layer = "median ‖g_L‖ (1/128 scale)", "log", True
    sensitivity = (1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4)
    needs = "runs with a non-zero finite ‖g_L‖"

    @classmethod
    def threshold_text(cls, threshold: float) -> str:
        return f"{cls.operator} {exact_exponent(threshold)}"

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        floor = self.limit()
        hidden = evidence.hidden_norms
        value = evidence.grad_norms[-1] if evidence.grad_norms else math.nan
        zero_fraction = evidence.g_L_zero_fraction
        nonzero_median = evidence.g_L_nonzero_median
        # A grown stream by the protocol's own (a) threshold: the two never disagree.
        growth = (ResidualStreamScale().limit() if evidence.growth_limit is None
                  else evidence.growth_limit)
        before = embed_growth(hidden, evidence.initial_hidden_norms)  # before h_0, since init
        grew = ((len(hidden) > 1 and hidden[0] > 0 and hidden[-1] / hidden[0] > growth)
                or (before is not None and before > growth))
        details: dict[str, Any] = {"zero_fraction": zero_fraction,
                                   "nonzero_median": nonzero_median,
                                   "terminal_ln": evidence.terminal_ln,
                                   "stream_grew": bool(grew), "cause": None}
        zero_text = "" if zero_fraction is None else f"{zero_fraction:.0%}"
        if not evidence.grad_norms:
            return self.result(None, NOT_EVALUATED, "no gradient norms given", **details)
        if not math.isfinite(value):
            # a NaN, or an Inf in some sample's gradient (:func:`~creditaudit.measures.
            # gradients.median`): no pass stands on it, as no cosine against it does
            what = "NaN" if math.isnan(value) else "inf for some samples"
            return self.result(None, NOT_EVALUATED,
                               f"‖g_L‖ is {what} (diverged model): no reference gradient",
                               **details)
        if not _finite(hidden):
            return self.result(None, NOT_EVALUATED, OVERFLOWED_STATES, **details)
        if value >= floor:
            return self.result(value, PASSED,
                               f"median ‖g_L‖ = {self.shown(value)} "
                               f"(≥ {exact_exponent(floor)}); {zero_text} of samples have an "
                               "exactly-zero gradient", **details)
        if zero_fraction is not None and zero_fraction >= 0.5:
            if not _mostly_unsaturated(evidence, 0.0):
                cause = CAUSE_SATURATION
            elif evidence.terminal_ln is not False and grew:
                # A terminal LN on a stream grown past fp32's range (its variance overflows)
                # gives every sample the same output and an exactly-zero gradient.
                cause = CAUSE_LN
            else:
                cause = CAUSE_NO_PATH
        elif evidence.terminal_ln is False:
            # Without a terminal LN, g_L = W_headᵀ e / 128 is small when the output error
            # e = softmax − onehot is (a saturated softmax) or the head's weights are: the
            # logits tell which; without them, saturation (the usual cause).
            cause = (CAUSE_WEAK_HEAD if _mostly_unsaturated(evidence, floor)
                     else CAUSE_SATURATION_NO_LN)
        elif grew:
            # A terminal LN (declared, or not said) hides a grown stream's scale from the
            # loss, so g_L shrinks like 1/‖h_L‖: LN cancellation needs both.
            cause = CAUSE_LN
        else:
            # A stream that did not grow cancels nothing, LN or not (tiny head weights, a
            # confident network): the evidence names no cause beyond the floor.
            cause = CAUSE_FLOOR
        details["cause"] = cause
        if cause == CAUSE_FLOOR and evidence.terminal_ln:
            cause += f" (the stream did not grow by more than {growth:g}×: not LN cancellation)"
        return self.result(value, FIRED,
                           f"median ‖g_L‖ = {self.shown(value)} (< {exact_exponent(floor)}): "
                           f"{cause}; zero fraction {zero_text}"
                           f"{_nonzero_text(nonzero_median)}", **details)


# (b) and (c) on a network whose stream overflowed: its gradients are taken at NaN/Inf.
OVERFLOWED_STATES = ("state norms are NaN/Inf (diverged model): gradients at an overflowed "
                     "stream are no reference")


def _finite(norms: list[float]) -> bool:
    """Whether every median state norm is finite (one is NaN/Inf where any sample's is)."""
    return all(math.isfinite(v) for v in norms)


def _mostly_unsaturated(evidence: Evidence, below: float) -> bool:
    """Whether the softmax of most samples whose ‖g_L‖ is at most ``below`` is not saturated
    (:func:`~creditaudit.protocol.checks.unsaturated_share`); False when the evidence has
    no per-sample gradients and logits (a record judged again from its stored numbers)."""
    if evidence.grads is None or evidence.logits is None:
        return False
    share = unsaturated_share(evidence.grads[-1], evidence.logits, below=below,
                              losses=evidence.losses)
    return share is not None and share > 0.5


def _nonzero_text(nonzero_median: float | None) -> str:
    """The median ‖g_L‖ over the samples whose gradient is not 0, as (b)'s reason ends it
    (in words when no sample has one: the median of nothing is NaN)."""
    if nonzero_median is None:
        return ""
    if math.isnan(nonzero_median):
        return " (every per-sample gradient is exactly 0)"
    return f", non-zero median {nonzero_median:.3g}"


@register
class DirectionStability(ProtocolDiagnostic[StabilityOptions]):
    name = "c"
    label = "cross-batch direction stability"
    statistic = "mean pairwise cos of K ≥ 8 batch-mean g at L//2"
    operator, unit, value_format, threshold = ">", "", ".3f", "stability"
    hint = ("batch-mean gradients share one direction: the drift sub-mode (bimodal: (c) tells "
            "sub-modes apart rather than detecting)")
    default = True
    rank = 2
    short = "mean pairwise cos (state L//2)"
    # Bimodal (science.md §5): a threshold sweep says nothing; judged at its threshold only.
    sensitivity = ()
    needs = "runs with diagnostics.eval_samples ≥ 1024 (8 batches of 128)"

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        limit, size = self.limit(), self.options.stability_batch_size
        layer = (len(evidence.grad_norms) - 1) // 2
        if evidence.grads is None:
            return self.result(None, NOT_EVALUATED,
                               "needs the per-sample gradients of the evaluation set",
                               layer=layer, batch_size=size, n_batches=0)
        grad = evidence.grads[layer]
        full = grad.shape[0] // size
        if not _finite(evidence.hidden_norms):
            return self.result(None, NOT_EVALUATED, OVERFLOWED_STATES, layer=layer,
                               batch_size=size, n_batches=full)
        details: dict[str, Any] = {"layer": layer, "batch_size": size, "n_batches": full}
        if full < self.options.stability_batches:
            return self.result(None, NOT_EVALUATED,
                               f"needs {self.options.stability_batches} full batches of {size} "
                               f"evaluation samples, got {grad.shape[0]} samples ({full} "
                               "batches)", **details)
        if not bool(torch.isfinite(grad).all()):
            return self.result(None, NOT_EVALUATED,
                               f"gradients at state {layer} are NaN/Inf (diverged model)",
                               **details)
        sorted_by_class = _sorted_by_class(evidence.labels, grad.shape[0], size, full)
        if sorted_by_class is not None:
            return self.result(None, NOT_EVALUATED, sorted_by_class, **details)
        value, k = cross_batch_stability(grad, size)
        details["n_batches"] = k
        if k < self.options.stability_batches:
            return self.result(None, NOT_EVALUATED,
                               f"only {k} of {full} batch-mean gradients at state {layer} are "
                               "non-zero", **details)
        if self.fires(value):
            return self.result(value, FIRED,
                               f"batch-mean gradients at state {layer} share one direction "
                               f"(mean pairwise cos {self.shown(value)} > {limit:g} over {k} "
                               "batches): drift sub-mode", **details)
        return self.result(value, PASSED,
                           f"mean pairwise cos {self.shown(value)} at state {layer} over {k} "
                           f"batches (≤ {limit:g})", **details)


def _sorted_by_class(labels: torch.Tensor | None, n: int, size: int, k: int) -> str | None:
    """Why (c) cannot judge batches of an evaluation set sorted by class, or None: its
    ``k`` consecutive batches of ``size`` then hold a class mix far from the set's
    (:func:`~creditaudit.protocol.checks.batch_class_mix`), and their mean gradients differ
    by class rather than by what (c) measures. None when the labels are unknown or are not
    one per sample (``n``)."""
    if labels is None or tuple(labels.shape) != (n,):
        return None
    seen, shuffled = batch_class_mix(labels, size, k)
    if seen < SORTED_DISTANCE or seen <= SORTED_RATIO * shuffled:
        return None
    return (f"the evaluation samples look sorted by class: the class mix of its {k} "
            f"consecutive batches of {size} is far from the set's (mean total-variation "
            f"distance {seen:.2f}, {shuffled:.2f} when shuffled); shuffle them (x, y = x[p], "
            "y[p] with p = torch.randperm(len(y)))")


@register
class DepthUtility(ProtocolDiagnostic[DepthOptions]):
    name = "d"
    label = "depth utility"
    statistic = "headline acc − frozen-blocks acc (pp)"
    operator, unit, value_format, threshold = "<", " pp", "+.2f", "margin_pp"
    hint = "the trained blocks add too little over blocks frozen at initialisation"
    default = True
    rank = 3
    short = "accuracy − frozen"
    sensitivity = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
    # Before training it would compare an untrained net with a trained baseline.
    before_training = False
    needs = ("frozen-blocks runs (--method frozen) of the same recipe (read unless "
             "--no-frozen-from-runs), or runs trained with diagnostics.frozen_acc,")

    def fires(self, value: float) -> bool:
        """Below the threshold by more than float32's rounding of a margin
        (:func:`~creditaudit.protocol.checks.at_threshold`): a stored margin re-judged at
        another threshold than the one it was recorded at is judged as (d) judges it there."""
        return super().fires(at_threshold(value, self.limit()))

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        limit = self.limit()
        headline, frozen = evidence.headline_acc, evidence.frozen_acc
        details = {"headline_acc": headline, "frozen_acc": frozen}
        if headline is None:
            return self.result(None, NOT_EVALUATED, "no headline accuracy given",
                               **details)
        if frozen is None:
            return self.result(None, NOT_EVALUATED, NO_FROZEN_REASON, **details)
        if math.isnan(headline) or math.isnan(frozen):
            return self.result(None, NOT_EVALUATED, "an accuracy is NaN", **details)
        margin = margin_pp(headline, frozen, limit)
        if self.fires(margin):
            return self.result(margin, FIRED,
                               f"accuracy {headline:.3f} vs frozen blocks {frozen:.3f}: margin "
                               f"{self.shown(margin)} pp (< {limit:g} pp), the trained blocks "
                               "add too little", **details)
        return self.result(margin, PASSED,
                           f"accuracy {headline:.3f} vs frozen blocks {frozen:.3f}: margin "
                           f"{self.shown(margin)} pp (≥ {limit:g} pp)", **details)


def depth_utility(headline_acc: float | None, frozen_acc: float | None,
                  thresholds: Thresholds | DepthOptions, *, trained: bool = True
                  ) -> DiagnosticResult:
    """(d) on two accuracies (fractions) at ``thresholds``' ``margin_pp``: what re-judging a
    record against a frozen baseline needs. Not evaluated where ``headline_acc`` is that of
    the untrained network (``trained`` False: a run's epoch 0)."""
    return DepthUtility(thresholds).assess(Evidence([], [], headline_acc=headline_acc,
                                                    frozen_acc=frozen_acc, trained=trained))


__all__ = ["Evidence", "ProtocolDiagnostic", "protocol", "default_names", "register",
           "OPERATORS", "SCALES", "ResidualStreamScale", "ReferenceValidity",
           "DirectionStability", "DepthUtility", "GrowthOptions", "ReferenceOptions",
           "StabilityOptions", "DepthOptions", "depth_utility"]
