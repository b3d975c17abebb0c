"""What the training loop needs of stacked and captured steps: the runs a stack is made of
(:class:`StackMember`), whether data stay on the device, and whether a run's step is captured
in a CUDA graph (:func:`cuda_graphs_decision`).

The stacked step itself — K runs of one shape as one vmapped model — is the rules' own
(:mod:`creditaudit.methods.stacked`), where the conformance suite checks it against each
rule's ``train_step``; its names stay importable from here for code written before the
move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from creditaudit.data.loader import InMemoryLoader
from creditaudit.methods import CreditRule
from creditaudit.methods.stacked import (
    StackedStep,
    StepTensors,
    stack_refusal,
    stacked_rule_names,
)


def uses_device_data(setting: str, device: torch.device) -> bool:
    """``run.device_data`` resolved: ``auto`` is on for CUDA devices."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


@dataclass(frozen=True)
class GraphDecision:
    """``run.cuda_graphs`` resolved for one run: ``on``, and ``text`` for its record."""

    on: bool
    text: str



# The captured optimiser's fused kernel reads the learning rate from a float32 tensor.
LARGEST_CAPTURED_RATE = torch.finfo(torch.float32).max
# What a run whose step could be captured records when a run stacked with it cannot be.
STACKED_WITH_UNCAPTURED = GraphDecision(
    False, "off (stacked with a run whose step cannot be captured)")


def cuda_graphs_decision(setting: str, device: torch.device, rule: CreditRule,
                         lr: float = 0.0) -> GraphDecision:
    """Whether the run's training step is captured in a CUDA graph (``auto``: on for CUDA
    runs whose step can be captured), with the reason when it is not. ``lr``: the run's
    largest learning rate (``optim.lr``; the schedules only lower it)."""
    if setting == "off":
        return GraphDecision(False, "off (run.cuda_graphs = off)")
    if device.type != "cuda" or not torch.cuda.is_available():
        return GraphDecision(False, "off (not a CUDA run)")
    if any(p.dtype == torch.float64 for p in rule.trainable_parameters()):
        # The eager step's rate is a Python float; a float32 one would round lr 1e-3 by 4.7e-8.
        return GraphDecision(False, "off (a float64 run: the captured step holds its "
                                    "learning rate in float32)")
    if not abs(lr) <= LARGEST_CAPTURED_RATE:
        return GraphDecision(False, f"off (learning rate {lr:g} is beyond float32, in which "
                                    "a captured step holds it)")
    refusal = stack_refusal(rule)
    if refusal is not None:
        return GraphDecision(False, f"off ({refusal})")
    return GraphDecision(True, "on")


class StackMember(Protocol):
    """What stacked epochs need of each run (a :class:`~creditaudit.run.trainer.Trainer`):
    what :class:`~creditaudit.methods.stacked.StackedStep` needs, and the run's schedule,
    data, config, record and loggers."""

    rule: CreditRule
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_loader: InMemoryLoader
    data_generator: torch.Generator
    device: torch.device
    config: Any
    record: Any
    loggers: Any


__all__ = ["stacked_rule_names", "StackedStep", "StepTensors", "StackMember",
           "GraphDecision", "STACKED_WITH_UNCAPTURED", "stack_refusal",
           "uses_device_data", "cuda_graphs_decision"]
