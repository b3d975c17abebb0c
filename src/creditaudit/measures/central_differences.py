"""The verdict of one comparison: does a backward agree with central differences of the
forward? Used by the reference check (:mod:`creditaudit.measures.reference_check`).

Finite differences are judged by their own accuracy. Steps are relative to the state
(s = δ·‖h‖ per sample, so a stream grown to 1e7 is probed like one of norm 1), at five sizes
δ ∈ :data:`STEPS`: large steps lose to curvature, small ones to rounding. The uncertainty of
the difference at one step is its distance from the next larger step's plus the float64
rounding of the losses it subtracts (:data:`ROUNDING_ULPS` ulps of the largest logit).
Where that is below :data:`PRECISION` of the compared values, the backward *agrees* when it
is within ten uncertainties (and at most :data:`TOLERANCE`, relative, when the difference is
more precise than that) and *disagrees* otherwise; where no step is that precise — the loss
of a saturated softmax is flat in float64 — the comparison says nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

STEPS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)  # relative central-difference steps, largest first
TOLERANCE = 1e-6  # relative disagreement that refuses, where differences resolve it
PRECISION = 1e-3  # a difference less certain than this (relative) says nothing
ROUNDING_ULPS = 64  # the rounding of one loss value: ulps of its largest logit
F64 = torch.float64

Difference = Callable[[float, Tensor], tuple[Tensor, Tensor]]


def _as64(x: Tensor) -> Tensor:
    return x.to(F64) if x.is_floating_point() else x


def _verdicts(backward: Tensor, forward: Tensor, noise: Tensor) -> Tensor:
    """+1 (agrees), −1 (disagrees) or 0 (says nothing) per comparison.

    ``backward`` ``(P,)``: ⟨autograd's gradient, direction⟩; ``forward`` ``(2, P)``: the
    central differences at two adjacent :data:`STEPS` (larger first); ``noise`` ``(2, P)``:
    their rounding error; all in the same units.
    """
    estimate = forward[1]
    uncertainty = (estimate - forward[0]).abs() + noise[1] + noise[0]
    size = backward.abs() + estimate.abs()
    precise = (size > 0) & (uncertainty <= PRECISION * size)
    off = (backward - estimate).abs() > torch.maximum(TOLERANCE * size, 10 * uncertainty)
    return torch.where(precise, torch.where(off, -1, 1), 0)


def _compared(backward: Tensor, difference: Difference) -> Tensor:
    """+1, −1 or 0 per comparison of ``backward`` ``(P,)`` with the central differences
    ``difference(δ, which) -> (values, rounding)`` of the comparisons ``which`` (indices),
    taken at the :data:`STEPS` from the largest down. A comparison that agrees at one pair
    of adjacent steps agrees, and leaves the running (so a healthy model costs two or three
    steps); one that disagrees at every precise pair disagrees: a kink of ReLU or max
    crossed by the larger steps spoils those, not the smaller ones."""
    agreed = torch.zeros(backward.shape, dtype=torch.bool, device=backward.device)
    disagreed = torch.zeros_like(agreed)
    running = torch.arange(backward.shape[0], device=backward.device)
    previous = difference(STEPS[0], running)
    for delta in STEPS[1:]:
        current = difference(delta, running)
        verdicts = _verdicts(backward[running], torch.stack([previous[0], current[0]]),
                             torch.stack([previous[1], current[1]]))
        agreed[running[verdicts > 0]] = True
        disagreed[running[verdicts < 0]] = True
        going_on = verdicts <= 0
        running = running[going_on]
        if running.numel() == 0:
            break
        previous = (current[0][going_on], current[1][going_on])
    return torch.where(agreed, 1, torch.where(disagreed, -1, 0))


def _disagree(verdicts: Tensor) -> bool:
    """A group of comparisons disagrees when at least as many disagree as agree (the odd
    comparison may cross a kink at every step; a wrong backward makes most of them)."""
    bad, good = int((verdicts < 0).sum()), int((verdicts > 0).sum())
    return bad > 0 and bad >= good
