"""What a rule's training step reports (:class:`StepResult`: the batch's loss, how many it
got right, whether the step stayed finite) and how a step summarises itself
(:func:`step_result`, with :func:`all_finite` to check a state without a device-wide
temporary). The trainer counts an epoch's accuracy and loss from these and stops a run that
diverged. Importable from :mod:`creditaudit.methods.base` too."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class StepResult:
    """What one training step reports: batch-mean CE, correct count, batch size, finiteness."""

    loss: float
    correct: int
    n: int
    finite: bool


def all_finite(tensor: Tensor) -> bool:
    """Whether every entry of a floating ``tensor`` is finite (True when it is empty).

    From its minimum and maximum, which NaN and ±Inf reach: one pass without a temporary,
    where ``isfinite(t).all()`` takes five (168 µs against 9 µs for a 128×512 state on one
    CPU thread — 1% of a plain MLP's training step).
    """
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor.detach())
    return math.isfinite(float(low)) and math.isfinite(float(high))


def step_result(loss: Tensor, logits: Tensor, y: Tensor, *extra_finite: Tensor) -> StepResult:
    """Summarise a step; non-finite loss or state marks divergence."""
    loss_value = float(loss.detach())
    finite = math.isfinite(loss_value) and all(all_finite(t) for t in extra_finite)
    correct = int((logits.detach().argmax(dim=1) == y).sum())
    return StepResult(loss=loss_value, correct=correct, n=int(y.shape[0]), finite=finite)


__all__ = ["StepResult", "all_finite", "step_result"]
