"""The four diagnostics (a)–(d) and the verdict they give, one function each.

Every diagnostic takes summaries the caller already has — median per-sample norms,
``(N, d)`` gradients in the 1/128 convention, accuracies as fractions — and returns a
:class:`DiagnosticResult`: fired, passed, or *not evaluated* (never a silent pass).
:mod:`creditaudit.protocol.evaluate` runs all four on one evaluation set.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from creditaudit.diagnostics.gradients import (
    REFERENCE_FLOOR,
    max_block_growth,
    median_norms,
    zero_gradient_stats,
)

FIRED, PASSED, NOT_EVALUATED = "fired", "passed", "not evaluated"
TRUSTWORTHY, WALK_BACK, INCOMPLETE = "trustworthy", "needs walk-back", "incomplete"
DIAGNOSTIC_NAMES = {
    "a": "residual-stream scale",
    "b": "reference validity",
    "c": "cross-batch direction stability",
    "d": "depth utility",
}
CAUSE_SATURATION = ("saturated softmax (most per-sample gradients are exactly 0; not LN "
                    "cancellation)")
CAUSE_SATURATION_NO_LN = ("saturated softmax (no terminal LN: g_L is the head's transpose times "
                          "a vanishing output error on confident samples; not LN cancellation)")
CAUSE_LN = "reference gradient below the floor (LN cancellation of a grown residual stream)"
CAUSE_FLOOR = "gradient below floor"
NO_FROZEN_REASON = "no frozen-blocks accuracy given (pass --frozen RUN_OR_ACC)"
HEADLINE_GAMMA = "samples_then_layers"


@dataclass(frozen=True)
class Thresholds:
    """Firing thresholds (science.md §5 defaults) and the batching of diagnostic (c).

    ``growth``: (a) fires when the largest single-block growth exceeds it (ratio).
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


def _result(id_: str, value: float | None, threshold: float, status: str, reason: str,
            **details: Any) -> DiagnosticResult:
    return DiagnosticResult(id_, DIAGNOSTIC_NAMES[id_], value, threshold, status, reason,
                            details)


# --- the four statistics ----------------------------------------------------------------
def block_growths(hidden_norms: Sequence[float]) -> list[float]:
    """‖h_{l+1}‖/‖h_l‖ for every block l (inf where ‖h_l‖ = 0)."""
    return [max_block_growth([a, b]) for a, b in zip(hidden_norms[:-1], hidden_norms[1:])]


def growth_diagnostic(hidden_norms: Sequence[float], thresholds: Thresholds) -> DiagnosticResult:
    """(a): the largest single-block growth of the median per-sample state norm."""
    limit = thresholds.growth
    if not all(math.isfinite(v) for v in hidden_norms):
        # NaN/Inf states mean the stream overflowed: the failure (a) exists to catch.
        return _result("a", math.inf, limit, FIRED,
                       "state norms are NaN/Inf: the residual stream overflowed (diverged "
                       "model)", block_growth=block_growths(hidden_norms), block=None)
    growths = block_growths(hidden_norms)
    value = max_block_growth(list(hidden_norms))
    block = growths.index(value) if growths else None
    details = {"block_growth": growths, "block": block}
    if value > limit:
        return _result("a", value, limit, FIRED,
                       f"block {block} grows the residual stream {value:.3g}× (> {limit:g}×); "
                       f"‖h_L‖ = {hidden_norms[-1]:.3g}", **details)
    where = f" at block {block}" if block is not None else ""
    return _result("a", value, limit, PASSED,
                   f"largest block growth {value:.3g}×{where} (≤ {limit:g}×)", **details)


def reference_diagnostic(grad_last: Tensor, hidden_norms: Sequence[float],
                         thresholds: Thresholds, *, terminal_ln: bool | None = None
                         ) -> DiagnosticResult:
    """(b): median per-sample ‖g_L‖ ``grad_last`` ``(N, d)`` (1/128 scale) against the floor.

    Also reports the fraction of samples whose gradient is exactly 0 and the median over the
    rest, and names the cause when it fires: a saturated softmax (≥ half the samples exactly
    0, or any tiny median on a model known to have no terminal LN), LN cancellation
    (terminal LN, or — when unknown — a grown stream), or plainly a gradient below the
    floor.
    """
    floor = thresholds.grad_floor
    value = median_norms([grad_last])[0]
    zero_fraction, nonzero_median = zero_gradient_stats(grad_last)
    grew = (len(hidden_norms) > 1 and hidden_norms[0] > 0
            and hidden_norms[-1] / hidden_norms[0] > thresholds.growth)
    details: dict[str, Any] = {"zero_fraction": zero_fraction, "nonzero_median": nonzero_median,
                               "terminal_ln": terminal_ln, "stream_grew": bool(grew),
                               "cause": None}
    if math.isnan(value):
        return _result("b", None, floor, NOT_EVALUATED,
                       "‖g_L‖ is NaN (diverged model): no reference gradient", **details)
    if value >= floor:
        return _result("b", value, floor, PASSED,
                       f"median ‖g_L‖ = {value:.3g} (≥ {floor:.0e}); {zero_fraction:.0%} of "
                       "samples have an exactly-zero gradient", **details)
    if zero_fraction >= 0.5:
        cause = CAUSE_SATURATION
    elif terminal_ln is False:
        # Without a terminal LN, g_L = W_headᵀ e / 128: it can only vanish when the output
        # error e = softmax − onehot does, i.e. the softmax saturates on confident samples.
        cause = CAUSE_SATURATION_NO_LN
    elif terminal_ln or (terminal_ln is None and grew):
        cause = CAUSE_LN
    else:
        cause = CAUSE_FLOOR
    details["cause"] = cause
    return _result("b", value, floor, FIRED,
                   f"median ‖g_L‖ = {value:.3g} (< {floor:.0e}): {cause}; zero fraction "
                   f"{zero_fraction:.0%}, non-zero median {nonzero_median:.3g}", **details)


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


def stability_diagnostic(grads: Sequence[Tensor], thresholds: Thresholds) -> DiagnosticResult:
    """(c): direction stability of batch-mean gradients at state L//2."""
    limit, size = thresholds.stability, thresholds.stability_batch_size
    layer = (len(grads) - 1) // 2
    grad = grads[layer]
    full = grad.shape[0] // size
    details: dict[str, Any] = {"layer": layer, "batch_size": size, "n_batches": full}
    if full < thresholds.stability_batches:
        return _result("c", None, limit, NOT_EVALUATED,
                       f"needs {thresholds.stability_batches} full batches of {size} "
                       f"evaluation samples, got {grad.shape[0]} samples ({full} batches)",
                       **details)
    if not bool(torch.isfinite(grad).all()):
        return _result("c", None, limit, NOT_EVALUATED,
                       f"gradients at state {layer} are NaN/Inf (diverged model)", **details)
    value, k = cross_batch_stability(grad, size)
    details["n_batches"] = k
    if k < thresholds.stability_batches:
        return _result("c", None, limit, NOT_EVALUATED,
                       f"only {k} of {full} batch-mean gradients at state {layer} are "
                       "non-zero", **details)
    if value > limit:
        return _result("c", value, limit, FIRED,
                       f"batch-mean gradients at state {layer} share one direction (mean "
                       f"pairwise cos {value:.3f} > {limit:g} over {k} batches): drift "
                       "sub-mode", **details)
    return _result("c", value, limit, PASSED,
                   f"mean pairwise cos {value:.3f} at state {layer} over {k} batches "
                   f"(≤ {limit:g})", **details)


def depth_utility_diagnostic(headline_acc: float | None, frozen_acc: float | None,
                             thresholds: Thresholds) -> DiagnosticResult:
    """(d): headline − frozen-blocks accuracy in percentage points (accuracies as fractions)."""
    limit = thresholds.margin_pp
    details = {"headline_acc": headline_acc, "frozen_acc": frozen_acc}
    if headline_acc is None:
        return _result("d", None, limit, NOT_EVALUATED, "no headline accuracy given",
                       **details)
    if frozen_acc is None:
        return _result("d", None, limit, NOT_EVALUATED, NO_FROZEN_REASON, **details)
    margin = 100.0 * (headline_acc - frozen_acc)
    if margin < limit:
        return _result("d", margin, limit, FIRED,
                       f"accuracy {headline_acc:.3f} vs frozen blocks {frozen_acc:.3f}: margin "
                       f"{margin:+.2f} pp (< {limit:g} pp), the trained blocks add too little",
                       **details)
    return _result("d", margin, limit, PASSED,
                   f"accuracy {headline_acc:.3f} vs frozen blocks {frozen_acc:.3f}: margin "
                   f"{margin:+.2f} pp (≥ {limit:g} pp)", **details)


def verdict_of(results: Sequence[DiagnosticResult]) -> tuple[str, list[str], list[str]]:
    """(verdict, fired ids, not-evaluated ids): needs walk-back if any fired, trustworthy if
    all were evaluated and none fired, incomplete otherwise."""
    fired = [r.id for r in results if r.status == FIRED]
    skipped = [r.id for r in results if r.status == NOT_EVALUATED]
    return verdict_from(fired, skipped), fired, skipped


def verdict_from(fired: Sequence[str], not_evaluated: Sequence[str]) -> str:
    return WALK_BACK if fired else (INCOMPLETE if not_evaluated else TRUSTWORTHY)


def labels(ids: Sequence[str]) -> str:
    """``["a", "b"]`` → ``"(a)(b)"``; three or more consecutive ids → ``"(a)–(c)"``."""
    ids = list(ids)
    order = "".join(DIAGNOSTIC_NAMES)
    if len(ids) >= 3 and "".join(ids) in order:
        return f"({ids[0]})–({ids[-1]})"
    return "".join(f"({i})" for i in ids)


def verdict_phrase(fired: Sequence[str], not_evaluated: Sequence[str]) -> str:
    """What a table prints: ``trustworthy`` only when all four diagnostics were evaluated and
    none fired; ``needs walk-back (a)(b)`` (plus what was not evaluated); otherwise ``no
    walk-back in (a)–(c); (d) not evaluated``."""
    if fired:
        text = f"{WALK_BACK} {labels(fired)}"
        return text + (f"; {labels(not_evaluated)} not evaluated" if not_evaluated else "")
    if not_evaluated:
        evaluated = [i for i in DIAGNOSTIC_NAMES if i not in not_evaluated]
        head = f"no walk-back in {labels(evaluated)}; " if evaluated else ""
        return f"{head}{labels(not_evaluated)} not evaluated"
    return TRUSTWORTHY
