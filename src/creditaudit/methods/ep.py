"""Equilibrium Propagation on residual contract models (SPEC §4).

Energy of a set of states h_0 … h_L for input x (per sample, summed over the batch):

    E(h) = ½‖h_0 − embed(x)‖² + ½ Σ_l ‖r_l‖²,   r_l = h_{l+1} − h_l − f_l(h_l)

(r_l = h_{l+1} − f_l(h_l) without skips). The free phase is the forward pass (E = 0). The
nudged phase starts there and relaxes *all* states h_0 … h_L by ``ep_steps`` (20) steps of
gradient descent with step size ``ep_step_size`` on E + β·Σ_i CE_i(readout(h_L)), β =
``ep_beta`` (0.1). h_0 relaxes too, tied to embed(x) by the embedding term above: that term
is what lets EP train the embedding (its contrastive update is ⟨embed(x), a_0⟩) and gives
layer 0 a credit; clamping h_0 would leave both at zero.

Why the relaxation is written in displacements δ = h^nudged − h^free: r_l is then computed as
δ_{l+1} − δ_l − (f_l(h_l + δ_l) − f_l(h_l)), whose rounding error is eps·‖f‖ instead of
eps·‖h‖ — on a residual stream that grew to 1e7 the nudge (≈ β·‖∂CE/∂h‖ ≈ 1e-10) would
otherwise vanish below fp32 resolution. The relaxation always runs in at least fp32, also
under bf16 autocast.

Step size: the Hessian of E at the free state is JᵀJ, with J the Jacobian of the residuals
(identity blocks on the diagonal, −(I + ∂f_l/∂h_l) below it). For near-identity blocks its
eigenvalues lie in (0, 4), so gradient descent is stable for η < 0.5; trained blocks with
‖I + ∂f/∂h‖ up to ≈ 1.8 still are at η = 0.25, the default (0.25 keeps a factor 2 margin;
the slowest modes of a chain of L + 1 states then decay as (1 − 0.25·λ_min)^t, so 20 steps
relax the layers near the output well and layer 0 only partly). Whenever ‖∇F‖ grows by more
than 10% in one step anyway (a stiff model, e.g. a fresh ViT whose CLS token has a tiny
norm, so LN'(h) is large), the relaxation steps back and halves η for the rest of it.
``ep_relax_grad_ratio`` (‖∇F‖ at the last step / at the first) and ``ep_backoff_fraction``
(share of steps that halved η), both epoch means, record how each relaxation went.

Credit. At the nudged equilibrium ∂E/∂h + β∂C/∂h = 0 gives the residuals r = −β J⁻ᵀ∇C, i.e.
r_{l−1} = −β·g_l to first order, where g_l = ∂CE/∂h_l is backprop's gradient. So the
prediction error of the state block l−1 writes, divided by −β, estimates g_l:

    a_l = −r_{l−1}/β = (h_{l−1}^n + f_{l−1}(h_{l−1}^n) − h_l^n)/β,   a_0 = (h_0^free − h_0^n)/β,

scaled by 1/B to the batch-mean convention of the other rules. This is the quantity the
contrastive weight update actually feeds block l−1 (below), so it is the credit of the state
the block writes (SPEC §4). The state displacement (h_l^free − h_l^n)/β, which SPEC §4 and
the issue name as the credit, equals a_l only at l = 0: in general it is J⁻¹·a = Σ_{k≤l}
(∂h_l/∂h_k)·a_k, the gradient *propagated forwards* and accumulated over the layers below,
which does not converge to g_l as β → 0 (it is ≈ (l+1)·g_l only for near-identity blocks).
It stays available as :meth:`EP.displacement_credits` for comparison.

Weights: the contrastive update (∂E/∂θ at the nudged states − at the free states)/β. At the
free states every r_l = 0, so that term vanishes and the update of block l is exactly the
gradient of ⟨f_l(h_l^n), a_{l+1}⟩ (summed over samples, a already 1/B-scaled) with the nudged
input h_l^n detached — the un-normalised credit, as EP prescribes, rather than the RMS-
normalised credit of the other local rules (AdamW makes the overall scale irrelevant); the
embedding's is ⟨embed(x), a_0⟩. The readout takes its exact local CE gradient on the free
h_L, and the penalty λ‖f_l(h_l)‖² is added on the free states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.methods.base import (
    CreditRule,
    StepResult,
    branch_penalty,
    per_sample_dot,
    step_result,
)
from creditaudit.methods.registry import register
from creditaudit.models.contract import ResidualNet, block_is_trainable, restored_buffers

BACKOFF_GROWTH = 1.1  # ‖∇F‖ may grow by 10% in one step before η is halved


@dataclass
class Relaxation:
    """Result of one nudged phase.

    ``states`` are the free h_0 … h_L (relaxation dtype), ``deltas`` the displacements
    h^nudged − h^free, ``residuals`` [r_{−1} = δ_0, r_0, …, r_{L−1}] at the nudged states
    (all detached, summed-energy scale), ``grad_ratio`` ‖∇F‖ at the last step / first step.
    """

    states: list[Tensor]
    deltas: list[Tensor]
    residuals: list[Tensor]
    grad_ratio: float
    final_step_size: float


def relaxation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least fp32: bf16 states cannot resolve a nudge of β·‖∂CE/∂h‖."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def nudged_residuals(model: ResidualNet, states: list[Tensor], branches: list[Tensor],
                     deltas: list[Tensor]) -> list[Tensor]:
    """[r_{−1}, r_0, …, r_{L−1}] at h = free + δ, in displacement form (see module doc).

    ``branches[l]`` is f_l(h_l) at the free state. Block parameters stay in the graph, but
    callers only differentiate with respect to ``deltas``.
    """
    residuals = [deltas[0]]
    for index, block in enumerate(model.blocks):
        delta = deltas[index]
        moved = block(states[index] + delta) - branches[index]
        if model.residual:
            moved = delta + moved
        residuals.append(deltas[index + 1] - moved)
    return residuals


def relax(model: ResidualNet, states: list[Tensor], y: Tensor, *, beta: float, steps: int,
          step_size: float) -> Relaxation:
    """Nudged phase: ``steps`` gradient-descent steps on E + β·Σ_i CE_i from the free states.

    ``states`` are the free h_0 … h_L of the batch (any dtype; relaxed in ≥ fp32). Touches
    no parameter ``.grad`` (gradients are taken with respect to the displacements only).
    """
    dtype = relaxation_dtype(states[0].dtype)
    free = [h.detach().to(dtype) for h in states]
    with torch.no_grad():
        branches = [block(free[i]) for i, block in enumerate(model.blocks)]
    deltas = [torch.zeros_like(h) for h in free]
    eta, first, previous = step_size, 0.0, None
    with torch.enable_grad():
        for step in range(steps):
            leaves = [d.requires_grad_(True) for d in deltas]
            residuals = nudged_residuals(model, free, branches, leaves)
            energy = sum(0.5 * r.pow(2).sum() for r in residuals)
            logits = model.readout(free[-1] + leaves[-1])
            total = energy + beta * F.cross_entropy(logits, y, reduction="sum")
            grads = [g.detach() for g in torch.autograd.grad(total, leaves)]
            leaves = [d.detach() for d in leaves]
            norm = float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads)))
            first = norm if step == 0 else first
            if previous is not None and not norm <= BACKOFF_GROWTH * previous[2]:
                # ‖∇F‖ grew: η exceeds 2/λ_max somewhere (a stiff model, e.g. a ViT's
                # small-norm CLS token). Step back and halve η. (Within a stable η, ‖∇F‖
                # never grows on the quadratic part; the 10% slack ignores rounding noise
                # and the CE term's curvature near convergence.)
                leaves, grads, norm = previous
                eta /= 2
            previous = (leaves, grads, norm)
            deltas = [d - eta * g for d, g in zip(leaves, grads)]
        residuals = [r.detach() for r in nudged_residuals(model, free, branches, deltas)]
    last = previous[2] if previous is not None else 0.0
    ratio = last / first if first > 0 else 0.0
    return Relaxation(states=free, deltas=deltas, residuals=residuals, grad_ratio=ratio,
                      final_step_size=eta)


@register
class EP(CreditRule):
    """Equilibrium Propagation: credit a_l = −r_{l−1}/β at the nudged state (1/B-scaled)."""

    name = "ep"
    label = "EP"
    credit_formula = "a_l = −r_{l−1}/β (nudged equilibrium)"
    feedback_kind = "symmetric"
    color, marker = "#1b7837", "^"
    rank = 30

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        self.beta, self.steps = config.ep_beta, config.ep_steps
        self.step_size = config.ep_step_size
        self.ratio_sum, self.ratio_count, self.backoffs = 0.0, 0, 0

    # --- credit -------------------------------------------------------------------------
    def relax(self, states: list[Tensor], y: Tensor, *, beta: float | None = None,
              steps: int | None = None, step_size: float | None = None) -> Relaxation:
        return relax(self.model, states, y, beta=self.beta if beta is None else beta,
                     steps=self.steps if steps is None else steps,
                     step_size=self.step_size if step_size is None else step_size)

    def credits_from(self, relaxation: Relaxation, batch: int, beta: float | None = None
                     ) -> list[Tensor]:
        """a_l = −r_{l−1}/(β·B), l = 0 … L (with r_{−1} = δ_0)."""
        scale = (self.beta if beta is None else beta) * batch
        return [-r / scale for r in relaxation.residuals]

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor, *, beta: float | None = None,
                steps: int | None = None, step_size: float | None = None) -> list[Tensor]:
        states, _ = self.model.forward_states(x)
        relaxation = self.relax(states, y, beta=beta, steps=steps, step_size=step_size)
        return [a.to(h.dtype) for a, h in zip(self.credits_from(relaxation, y.shape[0], beta),
                                               states)]

    @torch.no_grad()
    def displacement_credits(self, x: Tensor, y: Tensor, *, beta: float | None = None,
                             steps: int | None = None, step_size: float | None = None
                             ) -> list[Tensor]:
        """(h_l^free − h_l^nudged)/(β·B): the state displacement (see the module doc)."""
        states, _ = self.model.forward_states(x)
        relaxation = self.relax(states, y, beta=beta, steps=steps, step_size=step_size)
        scale = (self.beta if beta is None else beta) * y.shape[0]
        return [(-d / scale).to(h.dtype) for d, h in zip(relaxation.deltas, states)]

    # --- training -----------------------------------------------------------------------
    def contrastive_objective(self, x: Tensor, relaxation: Relaxation, credits: list[Tensor]
                              ) -> Tensor:
        """Σ_l ⟨f_l(h_l^n), a_{l+1}⟩ + ⟨embed(x), a_0⟩ (sums over samples; credits detached).

        Its parameter gradient equals (∂E/∂θ|nudged − ∂E/∂θ|free)/β / B.
        """
        model = self.model
        objective: Tensor | float = 0.0
        if any(p.requires_grad for p in model.embed.parameters()):
            objective = objective + per_sample_dot(model.embed(x), credits[0]).sum()
        for index, block in enumerate(model.blocks):
            if block_is_trainable(block):
                nudged = (relaxation.states[index] + relaxation.deltas[index]).to(
                    credits[index + 1].dtype)
                objective = objective + per_sample_dot(block(nudged), credits[index + 1]).sum()
        return objective  # type: ignore[return-value]

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        model = self.model
        with torch.no_grad():
            states, _ = model.forward_states(x)
        # The free phase above is the step's training forward; the relaxation and the
        # contrastive passes run the blocks ~ep_steps more times, which must not move
        # BatchNorm running statistics (they would then follow this batch alone).
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
            ce = F.cross_entropy(logits, y)  # autocast runs CE in fp32 anyway
            objective = ce
            if relaxation is not None:
                credits = self.credits_from(relaxation, y.shape[0])
                objective = objective + self.contrastive_objective(x, relaxation, credits)
            if self.config.penalty > 0:
                branches = [block(states[i].detach()) if block_is_trainable(block) else None
                            for i, block in enumerate(model.blocks)]
                objective = objective + self.config.penalty * branch_penalty(branches)
        checks = [h_last] + (relaxation.residuals if relaxation is not None else [])
        result = step_result(ce, logits, y, *checks)
        if result.finite:
            self.ratio_sum += relaxation.grad_ratio  # type: ignore[union-attr]
            self.ratio_count += 1
            self.backoffs += int(relaxation.final_step_size < self.step_size)  # type: ignore[union-attr]
            objective.backward()
            optimizer.step()
        return result

    def end_epoch(self, epoch: int, n_epochs: int) -> dict[str, float]:
        count = self.ratio_count
        fields = {"ep_relax_grad_ratio": self.ratio_sum / count if count else float("nan"),
                  "ep_backoff_fraction": self.backoffs / count if count else float("nan")}
        self.ratio_sum, self.ratio_count, self.backoffs = 0.0, 0, 0
        return fields

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"ratio_sum": self.ratio_sum, "ratio_count": self.ratio_count,
                "backoffs": self.backoffs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ratio_sum, self.ratio_count = state["ratio_sum"], state["ratio_count"]
        self.backoffs = state["backoffs"]
