"""Nudging test: does a step against the credit lower the loss?

At each deep state the credit is used as a descent direction: h_l ← h_l − η·â_l with
â = a/RMS(a) the credit's per-sample unit-RMS direction (RMS over the sample's entries, no eps
floor; a sample whose credit is exactly 0 does not move), and the network is run on from
state l. A useful credit lowers the mean loss (negative Δ); a random one leaves it unchanged
to first order. The same direction is used for a rule's credit and for its BP and random
controls, so Δ depends on the credit's direction only: it is the same for any positive
rescaling of the credit and for any chunking of the evaluation set into batches (credits in
the batch-mean convention scale with 1/batch). Computed on a float64 copy of the model by
default, because on a grown residual stream an η = 0.01 step changes the loss by less than
fp32 resolves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.diagnostics.perturbation import WorkingCopy

DEFAULT_ETAS = (0.01, 0.1)


def unit_rms(a: Tensor) -> Tensor:
    """a/RMS(a) per sample (RMS over every non-batch entry); exactly-zero samples stay 0.

    Each sample is divided by its largest |entry| first, so entries of 1e-200 neither
    underflow when squared nor lose the direction.
    """
    flat = a.flatten(1)
    peak = flat.abs().amax(dim=1, keepdim=True)
    scaled = flat / torch.where(peak > 0, peak, torch.ones_like(peak))
    rms = scaled.pow(2).mean(dim=1, keepdim=True).sqrt()
    return (scaled / torch.where(rms > 0, rms, torch.ones_like(rms))).view_as(a)


def eta_key(eta: float) -> str:
    """The record key of a step size: ``0.01`` → ``"0.01"`` (shortest round-trip repr)."""
    return repr(float(eta))


@torch.no_grad()
def nudging_deltas(model: nn.Module, x: Tensor, y: Tensor, credits: Sequence[Tensor],
                   etas: Sequence[float] = (0.01,), layers: Sequence[int] | None = None, *,
                   dtype: torch.dtype | None = torch.float64,
                   working: WorkingCopy | None = None) -> dict[str, list[float]]:
    """Δ mean CE = CE(h_l − η·â_l) − CE(h_l) per step size and layer.

    ``model`` meets the contract; ``x`` ``(N, …)``, ``y`` ``(N,)``; ``credits[l]`` has the
    full shape of h_l (any scale: only its direction per sample matters, see
    :func:`unit_rms`). ``layers`` defaults to the deep states 1 … L. The loss is the mean
    per-sample cross-entropy over the N samples (nats). Returns ``{"0.01": [Δ_l for l in
    layers], …}``; negative Δ means the credit is a descent direction. ``dtype=None`` runs
    the caller's model as it is (eval mode assumed); otherwise a copy in ``dtype``.
    ``working``: a :class:`~creditaudit.diagnostics.perturbation.WorkingCopy` of ``model``
    on ``x`` to reuse (``dtype`` is then ignored).
    """
    w = working or WorkingCopy.of(model, x, y, dtype)
    work, states = w.model, w.states
    before = F.cross_entropy(w.logits, y)
    layers = list(range(1, len(states))) if layers is None else list(layers)
    out: dict[str, list[float]] = {}
    for eta in etas:
        deltas = []
        for layer in layers:
            h = states[layer]
            step = unit_rms(credits[layer].to(device=h.device, dtype=h.dtype))
            after = F.cross_entropy(work.forward_from(layer, h - eta * step), y)
            deltas.append(float(after - before))
        out[eta_key(eta)] = deltas
    return out
