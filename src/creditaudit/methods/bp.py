"""Backpropagation: the exact-gradient rules (BP, and the frozen-blocks baseline beside it)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods import adapted
from creditaudit.methods.base import (
    CreditRule,
    NoRuleOptions,
    RuleOptions,
    RuleOptionsT,
    StepResult,
    loss_precision,
    step_result,
)
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import branch_penalty
from creditaudit.models.adapted import AdaptedModel
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
        ce = F.cross_entropy(checked_logits(model, logits, y), y)
        grads = torch.autograd.grad(ce, states)
    return [g.detach() for g in grads]


class BackpropRule(CreditRule[RuleOptionsT]):
    """What BP and the frozen-blocks baseline share (not a rule of its own): credits are the
    exact state gradients g_l, and whatever trains is trained by end-to-end backprop of
    CE + λΣ‖f_l‖². Code that means "credit by backprop" (BP or frozen) tests this class."""

    feedback_kind = "symmetric"
    adapted_models = True

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        return bp_state_gradients(self.model, x, y)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        return end_to_end_step(self, x, y, optimizer)


@register
class BP(BackpropRule[NoRuleOptions]):
    """a_l = g_l exactly; every parameter trained by end-to-end backprop of CE + λΣ‖f_l‖²."""

    name = "bp"
    label = "BP"
    credit_formula = "a_l = g_l (backprop)"
    color, marker = "#1965B0", "o"
    rank = 0
    stacked_step = "end_to_end"


def end_to_end_objective(model: ResidualNet, x: Tensor, y: Tensor, penalty: float
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(objective, batch-mean CE, logits, h_L) of end-to-end training: CE + λΣ_l‖f_l‖².

    The objective keeps its whole graph; its ``backward()`` is the training step's (exact
    for BP, with replaced weight transposes for the rules of :mod:`linear_feedback`). On an
    adapted model the penalty acts on the state increments (:mod:`.adapted`).
    """
    if isinstance(model, AdaptedModel):
        return adapted.end_to_end_objective(model, x, y, penalty)
    states, branches, logits = forward_with_branches(model, x)
    ce = F.cross_entropy(loss_precision(checked_logits(model, logits, y)), y)
    objective = ce
    if penalty > 0:
        # Only trainable blocks are penalised: a frozen block's branch still carries a graph
        # to the embedding, and its ‖f‖² must not train it.
        trainable = [f if block_is_trainable(block) else None
                     for f, block in zip(branches, model.blocks)]
        objective = ce + penalty * branch_penalty(trainable)
    return objective, ce, logits, states[-1]


def end_to_end_step(rule: CreditRule[RuleOptions], x: Tensor, y: Tensor,
                    optimizer: torch.optim.Optimizer,
                    graph: contextlib.AbstractContextManager[Any] | None = None) -> StepResult:
    """One end-to-end training step of ``rule``: the objective of
    :func:`end_to_end_objective` built under the rule's autocast (and inside ``graph``, e.g.
    :func:`linear_feedback.replaced_backward`, which decides what its backward computes), then
    its backward and the optimiser's step — both skipped when the loss is not finite.

    The backward runs inside ``graph`` too: a network that recomputes part of its forward in
    the backward pass (``torch.utils.checkpoint``) recomputes it as the forward ran, with
    the rule's replaced layers — outside, the recomputed layers would save W where the
    graph holds B, and those layers would train on backprop's signal."""
    optimizer.zero_grad(set_to_none=True)
    with graph or contextlib.nullcontext():
        with rule.autocast():
            objective, ce, logits, h_last = end_to_end_objective(rule.model, x, y,
                                                                 rule.options.penalty)
        result = step_result(ce, logits, y, h_last)
        if result.finite:
            objective.backward()
    if result.finite:
        optimizer.step()
    return result
