"""What every protocol diagnostic shares: its statuses, its result, the thresholds of the
four built-ins, and the statistics two of them compute.

Every diagnostic (:mod:`creditaudit.protocol.diagnostics`) returns a
:class:`DiagnosticResult`: fired, passed, or *not evaluated* (never a silent pass);
:mod:`creditaudit.protocol.verdicts` turns results into a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from creditaudit.config.validation import as_recorded, reading_a_record
from creditaudit.descriptions import max_block_growth
from creditaudit.errors import ConfigError
from creditaudit.measures.gradients import REFERENCE_BATCH, REFERENCE_FLOOR

FIRED, PASSED, NOT_EVALUATED = "fired", "passed", "not evaluated"
STATUSES = (FIRED, PASSED, NOT_EVALUATED)
TRUSTWORTHY, WALK_BACK, INCOMPLETE = "trustworthy", "needs walk-back", "incomplete"
CAUSE_SATURATION = ("saturated softmax (most per-sample gradients are exactly 0; not LN "
                    "cancellation)")
CAUSE_SATURATION_NO_LN = ("saturated softmax (no terminal LN: g_L is the head's transpose times "
                          "a vanishing output error on confident samples; not LN cancellation)")
CAUSE_NO_PATH = ("no gradient reaches h_L (most per-sample gradients are exactly 0 while "
                 "the softmax is not saturated: zero or dead weights between h_L and the "
                 "logits; not LN cancellation)")
CAUSE_WEAK_HEAD = ("weak head (no terminal LN and the softmax is not saturated: g_L = "
                   "W_headᵀ e / 128 is small because the head maps the output error e to "
                   "almost nothing — tiny or equal weights —, not because e vanishes; not LN "
                   "cancellation)")
CAUSE_LN = "reference gradient below the floor (LN cancellation of a grown residual stream)"
CAUSE_FLOOR = "gradient below floor"
# Neutral: each surface says how to give it there (with_frozen_hint in audit/diagnose.py).
NO_FROZEN_REASON = "no frozen-blocks accuracy given"
# A diagnostic whose ``before_training`` is False, on a network before any training step.
UNTRAINED_REASON = "untrained network (it means nothing before any training step)"
HEADLINE_GAMMA = "samples_then_layers"


# Each threshold's meaningful range, in words and as a test, and what lies outside it:
# a threshold out of its range keeps its diagnostic from ever firing, or makes it always fire.
THRESHOLD_RANGES: dict[str, tuple[str, Callable[[float], bool], str]] = {
    "growth": (">= 1", lambda v: v >= 1,
               "a growth factor: below 1 (a) fires on any stream that does not shrink"),
    "grad_floor": ("> 0", lambda v: v > 0,
                   "a floor under a norm: at 0 or below (b) never fires"),
    "stability": ("in [-1, 1)", lambda v: -1 <= v < 1,
                  "a mean cosine: at 1 or above (c) never fires, below -1 it always does"),
    "margin_pp": ("in (-100, 100]", lambda v: -100 < v <= 100,
                  "an accuracy difference in percentage points: at -100 or below (d) never "
                  "fires, above 100 it always does"),
    "stability_batches": (">= 2", lambda v: v >= 2, "(c) compares pairs of batches"),
    "stability_batch_size": (">= 1", lambda v: v >= 1, "a batch holds at least one sample"),
}
INTEGER_THRESHOLDS = frozenset({"stability_batches", "stability_batch_size"})


def check_threshold(key: str, name: str, value: Any) -> None:
    """A one-line ConfigError naming ``key`` unless ``value`` is a finite number (an integer
    for the batching fields) in the range of the threshold ``name``
    (:data:`THRESHOLD_RANGES`); the Python path (:class:`Thresholds`, the built-ins'
    ``Options``) and the config path (``[diagnostics.a] growth``) alike."""
    whole = name in INTEGER_THRESHOLDS
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        raise ConfigError(f"{key} must be {'an integer' if whole else 'a number'}, "
                          f"got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value")
    text, within, why = THRESHOLD_RANGES[name]
    if not within(value) and not reading_a_record():  # a record keeps what its run used
        raise ConfigError(f"{key}={value!r} is out of range: it must be {text} ({why})")


@dataclass(frozen=True)
class Thresholds:
    """Firing thresholds (science.md §5 defaults) and the batching of diagnostic (c): the
    options of the four built-in diagnostics in one object (each reads its own fields).

    ``growth``: (a) fires when the largest growth of the stream exceeds it (ratio): in one
    block, or of ‖h_0‖ since initialisation.
    ``grad_floor``: (b) fires when median ‖g_L‖ (1/128 scale) is below it.
    ``stability``: (c) fires when the mean pairwise cosine exceeds it.
    ``margin_pp``: (d) fires when headline − frozen accuracy is below it (percentage points).
    ``stability_batches``: the fewest disjoint batches (c) accepts; ``stability_batch_size``
    their size (the calibration used 128).
    """

    growth: float = 50.0
    grad_floor: float = REFERENCE_FLOOR
    stability: float = 0.30
    margin_pp: float = 2.0
    stability_batches: int = 8
    stability_batch_size: int = 128

    def __post_init__(self) -> None:
        """Each threshold a finite number in its range (:data:`THRESHOLD_RANGES`; the
        batching fields integers), else a one-line ConfigError naming it and its range: a
        NaN threshold never fires, nor does an out-of-range one (a stability above 1)."""
        for f in dataclasses.fields(self):
            check_threshold(f"Thresholds.{f.name}", f.name, getattr(self, f.name))

    @classmethod
    def as_recorded(cls, values: Mapping[str, Any]) -> Thresholds:
        """The thresholds a record or an options instance holds, kept even where out of
        the range checked now (an earlier version accepted a stability of 1): what its run
        was judged with."""
        with as_recorded():
            return cls(**values)

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


@dataclass
class DiagnosticResult:
    """One diagnostic's outcome. ``status`` is "fired", "passed" or "not evaluated"."""

    id: str
    name: str
    value: float | None
    threshold: float
    status: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"({self.id})"

    @property
    def fired(self) -> bool:
        return self.status == FIRED

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unfounded(status: Any, value: Any) -> str | None:
    """Why a result saying ``status`` cannot stand on the statistic ``value``, or None when
    it can: the status must be one of :data:`STATUSES`; fired and passed need a real number
    (not None, a bool, a string, NaN), passed a finite one — an infinite statistic may fire
    (a stream that overflowed is what (a) exists to catch) but never passes. What protocol
    evaluation, records and reports turn into "not evaluated" (never a silent pass)."""
    if status not in STATUSES:
        return f"its status {status!r} is none of {', '.join(STATUSES)}"
    if status == NOT_EVALUATED:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"its statistic is {value!r} ({type(value).__name__}), not a number"
    if math.isnan(value) or (math.isinf(value) and status == PASSED):
        return f"its statistic is {value}, not a finite number"
    return None


# Decimal places a margin in percentage points is rounded to (far below any test set's 1/n).
MARGIN_DECIMALS = 9
# How far float32 rounding moves a margin between two accuracies (fractions ≤ 1, each off by
# ≤ 2⁻²⁵ as a float32 mean): 100·2⁻²⁴ ≈ 6e-6 pp. A margin between fractions k/n that is not
# its threshold lies farther from it than this for any n below ~10⁷.
FLOAT32_MARGIN_PP = 100 * 2.0 ** -24


def margin_pp(accuracy: float, baseline: float, threshold: float | None = None) -> float:
    """``accuracy`` − ``baseline`` (fractions) in percentage points, rounded to
    :data:`MARGIN_DECIMALS` places. Accuracies are fractions k/n of a test set, whose
    binary rounding would otherwise put a margin of exactly 2 pp on either side of a 2 pp
    threshold: 100·(0.35 − 0.33) is 1.9999999999999996, and (d) fired at its threshold.
    An accuracy a loop of the user's own hands a Recorder is often a float32 mean
    (``(pred == y).float().mean()``: 415/500 reads 0.8299999833), whose rounding puts such a
    margin up to :data:`FLOAT32_MARGIN_PP` off: a margin that close to ``threshold`` (the
    one it is judged against, when given) is the threshold."""
    margin = round(100.0 * (accuracy - baseline), MARGIN_DECIMALS)
    return margin if threshold is None else at_threshold(margin, threshold)


def at_threshold(margin: float, threshold: float) -> float:
    """``margin`` (pp), or ``threshold`` where the margin lies within float32's rounding of
    it (:data:`FLOAT32_MARGIN_PP`). What (d) compares with its threshold — so that a stored
    margin re-judged at another threshold (threshold sensitivity's sweep) reads as
    :func:`margin_pp` would have recorded it at that one: a float32 margin of exactly 1 pp
    (0.999999 pp) passes at 1 pp as it would had (d) been judged there."""
    return float(threshold) if abs(margin - threshold) <= FLOAT32_MARGIN_PP else margin


def block_growths(hidden_norms: Sequence[float]) -> list[float]:
    """‖h_{l+1}‖/‖h_l‖ for every block l (inf where ‖h_l‖ = 0 < ‖h_{l+1}‖, 1 where both are 0)."""
    return [max_block_growth([a, b]) for a, b in zip(hidden_norms[:-1], hidden_norms[1:])]


def embed_growth(hidden_norms: Sequence[float],
                 initial_norms: Sequence[float] | None) -> float | None:
    """‖h_0‖ now / ‖h_0‖ at initialisation (median norms on one evaluation set): how much
    the segment before the first state (embedding, stem, first named layer) grew the stream
    since training began. None when the initial norms are unknown, or ‖h_0‖ was not a
    finite positive number at initialisation (no scale to grow from)."""
    if not initial_norms or not hidden_norms:
        return None
    start = initial_norms[0]
    if not math.isfinite(start) or start <= 0:
        return None
    return max_block_growth([start, hidden_norms[0]])


# The gain ‖W_headᵀ e‖/‖e‖ of a head at initialisation on an output error e (nn.Linear's
# Kaiming-uniform rows: 1/√3): what a head's gain is measured against.
HEAD_GAIN = 3 ** -0.5


def unsaturated_share(grad: Tensor, logits: Tensor, *, below: float = 0.0,
                      losses: Tensor | None = None) -> float | None:
    """Of the samples whose gradient ``grad`` ``(N, d)`` (1/128 scale) has a norm of at most
    ``below`` (default: exactly 0), the share whose softmax over ``logits`` ``(N, C)`` is not
    saturated: not what made the gradient small. 128·g = W_headᵀ e for the output error
    e = softmax − onehot, so g is small when ‖e‖ is or when the head's gain 128·‖g‖/‖e‖ is;
    the softmax is not saturated when ‖e‖ (at least 1 − max softmax, in the logits'
    precision) is nearer its unsaturated size 1 than the gain is to a head's at
    initialisation (:data:`HEAD_GAIN`): 128·‖g‖ < HEAD_GAIN·‖e‖². For a gradient that is
    exactly 0 this reads: the softmax is not one-hot. ``losses`` ``(N,)``, the samples'
    cross-entropies when known: a misclassified sample (CE > ln 2, so its label's
    probability p_y < 1/2) has ‖e‖ ≥ 1 − p_y however saturated its softmax is on a wrong
    class — its output error does not vanish. None when no sample's gradient is that small,
    or the arguments do not describe the same samples."""
    if grad.shape[0] != logits.shape[0] or logits.dim() != 2:
        return None
    if losses is not None and tuple(losses.shape) != (grad.shape[0],):
        losses = None
    norms = torch.linalg.vector_norm(grad.flatten(1).double(), dim=1)
    small = norms <= below
    if not bool(small.any()):
        return None
    probs = torch.softmax(logits[small], dim=1)
    top = torch.nn.functional.one_hot(probs.argmax(dim=1), logits.shape[1]).bool()
    error = probs.masked_fill(top, 0).double().sum(dim=1)  # exactly 0 when one-hot
    if losses is not None:
        ce = losses[small].double()
        error = torch.where(ce > math.log(2), torch.maximum(error, -torch.expm1(-ce)), error)
    # NaN logits are not shown saturated.
    saturated = HEAD_GAIN * error ** 2 <= REFERENCE_BATCH * norms[small]
    return float((~saturated).double().mean())


def cross_batch_stability(grad: Tensor, batch_size: int = 128) -> tuple[float, int]:
    """(mean pairwise cosine of normalised batch-mean gradients, number of batches K).

    ``grad`` ``(N, d)``: per-sample gradients at one state. The first K = N // batch_size
    disjoint consecutive batches are used (the remainder is dropped); batches whose mean is
    exactly zero have no direction and are left out. Returns (NaN, K) when K < 2.
    """
    k = grad.shape[0] // batch_size
    means = grad[: k * batch_size].double().reshape(k, batch_size, -1).mean(dim=1)
    # Scale before normalising so 1e-9-sized means cannot underflow when squared.
    means = means / means.abs().amax(dim=1, keepdim=True).clamp_min(
        torch.finfo(torch.float64).tiny)
    norms = torch.linalg.vector_norm(means, dim=1)
    units = means[norms > 0] / norms[norms > 0].unsqueeze(1)
    k = units.shape[0]
    if k < 2:
        return float("nan"), k
    gram = units @ units.T
    rows, cols = torch.triu_indices(k, k, offset=1)
    return float(gram[rows, cols].mean()), k


# (c)'s batches look sorted by class when their class mix is at least this far from the
# set's (mean total-variation distance) and this many times as far as shuffled batches'.
SORTED_DISTANCE, SORTED_RATIO = 0.2, 1.5


def batch_class_mix(labels: Tensor, batch_size: int, k: int, draws: int = 8
                    ) -> tuple[float, float]:
    """(how far the class mix of the first ``k`` consecutive batches of ``batch_size``
    ``labels`` ``(N,)`` is from that of all ``k·batch_size``, the same for those labels
    shuffled): each the mean over batches of the total-variation distance between a batch's
    class shares and the set's (0: every batch mixed like the set; 1 − 1/C for a
    balanced set of C classes sorted by class). The shuffled distance is the mean of
    ``draws`` shuffles drawn from a generator of its own (seed 0: the global RNG is
    untouched, the value reproducible): what chance alone gives batches of this size.
    ``labels`` may sit on any device; they are counted on the CPU."""
    used = labels[: k * batch_size].reshape(-1).cpu()
    _, index = torch.unique(used, return_inverse=True)
    n_classes, n = int(index.max()) + 1, index.numel()
    overall = torch.bincount(index, minlength=n_classes).double() / n
    batch = torch.arange(k).repeat_interleave(batch_size)

    def distance(order: Tensor) -> float:
        counts = torch.bincount(batch * n_classes + order, minlength=k * n_classes)
        shares = counts.reshape(k, n_classes).double() / batch_size
        return float(0.5 * (shares - overall).abs().sum(dim=1).mean())

    generator = torch.Generator().manual_seed(0)
    shuffled = [distance(index[torch.randperm(n, generator=generator)]) for _ in range(draws)]
    return distance(index), sum(shuffled) / draws
