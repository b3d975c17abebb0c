"""Backpropagation (and the frozen-blocks baseline, which is BP with blocks frozen)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods.base import (
    CreditRule,
    StepResult,
    branch_penalty,
    loss_precision,
    step_result,
)
from creditaudit.methods.registry import register
from creditaudit.models.contract import ResidualNet, block_is_trainable


def forward_with_branches(model: ResidualNet, x: Tensor) -> tuple[list[Tensor], list[Tensor],
                                                                  Tensor]:
    """End-to-end forward keeping states and branch outputs in the graph."""
    h = model.embed(x)
    states, branches = [h], []
    for block in model.blocks:
        f = block(h)
        branches.append(f)
        h = model.next_state(h, f)
        states.append(h)
    return states, branches, model.readout(h)


def bp_state_gradients(model: ResidualNet, x: Tensor, y: Tensor) -> list[Tensor]:
    """g_l = ∂CE/∂h_l for the batch-mean CE, l = 0 … L (detached, shaped like h_l).

    Leaves every parameter's ``.grad`` untouched (gradients are taken w.r.t. states only).
    """
    with torch.enable_grad():
        states, logits = model.forward_states(x)
        ce = F.cross_entropy(logits, y)
        grads = torch.autograd.grad(ce, states)
    return [g.detach() for g in grads]


@register
class BP(CreditRule):
    """a_l = g_l exactly; every parameter trained by end-to-end backprop of CE + λΣ‖f_l‖²."""

    name = "bp"
    label = "BP"
    credit_formula = "a_l = g_l (backprop)"
    feedback_kind = "symmetric"
    color, marker = "#2166ac", "o"
    rank = 0

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        return bp_state_gradients(self.model, x, y)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            states, branches, logits = forward_with_branches(self.model, x)
            ce = F.cross_entropy(loss_precision(logits), y)
            objective = ce
            if self.config.penalty > 0:
                # Only trainable blocks are penalised: a frozen block's branch still carries
                # a graph to the embedding, and its ‖f‖² must not train it.
                trainable = [f if block_is_trainable(block) else None
                             for f, block in zip(branches, self.model.blocks)]
                objective = ce + self.config.penalty * branch_penalty(trainable)
        result = step_result(ce, logits, y, states[-1])
        if result.finite:
            objective.backward()
            optimizer.step()
        return result
