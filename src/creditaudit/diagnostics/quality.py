"""The end-of-run credit-quality block: cosines, Γ, ρ, nudging, fresh-B null, drift.

Every metric comes with its positive (BP credit) and negative (random credit from a seeded
generator) control measured on the same model and samples, so a reader can tell a small
number from an unmeasurable one (science.md §6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.diagnostics.alignment import (
    deep_mean,
    gamma_aggregations,
    layer_cosine_table,
    layer_cosines,
)
from creditaudit.diagnostics.drift import feature_drift
from creditaudit.diagnostics.gradients import REFERENCE_FLOOR, state_gradients
from creditaudit.diagnostics.nudging import DEFAULT_ETAS, nudging_deltas
from creditaudit.diagnostics.null import DEFAULT_NULL_SEED, fresh_feedback_null, has_feedback
from creditaudit.diagnostics.perturbation import DEFAULT_EPS, WorkingCopy, rho_table
from creditaudit.errors import CreditAuditError
from creditaudit.methods.base import CreditRule
from creditaudit.models.contract import summary_vectors

GRAD_FLOOR = REFERENCE_FLOOR
Progress = Callable[[str], None]


class NonFiniteModelError(CreditAuditError):
    """The model's parameters or states are NaN/Inf, so no credit metric is defined."""


def full_credits(rule: CreditRule, x: Tensor, y: Tensor, *, chunk: int = 512) -> list[Tensor]:
    """The rule's credits with the full state shapes (token tensors kept), in chunks."""
    parts = [rule.credits(x[s:s + chunk], y[s:s + chunk]) for s in range(0, x.shape[0], chunk)]
    return [torch.cat([p[l] for p in parts]) for l in range(len(parts[0]))]


def check_finite(model: nn.Module) -> None:
    """Raise NonFiniteModelError naming the first non-finite parameter."""
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            raise NonFiniteModelError(f"parameter {name} holds NaN/Inf: credit-quality metrics "
                                      "are undefined for a diverged model")


def _random_like(tensors: Sequence[Tensor], generator: torch.Generator) -> list[Tensor]:
    return [torch.randn(t.shape, generator=generator).to(t.device) for t in tensors]


def credit_quality(rule: CreditRule, x: Tensor, y: Tensor, *,
                   rho_samples: int = 1024, rho_directions: int = 32, eps: float = DEFAULT_EPS,
                   null_draws: int = 20, null_seed: int = DEFAULT_NULL_SEED,
                   etas: Sequence[float] = DEFAULT_ETAS, seed: int = 0,
                   grad_floor: float = GRAD_FLOOR,
                   initial: dict[str, Tensor] | None = None,
                   dtype: torch.dtype | None = torch.float64,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Credit-quality metrics of ``rule`` on held-out ``x`` ``(N, …)``, ``y`` ``(N,)``.

    Keys (per-layer lists run over states l = 0 … L unless noted):

    - ``bp_cosine``: cos(a_l, g_l), per sample then mean (no eps clamp); ``deep_cos`` its
      mean over l ≥ 1; ``cosine_table``: the same with median ‖g_l‖ (1/128 scale) and a
      ``valid_reference`` mark (False where ‖g_l‖ < ``grad_floor``);
      ``cosine_controls``: ``{"bp": …, "random": …}``.
    - ``gamma``: the four Γ aggregations (:func:`gamma_aggregations`).
    - ``perturbation_rho``: ρ_l of the credit (float64); ``rho_controls``: ``{"bp", "random"}``;
      ``rho_measurable``: BP control ≥ 0.9 per layer; ``rho_samples``, ``rho_directions``.
    - ``nudging``: ``{"0.01": [Δ mean CE per deep layer 1 … L], …}`` (nats, negative =
      useful; each sample steps along its credit's unit-RMS direction a/RMS(a));
      ``nudging_controls``: ``{"bp": {…}, "random": {…}}`` (the same for the exact BP
      gradient and a random credit).
    - ``fresh_b_null`` (FA/DFA only): :func:`fresh_feedback_null`.
    - ``drift`` (only when ``initial`` parameters are given): :func:`feature_drift`.

    ρ and nudging run on a copy of ``rule.model`` in ``dtype`` (float64 by default: on a
    grown residual stream a small step changes the loss by less than fp32 resolves);
    ``dtype=None`` runs them on the model as it is. ``progress`` (e.g. ``print``) receives
    one line as each stage starts: ρ, nudging, the fresh-feedback null.

    Leaves parameters, ``.grad`` fields and every RNG state unchanged (forked RNG, seeded
    generators, gradients w.r.t. states only). Raises NonFiniteModelError for a model with
    NaN/Inf parameters or states.
    """
    model = rule.model
    check_finite(model)
    devices = [x.device] if x.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            return _credit_quality(rule, x, y, rho_samples=rho_samples,
                                   rho_directions=rho_directions, eps=eps,
                                   null_draws=null_draws, null_seed=null_seed, etas=etas,
                                   seed=seed, grad_floor=grad_floor, initial=initial,
                                   dtype=dtype, say=progress or (lambda text: None))
    finally:
        model.train(was_training)


def _credit_quality(rule: CreditRule, x: Tensor, y: Tensor, *, rho_samples: int,
                    rho_directions: int, eps: float, null_draws: int, null_seed: int,
                    etas: Sequence[float], seed: int, grad_floor: float,
                    initial: dict[str, Tensor] | None, dtype: torch.dtype | None,
                    say: Progress) -> dict[str, Any]:
    model = rule.model
    sg = state_gradients(model.forward_states, x, y)
    if not all(bool(torch.isfinite(h).all()) for h in sg.states):
        raise NonFiniteModelError("the model's states overflow to NaN/Inf on the evaluation "
                                  "set: credit-quality metrics are undefined")
    credits = full_credits(rule, x, y)
    summaries = [summary_vectors(a) for a in credits]
    noise = torch.Generator().manual_seed(seed + 2)
    random_credits = _random_like(credits, noise)
    cos = layer_cosines(summaries, sg.grads)
    out: dict[str, Any] = {
        "bp_cosine": cos,
        "deep_cos": deep_mean(cos),
        "cosine_table": layer_cosine_table(summaries, sg.grads, grad_floor),
        "cosine_controls": {
            "bp": layer_cosines(sg.grads, sg.grads),
            "random": layer_cosines([summary_vectors(r) for r in random_credits], sg.grads),
        },
        "gamma": gamma_aggregations(summaries, sg.grads),
    }
    # One copy of the model in the working dtype, and its forward pass, serve ρ, nudging
    # and their BP controls.
    working = WorkingCopy.of(model, x, y, dtype)
    n_rho = min(rho_samples, int(x.shape[0]))
    say(f"ρ (perturbation correlation): {n_rho} samples × {rho_directions} directions per "
        "layer, with BP and random controls")
    rho = rho_table(model, x, y, credits, n_directions=rho_directions, eps=eps,
                    n_samples=rho_samples, seed=seed, working=working)
    out.update({
        "perturbation_rho": rho["rho"],
        "rho_controls": {"bp": rho["bp"], "random": rho["random"]},
        "rho_measurable": rho["measurable"],
        "rho_samples": n_rho,
        "rho_directions": rho_directions,
    })
    say(f"nudging: η = {', '.join(f'{eta:g}' for eta in etas)} at each deep layer, with BP "
        "and random controls")
    out["nudging"] = nudging_deltas(model, x, y, credits, etas, working=working)
    out["nudging_controls"] = {
        "bp": nudging_deltas(model, x, y, working.bp_gradients(), etas, working=working),
        "random": nudging_deltas(model, x, y, random_credits, etas, working=working)}
    if has_feedback(rule):
        say(f"fresh-feedback null: deep cosine with {null_draws} fresh feedback draws")
        out["fresh_b_null"] = fresh_feedback_null(rule, x, y, n=null_draws, seed=null_seed,
                                                  grads=sg.grads)
    if initial is not None:
        out["drift"] = feature_drift(initial, dict(model.named_parameters()))
    return out
