"""The four-diagnostic protocol (SPEC §5): can a run's headline numbers be trusted?

=====  ===============================  =============================================  ==========
id     name                             statistic                                      fires when
=====  ===============================  =============================================  ==========
(a)    residual-stream scale            max_l ‖h_{l+1}‖/‖h_l‖ of median norms          > 50
(b)    reference validity               median per-sample ‖g_L‖ (1/128 scale)          < 1e-7
(c)    cross-batch direction stability  mean pairwise cos of K ≥ 8 batch-mean g at L//2 > 0.30
(d)    depth utility                    headline acc − frozen-blocks acc (pp)          < 2.0
=====  ===============================  =============================================  ==========

The verdict is *trustworthy* when none fires and *needs walk-back* (naming the fired ones)
otherwise. A diagnostic that cannot be evaluated (no frozen accuracy, too few evaluation
batches, non-finite values) is reported as *not evaluated* — never as passed.

:func:`diagnose` runs the protocol on a live model (a contract model, or any ``nn.Module``
with a states function); :func:`evaluate_protocol` runs it on precomputed
:class:`~creditaudit.diagnostics.gradients.StateGradients` (what training already has).
Norms follow SPEC §2: per-sample L2 over the feature axis, median over samples, gradients
as (1/128)·∂CE_i/∂h_l.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.config import RunConfig
from creditaudit.diagnostics.alignment import gamma_aggregations, layer_cosine_table
from creditaudit.diagnostics.epoch import rule_credits
from creditaudit.diagnostics.gradients import (
    StateGradients,
    StatesFn,
    max_block_growth,
    median_norms,
    state_gradients,
    zero_gradient_stats,
)
from creditaudit.diagnostics.quality import credit_quality
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.methods.base import CreditRule
from creditaudit.models.contract import summary_vectors

FIRED, PASSED, NOT_EVALUATED = "fired", "passed", "not evaluated"
TRUSTWORTHY, WALK_BACK = "trustworthy", "needs walk-back"
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
CREDIT_FORMULAS = {
    "bp": "a_l = g_l (backprop)",
    "fa": "a_l = B_l a_{l+1}, a_L exact",
    "dfa": "a_l = B_l^T e",
    "frozen": "blocks frozen; readout by BP",
    "state-bridge": "a_l = ∇_{h_l} CE(readout(G(h_l, l, e)), y)",
    "credit-bridge": "a_l = ∇_{h_l} V(h_l, l, e)",
    "ep": "a_l = −r_{l−1}/β at the nudged equilibrium (r_l = h_{l+1} − h_l − f_l(h_l))",
}
CreditFn = Callable[[Tensor, Tensor], list[Tensor]]


@dataclass(frozen=True)
class Thresholds:
    """Firing thresholds (SPEC §5 defaults) and the batching of diagnostic (c).

    ``growth``: (a) fires when the largest single-block growth exceeds it (ratio).
    ``grad_floor``: (b) fires when median ‖g_L‖ (1/128 scale) is below it.
    ``stability``: (c) fires when the mean pairwise cosine exceeds it.
    ``margin_pp``: (d) fires when headline − frozen accuracy is below it (percentage points).
    ``stability_batches``: the fewest disjoint batches (c) accepts; ``stability_batch_size``
    their size (the calibration used 128).
    """

    growth: float = 50.0
    grad_floor: float = 1e-7
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
    """(verdict, fired ids, not-evaluated ids)."""
    fired = [r.id for r in results if r.status == FIRED]
    skipped = [r.id for r in results if r.status == NOT_EVALUATED]
    return (WALK_BACK if fired else TRUSTWORTHY), fired, skipped


def labels(ids: Sequence[str]) -> str:
    """``["a", "b"]`` → ``"(a)(b)"``."""
    return "".join(f"({i})" for i in ids)


@dataclass
class DiagnosticReport:
    """The protocol's outcome on one model and evaluation set.

    ``hidden_norms[l]``: median per-sample ‖h_l‖; ``grad_norms[l]``: median per-sample ‖g_l‖
    in the 1/128 scale convention (SPEC §2), l = 0 … L. ``diagnostics``: (a)–(d) in order.
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
        """``"needs walk-back (a)(b)"``, ``"trustworthy"``, plus what was not evaluated."""
        text = self.verdict + (f" {labels(self.fired)}" if self.fired else "")
        if self.not_evaluated:
            text += f"; not evaluated: {labels(self.not_evaluated)}"
        return text

    @property
    def headline_gamma(self) -> float | None:
        return None if self.gamma is None else self.gamma.get(HEADLINE_GAMMA)

    # --- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (floats may be NaN/inf, which ``json`` writes and reads back)."""
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
        return json.dumps(self.to_dict(), indent=indent)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(**self.metadata.get("thresholds", {}))

    # --- rendering (creditaudit.report) ---------------------------------------------------
    def __str__(self) -> str:
        from creditaudit.report import render_text

        return render_text(self)

    def to_markdown(self) -> str:
        """The SPEC §5 reporting-template row, the diagnostics and a per-layer table."""
        from creditaudit.report import render_markdown

        return render_markdown(self)

    def to_latex(self) -> str:
        """One LaTeX table row: method & arch & acc & Γ & a & b & c & d & verdict."""
        from creditaudit.report import render_latex

        return render_latex(self)


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


def config_metadata(config: RunConfig) -> dict[str, Any]:
    """Report metadata (method, architecture, dataset, seeds) of a run's config."""
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
        "feedback_seed": feedback_seed if config.method.name in ("fa", "dfa") else None,
        "penalty": config.method.penalty, "run_id": config.run_id,
    }


class _FunctionCredit:
    """Adapts a credit function ``(x, y) -> [a_0 … a_L]`` to the rule interface."""

    name = "custom"

    def __init__(self, model: nn.Module, fn: CreditFn) -> None:
        self.model, self.fn = model, fn

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        return [a.detach() for a in self.fn(x, y)]


METRIC_OPTIONS = ("rho_samples", "rho_directions", "eps", "null_draws", "null_seed", "etas",
                  "seed")


def diagnose(model: nn.Module, eval_x: Tensor, eval_y: Tensor, *,
             credit: CreditRule | CreditFn | None = None, states_fn: StatesFn | None = None,
             headline_acc: float | None = None, frozen_acc: float | None = None,
             thresholds: Thresholds = Thresholds(), metrics: bool = False,
             metric_options: dict[str, Any] | None = None,
             metadata: dict[str, Any] | None = None) -> DiagnosticReport:
    """Run the four-diagnostic protocol on ``model`` over a held-out evaluation set.

    ``eval_x`` ``(N, …)`` model inputs, ``eval_y`` ``(N,)`` int64 labels; use N ≥ 1024 (8
    batches of 128) for (c). ``states_fn(x) -> ([h_0 … h_L], logits)`` audits any module
    (states ``(B, d)``, ``(B, T, d)`` → CLS token, ``(B, C, H, W)`` → pooled); by default
    ``model.forward_states``. ``credit``: a CreditRule or a function ``(x, y) -> [a_0 …
    a_L]`` adds per-layer cosines and Γ. ``headline_acc``/``frozen_acc``: test accuracies
    as fractions for (d). ``metrics=True`` adds the credit-quality block (ρ, nudging,
    fresh-B null; needs a contract model with ``forward_from`` and a credit);
    ``metric_options`` are passed to :func:`diagnostics.quality.credit_quality`.

    Leaves every parameter, buffer, ``.grad`` field and RNG state (global CPU, and CUDA when
    the inputs are on a GPU) unchanged: runs in eval mode under a forked RNG, takes
    gradients w.r.t. states only, and restores the model's training flag.
    """
    if states_fn is None:
        if not hasattr(model, "forward_states"):
            raise ModelContractError(
                f"{type(model).__name__} has no forward_states: pass states_fn=lambda x: "
                "([h_0, …, h_L], logits) to diagnose()")
        states_fn = model.forward_states  # type: ignore[assignment]
    if eval_y.dim() != 1 or eval_y.shape[0] != eval_x.shape[0]:
        raise ModelContractError(f"eval_y must be ({eval_x.shape[0]},) labels for the "
                                 f"{eval_x.shape[0]} inputs, got shape {tuple(eval_y.shape)}")
    options = dict(metric_options or {})
    unknown = sorted(set(options) - set(METRIC_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown metric option {unknown[0]!r}; allowed: "
                          f"{', '.join(METRIC_OPTIONS)}")
    rule: Any = None
    if isinstance(credit, CreditRule):
        rule = credit
    elif credit is not None:
        rule = _FunctionCredit(model, credit)
    if metrics and (rule is None or not hasattr(model, "forward_from")):
        raise ModelContractError(
            "metrics=True needs a credit (a CreditRule or a function) and a model with "
            "forward_from(layer, h) (the contract of creditaudit.models.ResidualNet); pass "
            "metrics=False to run the four diagnostics only")
    devices = [eval_x.device] if eval_x.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            sg = state_gradients(states_fn, eval_x, eval_y)
            summaries = None
            if isinstance(rule, CreditRule):
                summaries = rule_credits(rule, eval_x, eval_y)
            elif rule is not None:
                summaries = [summary_vectors(a) for a in rule.credits(eval_x, eval_y)]
            quality = None
            if metrics:
                quality = credit_quality(rule, eval_x, eval_y,
                                         grad_floor=thresholds.grad_floor, **options)
    finally:
        model.train(was_training)
    # A contract model says whether it ends in a LayerNorm; a plain module may not.
    terminal_ln = (model.out_ln is not None) if hasattr(model, "out_ln") else None
    meta: dict[str, Any] = {"model": type(model).__name__,
                            "method": getattr(rule, "name", None)}
    meta.update(metadata or {})
    terminal_ln = meta.pop("terminal_ln", terminal_ln)
    return evaluate_protocol(sg, headline_acc=headline_acc, frozen_acc=frozen_acc,
                             thresholds=thresholds, terminal_ln=terminal_ln,
                             credits=summaries, metrics=quality, metadata=meta)


__all__ = [
    "Thresholds", "DiagnosticResult", "DiagnosticReport", "diagnose", "evaluate_protocol",
    "cross_batch_stability", "growth_diagnostic", "reference_diagnostic",
    "stability_diagnostic", "depth_utility_diagnostic", "verdict_of", "config_metadata",
]
