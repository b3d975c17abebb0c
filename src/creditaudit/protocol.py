"""The four-diagnostic protocol (science.md §5): can a run's headline numbers be trusted?

=====  ===============================  =============================================  ==========
id     name                             statistic                                      fires when
=====  ===============================  =============================================  ==========
(a)    residual-stream scale            max_l ‖h_{l+1}‖/‖h_l‖ of median norms          > 50
(b)    reference validity               median per-sample ‖g_L‖ (1/128 scale)          < 1e-7
(c)    cross-batch direction stability  mean pairwise cos of K ≥ 8 batch-mean g at L//2 > 0.30
(d)    depth utility                    headline acc − frozen-blocks acc (pp)          < 2.0
=====  ===============================  =============================================  ==========

The verdict is *needs walk-back* (naming the fired ones) when any fires, *trustworthy* only
when all four were evaluated and none fired, and *incomplete* otherwise — printed as "no
walk-back in (a)–(c); (d) not evaluated". A diagnostic that cannot be evaluated (no frozen
accuracy, too few evaluation batches, non-finite values) is reported as *not evaluated* —
never as passed.

:func:`creditaudit.own_model.diagnose` runs the protocol on a live model (a contract model,
or any ``nn.Module`` with a states function); :func:`evaluate_protocol` runs it on precomputed
:class:`~creditaudit.diagnostics.gradients.StateGradients` (what training already has).
Norms follow science.md §2: per-sample L2 over the feature axis, median over samples, gradients
as (1/128)·∂CE_i/∂h_l.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from creditaudit import strict_json
from creditaudit.config import RunConfig
from creditaudit.diagnostics.alignment import gamma_aggregations, layer_cosine_table
from creditaudit.diagnostics.gradients import (
    REFERENCE_FLOOR,
    StateGradients,
    max_block_growth,
    median_norms,
    zero_gradient_stats,
)
from creditaudit.errors import ConfigError
from creditaudit.methods.registry import find_rule

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
CreditFn = Callable[[Tensor, Tensor], list[Tensor]]


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


@dataclass
class DiagnosticReport:
    """The protocol's outcome on one model and evaluation set.

    ``hidden_norms[l]``: median per-sample ‖h_l‖; ``grad_norms[l]``: median per-sample ‖g_l‖
    in the 1/128 scale convention (science.md §2), l = 0 … L. ``diagnostics``: (a)–(d) in order.
    ``layer_cosines``/``gamma``: present when a credit was given; ``metrics``: the
    credit-quality block when asked for; ``metadata``: model, method, n samples, thresholds,
    accuracies and whatever the caller added (dataset, seeds, epoch, …).
    """

    hidden_norms: list[float]
    grad_norms: list[float]
    diagnostics: list[DiagnosticResult]
    verdict: str
    fired: list[str]
    not_evaluated: list[str]
    layer_cosines: list[dict[str, Any]] | None = None
    gamma: dict[str, float] | None = None
    metrics: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def diagnostic(self, id_: str) -> DiagnosticResult:
        """The result of diagnostic ``id_`` ("a" … "d")."""
        for result in self.diagnostics:
            if result.id == id_:
                return result
        raise KeyError(id_)

    @property
    def verdict_text(self) -> str:
        """``"needs walk-back (a)(b)"``, ``"trustworthy"`` (all four evaluated, none fired)
        or ``"no walk-back in (a)–(c); (d) not evaluated"`` (see :func:`verdict_phrase`)."""
        return verdict_phrase(self.fired, self.not_evaluated)

    @property
    def headline_gamma(self) -> float | None:
        return None if self.gamma is None else self.gamma.get(HEADLINE_GAMMA)

    # --- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (floats may be NaN/inf: :meth:`to_json` writes them as strict
        JSON, null plus a ``non_finite`` mark)."""
        return {
            "verdict": self.verdict,
            "fired": list(self.fired),
            "not_evaluated": list(self.not_evaluated),
            "diagnostics": {r.id: r.to_dict() for r in self.diagnostics},
            "hidden_norms": list(self.hidden_norms),
            "grad_norms": list(self.grad_norms),
            "layer_cosines": self.layer_cosines,
            "gamma": self.gamma,
            "metrics": self.metrics,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagnosticReport:
        """Rebuild a report from :meth:`to_dict` output (e.g. a run record's protocol block)."""
        return cls(
            hidden_norms=data["hidden_norms"], grad_norms=data["grad_norms"],
            diagnostics=[DiagnosticResult(**r) for r in data["diagnostics"].values()],
            verdict=data["verdict"], fired=data["fired"], not_evaluated=data["not_evaluated"],
            layer_cosines=data.get("layer_cosines"), gamma=data.get("gamma"),
            metrics=data.get("metrics"), metadata=data.get("metadata", {}),
        )

    def to_json(self, indent: int | None = 1) -> str:
        """Strict JSON (no NaN/Infinity tokens; see :mod:`creditaudit.strict_json`)."""
        return strict_json.dumps(self.to_dict(), indent=indent)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(**self.metadata.get("thresholds", {}))

    def __str__(self) -> str:
        """The verdict in words; :func:`creditaudit.report.render` gives the full tables."""
        return self.verdict_text


# --- running it ---------------------------------------------------------------------------
def _check_fraction(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{name}={value!r} must be an accuracy fraction in [0, 1] "
                          "(e.g. 0.349 for 34.9%)")
    return float(value)


def evaluate_protocol(sg: StateGradients, *, headline_acc: float | None,
                      frozen_acc: float | None, thresholds: Thresholds = Thresholds(),
                      terminal_ln: bool | None = None, credits: Sequence[Tensor] | None = None,
                      metrics: dict[str, Any] | None = None,
                      metadata: dict[str, Any] | None = None) -> DiagnosticReport:
    """The four diagnostics from precomputed per-sample states and gradients.

    ``sg``: :class:`StateGradients` on the evaluation set (``(N, d)`` summaries, gradients
    in the 1/128 convention); ``headline_acc``/``frozen_acc``: test accuracies as fractions
    (None → (d) not evaluated); ``terminal_ln``: whether the model ends in a LayerNorm (None
    = unknown, used only to name (b)'s cause); ``credits``: optional ``(N, d)`` credit
    summaries per layer for the per-layer cosine table and Γ. Pure: no autograd, no RNG.
    """
    headline_acc = _check_fraction("headline_acc", headline_acc)
    frozen_acc = _check_fraction("frozen_acc", frozen_acc)
    hidden = median_norms(sg.states)
    grads = median_norms(sg.grads)
    results = [
        growth_diagnostic(hidden, thresholds),
        reference_diagnostic(sg.grads[-1], hidden, thresholds, terminal_ln=terminal_ln),
        stability_diagnostic(sg.grads, thresholds),
        depth_utility_diagnostic(headline_acc, frozen_acc, thresholds),
    ]
    verdict, fired, skipped = verdict_of(results)
    meta = {"n_samples": int(sg.states[0].shape[0]), "layout": sg.layout,
            "terminal_ln": terminal_ln, "headline_acc": headline_acc, "frozen_acc": frozen_acc,
            "headline_gamma_aggregation": HEADLINE_GAMMA, "thresholds": thresholds.to_dict()}
    meta.update(metadata or {})
    table = gamma = None
    if credits is not None:
        table = layer_cosine_table(list(credits), sg.grads, thresholds.grad_floor)
        gamma = gamma_aggregations(list(credits), sg.grads)
    return DiagnosticReport(hidden_norms=hidden, grad_norms=grads, diagnostics=results,
                            verdict=verdict, fired=fired, not_evaluated=skipped,
                            layer_cosines=table, gamma=gamma, metrics=metrics, metadata=meta)


def _draws_feedback(method: str) -> bool:
    """True when the rule draws from the feedback seed's generator (unknown rules: False)."""
    rule = find_rule(method)
    return rule is not None and rule.uses_feedback_seed


def config_metadata(config: RunConfig, run_id: str | None = None) -> dict[str, Any]:
    """Report metadata (method, architecture, dataset, seeds, run id) of a run's config."""
    model = config.model
    arch = f"{model.arch} d={model.d} L={model.n_blocks}"
    if model.arch == "student":
        arch = "student d=128 L=4"
    elif not model.out_ln:
        arch += " no out_ln"
    if not model.residual:
        arch += " no residual"
    feedback_seed = (config.method.feedback_seed if config.method.feedback_seed is not None
                     else config.run.seed)
    return {
        "method": config.method.name, "arch": arch,
        "terminal_ln": model.out_ln and model.arch != "student",
        "dataset": config.data.name, "seeds": str(config.run.seed),
        "feedback_seed": feedback_seed if _draws_feedback(config.method.name) else None,
        "penalty": config.method.penalty, "run_id": run_id,
    }


__all__ = [
    "Thresholds", "DiagnosticResult", "DiagnosticReport", "evaluate_protocol",
    "cross_batch_stability", "growth_diagnostic", "reference_diagnostic",
    "stability_diagnostic", "depth_utility_diagnostic", "verdict_of", "verdict_from",
    "verdict_phrase", "config_metadata", "TRUSTWORTHY", "WALK_BACK", "INCOMPLETE",
]
