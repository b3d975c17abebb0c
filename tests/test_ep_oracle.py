"""EP against an independent float64 oracle: the nudged equilibrium found by Newton's method
on the full energy E(h) + β·Σ_i CE_i of each sample (its own Hessian, no residual
coordinates, no CG), the credits read from it, and the weight update as the contrastive
difference of ∂E/∂θ between the nudged and the free states. The solvers must reach the same
fixed point (to ~1e-12) and the training step must apply that update."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.methods import EP, build_rule
from creditaudit.models import ResidualMLP

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C, BATCH, BETA = 4, 6, 0.01


def tiny(residual: bool = True) -> tuple[ResidualMLP, Tensor, Tensor]:
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=6, d=5, n_classes=C, n_blocks=3, w2_std=0.3,
                        residual=residual).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 6, generator=gen, dtype=F64)
    return model, x, torch.randint(0, C, (BATCH,), generator=gen)


def energy(model: ResidualMLP, states: list[Tensor], x: Tensor) -> Tensor:
    """E = ½‖h_0 − embed(x)‖² + ½Σ_l‖h_{l+1} − h_l − f_l(h_l)‖², summed over samples."""
    total = 0.5 * (states[0] - model.embed(x)).pow(2).sum()
    for index, block in enumerate(model.blocks):
        predicted = block(states[index])
        if model.residual:
            predicted = states[index] + predicted
        total = total + 0.5 * (states[index + 1] - predicted).pow(2).sum()
    return total


def newton_equilibrium(model: ResidualMLP, x: Tensor, y: Tensor, beta: float) -> list[Tensor]:
    """The nudged states h_0 … h_L, each sample by Newton's method from its free states."""
    with torch.no_grad():
        free, _ = model.forward_states(x)
    n = len(free)
    rows = []
    for i in range(x.shape[0]):
        def nudged_energy(flat: Tensor, i: int = i) -> Tensor:
            states = list(flat.view(n, 1, -1))
            logits = model.readout(states[-1])
            return (energy(model, states, x[i:i + 1])
                    + beta * F.cross_entropy(logits, y[i:i + 1], reduction="sum"))

        flat = torch.stack([h[i] for h in free]).flatten()
        for _ in range(30):
            grad = torch.autograd.functional.jacobian(nudged_energy, flat)
            step = torch.linalg.solve(torch.autograd.functional.hessian(nudged_energy, flat),
                                      grad)
            flat = flat - step
            if float(step.norm()) < 1e-15:
                break
        rows.append(flat.view(n, -1))
    return [torch.stack([row[l] for row in rows]) for l in range(n)]


def oracle_credits(model: ResidualMLP, x: Tensor, nudged: list[Tensor], beta: float
                   ) -> list[Tensor]:
    """a_0 = (embed(x) − h_0^n)/(βB), a_l = (h_{l−1}^n + f(h_{l−1}^n) − h_l^n)/(βB)."""
    with torch.no_grad():
        credits = [(model.embed(x) - nudged[0]) / (beta * BATCH)]
        for index, block in enumerate(model.blocks):
            predicted = block(nudged[index])
            if model.residual:
                predicted = nudged[index] + predicted
            credits.append((predicted - nudged[index + 1]) / (beta * BATCH))
    return credits


def relative(got: list[Tensor], want: list[Tensor]) -> float:
    return max(float((g - w).norm() / w.norm()) for g, w in zip(got, want))


@pytest.mark.parametrize("solver,steps", [("residual-cg", 60), ("cg", 200)])
def test_credits_are_read_at_the_newton_equilibrium(solver, steps):
    model, x, y = tiny()
    rule = build_rule(model, MethodConfig(name="ep", ep_beta=BETA, ep_steps=steps,
                                          ep_solver=solver), n_classes=C, seed=7)
    assert isinstance(rule, EP)
    want = oracle_credits(model, x, newton_equilibrium(model, x, y, BETA), BETA)
    assert relative(rule.credits(x, y), want) < 1e-11


def test_the_step_applies_the_contrastive_energy_difference_at_that_equilibrium():
    model, x, y = tiny()
    rule = build_rule(model, MethodConfig(name="ep", ep_beta=BETA, ep_steps=60), n_classes=C,
                      seed=7)
    with torch.no_grad():
        free, _ = model.forward_states(x)
    nudged = newton_equilibrium(model, x, y, BETA)
    names = [name for name, _ in model.named_parameters()]
    params = list(model.parameters())
    at_nudged = torch.autograd.grad(energy(model, nudged, x), params, allow_unused=True)
    at_free = torch.autograd.grad(energy(model, free, x), params, allow_unused=True)
    readout = torch.autograd.grad(F.cross_entropy(model.readout(free[-1]), y), params,
                                  allow_unused=True)
    assert rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0)).finite
    for name, param, n, f, r in zip(names, params, at_nudged, at_free, readout):
        if name.startswith(("embed", "blocks")):
            want = (n - f) / (BETA * BATCH)  # ∂E/∂θ at the free states is exactly 0
        else:
            want = r
        assert float((param.grad - want).norm() / want.norm()) < 1e-11, name
