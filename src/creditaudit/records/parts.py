"""The parts of a run record: how their fields are declared (documentation, and for numbers
a domain), and one epoch's entry; the run-level parts (final results, end-of-run block,
protocol state) are in :mod:`creditaudit.records.run_parts`.

Each part is a dataclass whose fields carry their documentation and, for numbers, their
domain (:func:`doc`, checked by :func:`check_domains` when a record is read), from which
``docs/records.md`` is generated; :mod:`creditaudit.records.schema` assembles them into a
:class:`~creditaudit.records.schema.RunRecord`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from creditaudit.deep_layers import deep_mean
from creditaudit.errors import RunRecordError

# Rounding slack of a domain's bounds: a cosine of 1.0000000002 (float32 arithmetic) is 1.
DOMAIN_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Domain:
    """The interval every number of a record field lies in, ``low ≤ x ≤ high`` (give or take
    :data:`DOMAIN_TOLERANCE`), for a number or each number of a list or mapping of them.

    NaN is always allowed: it is how an undefined value is written (the cosine of a zero
    vector, the norms of a diverged run). ±inf is allowed only on an unbounded side (the
    growth of a stream whose norm is 0); an infinite cosine or accuracy is refused.
    """

    low: float
    high: float
    what: str  # "a cosine": what a number of this domain is, for messages

    @property
    def text(self) -> str:
        """``[0, 1]``, ``[−1, 1]``, ``≥ 0``: the interval as docs/records.md states it."""
        if math.isinf(self.high):
            return f"≥ {self.low:g}"
        return f"[{self.low:g}, {self.high:g}]".replace("-", "−")

    def admits(self, number: float) -> bool:
        return math.isnan(number) or (self.low - DOMAIN_TOLERANCE <= number
                                      <= self.high + DOMAIN_TOLERANCE)


FRACTION = Domain(0.0, 1.0, "a fraction")
ACCURACY = Domain(0.0, 1.0, "an accuracy (a fraction, not a percentage)")
COSINE = Domain(-1.0, 1.0, "a cosine")
CORRELATION = Domain(-1.0, 1.0, "a correlation")
NONNEGATIVE = Domain(0.0, math.inf, "a norm, ratio, count or duration")
DEGREES = Domain(0.0, 180.0, "an angle in degrees")

# A field's domain: one Domain for every number in its value, or, for objects holding
# numbers of several kinds (rows of the cosine table), a Domain per key (others unchecked).
FieldDomain = Domain | Mapping[str, Domain]


def doc(text: str, default: Any = None, *, factory: Any = None,
        domain: FieldDomain | None = None) -> Any:
    """A dataclass field documented by ``text`` (rendered into docs/records.md); ``domain``:
    where its numbers lie, checked by :func:`check_domains` when a record is read."""
    metadata = {"doc": text, "domain": domain}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def domain_text(domain: FieldDomain | None) -> str:
    """The domain as docs/records.md states it (``""`` for none)."""
    if domain is None:
        return ""
    if isinstance(domain, Domain):
        return domain.text
    return ", ".join(f"`{key}` {d.text}" for key, d in domain.items())


def check_domains(part: Any, where: str, prefix: str = "") -> None:
    """Raise RunRecordError when a number of a field of dataclass ``part`` lies outside the
    field's ``domain`` (or is not a number at all). ``where`` starts the message (``run
    record PATH``), ``prefix`` names the part (``final.``, ``log[3].``)."""
    for name, domain in _field_domains(type(part)):
        _check_domain(getattr(part, name), domain, where, prefix + name)


@functools.cache
def _field_domains(cls: type) -> tuple[tuple[str, FieldDomain], ...]:
    """(name, domain) of the fields of dataclass ``cls`` that declare a domain."""
    return tuple((f.name, f.metadata["domain"]) for f in dataclasses.fields(cls)
                 if f.metadata.get("domain") is not None)


def _check_domain(value: Any, domain: FieldDomain, where: str, name: str) -> None:
    if value is None or (type(value) is float and isinstance(domain, Domain)
                         and domain.admits(value)):
        return
    if isinstance(value, list):
        suspects: Iterable[int] = range(len(value))
        if isinstance(domain, Domain):  # the common case, a list of floats, in one pass
            low, high = domain.low - DOMAIN_TOLERANCE, domain.high + DOMAIN_TOLERANCE
            suspects = [index for index, item in enumerate(value)
                        if not (type(item) is float and (low <= item <= high or item != item))]
        for index in suspects:
            _check_domain(value[index], domain, where, f"{name}[{index}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            inner = domain if isinstance(domain, Domain) else domain.get(key)
            if inner is not None:
                _check_domain(item, inner, where, f"{name}.{key}")
        return
    number = as_number(value)
    if not isinstance(domain, Domain):
        problem = f"{name} must be an object, got {reprlib.repr(value)}"
    elif number is None:
        problem = f"{name} must be a number, got {reprlib.repr(value)}"
    elif not domain.admits(number):
        problem = (f"{name} = {reprlib.repr(value)} is outside {domain.text}, the range of "
                   f"{domain.what}")
    else:
        return
    raise RunRecordError(f"{where}: {problem}; the record was not written by creditaudit as "
                         "it is")


def as_number(value: Any) -> float | None:
    """A float for int/float values (NaN and inf kept), None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def finite_number(value: Any) -> float | None:
    number = as_number(value)
    return number if number is not None and math.isfinite(number) else None


# --- one epoch ----------------------------------------------------------------------------
@dataclass
class EpochEntry:
    """One evaluated epoch (epoch 0 = at initialisation).

    Norms are medians over the evaluation samples of per-sample L2 norms; gradients follow
    the (1/128)·∂CE_i/∂h_l scale convention (the batch-mean loss of a batch of 128).
    """

    epoch: int = doc("epoch number (0 = initialisation, before any training)", 0,
                     domain=NONNEGATIVE)
    test_loss: float | None = doc("mean cross-entropy on the whole test split (nats)",
                                  domain=NONNEGATIVE)
    acc_eval: float | None = doc("test accuracy on the whole test split (fraction); also "
                                 "written as `test_acc`", domain=ACCURACY)
    train_loss: float | None = doc("mean training cross-entropy over the epoch (nats)")
    train_acc: float | None = doc("training accuracy over the epoch (fraction)",
                                  domain=ACCURACY)
    lr: float | None = doc("learning rate at the end of the epoch", domain=NONNEGATIVE)
    seconds: float | None = doc("wall-clock seconds of the epoch (training + evaluation)",
                                domain=NONNEGATIVE)
    hidden_norms: list[float] | None = doc("median ‖h_l‖ per state l = 0 … L",
                                           domain=NONNEGATIVE)
    bp_grad_norms_per_sample_med: list[float] | None = doc(
        "median ‖g_l‖ per state (g_l = backprop gradient, 1/128 scale)", domain=NONNEGATIVE)
    g_L_zero_fraction: float | None = doc("fraction of samples whose g_L is exactly 0",
                                          domain=FRACTION)
    g_L_nonzero_median: float | None = doc("median ‖g_L‖ over the samples where it is not 0",
                                           domain=NONNEGATIVE)
    cos_per_layer: list[float] | None = doc(
        "cos(a_l, g_l) per state: per sample, then mean over samples", domain=COSINE)
    cos_valid: list[bool] | None = doc(
        "per state: whether the reference ‖g_l‖ is at or above the floor (1e-7); a cosine "
        "against a gradient below the floor is measured against numerical noise")
    cos_defined: list[float] | None = doc(
        "per state: the fraction of samples cos_per_layer averages over (a sample whose "
        "credit or gradient is exactly zero has no direction and is left out)",
        domain=FRACTION)
    feedback_layers: list[str] | None = doc(
        "rules whose feedback matrix B stands in for one weight matrix W in the backward "
        "pass (fa-linear, usf, brsf, frsf, kp): the names of those layers, in module order")
    feedback_angle: list[float] | None = doc(
        "per feedback layer: the angle between B and W in degrees, of the flattened "
        "matrices (Lillicrap's angle between B and Wᵀ; BioTorch's layer alignment): 0 = B ∝ W, "
        "90 = unrelated", domain=DEGREES)
    feedback_norm_ratio: list[float] | None = doc(
        "per feedback layer: ‖B‖/‖W‖ (Frobenius norms; BioTorch's weight ratio)",
        domain=NONNEGATIVE)
    protocol: dict[str, str] | None = doc(
        "status of each diagnostic at this epoch: fired, passed or not evaluated")
    verdict: str | None = doc("protocol verdict at this epoch")
    extras: dict[str, float] = doc(
        "rule-specific per-epoch values written beside the others, e.g. `state_pred_error`, "
        "`bridge_consistency_error`, `ep_relax_grad_ratio`", factory=dict)

    # --- values read from the stored ones (each number is stored once) -------------------
    @property
    def test_acc(self) -> float | None:
        """The test accuracy (the original study's second name of ``acc_eval``)."""
        return self.acc_eval

    @property
    def has_diagnostics(self) -> bool:
        return self.hidden_norms is not None

    @property
    def h_L_norm(self) -> float | None:
        """Median ‖h_L‖ (deepest state)."""
        return self.hidden_norms[-1] if self.hidden_norms else None

    @property
    def g_L_norm(self) -> float | None:
        """Median ‖g_L‖: the statistic of diagnostic (b)."""
        grads = self.bp_grad_norms_per_sample_med
        return grads[-1] if grads else None

    @property
    def g_2_norm(self) -> float | None:
        """Median ‖g_2‖ (the original study's mid-depth gradient; ‖g_L‖ for L < 2)."""
        grads = self.bp_grad_norms_per_sample_med
        if not grads:
            return None
        return grads[2] if len(grads) > 2 else grads[-1]

    @property
    def max_block_growth(self) -> float | None:
        """max_l ‖h_{l+1}‖/‖h_l‖ of the median norms: the statistic of diagnostic (a)."""
        norms = self.hidden_norms
        if not norms:
            return None
        ratios = [b / a if a > 0 else math.inf for a, b in zip(norms[:-1], norms[1:])]
        return max(ratios) if ratios else 1.0

    @property
    def deep_cos(self) -> float | None:
        """Mean of ``cos_per_layer`` over the deep states l ≥ 1 (finite values)."""
        return finite_number(deep_mean(self.cos_per_layer))

    @property
    def deep_cos_valid(self) -> bool | None:
        """Whether every deep state's reference gradient is valid."""
        return None if self.cos_valid is None else all(self.cos_valid[1:])

    def value(self, key: str) -> Any:
        """A stored field, a derived value (:data:`DERIVED`) or a rule extra by its record
        key (None when absent): the one way a series is read."""
        if key in _ENTRY_FIELDS or key in DERIVED:
            return getattr(self, key)
        return self.extras.get(key)

    def to_dict(self, *, token_states: bool = False, copies: bool = True) -> dict[str, Any]:
        """The entry as JSON: the stored fields, the rule extras, and the original study's
        key names of values derived from them (``test_acc``, ``h_L_norm``, ``g_2_norm``,
        and ``hidden_norms_cls`` for ``token_states``), which scripts reading the files
        directly expect; reading ignores those (they are derived again). Without ``copies``
        (record.json) ‖g_L‖ is written twice at most, in the gradient norms and as the
        statistic of (b): ``g_2_norm`` is left out where state 2 is the deepest (it is
        ‖g_L‖), and ``g_L_nonzero_median`` where no g_L is zero (it is then the median
        ‖g_L‖ itself; :func:`nonzero_median_restored` puts it back on read)."""
        out: dict[str, Any] = {"epoch": self.epoch}
        for name in _ENTRY_FIELDS:
            value = getattr(self, name)
            if name in ("epoch", "extras") or value is None:
                continue
            if (not copies and name == "g_L_nonzero_median" and self.g_L_zero_fraction == 0.0
                    and value == self.g_L_norm):
                continue
            out[name] = value
        deepest = len(self.bp_grad_norms_per_sample_med or []) <= 3  # g_2 is g_L
        for name, value in (("test_acc", self.acc_eval), ("h_L_norm", self.h_L_norm),
                            ("g_2_norm", None if deepest and not copies else self.g_2_norm)):
            if value is not None:
                out[name] = value
        if token_states and self.hidden_norms is not None:
            out["hidden_norms_cls"] = self.hidden_norms
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "log entry") -> EpochEntry:
        if not isinstance(raw, Mapping):
            raise RunRecordError(f"{where} is not an object")
        epoch = raw.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise RunRecordError(f"{where} has no integer 'epoch'")
        known = {k: raw[k] for k in _ENTRY_FIELDS if k in raw and k != "extras"}
        # Derived values (and the copies earlier schemas stored) are read again from the
        # stored ones, never taken from the file.
        extras = {k: v for k, v in raw.items()
                  if k not in _ENTRY_FIELDS and k not in DERIVED and k not in WRITTEN_ALIASES}
        for key, value in extras.items():
            if value is not None and as_number(value) is None:
                raise RunRecordError(f"{where}: {key!r} must be a number, got "
                                     f"{type(value).__name__}")
        return cls(**known, extras=extras)


def nonzero_median_restored(raw: Any) -> Any:
    """A stored entry (schema 4 on) with ``g_L_nonzero_median`` put back where
    :meth:`EpochEntry.to_dict` left it out: no g_L is zero, so the median over the non-zero
    ones is the median ‖g_L‖. Anything else is returned as it is (checked when read)."""
    if (not isinstance(raw, Mapping) or "g_L_nonzero_median" in raw
            or raw.get("g_L_zero_fraction") != 0.0):
        return raw
    grads = raw.get("bp_grad_norms_per_sample_med")
    if not isinstance(grads, list) or not grads:
        return raw
    return {**raw, "g_L_nonzero_median": grads[-1]}


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EpochEntry))
# Values an entry derives from its stored fields (properties), and the keys earlier schemas
# stored for them: read again, never from the file.
DERIVED = ("test_acc", "h_L_norm", "g_L_norm", "g_2_norm", "max_block_growth", "deep_cos",
           "deep_cos_valid")
WRITTEN_ALIASES = ("hidden_norms_cls",)
