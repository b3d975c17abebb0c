"""What a protocol diagnostic is: the evidence it reads, the class every diagnostic derives
from, and the protocol as the diagnostics a config selects, each an instance holding its
options.

:mod:`creditaudit.protocol.diagnostics` holds the four built-ins; a diagnostic of another
package derives from :class:`ProtocolDiagnostic` and registers through the
``creditaudit.diagnostics`` entry point.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from torch import Tensor

from creditaudit.config.composed import check_distinct
from creditaudit.config.sections import DiagnosticsConfig
from creditaudit.errors import ConfigError
from creditaudit.files import strict_json
from creditaudit.formatting import error_text, telling_number
from creditaudit.protocol.checks import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    UNTRAINED_REASON,
    DiagnosticResult,
    unfounded,
)
from creditaudit.registry import DIAGNOSTICS, Component, defines, own_rank

OPERATORS = (">", "<")
SCALES = ("linear", "log")


@dataclass
class Evidence:
    """What the diagnostics of one evaluation set may look at.

    ``hidden_norms[l]``/``grad_norms[l]``: median per-sample ‖h_l‖ and ‖g_l‖ (1/128 scale),
    l = 0 … L; ``g_L_zero_fraction``/``g_L_nonzero_median``: the share of samples whose
    g_L is exactly 0 and the median over the others; ``grads``: the per-sample gradient
    summaries ``(N, d)`` per layer, ``logits`` ``(N, C)``, ``labels``, the samples' class
    indices ``(N,)``, and ``losses``, the per-sample cross-entropy ``(N,)`` — row i of each
    is the same sample (None when a record is judged again from its stored numbers);
    accuracies are fractions; ``terminal_ln``: whether the model ends in a LayerNorm (None =
    unknown); ``initial_hidden_norms``: ``hidden_norms`` of
    the same network at initialisation on the same evaluation set (a run's epoch 0), when
    known; ``trained``: False for a network at initialisation, before any training step (a
    run's epoch 0), where every diagnostic whose ``before_training`` is False is not
    evaluated; ``growth_limit``: the growth factor above which the protocol's (a) fires —
    what (b) calls a grown stream (None: (a)'s default; :meth:`Protocol.evaluate
    <creditaudit.protocol.verdicts.Protocol.evaluate>` sets its own (a)'s).
    """

    hidden_norms: list[float]
    grad_norms: list[float]
    g_L_zero_fraction: float | None = None
    g_L_nonzero_median: float | None = None
    grads: list[Tensor] | None = None
    logits: Tensor | None = None
    labels: Tensor | None = None
    losses: Tensor | None = None
    headline_acc: float | None = None
    frozen_acc: float | None = None
    terminal_ln: bool | None = None
    initial_hidden_norms: list[float] | None = None
    trained: bool = True
    growth_limit: float | None = None

    def on_cpu(self) -> Evidence:
        """This evidence with every tensor on the CPU, as a plugin diagnostic receives it:
        itself when they all are there already, otherwise a shallow copy whose tensor fields
        (``grads``' tensors, ``logits``, ``labels``, ``losses``) are moved and whose other
        fields are the same objects."""
        moved: dict[str, Any] = {}
        for name in (f.name for f in dataclasses.fields(self)):
            value = getattr(self, name)
            if isinstance(value, Tensor) and _elsewhere(value):
                moved[name] = _to_cpu(value)
            elif isinstance(value, list) and any(isinstance(t, Tensor) and _elsewhere(t)
                                                 for t in value):
                moved[name] = [_to_cpu(t) if isinstance(t, Tensor) else t for t in value]
        if not moved:
            return self
        copied = copy.copy(self)
        for name, value in moved.items():
            setattr(copied, name, value)
        return copied


def _elsewhere(tensor: Tensor) -> bool:
    return tensor.device.type != "cpu"


def _to_cpu(tensor: Tensor) -> Tensor:
    """``tensor`` on the CPU (itself when it is there)."""
    return tensor.cpu()


OptionsT = TypeVar("OptionsT", covariant=True)


class ProtocolDiagnostic(Component, Generic[OptionsT]):
    """One diagnostic of the protocol (see the module docstring): an instance holds its
    options (``self.options``, its config table ``[diagnostics.NAME]``; the ``threshold``
    option is what :meth:`fires` compares the statistic with, by ``operator``).

    Subclasses declare the class attributes, name their ``Options`` as the parameter of this
    base (``class Margin(ProtocolDiagnostic[MarginOptions])``, which also types
    ``self.options``; ``Options = MarginOptions`` in the body works too) and implement
    :meth:`evaluate`; ``default``: part of the protocol unless a config's
    ``diagnostics.protocol`` leaves it out (the built-ins; a plugin is added by listing it).
    A diagnostic written for the older interface — ``evaluate(cls, evidence, options)`` a
    classmethod calling ``cls.judge(value, options, reason)`` — keeps working.

    What the readers of records need besides (all optional): ``short``, the statistic in a
    few words for axes and table columns (default: the ``label``); ``scale``, ``"log"``
    when values span decades (audit panels draw a log axis, threshold sensitivity measures
    gaps as ratios) or ``"linear"``; ``sensitivity``, the thresholds threshold sensitivity
    sweeps (empty: judged at its threshold only); ``before_training``, False when the
    diagnostic means nothing on an untrained network (random-init summaries leave it
    out); ``per_layer``, True when a report's per-layer table already shows its statistic
    (the reporting-template row then has no column for it); ``needs``, the runs that
    would have it evaluated, in words.
    """

    statistic: ClassVar[str] = ""
    operator: ClassVar[str] = ">"
    unit: ClassVar[str] = ""
    value_format: ClassVar[str] = ".3g"
    value_unit: ClassVar[str | None] = None  # the value's unit where it is not ``unit``
    threshold: ClassVar[str] = ""
    hint: ClassVar[str] = ""
    default: ClassVar[bool] = False
    short: ClassVar[str] = ""
    scale: ClassVar[str] = "linear"
    sensitivity: ClassVar[tuple[float, ...]] = ()
    before_training: ClassVar[bool] = True
    per_layer: ClassVar[bool] = False
    needs: ClassVar[str] = ""
    hooks = ("evaluate", "limit", "fires", "result", "judge", "status_of", "checked",
             "with_threshold")
    # The older spelling took the options after the value: ``cls.judge(value, options, …)``.
    older_options = {"evaluate": 1, "fires": 1, "result": 1, "judge": 1, "status_of": 1,
                     "checked": 1}

    options: OptionsT

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        """The diagnostic's result on ``evidence`` with its options (its thresholds)."""
        raise NotImplementedError

    def assess(self, evidence: Evidence) -> DiagnosticResult:
        """Its result on ``evidence`` as readers take it: :meth:`evaluate`, :meth:`checked`;
        on an untrained network (``evidence.trained`` False) a diagnostic that means nothing
        before training (``before_training`` False) is not evaluated, never judged."""
        if not evidence.trained and not self.before_training:
            return self.result(None, NOT_EVALUATED, UNTRAINED_REASON)
        return self.checked(self.evaluate(evidence))

    # --- what every diagnostic shares ------------------------------------------------------
    def limit(self) -> float:
        """The threshold its options set."""
        return float(getattr(self.options, self.threshold))

    def fires(self, value: float) -> bool:
        limit = self.limit()
        return value > limit if self.operator == ">" else value < limit

    def result(self, value: float | None, status: str, reason: str, **details: Any
               ) -> DiagnosticResult:
        return DiagnosticResult(self.name, self.label, value, self.limit(), status, reason,
                                details)

    def judge(self, value: float, reason: str, **details: Any) -> DiagnosticResult:
        """Fired or passed by comparing ``value`` with the threshold."""
        status = FIRED if self.fires(value) else PASSED
        return self.result(value, status, reason, **details)

    @classmethod
    def value_text(cls, value: float | None, threshold: float | None = None) -> str:
        """``694``, ``+1.23 pp``, ``—`` for a missing value; with ``threshold``, with the
        digits it takes to tell which side of it the value lies (:func:`telling_number`:
        ``+1.997 pp`` below 2 pp, not ``+2.00 pp``)."""
        if value is None:
            return "—"
        unit = cls.unit if cls.value_unit is None else cls.value_unit
        if threshold is None:
            return f"{value:{cls.value_format}}{unit}"
        return telling_number(value, cls.value_format, cls.operator, threshold) + unit

    def shown(self, value: float) -> str:
        """``value`` as a reason states it: the diagnostic's format, with the digits that
        tell which side of the threshold it lies (:func:`telling_number`), no unit."""
        return telling_number(value, self.value_format, self.operator, self.limit())

    @classmethod
    def threshold_text(cls, threshold: float) -> str:
        """``> 50×``: when it fires."""
        return f"{cls.operator} {threshold:g}{cls.unit}"

    @classmethod
    def id_label(cls) -> str:
        return f"({cls.name})"

    @classmethod
    def axis_label(cls) -> str:
        """``max stream growth (×)``: the short statistic with its unit."""
        unit = cls.unit.strip()
        name = cls.short or cls.label
        return f"{name} ({unit})" if unit else name

    def with_threshold(self, threshold: float) -> ProtocolDiagnostic[OptionsT]:
        """The diagnostic with its threshold replaced, its other options kept (what
        re-judging a stored value at another threshold compares it with)."""
        return type(self)(dataclasses.replace(self.options, **{self.threshold: threshold}))

    def status_of(self, value: float | None) -> str:
        """Fired or passed for a stored statistic; not evaluated when there is none, or when
        it is infinite and would pass."""
        if value is None or math.isnan(value):
            return NOT_EVALUATED
        status = FIRED if self.fires(value) else PASSED
        return NOT_EVALUATED if unfounded(status, value) else status

    def checked(self, result: Any) -> DiagnosticResult:
        """``result`` as :meth:`evaluate` gave it — unless it claims what it cannot show:
        not a :class:`DiagnosticResult` of this diagnostic, or a status its statistic cannot
        carry (:func:`~creditaudit.protocol.checks.unfounded`) or its threshold contradicts
        (fired or passed where :meth:`fires` says otherwise: a "pass" of 5 at "> 1", which
        threshold sensitivity and :meth:`status_of` read as fired; or at a NaN/infinite
        threshold, which a plugin's own ``Options`` may hold in Python), or stating another
        threshold than the one it judges at (a record would show it). Then it is *not
        evaluated*, the reason naming what was wrong and what it claimed: never a silent
        pass."""
        if not isinstance(result, DiagnosticResult):
            return self.result(None, NOT_EVALUATED,
                               f"evaluate() returned {type(result).__name__}, not a "
                               "DiagnosticResult")
        if result.id != self.name:
            return self.result(None, NOT_EVALUATED,
                               f"evaluate() returned the result of ({result.id}), not "
                               f"({self.name})")
        why = unfounded(result.status, result.value)
        if why is None and result.status != NOT_EVALUATED:
            why = self._contradiction(result)
        details = result.details
        unplain = _unplain(details)  # a record holds it: numpy and tensors cannot be written
        if why is None and unplain is None:
            return result
        if unplain is not None:
            why, details = why or f"its details are not plain JSON ({unplain})", {}
        return self.result(None, NOT_EVALUATED,
                           f"{why} (it said {result.status!r}: {result.reason})",
                           **{**details, "claimed": result.status})

    def _contradiction(self, result: DiagnosticResult) -> str | None:
        """Why a fired or passed ``result`` (its statistic a real number) disagrees with
        this diagnostic's threshold, or None: a NaN or infinite threshold (``fires`` is then
        never, or always, true: no test of the run); a status ``fires`` contradicts
        (verdicts read the status, threshold sensitivity the value); another threshold
        stated than the one judged at (records and reports show the result's)."""
        if not math.isfinite(self.limit()):
            return (f"its threshold {self.threshold}={self.limit()} is not a finite number "
                    f"(options {type(self.options).__name__})")
        if self.fires(result.value) != (result.status == FIRED):
            does = "fires" if self.fires(result.value) else "does not fire"
            return (f"its statistic {result.value:g} {does} at its threshold "
                    f"{self.operator} {self.limit():g}")
        if result.threshold != self.limit():
            return (f"it states the threshold {result.threshold!r}, but it judges at "
                    f"{self.threshold}={self.limit():g} (build results with self.result() "
                    "or self.judge())")
        return None

def _unplain(details: Any) -> str | None:
    """Why ``details`` (a result's) cannot go into a record as they are — not a dict of
    plain JSON (a numpy bool or array, a tensor; two keys JSON spells alike, ``1`` and
    ``"1"``) — or None when they can."""
    if not isinstance(details, dict):
        return f"a {type(details).__name__}, not a dict"
    try:
        json.dumps(details)
    except (TypeError, ValueError) as err:
        return error_text(err)
    clash = strict_json.keys_spelled_alike(details)  # written twice: the record unreadable
    if clash is not None:
        (first, second), spelled = clash
        return f"the keys {first!r} and {second!r} of one object are both written {spelled!r}"
    return None


# A diagnostic's options are the table [diagnostics.NAME]: no name may be a common key.
DIAGNOSTICS_KEYS = frozenset(f.name for f in dataclasses.fields(DiagnosticsConfig))


def _validate(cls: type[ProtocolDiagnostic], source: str) -> None:
    name = cls.name
    if not name.isidentifier():
        raise ConfigError(f"{source} ({name}): a diagnostic's name must be a Python "
                          "identifier (letters, digits, _): it is a config table "
                          "[diagnostics.NAME]")
    if name in DIAGNOSTICS_KEYS:
        raise ConfigError(f"{source}: its name {name!r} is a common key of [diagnostics] "
                          "(its options would be the table [diagnostics.NAME]); rename the "
                          "diagnostic and its entry point")
    if cls.operator not in OPERATORS:
        raise ConfigError(f"{source} ({name}): operator must be one of {OPERATORS}")
    if cls.threshold not in cls.option_names():
        raise ConfigError(f"{source} ({name}): `threshold` must name one of its options "
                          f"({', '.join(cls.option_names()) or 'none declared'})")
    for attribute in ("statistic", "hint"):
        if not isinstance(getattr(cls, attribute), str) or not getattr(cls, attribute):
            raise ConfigError(f"{source} ({name}) needs a non-empty `{attribute}` string")
    if not defines(cls, "evaluate", ProtocolDiagnostic):
        raise ConfigError(f"{source} ({name}) must implement evaluate()")
    if cls.scale not in SCALES:
        raise ConfigError(f"{source} ({name}): scale must be one of {SCALES}")
    sweep = cls.sensitivity
    if not isinstance(sweep, tuple) or not all(
            isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
            for t in sweep):
        raise ConfigError(f"{source} ({name}): sensitivity must be a tuple of finite "
                          "thresholds")


DIAGNOSTICS.configure(ProtocolDiagnostic, _validate)
register = DIAGNOSTICS.register


def protocol(names: Sequence[str] | None = None, options: Any = None
             ) -> tuple[ProtocolDiagnostic[Any], ...]:
    """The diagnostics of a protocol, in listing order, each an instance holding its
    options: those named (a config's ``diagnostics.protocol``), or the default ones (the
    four built-ins). ``options``: where each finds its own — a config's ``[diagnostics]``
    section (its table ``[diagnostics.NAME]``) or a mapping name → ``Options``; a
    diagnostic it has none for (or None) takes its defaults."""
    if names is None:  # the built-ins' default set: no plugin needs importing
        classes = [cls for cls in DIAGNOSTICS.builtin_classes() if cls.default]
    else:
        check_distinct(names)
        # Listing order (rank, then name) among those named only: the others stay unimported.
        classes = sorted((DIAGNOSTICS.get(name) for name in names),
                         key=lambda cls: (own_rank(cls), cls.name))
    return tuple(cls(_own_options(options, cls.name)) for cls in classes)


def _own_options(options: Any, name: str) -> Any:
    if isinstance(options, Mapping):
        return options.get(name)
    return getattr(options, name, None)


def default_names() -> list[str]:
    return [d.name for d in protocol()]


__all__ = ["Evidence", "ProtocolDiagnostic", "protocol", "default_names", "register",
           "OPERATORS", "SCALES"]
