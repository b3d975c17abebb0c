"""EP's nudged free energy F = E + β·CE of one batch, in two coordinate systems.

Over the state displacements δ_l = h_l^nudged − h_l^free (:class:`NudgedEnergy`) and over the
residuals r_l of the nudged states (:class:`ResidualEnergy`); the two are one forward
substitution apart, and both have the same minimiser, EP's nudged equilibrium. Their
gradients are what the solvers of :mod:`creditaudit.methods.ep_relax` iterate on.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods.logits import checked_logits
from creditaudit.models.contract import ResidualNet


def flatten(parts: list[Tensor]) -> Tensor:
    """Per-state ``(B, …)`` tensors → one flat ``(B, N)`` tensor."""
    return torch.cat([part.flatten(1) for part in parts], 1)


class NudgedEnergy:
    """F(δ) of one batch, evaluated on flat displacements x: ``(B, N)``, N = Σ_l numel(h_l[i]).

    ``free`` are the free states h_0 … h_L (relaxation dtype), ``y`` ``(B,)`` labels.
    """

    value_scale = None  # no per-sample values, so nothing to bound

    def __init__(self, model: ResidualNet, free: list[Tensor], y: Tensor, beta: float) -> None:
        self.model, self.free, self.y, self.beta = model, free, y, beta
        with torch.no_grad():
            self.branches = [block(free[i]) for i, block in enumerate(model.blocks)]
        self.sizes = [h[0].numel() for h in free]

    def zeros(self) -> Tensor:
        """Flat ``(B, N)`` zeros in the relaxation dtype."""
        return self.free[0].new_zeros(self.free[0].shape[0], sum(self.sizes))

    def unflatten(self, x: Tensor) -> list[Tensor]:
        """Flat ``(B, N)`` → per-state views shaped like h_0 … h_L."""
        return [part.view(h.shape) for part, h in zip(x.split(self.sizes, dim=1), self.free)]

    def start_gradient(self) -> Tensor:
        """∇F at δ = 0: every r_l is exactly 0 there, so only the nudge β·∂CE/∂h_L remains."""
        grad = self.zeros()
        with torch.enable_grad():
            leaf = torch.zeros_like(self.free[-1], requires_grad=True)
            (last,) = torch.autograd.grad(self._nudge(leaf), [leaf])
        grad[:, -self.sizes[-1]:] = last.flatten(1)
        return grad

    def start(self) -> tuple[Tensor, None]:
        return self.start_gradient(), None

    def probe(self, x: Tensor) -> tuple[Tensor, None]:
        """∇F at ``x``, without values: the bound on F is residual-cg's, and `cg` keeps the
        iteration it was measured with (docs/methods.md, EP)."""
        return self.gradient(x)[0], None

    def gradient(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """(∇F at x, flat like x; the residuals [r_{−1}, …, r_{L−1}] there, detached).

        ∂F/∂δ_l = r_{l−1} − r_l − (∂f_l/∂h_l)ᵀ r_l (no "− r_l" without skips) and
        ∂F/∂δ_L = r_{L−1} + β·∂CE/∂h_L: one forward of every block and one backward for all
        the vector-Jacobian products together. Touches no ``.grad``. The residual r_{−1} = δ_0
        is a view of ``x``.
        """
        model, deltas = self.model, self.unflatten(x.detach())
        with torch.enable_grad():
            inputs = [(self.free[i] + deltas[i]).requires_grad_(True)
                      for i in range(len(model.blocks))]
            outputs = [block(h) for block, h in zip(model.blocks, inputs)]
            last = deltas[-1].clone().requires_grad_(True)
            nudge = self._nudge(last)
        with torch.no_grad():
            residuals = [deltas[0]]
            for index, (out, branch) in enumerate(zip(outputs, self.branches)):
                moved = out - branch
                if model.residual:
                    moved = deltas[index] + moved
                residuals.append(deltas[index + 1] - moved)
        # grad_outputs r_l give (∂f_l/∂h_l)ᵀ r_l; None seeds the scalar nudge with 1.
        vjps = torch.autograd.grad([*outputs, nudge], [*inputs, last],
                                   grad_outputs=[*residuals[1:], None])
        with torch.no_grad():
            grad = torch.empty_like(x)
            parts = self.unflatten(grad)
            for index, vjp in enumerate(vjps[:-1]):
                torch.sub(residuals[index], vjp, out=parts[index])
                if model.residual:
                    parts[index].sub_(residuals[index + 1])
            torch.add(residuals[-1], vjps[-1], out=parts[-1])
        return grad, residuals

    def _nudge(self, delta_last: Tensor) -> Tensor:
        """β·Σ_i CE_i(readout(h_L + δ_L))."""
        logits = checked_logits(self.model, self.model.readout(self.free[-1] + delta_last),
                                self.y)
        return self.beta * F.cross_entropy(logits, self.y, reduction="sum")


class Energy(Protocol):
    """F of one batch over flat ``(B, N)`` coordinates (what the CG iterations need)."""

    # ``(B, 1)`` magnitude on which the per-sample values are rounded beyond their own
    # (None without values).
    value_scale: Tensor | None

    def zeros(self) -> Tensor: ...

    def start(self) -> tuple[Tensor, Tensor | None]:
        """:meth:`probe` at the free states."""
        ...

    def probe(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """(∇F at ``x``, flat like it; the per-sample values F_i ``(B, 1)`` there, or None
        where the energy cannot resolve them)."""
        ...


class ResidualEnergy:
    """The same F over the residuals ρ = (r_{−1}, r_0, …, r_{L−1}), flat ``(B, N)`` like δ.

    Every ρ fixes the states by one forward substitution, δ_0 = ρ_{−1} and
    δ_{l+1} = ρ_l + δ_l + f_l(h_l + δ_l) − f_l(h_l) (no "+ δ_l" without skips), so

        F(ρ) = ½‖ρ‖² + β·Σ_i CE_i(readout(h_L + δ_L(ρ))),
        ∇_ρF = ρ + β·(∂δ_L/∂ρ)ᵀ ∂CE/∂h_L (one forward and one backward pass).

    The change of variables is J, the Jacobian of the residuals (module doc): the Hessian
    becomes J⁻ᵀ(JᵀJ + β∇²CE)J⁻¹ = I + β·(∂δ_L/∂ρ)ᵀ∇²CE(∂δ_L/∂ρ) at ρ = 0, the identity
    up to the nudge's curvature, however stiff the blocks.
    """

    def __init__(self, energy: NudgedEnergy) -> None:
        self.energy = energy
        with torch.no_grad():
            logits = energy.model.readout(energy.free[-1])
        # CE is computed from logits, so its rounding error scales with their magnitude,
        # not with CE itself: a confident sample's CE ≈ 4e-4 carries the rounding of logits
        # ≈ 20. (B, 1).
        self.value_scale = energy.beta * logits.abs().amax(dim=1, keepdim=True)

    def zeros(self) -> Tensor:
        return self.energy.zeros()

    def start_gradient(self) -> Tensor:
        """∇_ρF at ρ = 0: β·(∂δ_L/∂ρ)ᵀ ∂CE/∂h_L, backprop's gradients of the nudge."""
        return self.start()[0]

    def start(self) -> tuple[Tensor, Tensor]:
        return self.probe(self.zeros())

    def probe(self, x: Tensor) -> tuple[Tensor, Tensor]:
        grad, _, values = self.evaluate(x)
        return grad, values

    def gradient(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """(∇_ρF at ``x``, flat like it; the displacements δ_0 … δ_L there, detached)."""
        grad, deltas, _ = self.evaluate(x)
        return grad, deltas

    def evaluate(self, x: Tensor) -> tuple[Tensor, list[Tensor], Tensor]:
        """(∇_ρF at ``x``; the displacements there; F_i = ½‖ρ_i‖² + β·CE_i, ``(B, 1)``).

        At ρ = 0, F_i = β·CE_i of the free states, and F_i ≥ ½‖ρ_i‖² everywhere: no point
        with F_i above its free value can be the sample's equilibrium.
        """
        energy = self.energy
        with torch.enable_grad():
            rho = x.detach().clone().requires_grad_(True)
            deltas = self._forward(energy.unflatten(rho))
            logits = checked_logits(energy.model, energy.model.readout(
                energy.free[-1] + deltas[-1]), energy.y)
            losses = F.cross_entropy(logits, energy.y, reduction="none")
            (grad,) = torch.autograd.grad(energy.beta * losses.sum(), [rho])
        with torch.no_grad():
            values = torch.linalg.vector_norm(x, dim=1).square().mul_(0.5)
            values.add_(losses.detach(), alpha=energy.beta)
        return grad.add_(x), [d.detach() for d in deltas], values.unsqueeze(1)

    def _forward(self, rho: list[Tensor]) -> list[Tensor]:
        """δ_0 … δ_L from the residuals by forward substitution."""
        energy, model = self.energy, self.energy.model
        deltas = [rho[0]]
        for index, block in enumerate(model.blocks):
            moved = block(energy.free[index] + deltas[index]) - energy.branches[index]
            if model.residual:
                moved = deltas[index] + moved
            deltas.append(rho[index + 1] + moved)
        return deltas
