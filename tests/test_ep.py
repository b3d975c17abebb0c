"""Equilibrium Propagation: the credit tends to BP's gradient as β → 0, the weight update is
the contrastive energy difference, block updates are local, and runs resume exactly."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.audit import audit_run
from creditaudit.config import MethodConfig, RunConfig
from creditaudit.errors import ConfigError
from creditaudit.formatting import markdown_text
from creditaudit.measures.alignment import layer_cosines
from creditaudit.methods import EP, build_rule
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.methods.ep import update_agreement
from creditaudit.methods.ep_energy import NudgedEnergy, ResidualEnergy, flatten
from creditaudit.methods.ep_relax import EP_SOLVERS, SOLVERS, relax
from creditaudit.models import ResidualMLP, ViTMini
from creditaudit.records import CHECKPOINT_FILE, comparable, load_record
from creditaudit.report import render
from creditaudit.run.trainer import train

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C = 4


def mlp(seed: int = 0, *, w2_std: float = 0.1, d: int = 8, n_blocks: int = 3, **kw
        ) -> ResidualMLP:
    torch.manual_seed(seed)
    return ResidualMLP(in_dim=6, d=d, n_classes=C, n_blocks=n_blocks, w2_std=w2_std,
                       **kw).double()


def batch(n: int = 8, seed: int = 1) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen, dtype=F64), torch.randint(0, C, (n,), generator=gen)


def ep_rule(model, **kw) -> EP:
    rule = build_rule(model, MethodConfig(name="ep", **kw), n_classes=C, seed=7)
    assert isinstance(rule, EP)
    return rule


def mean_cos(a: list[Tensor], g: list[Tensor]) -> float:
    values = layer_cosines(a, g)
    return sum(values) / len(values)


def grads_after_step(rule, x, y) -> dict[str, Tensor | None]:
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    assert rule.train_step(x, y, optimizer).finite
    return {n: None if p.grad is None else p.grad.clone()
            for n, p in rule.model.named_parameters()}


# --- the credit ---------------------------------------------------------------------------
def test_ep_credit_approaches_bp_gradient_as_beta_shrinks():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    g = bp_state_gradients(model, x, y)
    cosines = [mean_cos(rule.credits(x, y, beta=beta, steps=600, step_size=0.2), g)
               for beta in (1.0, 0.1, 0.01)]
    assert cosines[0] < cosines[1] < cosines[2], cosines
    assert cosines[2] > 0.99, cosines
    assert cosines[0] < 0.9  # β = 1 is visibly biased: the test can tell the regimes apart


def test_state_displacement_is_forward_propagated_credit_not_the_gradient():
    """(h^free − h^nudged)/β = J⁻¹·a: equal to the credit at l = 0 only (module docstring)."""
    model = mlp(w2_std=0.3)
    rule = ep_rule(model)
    x, y = batch()
    g = bp_state_gradients(model, x, y)
    kw = {"beta": 1e-4, "steps": 800, "step_size": 0.1}
    credit = rule.credits(x, y, **kw)
    shift = rule.displacement_credits(x, y, **kw)  # the same (deterministic) relaxation
    assert torch.allclose(shift[0], credit[0], rtol=1e-12, atol=0)
    assert min(layer_cosines(credit, g)) > 0.99
    assert layer_cosines(shift, g)[-1] < 0.99
    # J⁻¹ a, computed forwards: s_0 = a_0, s_{l+1} = (I + ∂f_l/∂h_l) s_l + a_{l+1}
    # (a first-order identity: it holds up to O(β) relative terms)
    states, _ = model.forward_states(x)
    s = credit[0]
    for index, block in enumerate(model.blocks):
        h = states[index].detach()
        _, jvp = torch.autograd.functional.jvp(block, h, s)
        s = s + jvp + credit[index + 1]
        assert float((shift[index + 1] - s).norm() / s.norm()) < 1e-3, index


def test_relaxation_lowers_the_nudged_free_energy_and_keeps_free_states():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    states, _ = model.forward_states(x)
    relaxation = rule.relax(states, y)
    assert relaxation.grad_ratio < 1.0
    for free, h in zip(relaxation.states, states):
        assert torch.equal(free, h.detach())
    # residuals are the displacement-form r_l of the nudged states
    nudged = [h + d for h, d in zip(relaxation.states, relaxation.deltas)]
    for index, block in enumerate(model.blocks):
        literal = nudged[index + 1] - nudged[index] - block(nudged[index])
        assert torch.allclose(relaxation.residuals[index + 1], literal.detach(), atol=1e-12)
    assert torch.equal(relaxation.residuals[0], relaxation.deltas[0])


def test_credits_leave_parameters_grads_and_rng_alone():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    before = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    credits = rule.credits(x, y)
    assert [a.shape for a in credits] == [h.shape for h in model.forward_states(x)[0]]
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert torch.equal(torch.get_rng_state(), rng)


def test_exploded_stream_keeps_its_credit_in_fp32():
    """Displacement form: a nudge 1e-13 × ‖h‖ survives fp32 (module docstring)."""
    torch.manual_seed(0)
    model = ResidualMLP(6, 16, C, 3)
    with torch.no_grad():
        model.embed.weight.mul_(1e6)
        model.embed.bias.mul_(1e6)
    x, y = batch()
    twin = copy.deepcopy(model).double()
    g = bp_state_gradients(twin, x, y)
    assert float(g[-1].norm(dim=1).median()) < 1e-6
    credits = ep_rule(model).credits(x.float(), y)
    assert min(layer_cosines(credits, g)) > 0.99


def test_confident_samples_keep_their_credit_in_fp32():
    """A confident sample's CE (≈ 1e-5) is far below the rounding of the logits (≈ 17) it is
    computed from, so in fp32 its nudged energy cannot resolve the relaxation's decrease.
    The bound on F must allow for that rounding: it once sent such samples back to their
    free states, and their credits came back exactly zero."""
    torch.manual_seed(0)
    model = ResidualMLP(6, 16, C, 3)
    x, _ = batch(n=32)
    with torch.no_grad():
        model.out_head.weight.mul_(20)
        logits = model(x.float())
    y = logits.argmax(dim=1)
    ce = F.cross_entropy(logits, y, reduction="none")
    resolved = ce > 0  # fp32 rounds the most confident samples' CE to exactly 0
    assert int((resolved & (ce < 1e-4)).sum()) >= 2
    credits = ep_rule(model).credits(x.float(), y)
    reference = ep_rule(copy.deepcopy(model).double()).credits(x, y)
    for a, want in zip(credits, reference):
        a, want = a[resolved].double().flatten(1), want[resolved].flatten(1)
        assert bool((a.norm(dim=1) > 0).all())
        assert float(F.cosine_similarity(a, want, dim=1).min()) > 0.999


def test_backoff_keeps_a_too_large_step_size_stable():
    model = mlp(w2_std=0.3)
    rule = ep_rule(model, ep_solver="gd")
    x, y = batch()
    states, _ = model.forward_states(x)
    stiff = rule.relax(states, y, steps=60, step_size=4.0)  # far beyond 2/λ_max
    assert stiff.final_step_size < 4.0 and stiff.grad_ratio < 1.0 and stiff.backoffs > 0
    assert all(torch.isfinite(r).all() for r in stiff.residuals)


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_cg_probe_length_does_not_change_where_it_goes(solver):
    """CG measures the curvature itself: η only sets the first probe, short or far."""
    model = mlp()
    rule = ep_rule(model, ep_solver=solver)
    x, y = batch()
    states, _ = model.forward_states(x)
    runs = [rule.relax(states, y, steps=100, step_size=eta) for eta in (0.01, 0.25, 4.0)]
    for run in runs:
        assert run.backoffs == 0 and run.grad_ratio < 1e-7
        for r, ref in zip(run.residuals, runs[1].residuals):
            assert torch.allclose(r, ref, rtol=0, atol=1e-6 * float(ref.abs().max()))


# --- the relaxation solvers ---------------------------------------------------------------
def test_unknown_solver_is_a_config_error():
    with pytest.raises(ConfigError, match="method.ep_solver='adam' is not allowed; choose one "
                                          "of residual-cg, cg, gd"):
        RunConfig().replace(**{"method.name": "ep", "method.ep_solver": "adam"})
    assert tuple(SOLVERS) == EP_SOLVERS  # every allowed choice has a solver, and only those


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_one_cg_step_moves_no_state_and_is_refused_before_a_run(solver, tmp_path):
    """A CG solver's first step is the free states' gradient: with ep_steps=1 every credit
    is exactly 0 and no block trains, so the value is refused before a run folder exists,
    naming the key, the solver and what to give; gd's first step moves h_L."""
    model = mlp()
    x, y = batch()
    states, _ = model.forward_states(x)
    relaxation = relax(model, states, y, beta=0.01, steps=1, step_size=0.25, solver=solver)
    assert all(float(r.abs().max()) == 0.0 for r in relaxation.residuals)
    with pytest.raises(ConfigError, match=rf"^method.ep_steps=1 with method.ep_solver="
                                          rf"'{solver}' moves no state: .* no block would "
                                          r"train; give method.ep_steps >= 2"):
        ep_rule(mlp(), ep_steps=1, ep_solver=solver)
    config = RunConfig().replace(**{
        "method.name": "ep", "method.ep_steps": 1, "method.ep_solver": solver,
        "data.n_train": 64, "data.n_test": 64, "data.in_dim": 8, "model.d": 8,
        "model.n_blocks": 2, "optim.epochs": 1, "run.out_dir": str(tmp_path / "runs")})
    with pytest.raises(ConfigError, match="method.ep_steps=1"):
        train(config)
    assert not (tmp_path / "runs").exists()
    gd = relax(model, states, y, beta=0.01, steps=1, step_size=0.25, solver="gd")
    assert float(gd.residuals[-1].abs().max()) > 0
    ep_rule(mlp(), ep_steps=1, ep_solver="gd")  # accepted


def test_gd_credits_one_more_state_per_step_and_the_refusal_says_so():
    """gd moves the states one layer per step: after k ≤ L steps only h_{L−k+1} … h_L have
    a credit, so the embedding trains only from ep_steps = L + 1 on — the refusal of
    ep_steps=1 with a CG solver must not offer gd as if its first step credited every
    state (it said "gd, whose first step moves the states")."""
    model = mlp(n_blocks=3)
    x, y = batch()
    n_states = 4
    for steps in range(1, n_states + 1):
        credits = ep_rule(model, ep_solver="gd", ep_steps=steps).credits(x, y)
        moved = [float(a.abs().max()) > 0 for a in credits]
        assert moved == [state >= n_states - steps for state in range(n_states)], (steps,
                                                                                   moved)
    with pytest.raises(ConfigError, match=r"method.ep_solver='gd' moves the states one layer "
                                          r"per step.*ep_steps >= L \+ 1"):
        ep_rule(mlp(), ep_steps=1, ep_solver="cg")


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_two_cg_steps_are_one_step_along_the_free_states_gradient(solver):
    """ep_steps=2 is one CG iteration (the first step is the free states' gradient): over ρ
    every credit is, per sample, a multiple of backprop's state gradient (the line search's
    α, within O(β) of 1); over δ only h_L moves, its
    credit parallel to ∂CE/∂h_L. An iteration count one off either way (no step, or two)
    fails it; with ep_steps=1 nothing moves (test above)."""
    model = mlp(w2_std=0.3)
    x, y = batch()
    g = bp_state_gradients(model, x, y)
    credits = ep_rule(model, ep_solver=solver, ep_steps=2).credits(x, y)
    moved = range(len(g)) if solver == "residual-cg" else [len(g) - 1]
    for state, (a, grad) in enumerate(zip(credits, g)):
        if state not in moved:
            assert float(a.abs().max()) == 0.0, state
            continue
        cos = F.cosine_similarity(a.flatten(1), grad.flatten(1), dim=1)
        assert float((1 - cos).abs().max()) < 1e-12, (state, cos)
        scale = a.flatten(1).norm(dim=1) / grad.flatten(1).norm(dim=1)
        assert bool(((scale - 1).abs() < 0.1).all()), (state, scale)


def residual_energy(model, states: list[Tensor], y: Tensor, beta: float,
                    rho: list[Tensor]) -> Tensor:
    """F over the residuals, literally: h_0 = free h_0 + ρ_{−1}, h_{l+1} = h_l + f_l(h_l) + ρ_l,
    F = ½‖ρ‖² + β·Σ_i CE_i(readout(h_L))."""
    h = states[0] + rho[0]
    for index, block in enumerate(model.blocks):
        h = h + block(h) + rho[index + 1]
    squares = sum(r.pow(2).sum() for r in rho)
    return 0.5 * squares + beta * F.cross_entropy(model.readout(h), y, reduction="sum")


def residual_gradient_norm(model, states, y, beta, rho) -> float:
    """‖∇_ρF‖ over the batch (autograd through :func:`residual_energy`)."""
    leaves = [r.detach().clone().requires_grad_(True) for r in rho]
    grads = torch.autograd.grad(residual_energy(model, states, y, beta, leaves), leaves)
    return float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))


@pytest.mark.parametrize("solver", EP_SOLVERS)
def test_recorded_grad_ratio_is_the_residual_gradient_end_over_start(solver):
    model = mlp(w2_std=0.3)
    x, y = batch()
    rule = ep_rule(model, ep_solver=solver, ep_steps=6)
    states = [h.detach() for h in model.forward_states(x)[0]]
    relaxation = rule.relax(states, y)
    # at ρ = 0, ∂F/∂ρ_{l−1} = β·∂CE/∂h_l: β times backprop's state gradients of the summed CE
    g = bp_state_gradients(model, x, y)
    start = rule.beta * x.shape[0] * float(torch.sqrt(sum(v.pow(2).sum() for v in g)))
    end = residual_gradient_norm(model, states, y, rule.beta, relaxation.residuals)
    assert relaxation.grad_norms[0] == pytest.approx(start, rel=1e-10)
    assert relaxation.grad_norms[-1] == pytest.approx(end, rel=1e-7, abs=1e-15 * start)
    assert relaxation.grad_ratio == pytest.approx(end / start, rel=1e-7, abs=1e-15)
    # the returned displacements are the states whose residuals these are
    nudged = [h + d for h, d in zip(states, relaxation.deltas)]
    for index, block in enumerate(model.blocks):
        literal = nudged[index + 1] - nudged[index] - block(nudged[index])
        assert torch.allclose(relaxation.residuals[index + 1], literal.detach(), rtol=0,
                              atol=1e-12)
    ratios, backed_off = [], []
    original = rule.relax

    def recording(*args, **kw):
        result = original(*args, **kw)
        ratios.append(result.grad_ratio)
        backed_off.append(result.backoffs > 0)
        return result

    rule.relax = recording
    for seed in (1, 2, 3):
        grads_after_step(rule, *batch(seed=seed))
    fields = rule.end_epoch(1, 1)
    assert fields["ep_relax_grad_ratio"] == pytest.approx(sum(ratios) / 3, rel=1e-12)
    assert fields["ep_backoff_fraction"] == sum(backed_off) / 3


def test_an_epoch_ended_twice_keeps_its_relaxation_fields():
    """A loop that calls rule.end_epoch itself and then rec.epoch, which ends the epoch
    again: the second call gave ep_relax_grad_ratio and ep_backoff_fraction NaN (an epoch
    of no steps), which the record kept as the epoch's convergence. Ended again with no
    step since, the epoch now gives its fields again; a step starts the next epoch's."""
    rule = ep_rule(mlp())
    grads_after_step(rule, *batch())
    fields = rule.end_epoch(1, 3)
    assert math.isfinite(fields["ep_relax_grad_ratio"])
    assert rule.end_epoch(1, 3) == fields
    assert math.isnan(rule.end_epoch(2, 3)["ep_relax_grad_ratio"])  # no step in epoch 2
    grads_after_step(rule, *batch(seed=2))
    assert rule.end_epoch(2, 3)["ep_relax_grad_ratio"] != fields["ep_relax_grad_ratio"]


def test_residual_energy_gradient_and_forward_substitution():
    """ResidualEnergy: ∇_ρF against central differences of the literal F(ρ), and the
    displacements it returns have exactly the residuals ρ."""
    model = mlp(w2_std=0.5)
    x, y = batch()
    states = [h.detach() for h in model.forward_states(x)[0]]
    energy = NudgedEnergy(model, states, y, 0.05)
    on_residuals = ResidualEnergy(energy)
    gen = torch.Generator().manual_seed(3)
    rho = 0.01 * torch.randn(energy.zeros().shape, generator=gen, dtype=F64)
    grad, deltas = on_residuals.gradient(rho)
    direction = torch.randn(rho.shape, generator=gen, dtype=F64)
    step = 1e-6

    @torch.no_grad()
    def value(flat: Tensor) -> float:
        return float(residual_energy(model, states, y, 0.05, energy.unflatten(flat)))

    numeric = (value(rho + step * direction) - value(rho - step * direction)) / (2 * step)
    assert float((grad * direction).sum()) == pytest.approx(numeric, rel=1e-6)
    _, residuals = energy.gradient(torch.cat([d.flatten(1) for d in deltas], 1))
    for r, want in zip(residuals, energy.unflatten(rho)):
        assert torch.allclose(r, want, rtol=0, atol=1e-15)


def test_residual_cg_converges_on_stiff_blocks_where_cg_and_gd_do_not():
    """Stiff blocks make the displacements' Hessian ill-conditioned, not the residuals'."""
    model = mlp(w2_std=3.0, d=16)
    x, y = batch(n=16)

    def agreement(solver: str, steps: int) -> dict:
        return update_agreement(model, x, y, beta=1e-3, steps=steps, step_size=0.25,
                                solver=solver)

    converged = agreement("residual-cg", 20)
    assert converged["ep_eval_relax_grad_ratio"] < 1e-10
    assert converged["ep_update_cos"] > 0.9999
    assert agreement("cg", 200)["ep_update_cos"] < 0.95
    assert agreement("gd", 200)["ep_update_cos"] < 0.6


@pytest.mark.parametrize(("w2_std", "beta", "seed"), [(1.0, 0.1, 0), (3.0, 1.0, 2)])
def test_residual_cg_never_returns_a_sample_above_its_free_energy(monkeypatch, w2_std, beta,
                                                                   seed):
    """F ≥ ½‖ρ‖² and F(0) = β·CE(free): no equilibrium lies above F(0). On these strongly
    nudged stiff nets the plain secant iteration ends some samples above it; the bound sends
    them back to their best point."""
    model = mlp(seed=seed, w2_std=w2_std, d=16, n_blocks=4)
    x, y = batch(n=32, seed=seed + 1)
    states = [h.detach() for h in model.forward_states(x)[0]]
    on_residuals = ResidualEnergy(NudgedEnergy(model, states, y, beta))
    _, bound = on_residuals.start()

    def values_above_bound() -> int:
        relaxation = relax(model, states, y, beta=beta, steps=20, step_size=0.25,
                           solver="residual-cg")
        _, _, values = on_residuals.evaluate(flatten(relaxation.residuals))
        return int((values > bound * (1 + 1e-12)).sum())

    assert values_above_bound() == 0
    unbounded = ResidualEnergy.start
    monkeypatch.setattr(ResidualEnergy, "start", lambda self: (unbounded(self)[0], None))
    assert values_above_bound() > 0  # without the bound: the test tells the two apart


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_cg_stops_a_converged_sample_instead_of_following_rounding_noise(solver):
    model = mlp(d=16)
    x, y = batch(n=16)
    states, _ = model.forward_states(x)
    rule = ep_rule(model, ep_beta=1e-3)
    done = rule.relax(states, y, solver=solver, steps=150 if solver == "cg" else 12)
    longer = rule.relax(states, y, solver=solver, steps=300)
    assert done.grad_ratio < 1e-11 and longer.grad_ratio < 1e-11
    for a, b in zip(done.residuals, longer.residuals):
        assert torch.allclose(a, b, rtol=0, atol=1e-12 * float(b.abs().max()))


def test_backoff_fraction_is_the_share_of_steps_that_halved_the_step_size():
    model = mlp(w2_std=0.3)
    x, y = batch()
    rule = ep_rule(model, ep_solver="gd", ep_step_size=4.0, ep_steps=5)
    grads_after_step(rule, x, y)
    rule.step_size = 0.1  # the same rule, now within the stable range
    grads_after_step(rule, x, y)
    assert rule.end_epoch(1, 1)["ep_backoff_fraction"] == 0.5


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_cg_reaches_the_same_equilibrium_as_gradient_descent_in_fewer_steps(solver):
    model = mlp(n_blocks=5)
    rule = ep_rule(model)
    x, y = batch()
    states, _ = model.forward_states(x)
    reference = rule.relax(states, y, solver="gd", steps=5000, step_size=0.25)
    converged = rule.relax(states, y, solver=solver, steps=150)
    assert reference.grad_ratio < 1e-12 and converged.grad_ratio < 1e-10
    for a, b in zip(converged.residuals + converged.deltas,
                    reference.residuals + reference.deltas):
        assert torch.allclose(a, b, rtol=0, atol=1e-9 * float(b.abs().max()))

    def error(relaxation) -> float:
        return float(sum((r - s).pow(2).sum() for r, s in zip(
            relaxation.residuals, reference.residuals)).sqrt())

    for steps, factor in ((20, 3), (40, 100)):
        cg = rule.relax(states, y, solver=solver, steps=steps)
        gd = rule.relax(states, y, solver="gd", steps=steps)
        assert cg.grad_ratio < gd.grad_ratio / factor, steps
        assert error(cg) < error(gd) / factor, steps


@pytest.mark.parametrize("solver", ["residual-cg", "cg"])
def test_cg_relaxes_every_sample_on_its_own(solver):
    """Per-sample step sizes: a sample's equilibrium does not depend on its batch."""
    model = mlp(w2_std=0.3)
    rule = ep_rule(model, ep_solver=solver)
    x, y = batch(n=8)
    states, _ = model.forward_states(x)
    whole = rule.relax(states, y, steps=12)
    half = rule.relax([h[:4] for h in states], y[:4], steps=12)
    for a, b in zip(whole.residuals, half.residuals):
        assert torch.allclose(a[:4], b, rtol=1e-10, atol=1e-14)


# --- the weight update --------------------------------------------------------------------
def literal_energy(model, x: Tensor, states: list[Tensor]) -> Tensor:
    """E = ½‖h_0 − embed(x)‖² + ½Σ‖h_{l+1} − h_l − f_l(h_l)‖², summed over the batch."""
    energy = 0.5 * (states[0] - model.embed(x)).pow(2).sum()
    for index, block in enumerate(model.blocks):
        r = states[index + 1] - states[index] - block(states[index])
        energy = energy + 0.5 * r.pow(2).sum()
    return energy


@pytest.mark.parametrize("penalty", [0.0, 0.05])
def test_weight_update_is_contrastive_energy_difference(penalty):
    model = mlp(w2_std=0.3)
    rule = ep_rule(model, penalty=penalty, ep_steps=50)
    x, y = batch()
    reference = copy.deepcopy(model)
    states, _ = reference.forward_states(x)
    states = [h.detach() for h in states]
    relaxation = rule.relax(states, y)
    nudged = [h + d for h, d in zip(relaxation.states, relaxation.deltas)]
    beta, n = rule.beta, x.shape[0]
    contrast = (literal_energy(reference, x, nudged) - literal_energy(reference, x, states))
    objective = contrast / (beta * n)
    objective = objective + F.cross_entropy(reference.readout(states[-1]), y)
    for index, block in enumerate(reference.blocks):
        objective = objective + penalty * block(states[index]).pow(2).sum(1).mean()
    names = [name for name, _ in reference.named_parameters()]
    want = dict(zip(names, torch.autograd.grad(objective, list(reference.parameters()))))
    got = grads_after_step(rule, x, y)
    for name in names:
        assert torch.allclose(got[name], want[name], rtol=1e-7, atol=1e-12), name


def test_readout_trained_by_exact_local_ce():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    reference = copy.deepcopy(model)
    states, _ = reference.forward_states(x)
    ce = F.cross_entropy(reference.readout(states[-1].detach()), y)
    want = torch.autograd.grad(ce, [reference.out_head.weight, reference.out_ln.weight])
    got = grads_after_step(rule, x, y)
    assert torch.allclose(got["out_head.weight"], want[0], rtol=1e-12)
    assert torch.allclose(got["out_ln.weight"], want[1], rtol=1e-12)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_block_update_depends_only_on_its_own_credit(layer):
    x, y = batch()

    def grads(zero_own: bool, flip_others: bool) -> dict[str, Tensor | None]:
        rule = ep_rule(mlp())
        original = rule.credits_from

        def patched(relaxation, batch_size, beta=None):
            credits = [(-a if flip_others else a) for a in original(relaxation, batch_size, beta)]
            if zero_own:
                credits[layer + 1] = torch.zeros_like(credits[layer + 1])
            elif flip_others:
                credits[layer + 1] = -credits[layer + 1]  # keep its own credit as it was
            return credits

        rule.credits_from = patched
        return grads_after_step(rule, x, y)

    base, zeroed, others = grads(False, False), grads(True, False), grads(False, True)
    prefix = f"blocks.{layer}."
    for name, g in zeroed.items():
        if name.startswith(prefix):
            assert torch.count_nonzero(g) == 0, name
            assert torch.equal(others[name], base[name]), name  # others' credits are irrelevant
        else:
            assert torch.equal(g, base[name]), name


# --- convergence at the end of a run ------------------------------------------------------
def test_converged_relaxation_gives_the_bp_weight_update_for_small_beta():
    model = mlp()
    x, y = batch(n=16)
    converged = update_agreement(model, x, y, beta=1e-3, steps=100, step_size=0.25, solver="cg")
    assert converged["ep_eval_relax_grad_ratio"] < 1e-8
    assert converged["ep_update_cos"] >= 0.999, converged
    assert min(converged["ep_update_cos_layers"]) >= 0.999, converged
    # an unconverged relaxation is visibly worse: the metric tells the two apart
    short = update_agreement(model, x, y, beta=1e-3, steps=3, step_size=0.25, solver="gd")
    assert short["ep_update_cos"] < 0.99 and short["ep_eval_relax_grad_ratio"] > 0.1


def test_update_agreement_is_the_cosine_of_the_rules_update_with_bp():
    """By hand: the rule's own training gradients, chunk-weighted, against ∇ mean CE."""
    model = mlp(w2_std=0.3)
    x, y = batch(n=160)  # two relaxation chunks: 128 + 32 samples
    rule = ep_rule(model)
    got = update_agreement(model, x, y, beta=rule.beta, steps=rule.steps,
                           step_size=rule.step_size, solver=rule.solver)
    names = [n for n, _ in model.named_parameters() if n.startswith(("embed.", "blocks."))]
    ep = {n: torch.zeros_like(dict(model.named_parameters())[n]) for n in names}
    for start in (0, 128):
        chunk = grads_after_step(rule, x[start:start + 128], y[start:start + 128])
        for n in names:
            ep[n] += chunk[n] * min(128, 160 - start) / 160
    twin = copy.deepcopy(model)
    bp = dict(zip(names, torch.autograd.grad(
        F.cross_entropy(twin(x), y), [dict(twin.named_parameters())[n] for n in names])))

    def cosine(prefixes: tuple[str, ...]) -> float:
        a = torch.cat([ep[n].flatten() for n in names if n.startswith(prefixes)])
        b = torch.cat([bp[n].flatten() for n in names if n.startswith(prefixes)])
        return float(a @ b / (a.norm() * b.norm()))

    assert got["ep_update_cos"] == pytest.approx(cosine(("embed.", "blocks.")), rel=1e-9)
    modules = ["embed."] + [f"blocks.{i}." for i in range(3)]
    assert got["ep_update_cos_layers"] == pytest.approx([cosine((m,)) for m in modules],
                                                        rel=1e-9)


def test_frozen_modules_have_no_update_cosine():
    model = mlp()
    rule = build_rule(model, MethodConfig(name="ep", trainable_blocks=1), n_classes=C, seed=7)
    cosines = rule.run_metrics(*batch())["ep_update_cos_layers"]
    assert cosines[1] is None and cosines[2] is None
    assert all(isinstance(c, float) for c in (cosines[0], cosines[3]))


def test_run_metrics_leave_model_grads_rule_state_and_rng_alone():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    grads_after_step(rule, x, y)  # .grad fields and step counters now hold something
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state, rng = copy.deepcopy(rule.state_dict()), torch.get_rng_state()
    assert rule.run_metrics(x, y)["ep_update_cos"] > 0.5
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert rule.state_dict() == state and torch.equal(torch.get_rng_state(), rng)
    assert all(p.dtype == F64 for p in model.parameters()) and model.training


# --- other architectures ------------------------------------------------------------------
def test_token_states_give_token_credits():
    torch.manual_seed(0)
    model = ViTMini(n_classes=C, d=16, n_blocks=1, heads=2, mlp_ratio=2).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 32, 32, generator=gen, dtype=F64)
    y = torch.tensor([0, 3])
    rule = ep_rule(model)
    states, _ = model.forward_states(x)
    # the near-zero CLS token of a fresh ViT makes its energy stiff: relax longer
    credits = rule.credits(x, y, beta=1e-3, steps=200)
    assert [a.shape for a in credits] == [h.shape for h in states]
    g = bp_state_gradients(model, x, y)
    assert min(layer_cosines([a.flatten(1) for a in credits], [b.flatten(1) for b in g])) > 0.8
    assert grads_after_step(rule, x, y)["blocks.0.w1.weight"].abs().sum() > 0


# --- persistence and resume ---------------------------------------------------------------
def test_state_dict_round_trip():
    model = mlp()
    rule = ep_rule(model)
    x, y = batch()
    grads_after_step(rule, x, y)
    twin = ep_rule(mlp(seed=5))
    twin.load_state_dict(copy.deepcopy(rule.state_dict()))
    assert twin.state_dict() == rule.state_dict()
    assert twin.end_epoch(1, 3) == rule.end_epoch(1, 3)


TINY_RUN = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "model.d": 16,
    "model.n_blocks": 2, "optim.epochs": 3, "optim.batch_size": 64,
    "diagnostics.eval_samples": 128, "run.progress": False, "method.name": "ep",
}


def test_killed_and_resumed_run_equals_uninterrupted(tmp_path, kill_run_at):
    def config(out: Path) -> RunConfig:
        return RunConfig().replace(**{**TINY_RUN, "run.out_dir": str(out)})

    straight = train(config(tmp_path / "a"))
    kill_run_at(config(tmp_path / "b"))
    run_dir = tmp_path / "b" / straight.record.run_id
    assert load_record(run_dir).status == "interrupted"
    resumed = train(config(tmp_path / "b"), resume=True).record.to_dict()

    def semantic(record):
        out = copy.deepcopy(comparable(record))
        out["config"]["run"].pop("out_dir", None)
        return out

    assert straight.status == resumed["status"] == "completed"
    assert semantic(resumed) == semantic(straight.record)
    assert all(e.value("ep_relax_grad_ratio") is not None for e in straight.record.log[1:])
    a = torch.load(straight.run_dir / CHECKPOINT_FILE, weights_only=False)
    b = torch.load(run_dir / CHECKPOINT_FILE, weights_only=False)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["rule"] == b["rule"]


def test_run_record_and_audit_report_show_the_convergence(tmp_path):
    config = RunConfig().replace(**{**TINY_RUN, "optim.epochs": 1,
                                    "run.out_dir": str(tmp_path)})
    result = train(config)
    diagnostics = result.record.diagnostics.to_dict()
    assert len(diagnostics["ep_update_cos_layers"]) == config.model.n_blocks + 1
    assert -1.0 <= diagnostics["ep_update_cos"] <= 1.0
    assert 0.0 < diagnostics["ep_eval_relax_grad_ratio"] < 1.0
    # the report recomputes the same numbers from the checkpoint and prints them
    report = audit_run(str(result.run_dir))
    for key in ("ep_update_cos", "ep_update_cos_layers", "ep_eval_relax_grad_ratio"):
        assert report.metrics[key] == pytest.approx(diagnostics[key], rel=1e-9), key
    epoch = result.record.log[-1].to_dict()
    assert report.metrics["ep_relax_grad_ratio"] == epoch["ep_relax_grad_ratio"]
    text = render(report, "text")
    assert f"EP weight update vs BP: cos {diagnostics['ep_update_cos']:.4f}" in text
    assert f"‖∇_ρF‖ end/start {epoch['ep_relax_grad_ratio']:.3g} (epoch mean" in text
    assert markdown_text("−r_{l−1}/β") in render(report, "md")  # record text, escaped
    quick = audit_run(str(result.run_dir), metrics=False)
    assert "ep_update_cos" not in quick.metrics
    assert "‖∇_ρF‖ end/start" in render(quick, "text")


def test_reports_say_when_the_nudged_relaxation_diverged():
    from creditaudit.report.protocol import ep_convergence_lines

    converged = ep_convergence_lines({"ep_relax_grad_ratio": 0.05, "ep_backoff_fraction": 0.0})
    assert len(converged) == 1 and "0.05" in converged[0]
    diverged = ep_convergence_lines({"ep_relax_grad_ratio": 4.2e4, "ep_backoff_fraction": 0.0})
    assert len(diverged) == 2 and "farther from equilibrium" in diverged[1]


def test_a_relaxation_that_moves_no_state_is_said_and_has_no_update_cosine(tmp_path):
    """A probe η so large that every probe lands above the bound: each nudged phase returns
    the free states, every credit is 0 and no block trains. The record must not read as an
    update orthogonal to BP's (ep_update_cos 0.0): EP's update has no direction, so the
    cosine is None, and the audit says why (the epoch's ratio is exactly 1)."""
    model, (x, y) = mlp(), batch()
    out = update_agreement(model, x, y, beta=0.01, steps=20, step_size=1e30,
                           solver="residual-cg")
    assert out["ep_eval_relax_grad_ratio"] == 1.0
    assert out["ep_update_cos"] is None and out["ep_update_cos_layers"] == [None] * 4
    config = RunConfig().replace(**{**TINY_RUN, "optim.epochs": 1, "method.ep_step_size": 1e30,
                                    "diagnostics.rho_samples": 16, "diagnostics.null_draws": 2,
                                    "run.out_dir": str(tmp_path)})
    result = train(config)
    assert result.record.log[-1].to_dict()["ep_relax_grad_ratio"] == 1.0
    assert result.record.diagnostics.to_dict()["ep_update_cos"] is None
    text = render(audit_run(str(result.run_dir)), "text")
    assert "EP weight update vs BP: cos — (embed, blocks: [—, —, —]" in text
    assert "no relaxation moved a state: every nudged phase returned the free states" in text


def test_a_relaxation_not_finite_on_the_evaluation_set_is_an_error_not_a_missing_cosine():
    """A nudged phase that came back NaN made EP's update NaN, and the cosine with BP's None:
    recorded as "the update had no direction". Now an ep_update_error says why."""
    from creditaudit.report.protocol import ep_convergence_lines

    def nan_relax(*args, **kwargs):
        relaxation = relax(*args, **kwargs)
        relaxation.residuals = [torch.full_like(r, math.nan) for r in relaxation.residuals]
        return relaxation

    model, (x, y) = mlp(), batch()
    out = update_agreement(model, x, y, beta=0.01, steps=20, step_size=0.25,
                           solver="residual-cg", relaxer=nan_relax)
    assert "ep_update_cos" not in out
    assert out == {"ep_update_error": "the nudged relaxation on the evaluation set is not "
                                      "finite (NaN/Inf states or residuals)"}
    assert ep_convergence_lines(out) == ["EP weight update vs BP: not measured (the nudged "
                                         "relaxation on the evaluation set is not finite "
                                         "(NaN/Inf states or residuals))"]


def test_a_nudge_beyond_float32s_reach_is_refused_and_old_records_keep_theirs() -> None:
    """ep_beta had no upper bound: at 1e300 a run stopped with "internal error: RuntimeError:
    value cannot be converted to type float without overflow", at 1e30 it completed with
    zero credits. Now at most 100, refused in one line; a record keeps what its run used."""
    from creditaudit.config import config_from_dict

    with pytest.raises(ConfigError, match=r"method\.ep_beta=1e\+300 is out of range; it must "
                                          r"be <= 100"):
        RunConfig().replace(**{"method.name": "ep", "method.ep_beta": 1e300})
    assert RunConfig().replace(**{"method.name": "ep",
                                  "method.ep_beta": 100.0}).method.ep_beta == 100.0
    raw = RunConfig().replace(**{"method.name": "ep"}).to_dict()
    raw["method"]["ep_beta"] = 1e300
    with pytest.raises(ConfigError, match="out of range"):
        config_from_dict(raw)
    assert config_from_dict(raw, strict=False).method.ep_beta == 1e300


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_network_held_below_float32_is_refused_in_one_line(dtype):
    """A network cast with .to(torch.bfloat16) (which a Recorder records as such) was bound,
    and its first step failed with PyTorch's "mixed dtype (CPU): expect parameter to have
    scalar type of Float": the relaxation runs the blocks and the readout on float32 states.
    Binding now refuses it, naming the dtype and the way out."""
    from creditaudit import rule
    from creditaudit.errors import ModelContractError

    model = mlp().to(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ModelContractError) as error:
        rule("ep", model)
    assert str(error.value) == (
        f"ep relaxes the states through the blocks and the readout in float32 or float64 "
        f"({name} cannot resolve the nudge β·∂CE/∂h), but ResidualMLP's parameters are "
        f"{name}: keep the network in float32 (model.float()) to train it with ep")
    kept = model.float()  # the way out: in float32 it binds and steps
    x, y = batch()
    assert ep_rule(kept).train_step(x.float(), y, torch.optim.SGD(kept.parameters(),
                                                                 lr=0.0)).finite
