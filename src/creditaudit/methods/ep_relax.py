"""EP's nudged phase: relaxing the states on E + β·CE by conjugate gradients or gradient descent.

The free energy of the nudged phase, for displacements δ_l = h_l^nudged − h_l^free of the
states h_0 … h_L (per sample, summed over the batch; see :mod:`creditaudit.methods.ep`):

    F(δ) = ½‖δ_0‖² + ½ Σ_l ‖r_l‖² + β·Σ_i CE_i(readout(h_L + δ_L)),
    r_l = δ_{l+1} − δ_l − (f_l(h_l + δ_l) − f_l(h_l))     (no "− δ_l" without skips).

Its Hessian at δ = 0 is JᵀJ (+ β·∇²CE at the last state), J the Jacobian of the residuals:
identity blocks on the diagonal, −(I + ∂f_l/∂h_l) below it. For near-identity blocks this
is a chain Laplacian over the L + 1 states, eigenvalues in (0, 4); at L = 4 the smallest is
4·sin²(π/22) ≈ 0.08, so gradient descent at η = 0.25 shrinks the slowest mode by only 2% per
step, and 20 steps leave the layers near the input far from equilibrium. Trained blocks
(‖I + ∂f/∂h‖ up to 2) are stiffer still: the dense JᵀJ of single samples of a d=256 L=4
ResidualMLP had condition numbers 150–350 after 3 epochs of BP on Fashion-MNIST, 65–70 at
init.

Solvers (``method.ep_solver``):

- ``"cg"`` (default): conjugate gradients, run independently for every sample (F is a sum
  of per-sample energies, so each sample gets its own step sizes and its relaxation never
  depends on the rest of the batch unless η backs off). The curvature pᵀHp along each
  direction p is measured by one gradient probe, ∇F(x + t·p) − ∇F(x) = t·Hp on the
  quadratic part of F, which gives the exact line-search step α = −pᵀ∇F/pᵀHp; the gradient
  at the new iterate is extrapolated linearly from the probe. So a step costs what a
  gradient-descent step costs (one forward and one input-gradient pass through the blocks)
  plus a few (B, N) vector operations, and converges like CG, in about √κ instead of κ
  steps, with no estimate of the spectrum (heavy-ball and Nesterov momentum need one, and
  tuned on fresh blocks they diverge on trained ones). Its fixed point is gradient descent's:
  the iteration stops only where the probed gradient vanishes. The probe length t is the
  sample's previous step (at least η), so η only sets the first probe.
- ``"gd"``: plain gradient descent with step size η. Whenever ‖∇F‖ at a new iterate
  exceeds 1.1 × ‖∇F‖ at the current one (η beyond 2/λ_max somewhere, e.g. a fresh ViT's
  near-zero CLS token; or a NaN), the iterate is rejected and η halved for the rest of the
  relaxation.

Both start from the exact gradient at the free states, ∇F(0) = (0, …, 0, β·∂CE/∂h_L)
(every r_l is exactly 0 there), so ``steps`` steps cost ``steps`` forward-and-input-gradient
passes through the blocks, and both end with the gradient at the returned state: the
recorded ``grad_ratio`` is exactly ‖∇F(returned state)‖ / ‖∇F(free state)‖. (For CG it need
not fall monotonically: CG minimises the error in the energy norm, which is the error of the
residuals r and hence of the credits, not ‖∇F‖.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.config import EP_SOLVERS
from creditaudit.errors import ConfigError
from creditaudit.models.contract import ResidualNet

BACKOFF_GROWTH = 1.1  # ‖∇F‖ may grow by 10% in one step before η is halved


@dataclass
class Relaxation:
    """Result of one nudged phase.

    ``states`` are the free h_0 … h_L (relaxation dtype), ``deltas`` the displacements
    h^nudged − h^free, ``residuals`` [r_{−1} = δ_0, r_0, …, r_{L−1}] at the nudged states
    (all detached, summed-energy scale). ``grad_norms``: ‖∇F‖ over the batch at the free
    state first and at the returned state last (gd: after every accepted step between);
    ``grad_ratio`` = last / first; ``final_step_size``: η after any back-off;
    ``backoffs``: how many times η (gd's step, cg's probe) was halved.
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


class NudgedEnergy:
    """F(δ) of one batch, evaluated on flat displacements x: ``(B, N)``, N = Σ_l numel(h_l[i]).

    ``free`` are the free states h_0 … h_L (relaxation dtype), ``y`` ``(B,)`` labels.
    """

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
        logits = self.model.readout(self.free[-1] + delta_last)
        return self.beta * F.cross_entropy(logits, self.y, reduction="sum")


def relax(model: ResidualNet, states: list[Tensor], y: Tensor, *, beta: float, steps: int,
          step_size: float, solver: str = "cg") -> Relaxation:
    """Nudged phase: ``steps`` gradient evaluations of ``solver`` on E + β·Σ_i CE_i.

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


Trajectory = tuple[Tensor, list[Tensor], list[float], float, int]


def _gradient_descent(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """x ← x − η∇F, each step evaluated; a step that grows ‖∇F‖ is undone and η halved."""
    x, grad = energy.zeros(), energy.start_gradient()
    residuals = [torch.zeros_like(h) for h in energy.free]
    norms, eta, backoffs = [_norm(grad)], step_size, 0
    for _ in range(steps):
        candidate = x - eta * grad
        candidate_grad, candidate_residuals = energy.gradient(candidate)
        norm = _norm(candidate_grad)
        if not norm <= BACKOFF_GROWTH * norms[-1]:
            # ‖∇F‖ grew (or turned NaN): η exceeds 2/λ_max somewhere (a stiff model, e.g. a
            # ViT's small-norm CLS token). Within a stable η, ‖∇F‖ never grows on the
            # quadratic part of F; the 10% slack ignores rounding noise and the CE term's
            # curvature near convergence.
            eta, backoffs = eta / 2, backoffs + 1
            continue
        x, grad, residuals = candidate, candidate_grad, candidate_residuals
        norms.append(norm)
    return x, residuals, norms, eta, backoffs


def _conjugate_gradients(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """Per-sample conjugate gradients with secant curvature (module doc).

    ``steps − 1`` iterations, each probing q = ∇F(x + t·p), and a last evaluation at the
    returned state. Per sample (rows of the flat tensors), with g = ∇F(x): the curvature
    along p is κ = pᵀ(q − g)/t (exact on the quadratic part of F), the step α = −pᵀg/κ,
    x ← x + α·p, and the gradient there g ← q + (α − t)·(q − g)/t, extrapolated linearly
    from the probe; then the Polak–Ribière+ direction p ← −g + max(0, gᵀ(g − g_old)/‖g_old‖²)·p.
    The probe length t is the sample's previous step α (at least η): probing about as far
    as the step will go keeps the extrapolation short and the difference q − g well above
    rounding. Buffers are updated in place (these (B, N) passes cost a tenth of a step).
    """
    x, grad = energy.zeros(), energy.start_gradient()
    direction = -grad
    probe = torch.empty_like(x)
    grad_square = _rowdot(grad, grad)
    along = -grad_square  # pᵀg per sample
    eta, backoffs = step_size, 0
    length = torch.full_like(along, eta)
    norms = [_norm(grad)]
    for _ in range(steps - 1):
        probed, _ = energy.gradient(torch.addcmul(x, length, direction, out=probe))
        along_probe = _rowdot(direction, probed)
        curvature = (along_probe - along) / length
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
        new_square = torch.linalg.vector_norm(new_grad, dim=1, keepdim=True).square()
        overlap = _rowdot(new_grad, grad)
        # Polak–Ribière+, restarted where the curvature was not positive or where successive
        # gradients are far from orthogonal (Powell's test: conjugacy is lost)
        restart = ~convex | (grad_square <= 0) | (overlap.abs() >= 0.2 * new_square)
        ratio = (new_square - overlap) / torch.where(grad_square > 0, grad_square, 1.0)
        ratio = torch.where(restart, 0.0, ratio.clamp_min(0.0))
        direction.mul_(ratio).sub_(new_grad)
        # a direct dot product: from the ones at hand it would cancel catastrophically near
        # convergence (the old direction is then orthogonal to the new gradient)
        along = _rowdot(direction, new_grad)
        grad, grad_square = new_grad, new_square
        length = alpha.clamp_min(eta)
    final_grad, residuals = energy.gradient(x)
    norms.append(_norm(final_grad))
    return x, residuals, norms, eta, backoffs


# A solver maps (energy, steps, step size) to (x, residuals at x, ‖∇F‖ at the start and at x,
# final η, back-offs). Keys are the choices of method.ep_solver (benchmarks/bench_ep.py adds
# the baselines it measures against).
SOLVERS: dict[str, Callable[[NudgedEnergy, int, float], Trajectory]] = {
    "cg": _conjugate_gradients, "gd": _gradient_descent}


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample dot products of ``(B, N)`` tensors, as ``(B, 1)``."""
    return (a * b).sum(dim=1, keepdim=True)


def _norm(grad: Tensor) -> float:
    return float(torch.linalg.vector_norm(grad))
