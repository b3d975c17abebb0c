"""The reference check's look at a state that sits on a kink itself
(:mod:`creditaudit.measures.reference_check`): states taken at ReLU outputs hold exact
zeros whatever the input, and the max-pool or ReLU after them is tied there. Beside the
state the backward is compared with central differences through ``forward_from`` (once
that backward at the state is the one ``states_fn`` gives: :func:`same_backward`); on the
state itself, along its zeros, with the slope of each side of the kink
(:func:`zeros_verdicts`)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.measures.central_differences import _compared
from creditaudit.measures.model_copies import StatesNet


def gradient_from(work: StatesNet, layer: int, h: Tensor, y: Tensor) -> Tensor:
    """∂CE/∂h of the network run on from state ``h`` ``(k, …)`` at ``layer`` (labels ``y``)
    through ``work.forward_from``: zero where the loss does not depend on it."""
    with torch.enable_grad():
        h = h.detach().requires_grad_(True)
        loss = F.cross_entropy(work.forward_from(layer, h), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, [h], allow_unused=True)
    return torch.zeros_like(h) if g is None else g.detach()


def same_backward(g: Tensor, other: Tensor) -> bool:
    """Whether two float64 gradients ``(k, …)`` at the same state are the same backward's,
    per probe up to rounding (1e-9 of the larger norm): ``forward_states``' and
    ``forward_from``'s, which a hook or a ``torch.autograd.Function`` in one only would set
    apart. NaN/Inf anywhere is not the same."""
    diff = torch.linalg.vector_norm((g - other).flatten(1), dim=1)
    scale = torch.maximum(torch.linalg.vector_norm(g.flatten(1), dim=1),
                          torch.linalg.vector_norm(other.flatten(1), dim=1))
    return bool((diff <= 1e-9 * scale).all())


def step_scale(flat_h: Tensor) -> Tensor:
    """What the relative steps of a state ``(k, D)`` scale with, per probe ``(k,)``: its
    norm, or 1 for a zero state (steps absolute)."""
    h_norm = torch.linalg.vector_norm(flat_h, dim=1)
    return torch.where(h_norm > 0, h_norm, torch.ones_like(h_norm))


def zeros_verdicts(work: StatesNet, layer: int, h: Tensor, g: Tensor, y: Tensor,
                    floor: Tensor) -> Tensor:
    """Verdicts ``(k,)`` of the backward ``g`` at state ``h`` ``(k, …)`` along w, the unit
    direction that moves its exact zeros alike (0 for a probe without any): a kink there
    (a ReLU, the tied windows of a max-pool) has a slope on each side of h along w, and a
    backward that is a gradient's limit agrees with one of them (torch's ReLU with the
    lower, a max-pool with both); one that agrees with neither is not the gradient where
    the data puts the state. ``floor`` ``(k,)``: the rounding of each loss."""
    flat_h = h.flatten(1)
    zeros = (flat_h == 0).to(h.dtype)
    count = zeros.sum(dim=1)
    w = (zeros / count.clamp_min(1).sqrt().unsqueeze(1)).view_as(h)
    backward = (g * w).flatten(1).sum(dim=1).cpu()
    h_norm = step_scale(flat_h)
    with torch.no_grad():
        at_h = F.cross_entropy(work.forward_from(layer, h), y, reduction="none")

    def side(sign: float) -> Tensor:
        def difference(delta: float, which: Tensor) -> tuple[Tensor, Tensor]:
            which = which.to(h.device)
            step = delta * h_norm[which]
            rows = h[which] + sign * step.view(-1, *[1] * (h.dim() - 1)) * w[which]
            with torch.no_grad():
                ce = F.cross_entropy(work.forward_from(layer, rows), y[which],
                                     reduction="none")
            return ((ce - at_h[which]) * sign / step).cpu(), (2 * floor[which] / step).cpu()
        return _compared(backward, difference)

    up, down = side(1.0), side(-1.0)
    verdicts = torch.where((up > 0) | (down > 0), 1, torch.where((up < 0) & (down < 0), -1, 0))
    return torch.where(count.cpu() > 0, verdicts, 0)
