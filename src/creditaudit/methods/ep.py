"""Equilibrium Propagation on residual contract models (science.md §4).

Energy of a set of states h_0 … h_L for input x (per sample, summed over the batch):

    E(h) = ½‖h_0 − embed(x)‖² + ½ Σ_l ‖r_l‖²,   r_l = h_{l+1} − h_l − f_l(h_l)

(r_l = h_{l+1} − f_l(h_l) without skips). The free phase is the forward pass (E = 0). The
nudged phase starts there and relaxes *all* states h_0 … h_L by at most ``ep_steps`` (20)
steps of ``ep_solver`` (conjugate gradients over the residuals by default; step size
``ep_step_size``) on E + β·Σ_i CE_i(readout(h_L)), β = ``ep_beta`` (0.01): see
:mod:`creditaudit.methods.ep_relax` for the solvers, the step size and the back-off. h_0
relaxes too, tied to embed(x) by the embedding term above: that term is what lets EP train
the embedding (its contrastive update is ⟨embed(x), a_0⟩) and gives layer 0 a credit;
clamping h_0 would leave both at zero.

Why the relaxation is written in displacements δ = h^nudged − h^free: r_l is then computed as
δ_{l+1} − δ_l − (f_l(h_l + δ_l) − f_l(h_l)), whose rounding error is eps·‖f‖ instead of
eps·‖h‖ — on a residual stream that grew to 1e7 the nudge (≈ β·‖∂CE/∂h‖ ≈ 1e-10) would
otherwise vanish below fp32 resolution. The relaxation always runs in at least fp32, also
under bf16 autocast.

Convergence is recorded per epoch: ``ep_relax_grad_ratio`` (‖∇_ρF‖, the gradient of F over
the residuals, at the end of the nudged phase / at its start, mean over the epoch's steps:
to first order the relative error of the credits) and ``ep_backoff_fraction`` (share of the
epoch's steps whose relaxation had to halve η at least once). At the end of a run,
:meth:`EP.run_metrics` measures what the relaxation is for: the cosine between EP's weight
update and BP's (gradient of the batch-mean CE) on the evaluation set, in float64.

Credit. At the nudged equilibrium ∂E/∂h + β∂C/∂h = 0 gives the residuals r = −β J⁻ᵀ∇C, i.e.
r_{l−1} = −β·g_l to first order, where g_l = ∂CE/∂h_l is backprop's gradient. So the
prediction error of the state block l−1 writes, divided by −β, estimates g_l:

    a_l = −r_{l−1}/β = (h_{l−1}^n + f_{l−1}(h_{l−1}^n) − h_l^n)/β,   a_0 = (h_0^free − h_0^n)/β,

scaled by 1/B to the batch-mean convention of the other rules. This is the quantity the
contrastive weight update actually feeds block l−1 (below), so it is the credit of the state
the block writes (science.md §4). The state displacement (h_l^free − h_l^n)/β, often named
as EP's credit, equals a_l only at l = 0: in general it is J⁻¹·a = Σ_{k≤l} (∂h_l/∂h_k)·a_k,
the gradient *propagated forwards* and accumulated over the layers below, which does not
converge to g_l as β → 0 (it is ≈ (l+1)·g_l only for near-identity blocks).
It stays available as :meth:`EP.displacement_credits` for comparison.

BatchNorm (ConvMixer) in training mode: the relaxation and the contrastive passes hold the
free phase's batch statistics (:func:`~creditaudit.models.contract.held_batch_statistics`),
so the energy stays a sum of per-sample energies; EP then estimates the gradient of the
network with those statistics held fixed.

Weights: the contrastive update (∂E/∂θ at the nudged states − at the free states)/β. At the
free states every r_l = 0, so that term vanishes and the update of block l is exactly the
gradient of ⟨f_l(h_l^n), a_{l+1}⟩ (summed over samples, a already 1/B-scaled) with the nudged
input h_l^n detached — the un-normalised credit, as EP prescribes, rather than the RMS-
normalised credit of the other local rules (AdamW makes the overall scale irrelevant); the
embedding's is ⟨embed(x), a_0⟩. The readout takes its exact local CE gradient on the free
h_L, and the penalty λ‖f_l(h_l)‖² is added on the free states.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig, opt
from creditaudit.errors import ModelContractError
from creditaudit.methods.base import CreditRule, RuleOptions, StepResult, step_result
from creditaudit.methods.ep_relax import EP_SOLVERS, Relaxation, relax, relaxation_dtype
from creditaudit.methods.epoch_fields import EndedEpoch
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import branch_penalty, per_sample_dot
from creditaudit.models.contract import (
    ResidualNet,
    block_is_trainable,
    held_batch_statistics,
    restored_buffers,
)

# Samples per relaxation in :func:`update_agreement` (the training batch of the recipe).
AGREEMENT_CHUNK = 128


def credits_from(relaxation: Relaxation, batch: int, beta: float) -> list[Tensor]:
    """a_l = −r_{l−1}/(β·B), l = 0 … L (with r_{−1} = δ_0)."""
    return [-r / (beta * batch) for r in relaxation.residuals]


def contrastive_objective(model: ResidualNet, x: Tensor, relaxation: Relaxation,
                          credits: list[Tensor]) -> Tensor:
    """Σ_l ⟨f_l(h_l^n), a_{l+1}⟩ + ⟨embed(x), a_0⟩ (sums over samples; credits detached).

    Its parameter gradient equals (∂E/∂θ|nudged − ∂E/∂θ|free)/β / B. Frozen modules are
    left out.
    """
    objective: Tensor | float = 0.0
    if any(p.requires_grad for p in model.embed.parameters()):
        objective = objective + per_sample_dot(model.embed(x), credits[0]).sum()
    for index, block in enumerate(model.blocks):
        if block_is_trainable(block):
            nudged = (relaxation.states[index] + relaxation.deltas[index]).to(
                credits[index + 1].dtype)
            objective = objective + per_sample_dot(block(nudged), credits[index + 1]).sum()
    return objective  # type: ignore[return-value]


def writer_modules(model: ResidualNet) -> list[nn.Module]:
    """The module that writes each state: [embed, block 0, …, block L−1] for h_0 … h_L."""
    return [model.embed, *model.blocks]


def update_agreement(model: ResidualNet, x: Tensor, y: Tensor, *, beta: float, steps: int,
                     step_size: float, solver: str,
                     relaxer: Callable[..., Relaxation] = relax) -> dict[str, Any]:
    """How well EP's weight update matches BP's on ``(x, y)`` (``(N, …)`` inputs, labels).

    On a float64 copy of ``model``: EP's update of the trainable embed and block parameters
    (relaxations of ``AGREEMENT_CHUNK`` samples with the given settings, averaged over all
    N samples) against the gradient of the mean CE over the N samples. Returns
    ``ep_update_cos`` (all those parameters flattened together), ``ep_update_cos_layers``
    ([embed, block 0, …]: per module writing h_0 … h_L; None for a frozen one) — each None
    where either update is exactly zero, which has no direction (a relaxation that moved
    no state gives EP none) — and
    ``ep_eval_relax_grad_ratio`` (‖∇_ρF‖ end / start, mean over the chunks); or
    ``ep_update_error`` when the model's states, or a relaxation's nudged states or
    residuals, are not finite (EP's update then is no number, not one without direction).
    Leaves ``model`` alone.
    ``relaxer`` relaxes each chunk, called with :func:`relax`'s arguments (benchmarks pass a
    reference solver).
    """
    twin = copy.deepcopy(model).double().eval()
    x = x.double() if x.is_floating_point() else x
    writers = [[p for p in module.parameters() if p.requires_grad]
               for module in writer_modules(twin)]
    params = [p for group in writers for p in group]
    if not params:
        return {}
    ep_update = [torch.zeros_like(p) for p in params]
    bp_update = [torch.zeros_like(p) for p in params]
    ratios = []
    for start in range(0, x.shape[0], AGREEMENT_CHUNK):
        xs, ys = x[start:start + AGREEMENT_CHUNK], y[start:start + AGREEMENT_CHUNK]
        weight = ys.shape[0] / y.shape[0]
        with torch.no_grad():
            states, _ = twin.forward_states(xs)
        if not all(bool(torch.isfinite(h).all()) for h in states):
            return {"ep_update_error": "non-finite states on the evaluation set"}
        relaxation = relaxer(twin, states, ys, beta=beta, steps=steps, step_size=step_size,
                             solver=solver)
        if not all(bool(torch.isfinite(t).all())
                   for t in (*relaxation.deltas, *relaxation.residuals)):
            return {"ep_update_error": "the nudged relaxation on the evaluation set is not "
                                       "finite (NaN/Inf states or residuals)"}
        ratios.append(relaxation.grad_ratio)
        credits = credits_from(relaxation, ys.shape[0], beta)
        objective = contrastive_objective(twin, xs, relaxation, credits) * weight
        ce = F.cross_entropy(twin(xs), ys, reduction="sum") / y.shape[0]
        for total, value in ((ep_update, objective), (bp_update, ce)):
            for acc, grad in zip(total, torch.autograd.grad(value, params, allow_unused=True)):
                if grad is not None:
                    acc += grad
    layers: list[float | None] = []
    index = 0
    for group in writers:
        layers.append(_cosine(ep_update[index:index + len(group)],
                              bp_update[index:index + len(group)]) if group else None)
        index += len(group)
    return {"ep_update_cos": _cosine(ep_update, bp_update), "ep_update_cos_layers": layers,
            "ep_eval_relax_grad_ratio": sum(ratios) / len(ratios)}


def _cosine(a: list[Tensor], b: list[Tensor]) -> float | None:
    """Cosine of two parameter lists flattened together (None when either is exactly zero:
    it has no direction, and 0 would read as an update orthogonal to BP's)."""
    flat_a = torch.cat([t.flatten() for t in a])
    flat_b = torch.cat([t.flatten() for t in b])
    norms = float(flat_a.norm() * flat_b.norm())
    return float(flat_a @ flat_b) / norms if norms > 0 else None


def check_relaxation_dtype(model: ResidualNet) -> None:
    """ModelContractError (one line) for a network held in a dtype below float32 (cast with
    ``.to(torch.bfloat16)``): the relaxation runs its blocks and readout on states in at
    least float32 (:func:`~creditaudit.methods.ep_relax.relaxation_dtype`; bfloat16 cannot
    resolve the nudge), which such parameters cannot take."""
    low = {p.dtype for p in model.parameters()
           if p.is_floating_point() and relaxation_dtype(p.dtype) != p.dtype}
    if low:
        names = ", ".join(sorted(str(dtype).removeprefix("torch.") for dtype in low))
        raise ModelContractError(
            f"ep relaxes the states through the blocks and the readout in float32 or float64 "
            f"({names} cannot resolve the nudge β·∂CE/∂h), but {type(model).__name__}'s "
            f"parameters are {names}: keep the network in float32 (model.float()) to train "
            "it with ep")


@dataclass
class EPOptions(RuleOptions):
    ep_beta: float = opt(0.01, "EP: nudging strength β of the cross-entropy term (the credit's "
                         "bias grows with β: at 0.1 even a converged relaxation's weight update "
                         "has cosine ≈ 0.99 with BP's on a fresh d=256 L=4 net, at 0.01 ≈ 0.9999; "
                         "0.957 on one trained 20 epochs on Fashion-MNIST; at most 100: far "
                         "larger nudges overflow the float32 relaxation)",
                         min=1e-12, max=100.0)
    ep_steps: int = opt(20, "EP: steps of the nudged relaxation (each one forward and "
                        "input-gradient pass through the blocks); at least 2 with the CG "
                        "solvers, whose first step is the free states' gradient (at 1 no "
                        "state moves); gd moves the states one layer per step, so below "
                        "L + 1 steps h_0 … h_{L−steps} get credit 0 and the modules "
                        "writing them do not train", min=1)
    ep_step_size: float = opt(0.25, "EP: state step size η of the nudged relaxation: gd's step "
                              "(stable while η < 2/λ_max of the energy Hessian; halved when "
                              "‖∇F‖ grows), the CG solvers' first and shortest curvature "
                              "probe; > 0: at 0 no state moves, every credit is 0 and no block "
                              "trains", above=0.0)
    ep_solver: str = opt(
        "residual-cg", "EP: relaxation solver. residual-cg = conjugate gradients per sample "
        "over the residuals r_l, the states following by one forward pass (same fixed point; "
        "its Hessian is the identity up to the nudge's curvature, so it converges however "
        "stiff the blocks); cg = the same over the state displacements (diverges once training "
        "makes the blocks stiff); gd = plain gradient descent on the displacements, step η",
        choices=EP_SOLVERS)


@register
class EP(CreditRule[EPOptions]):
    """Equilibrium Propagation: credit a_l = −r_{l−1}/β at the nudged state (1/B-scaled)."""

    name = "ep"
    label = "EP"
    credit_formula = "a_l = −r_{l−1}/β (nudged equilibrium)"
    feedback_kind = "symmetric"
    residual_reason = "it relaxes the residual energy ½Σ_l‖h_{l+1} − h_l − f_l(h_l)‖²"
    # 1: the default relaxation became residual-cg (it was cg). 2: residual-cg's bound on the
    # nudged energy allows for the rounding of the logits (in float32 it had sent confident
    # samples back to their free states with zero credit).
    id_version = 2
    color, marker = "#4EB265", "^"
    rank = 30
    expected_failures = {
        "blocks_train_on_the_reported_credit":
            "EP trains block l at its nudged input h_l + δ_l (module doc: Weights), so the "
            "output layer's gradient is Σ a ⊗ u(h_l + δ_l), not Σ a ⊗ u(h_l); δ_l = O(β), a "
            "gap that vanishes linearly as β → 0"}

    @classmethod
    def refused_options(cls, options: Any) -> dict[str, str]:
        """``ep_steps=1`` with a CG solver: its one gradient evaluation is the free states'
        own, so the relaxation returns them — every residual, so every credit, is 0."""
        if options.ep_steps < 2 and options.ep_solver != "gd":
            return {"ep_steps": (
                f"with method.ep_solver={options.ep_solver!r} moves no state: the CG "
                "solvers spend their first step on the free states' gradient, so every "
                "credit would be 0 and no block would train; give method.ep_steps >= 2 "
                "(method.ep_solver='gd' moves the states one layer per step, so its first "
                "step credits h_L alone: the embedding's credit needs ep_steps >= L + 1)")}
        return {}

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        check_relaxation_dtype(model)
        self.beta, self.steps = self.options.ep_beta, self.options.ep_steps
        self.step_size, self.solver = self.options.ep_step_size, self.options.ep_solver
        self.ratio_sum, self.ratio_count, self.backoffs = 0.0, 0, 0
        self.ended = EndedEpoch()

    # --- credit -------------------------------------------------------------------------
    def relax(self, states: list[Tensor], y: Tensor, *, beta: float | None = None,
              steps: int | None = None, step_size: float | None = None,
              solver: str | None = None) -> Relaxation:
        """The nudged phase from free ``states`` with the rule's settings (or overrides)."""
        return relax(self.model, states, y, beta=self.beta if beta is None else beta,
                     steps=self.steps if steps is None else steps,
                     step_size=self.step_size if step_size is None else step_size,
                     solver=self.solver if solver is None else solver)

    def credits_from(self, relaxation: Relaxation, batch: int, beta: float | None = None
                     ) -> list[Tensor]:
        """a_l = −r_{l−1}/(β·B), l = 0 … L (with r_{−1} = δ_0)."""
        return credits_from(relaxation, batch, self.beta if beta is None else beta)

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor, *, beta: float | None = None,
                steps: int | None = None, step_size: float | None = None,
                solver: str | None = None) -> list[Tensor]:
        states, _ = self.model.forward_states(x)
        relaxation = self.relax(states, y, beta=beta, steps=steps, step_size=step_size,
                                solver=solver)
        return [a.to(h.dtype) for a, h in zip(self.credits_from(relaxation, y.shape[0], beta),
                                               states)]

    @torch.no_grad()
    def displacement_credits(self, x: Tensor, y: Tensor, *, beta: float | None = None,
                             steps: int | None = None, step_size: float | None = None,
                             solver: str | None = None) -> list[Tensor]:
        """(h_l^free − h_l^nudged)/(β·B): the state displacement (see the module doc)."""
        states, _ = self.model.forward_states(x)
        relaxation = self.relax(states, y, beta=beta, steps=steps, step_size=step_size,
                                solver=solver)
        scale = (self.beta if beta is None else beta) * y.shape[0]
        return [(-d / scale).to(h.dtype) for d, h in zip(relaxation.deltas, states)]

    # --- training -----------------------------------------------------------------------
    def contrastive_objective(self, x: Tensor, relaxation: Relaxation, credits: list[Tensor]
                              ) -> Tensor:
        """Σ_l ⟨f_l(h_l^n), a_{l+1}⟩ + ⟨embed(x), a_0⟩ on the rule's model."""
        return contrastive_objective(self.model, x, relaxation, credits)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        model = self.model
        # The free phase is the step's training forward. The relaxation and the contrastive
        # passes run the blocks ~ep_steps more times: a BatchNorm then holds the free phase's
        # batch statistics (each sample's energy stays its own, as the per-sample solver
        # assumes) and no buffer moves (running statistics would follow this batch alone).
        with held_batch_statistics(model):
            with torch.no_grad():
                states, _ = model.forward_states(x)
            with restored_buffers(model):
                return self._nudged_step(x, y, states, optimizer)

    def _nudged_step(self, x: Tensor, y: Tensor, states: list[Tensor],
                     optimizer: torch.optim.Optimizer) -> StepResult:
        """The nudged phase and the update of :meth:`train_step` from the free states."""
        model = self.model
        finite_states = all(bool(torch.isfinite(h).all()) for h in states)
        relaxation = self.relax(states, y) if finite_states else None
        with self.autocast():
            h_last = states[-1].detach()
            logits = model.readout(h_last)
            ce = F.cross_entropy(checked_logits(model, logits, y), y)  # fp32 in autocast
            objective = ce
            if relaxation is not None:
                credits = self.credits_from(relaxation, y.shape[0])
                objective = objective + self.contrastive_objective(x, relaxation, credits)
            if self.options.penalty > 0:
                branches = [block(states[i].detach()) if block_is_trainable(block) else None
                            for i, block in enumerate(model.blocks)]
                objective = objective + self.options.penalty * branch_penalty(branches)
        checks = [h_last] + (relaxation.residuals if relaxation is not None else [])
        result = step_result(ce, logits, y, *checks)
        if result.finite:
            # relaxation is None only for non-finite free states, and a non-finite state
            # carries on to h_L in the residual stream (h_L is checked): never a finite step.
            assert relaxation is not None
            self.ratio_sum += relaxation.grad_ratio
            self.ratio_count += 1
            self.backoffs += int(relaxation.backoffs > 0)
            objective.backward()
            optimizer.step()
        return result

    def end_epoch(self, epoch: int, n_epochs: int) -> dict[str, float]:
        """``ep_relax_grad_ratio``: ‖∇_ρF‖ end / start of the nudged phase, mean over the
        epoch's steps; ``ep_backoff_fraction``: share of its steps that halved η. The same
        epoch ended again with no step since gives its fields again (:class:`EndedEpoch`)."""
        if (again := self.ended.again(epoch, self.ratio_count)) is not None:
            return again
        count = self.ratio_count
        fields = {"ep_relax_grad_ratio": self.ratio_sum / count if count else float("nan"),
                  "ep_backoff_fraction": self.backoffs / count if count else float("nan")}
        self.ratio_sum, self.ratio_count, self.backoffs = 0.0, 0, 0
        return self.ended.keep(epoch, fields)

    def run_metrics(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """EP/BP weight-update cosines on ``(x, y)`` with the run's relaxation settings
        (:func:`update_agreement`)."""
        return update_agreement(self.model, x, y, beta=self.beta, steps=self.steps,
                                step_size=self.step_size, solver=self.solver)

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"ratio_sum": self.ratio_sum, "ratio_count": self.ratio_count,
                "backoffs": self.backoffs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ratio_sum, self.ratio_count = state["ratio_sum"], state["ratio_count"]
        self.backoffs = state["backoffs"]
        self.ended = EndedEpoch()


__all__ = ["EP", "Relaxation", "contrastive_objective", "credits_from", "relax",
           "update_agreement"]
