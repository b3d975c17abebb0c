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

from creditaudit.deep_layers import deep_mean
from creditaudit.errors import CreditAuditError
from creditaudit.measures.alignment import (
    gamma_aggregations,
    layer_cosine_table,
    layer_cosines,
)
from creditaudit.measures.budget import rho_budget
from creditaudit.measures.drift import feature_drift
from creditaudit.measures.gradients import REFERENCE_FLOOR, state_gradients
from creditaudit.measures.nudging import DEFAULT_ETAS, nudging_table
from creditaudit.measures.null import DEFAULT_NULL_SEED, fresh_feedback_null, has_feedback
from creditaudit.measures.perturbation import BP_CREDIT, DEFAULT_EPS, rho_table
from creditaudit.measures.progress import release_freed_memory
from creditaudit.measures.working import DEFAULT_MEMORY_GB, WorkingCopy, measure_footprint
from creditaudit.methods.base import CreditRule
from creditaudit.models.contract import measurement_mode, summary_vectors

GRAD_FLOOR = REFERENCE_FLOOR
Progress = Callable[[str], None]
# ρ's default compute budget, floating-point operations (what diagnostics.rho_flops defaults
# to). One sample of ρ with 32 directions costs 8.7e7 on the d=256 L=4 ResidualMLP, so the
# audit table's 1024 samples fit (2288 would); ConvMixer (2.3e9 per sample) and ViT-Mini
# (3.5e10) at the README's sizes get 85 and the minimum 8, and their whole block stays under
# 2 minutes on one CPU thread (docs/benchmarks.md).
DEFAULT_RHO_FLOPS = 2e11
# The cosines' passes (state gradients, credits) take at most this many samples at once
# (powers of two below it when the memory cap asks for fewer).
COSINE_CHUNK = 512


class NonFiniteModelError(CreditAuditError):
    """The model's parameters or states are NaN/Inf, so no credit metric is defined."""


def full_credits(rule: CreditRule, x: Tensor, y: Tensor, *, chunk: int = 512) -> list[Tensor]:
    """The rule's credits with the full state shapes (token tensors kept), in chunks.

    Where ``x`` takes more than one chunk, every call sees exactly ``chunk`` samples: a short
    last chunk is filled up with the first samples of ``x``, whose credits there are dropped.
    A credit on the batch-mean scale (BP's, FA's, a user's ∂ mean CE/∂h) is 1/batch times a
    per-sample one, so a shorter last batch would put its samples on another scale, and ρ,
    which pools ε⟨a_i, v⟩ over samples, would mix the two (BP's own ρ fell from 1 to 0.71 on
    600 samples in chunks of 512).
    """
    n = x.shape[0]
    parts = []
    for s in range(0, n, chunk):
        xs, ys = x[s:s + chunk], y[s:s + chunk]
        kept = xs.shape[0]
        if s > 0 and kept < chunk:  # s ≥ chunk > chunk - kept: x[:chunk - kept] exists
            xs, ys = torch.cat([xs, x[:chunk - kept]]), torch.cat([ys, y[:chunk - kept]])
        parts.append([a[:kept] for a in rule.credits(xs, ys)])
    return [torch.cat([p[l] for p in parts]) for l in range(len(parts[0]))]


def check_finite(model: nn.Module) -> None:
    """Raise NonFiniteModelError naming the first non-finite parameter."""
    for name, param in model.named_parameters():
        if not bool(torch.isfinite(param).all()):
            raise NonFiniteModelError(f"parameter {name} holds NaN/Inf: credit-quality metrics "
                                      "are undefined for a diverged model")


def _random_like(tensors: Sequence[Tensor], generator: torch.Generator) -> list[Tensor]:
    """Gaussian float32 tensors of ``tensors``' shapes on their devices, drawn on the CPU
    whatever their dtype (never in torch's default dtype or on its default device, which
    are the caller's): a float64 model's random control is its float32 twin's."""
    return [torch.randn(t.shape, generator=generator, dtype=torch.float32, device="cpu"
                        ).to(t.device) for t in tensors]


def credit_quality(rule: CreditRule, x: Tensor, y: Tensor, *,
                   rho_samples: int = 1024, rho_directions: int = 32, eps: float = DEFAULT_EPS,
                   null_draws: int = 20, null_seed: int = DEFAULT_NULL_SEED,
                   etas: Sequence[float] = DEFAULT_ETAS, seed: int = 0,
                   grad_floor: float = GRAD_FLOOR,
                   initial: dict[str, Tensor] | None = None,
                   dtype: torch.dtype | None = torch.float64,
                   rho_flops: float | None = DEFAULT_RHO_FLOPS,
                   memory_gb: float = DEFAULT_MEMORY_GB,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Credit-quality metrics of ``rule`` on held-out ``x`` ``(N, …)``, ``y`` ``(N,)``.

    Keys (per-layer lists run over states l = 0 … L unless noted):

    - ``bp_cosine``: cos(a_l, g_l), per sample then mean (no eps clamp); ``deep_cos`` its
      mean over l ≥ 1; ``cosine_table``: the same with median ‖g_l‖ (1/128 scale) and a
      ``valid_reference`` mark (False where ‖g_l‖ < ``grad_floor``);
      ``cosine_controls``: ``{"bp": …, "random": …}``.
    - ``gamma``: the four Γ aggregations (:func:`gamma_aggregations`).
    - ``perturbation_rho``: ρ_l of the credit (float64); ``rho_se``: its jackknife standard
      error; ``rho_controls``: ``{"bp", "random"}``; ``rho_measurable``: per layer, BP
      control ≥ 0.9 and ρ a number (a credit zero at every sample has none);
      ``rho_samples`` (used), ``rho_directions``; ``rho_samples_asked``,
      ``rho_sample_flops`` and ``rho_budget_flops``: why ρ used that many (below).
    - ``nudging``: ``{"0.01": [Δ mean CE per deep layer 1 … L], …}`` (nats, negative =
      useful; each sample steps along its credit's unit-RMS direction a/RMS(a));
      ``nudging_controls``: ``{"bp": {…}, "random": {…}}`` (the same for the exact BP
      gradient and a random credit); ``nudging_samples``: the samples it averages over.
    - ``fresh_b_null`` (FA/DFA only): :func:`fresh_feedback_null`.
    - ``drift`` (only when ``initial`` parameters are given): :func:`feature_drift`.

    ρ and nudging run on a copy of ``rule.model`` in ``dtype`` (float64 by default: on a
    grown residual stream a small step changes the loss by less than fp32 resolves);
    ``dtype=None`` runs them on the model as it is. ``progress`` (e.g. ``print``) receives
    one line as each stage starts: ρ, nudging, the fresh-feedback null; and, within a
    stage, the samples done and the ETA at most every 10 s.

    Cost: ``rho_flops`` is ρ's compute budget in floating-point operations (None: none).
    ρ asks for min(``rho_samples``, N) samples and uses ⌊rho_flops / rho_sample_flops⌋ of
    them where that is fewer (at least 8), ``rho_sample_flops`` being one sample's perturbed
    forwards counted on the model (:func:`~creditaudit.measures.budget.rho_sample_flops`):
    the count follows from the model's shapes, so the samples do not depend on the machine
    or its load. ``rho_se`` says how precise ρ is; nudging then averages over the same
    samples instead of all N. Every
    pass runs in chunks whose autograd-saved tensors stay under ``memory_gb`` GB, sized from
    the bytes per sample measured on the model (chunking changes only the rounding).

    Leaves parameters, ``.grad`` fields and every RNG state unchanged (forked RNG, seeded
    generators, gradients w.r.t. states only). Raises NonFiniteModelError for a model with
    NaN/Inf parameters or states.
    """
    model = rule.model
    check_finite(model)
    devices = [x.device] if x.device.type == "cuda" else []
    with measurement_mode(model), torch.random.fork_rng(devices=devices):
        return _credit_quality(rule, x, y, rho_samples=rho_samples,
                               rho_directions=rho_directions, eps=eps,
                               null_draws=null_draws, null_seed=null_seed, etas=etas,
                               seed=seed, grad_floor=grad_floor, initial=initial,
                               dtype=dtype, rho_flops=rho_flops,
                               memory_bytes=memory_gb * 1e9,
                               say=progress or (lambda text: None))


def _credit_quality(rule: CreditRule, x: Tensor, y: Tensor, *, rho_samples: int,
                    rho_directions: int, eps: float, null_draws: int, null_seed: int,
                    etas: Sequence[float], seed: int, grad_floor: float,
                    initial: dict[str, Tensor] | None, dtype: torch.dtype | None,
                    rho_flops: float | None, memory_bytes: float,
                    say: Progress) -> dict[str, Any]:
    model = rule.model
    footprint = measure_footprint(model.forward_states, x, y)
    # A pass with its backward, keeping states and credits (or gradients) per sample.
    fits = footprint.samples_within(memory_bytes, copies=2, backward=True)
    chunk = min(COSINE_CHUNK, 1 << (fits.bit_length() - 1))
    sg = state_gradients(model.forward_states, x, y, chunk=chunk)
    if not all(bool(torch.isfinite(h).all()) for h in sg.states):
        raise NonFiniteModelError("the model's states overflow to NaN/Inf on the evaluation "
                                  "set: credit-quality metrics are undefined")
    credits = full_credits(rule, x, y, chunk=chunk)
    release_freed_memory()  # the passes' activations, kept in the C heap otherwise
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
    # One copy of the model in the working dtype, and its pass over the samples in
    # chunks, serve ρ, nudging and their BP controls.
    working = WorkingCopy.planned(model, x, y, dtype, memory_bytes=memory_bytes)
    budget = rho_budget(working, rho_samples, n_directions=rho_directions,
                        budget_flops=rho_flops)
    if budget.reached:  # the pass then never computes a sample past ρ's
        working = working.first(budget.samples)
    cut = f" ({budget.describe()})" if budget.reached else ""
    say(f"ρ (perturbation correlation): {budget.samples} samples × {rho_directions} "
        f"directions per layer, with BP and random controls{cut}")
    rho = rho_table(model, x, y, credits, n_directions=rho_directions, eps=eps,
                    n_samples=budget.samples, seed=seed, working=working, progress=say)
    out.update({
        "perturbation_rho": rho["rho"],
        "rho_se": rho["se"],
        "rho_controls": {"bp": rho["bp"], "random": rho["random"]},
        "rho_measurable": rho["measurable"],
        "rho_samples": rho["samples"],
        "rho_directions": rho_directions,
        "rho_samples_asked": budget.asked,
        "rho_sample_flops": budget.sample_flops,
        "rho_budget_flops": rho_flops,
    })
    # Nudging costs a fifth to a third of ρ per sample: where the budget cut ρ short, it
    # averages over ρ's samples rather than spend that compute again on all N.
    n_nudge = budget.samples if budget.reached else int(x.shape[0])
    among = f" over the {n_nudge} samples of ρ" if budget.reached else ""
    say(f"nudging: η = {', '.join(f'{eta:g}' for eta in etas)} at each deep layer{among}, "
        "with BP and random controls")
    rule_deltas, bp_deltas, random_deltas = nudging_table(
        model, x, y, [credits, BP_CREDIT, random_credits], etas, working=working,
        n_samples=n_nudge, progress=say)
    out["nudging"] = rule_deltas
    out["nudging_controls"] = {"bp": bp_deltas, "random": random_deltas}
    out["nudging_samples"] = n_nudge
    if has_feedback(rule):
        say(f"fresh-feedback null: deep cosine with {null_draws} fresh feedback draws")
        out["fresh_b_null"] = fresh_feedback_null(
            rule, x, y, n=null_draws, seed=null_seed, grads=sg.grads, credits=summaries,
            chunk=fits, progress=say)
    if initial is not None:
        out["drift"] = feature_drift(initial, dict(model.named_parameters()))
    return out
