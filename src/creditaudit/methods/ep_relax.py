"""EP's nudged phase: relaxing the states on E + β·CE by conjugate gradients or gradient descent.

The free energy of the nudged phase, for displacements δ_l = h_l^nudged − h_l^free of the
states h_0 … h_L (per sample, summed over the batch; see :mod:`creditaudit.methods.ep` and
:mod:`creditaudit.methods.ep_energy`):

    F(δ) = ½‖δ_0‖² + ½ Σ_l ‖r_l‖² + β·Σ_i CE_i(readout(h_L + δ_L)),
    r_l = δ_{l+1} − δ_l − (f_l(h_l + δ_l) − f_l(h_l))     (no "− δ_l" without skips).

Its Hessian at δ = 0 is JᵀJ (+ β·∇²CE at the last state), J the Jacobian of the residuals:
identity blocks on the diagonal, −(I + ∂f_l/∂h_l) below it. For near-identity blocks this
is a chain Laplacian over the L + 1 states, eigenvalues in (0, 4); at L = 4 the smallest is
4·sin²(π/22) ≈ 0.08, so gradient descent at η = 0.25 shrinks the slowest mode by only 2% per
step. Trained blocks are stiffer: J⁻¹ multiplies the gains ‖I + ∂f_l/∂h_l‖ of the blocks,
so the condition number of JᵀJ grows like their product squared. Per-sample λ_max of a d=256
L=4 ResidualMLP's JᵀJ was 4 at init and 6–38 after 20 epochs of EP with gd on three tasks;
90–950 on a run whose blocks EP with cg had made stiff.

Over the residuals ρ = (δ_0, r_0, …, r_{L−1}) instead, the states follow from ρ by one
forward substitution (δ_{l+1} = ρ_l + δ_l + f_l(h_l + δ_l) − f_l(h_l)), and the Hessian is
the identity plus the nudge's curvature seen through the network, I + β·Φᵀ∇²CE·Φ with
Φ = ∂δ_L/∂ρ, however stiff the blocks. Both coordinates have the same minimiser.

Solvers (``method.ep_solver``):

- ``"residual-cg"`` (default): the conjugate gradients below over ρ. One evaluation of
  ∇_ρF = ρ + β·Φᵀ∂CE/∂h_L is one forward and one backward pass through the blocks, what an
  evaluation of ∇F over δ costs. The first step lands on backprop's credits of the free
  states (ρ = −β·g); the next ones add the nudge's finite-β effect. Over ρ each sample's
  value F_i = ½‖ρ_i‖² + β·CE_i comes with its gradient, and F_i(0) = β·CE_i(free) bounds
  the equilibrium (F_i ≥ ½‖ρ_i‖²): a sample whose probe lands above it returns to its
  best evaluated point (:class:`BestPoints`).
- ``"cg"``: the same conjugate gradients over δ. Where JᵀJ is ill-conditioned its secant
  steps stall, and in training they can run away: once EP's own updates make the blocks
  stiff, its credit loses all alignment with BP's, and the blocks grow stiffer.
- ``"gd"``: plain gradient descent over δ with step size η. Whenever ‖∇F‖ at a new iterate
  exceeds 1.1 × ‖∇F‖ at the current one (η beyond 2/λ_max somewhere, e.g. a fresh ViT's
  near-zero CLS token; or a NaN), the iterate is rejected and η halved for the rest of the
  relaxation. Stable, but far from the equilibrium after 20 steps on trained blocks.

Conjugate gradients, run independently for every sample (F is a sum of per-sample energies,
so each sample gets its own step sizes and its relaxation never depends on the rest of the
batch unless η backs off): the curvature pᵀHp along each direction p is measured by one
gradient probe, ∇F(x + t·p) − ∇F(x) = t·Hp on the quadratic part of F, which gives the exact
line-search step α = −pᵀ∇F/pᵀHp; the gradient at the new iterate is extrapolated linearly
from the probe. So a step costs one gradient evaluation plus a few (B, N) vector operations,
and converges in about √κ instead of κ steps with no estimate of the spectrum (heavy-ball
and Nesterov momentum need one, and tuned on fresh blocks they diverge on trained ones). Its
fixed point is gradient descent's. The probe length t is the sample's previous step (at
least η), so η only sets the first probe. A sample stops once its gradient is down to
rounding, and the relaxation ends early once every sample has (``steps`` is a maximum).

Convergence measure (``grad_ratio``, recorded per epoch as ``ep_relax_grad_ratio``):
‖∇_ρF‖ at the returned state / at the free state, for every solver. Near the equilibrium
∇_ρF ≈ ρ − ρ*, so this is the relative error of the residuals, i.e. of the credits
a_l = −r_{l−1}/β. (‖∇F‖ over δ is Jᵀ∇_ρF: on stiff blocks it overstates the credits' error by
up to ‖J‖.) At the free state ∇_ρF = β·(g_0, …, g_L), backprop's state gradients of the
summed CE. Measuring it costs residual-cg one evaluation and cg and gd two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from creditaudit.errors import ConfigError
from creditaudit.methods.ep_energy import Energy, NudgedEnergy, ResidualEnergy, flatten
from creditaudit.models.contract import ResidualNet

EP_SOLVERS = ("residual-cg", "cg", "gd")  # the choices of method.ep_solver, in help order
BACKOFF_GROWTH = 1.1  # ‖∇F‖ may grow by 10% in one step before η is halved
SETTLED = 1000.0  # CG stops a sample at ‖∇F‖ ≤ SETTLED·eps·‖∇F at the start‖
# A value counts as above F(free) beyond its rounding: 64·eps·(F(free) + β·max|logit|). The
# logits' term matters for a confident sample, whose CE (≈ 4e-4) is far smaller than the
# rounding of the logits it is computed from; without it, rounding noise put every probe of
# such a sample above F(free) in float32, and its credit came back exactly zero.
BOUND_SLACK = 64.0
BOUND_SHRINK = 0.25  # the probe of a sample sent back to its best point


@dataclass
class Relaxation:
    """Result of one nudged phase.

    ``states`` are the free h_0 … h_L (relaxation dtype), ``deltas`` the displacements
    h^nudged − h^free, ``residuals`` [r_{−1} = δ_0, r_0, …, r_{L−1}] at the nudged states
    (all detached, summed-energy scale). ``grad_norms``: [‖∇_ρF‖ over the batch at the free
    states, at the returned ones] (module doc); ``grad_ratio`` = last / first;
    ``final_step_size``: η after any back-off; ``backoffs``: how many times η (gd's step,
    the CG solvers' probe) was halved.
    """

    states: list[Tensor]
    deltas: list[Tensor]
    residuals: list[Tensor]
    grad_norms: list[float]
    final_step_size: float
    backoffs: int

    @property
    def grad_ratio(self) -> float:
        first, last = self.grad_norms[0], self.grad_norms[-1]
        return last / first if first > 0 else 0.0


def relaxation_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least fp32: bf16 states cannot resolve a nudge of β·‖∂CE/∂h‖."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def relax(model: ResidualNet, states: list[Tensor], y: Tensor, *, beta: float, steps: int,
          step_size: float, solver: str = "residual-cg") -> Relaxation:
    """Nudged phase: about ``steps`` gradient evaluations of ``solver`` on E + β·Σ_i CE_i.

    ``states`` are the free h_0 … h_L of the batch (any dtype; relaxed in ≥ fp32), ``y``
    ``(B,)`` labels. Touches no parameter ``.grad`` and no random stream.
    """
    if solver not in SOLVERS:
        raise ConfigError(f"EP solver {solver!r} is not allowed; choose one of "
                          f"{', '.join(EP_SOLVERS)}")
    dtype = relaxation_dtype(states[0].dtype)
    free = [h.detach().to(dtype) for h in states]
    energy = NudgedEnergy(model, free, y, beta)
    x, residuals, norms, eta, backoffs = SOLVERS[solver](energy, steps, step_size)
    return Relaxation(states=free, deltas=energy.unflatten(x), residuals=residuals,
                      grad_norms=norms, final_step_size=eta, backoffs=backoffs)


# (flat displacements x, residuals at x, [‖∇_ρF‖ at the free states, at x], final η, back-offs)
Trajectory = tuple[Tensor, list[Tensor], list[float], float, int]


def residual_gradient_norms(energy: NudgedEnergy, residuals: list[Tensor]) -> list[float]:
    """[‖∇_ρF‖ at the free states, at the states with these residuals] (two evaluations):
    the convergence measure every solver reports (module doc)."""
    on_residuals = ResidualEnergy(energy)
    return [_norm(on_residuals.start_gradient()),
            _norm(on_residuals.gradient(flatten(residuals))[0])]


def _gradient_descent(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """x ← x − η∇F, each step evaluated; a step that grows ‖∇F‖ is undone and η halved."""
    x, grad = energy.zeros(), energy.start_gradient()
    residuals = [torch.zeros_like(h) for h in energy.free]
    norm, eta, backoffs = _norm(grad), step_size, 0
    for _ in range(steps):
        candidate = x - eta * grad
        candidate_grad, candidate_residuals = energy.gradient(candidate)
        candidate_norm = _norm(candidate_grad)
        if not candidate_norm <= BACKOFF_GROWTH * norm:
            # ‖∇F‖ grew (or turned NaN): η exceeds 2/λ_max somewhere (a stiff model, e.g. a
            # ViT's small-norm CLS token). Within a stable η, ‖∇F‖ never grows on the
            # quadratic part of F; the 10% slack ignores rounding noise and the CE term's
            # curvature near convergence.
            eta, backoffs = eta / 2, backoffs + 1
            continue
        x, grad, residuals = candidate, candidate_grad, candidate_residuals
        norm = candidate_norm
    return x, residuals, residual_gradient_norms(energy, residuals), eta, backoffs


def _conjugate_gradients(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """Per-sample conjugate gradients over the displacements (:func:`_cg_iterations`), then
    the residuals at the returned state."""
    run = _cg_iterations(energy, steps - 1, step_size)
    _, residuals = energy.gradient(run.x)
    return run.x, residuals, residual_gradient_norms(energy, residuals), run.eta, run.backoffs


def _residual_conjugate_gradients(energy: NudgedEnergy, steps: int, step_size: float
                                  ) -> Trajectory:
    """Per-sample conjugate gradients over the residuals (:class:`ResidualEnergy`), then the
    states by one forward substitution, which also gives ∇_ρF there. A sample whose last
    iterate lies above its bound returns its best evaluated point instead (one more
    evaluation, only then)."""
    on_residuals = ResidualEnergy(energy)
    run = _cg_iterations(on_residuals, steps - 1, step_size)
    rho = run.x
    final_grad, deltas, values = on_residuals.evaluate(rho)
    if run.best is not None:
        above = run.best.above(values)
        if bool(above.any()):
            rho = torch.where(above, run.best.x, rho)
            final_grad, deltas, _ = on_residuals.evaluate(rho)
    return (flatten(deltas), energy.unflatten(rho), [run.start, _norm(final_grad)], run.eta,
            run.backoffs)


class BestPoints:
    """Per sample, the point of lowest F evaluated exactly so far, and the bound F(free).

    No equilibrium lies above the bound: F ≥ ½‖ρ‖² and F(0) is the free states' β·CE. A
    probe above it has left the region the relaxation must stay in, so the CG iterations
    send that sample back to its best point (:func:`_cg_iterations`). ``scale`` ``(B, 1)``
    is the magnitude the values are rounded on beyond their own (the energy's
    ``value_scale``); the bound sits :data:`BOUND_SLACK` rounding units above F(free).
    """

    def __init__(self, x: Tensor, grad: Tensor, value: Tensor, scale: Tensor) -> None:
        self.x, self.grad, self.value = x.clone(), grad.clone(), value.clone()
        rounding = value.abs() + scale
        self.bound = value + BOUND_SLACK * torch.finfo(value.dtype).eps * rounding

    def above(self, value: Tensor) -> Tensor:
        """``(B, 1)`` True where ``value`` exceeds the bound or is not finite."""
        return ~(value <= self.bound)

    def offer(self, x: Tensor, grad: Tensor, value: Tensor) -> None:
        """Keep (x, ∇F there, F there) for the samples it improves."""
        better = value < self.value
        self.x = torch.where(better, x, self.x)
        self.grad = torch.where(better, grad, self.grad)
        self.value = torch.where(better, value, self.value)


class CGRun(NamedTuple):
    x: Tensor
    start: float  # ‖∇F‖ at the start
    eta: float
    backoffs: int
    best: BestPoints | None  # when the energy gives per-sample values


def _cg_iterations(energy: Energy, iterations: int, step_size: float) -> CGRun:
    """Per-sample conjugate gradients with secant curvature (module doc).

    Each iteration probes q = ∇F(x + t·p). Per sample (rows of the flat tensors), with
    g = ∇F(x): the curvature along p is κ = pᵀ(q − g)/t (exact on the quadratic part of F),
    the step α = −pᵀg/κ, x ← x + α·p, and the gradient there g ← q + (α − t)·(q − g)/t,
    extrapolated linearly from the probe; then the Polak–Ribière+ direction
    p ← −g + max(0, gᵀ(g − g_old)/‖g_old‖²)·p. The probe length t is the sample's previous
    step α (at least η): probing about as far as the step will go keeps the extrapolation
    short and the difference q − g well above rounding. A sample stops once ‖g‖ is down to
    ``SETTLED``·eps of its start (further probes would measure rounding noise, and a step on a
    noisy secant throws it off its equilibrium), and the iterations end early once every
    sample has stopped. Where the energy gives per-sample values (over the residuals), a
    sample whose probe lands above F(free) — which no equilibrium can — goes back to its best
    evaluated point and steepest descent, its probe ¼ as long (:class:`BestPoints`). Buffers
    are updated in place (these (B, N) passes cost a tenth of a step).
    """
    x = energy.zeros()
    grad, value = energy.start()
    scale = energy.value_scale
    best = None if value is None or scale is None else BestPoints(x, grad, value, scale)
    start = _norm(grad)
    direction = -grad
    probe = torch.empty_like(x)
    grad_square = _rowdot(grad, grad)
    settled_square = (SETTLED * torch.finfo(x.dtype).eps) ** 2 * grad_square
    along = -grad_square  # pᵀg per sample
    eta, backoffs = step_size, 0
    length = torch.full_like(along, eta)
    for _ in range(iterations):
        probed, value = energy.probe(torch.addcmul(x, length, direction, out=probe))
        along_probe = _rowdot(direction, probed)
        curvature = (along_probe - along) / length
        above = None
        if best is not None and value is not None:
            best.offer(probe, probed, value)
            above = best.above(value)
            curvature.masked_fill_(above, 1.0)  # these samples restart below, not all
        if not bool(torch.isfinite(curvature).all()):
            # The probe left the region where F is finite (a stiff model): shorten it and
            # restart every direction from steepest descent.
            eta, backoffs = eta / 2, backoffs + 1
            direction, along, length = -grad, -grad_square, torch.full_like(along, eta)
            continue
        # F is convex near the free state, but not everywhere (E is a nonlinear least-squares
        # energy): where the curvature along p is not positive, step to the probe itself,
        # whose gradient is known exactly, and restart that sample's direction.
        convex = curvature > 0
        alpha = torch.where(convex, -along / torch.where(convex, curvature, 1.0), length)
        x.addcmul_(alpha, direction)
        # g_new = w·q + (1 − w)·g, w = α/t: linear extrapolation from the probe (exact at w = 1)
        weight = alpha / length
        new_grad = probed.mul_(weight).addcmul_(grad, 1.0 - weight)
        if above is not None and best is not None:  # (best is set whenever above is)
            x = torch.where(above, best.x, x)
            new_grad = torch.where(above, best.grad, new_grad)
        new_square = torch.linalg.vector_norm(new_grad, dim=1, keepdim=True).square()
        overlap = _rowdot(new_grad, grad)
        # Polak–Ribière+, restarted where the curvature was not positive or where successive
        # gradients are far from orthogonal (Powell's test: conjugacy is lost)
        restart = ~convex | (grad_square <= 0) | (overlap.abs() >= 0.2 * new_square)
        if above is not None:
            restart |= above
        ratio = (new_square - overlap) / torch.where(grad_square > 0, grad_square, 1.0)
        ratio = torch.where(restart, 0.0, ratio.clamp_min(0.0))
        direction.mul_(ratio).sub_(new_grad)
        settled = new_square <= settled_square
        direction.masked_fill_(settled, 0.0)  # probes of a stopped sample land on x itself
        # a direct dot product: from the ones at hand it would cancel catastrophically near
        # convergence (the old direction is then orthogonal to the new gradient)
        along = _rowdot(direction, new_grad)
        grad, grad_square = new_grad, new_square
        if above is None:
            length = alpha.clamp_min(eta)
        else:
            length = torch.where(above, length * BOUND_SHRINK, alpha.clamp_min(eta))
        if bool(settled.all()):
            break
    return CGRun(x, start, eta, backoffs, best)


# A solver maps (energy, steps, step size) to a Trajectory (above). Keys are the choices of
# method.ep_solver (benchmarks/bench_ep.py adds the baselines it measures against).
SOLVERS: dict[str, Callable[[NudgedEnergy, int, float], Trajectory]] = {
    "residual-cg": _residual_conjugate_gradients, "cg": _conjugate_gradients,
    "gd": _gradient_descent}


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample dot products of ``(B, N)`` tensors, as ``(B, 1)``."""
    return (a * b).sum(dim=1, keepdim=True)


def _norm(grad: Tensor) -> float:
    return float(torch.linalg.vector_norm(grad))
