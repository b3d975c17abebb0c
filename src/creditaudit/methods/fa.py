"""Feedback Alignment: exact credit at h_L, then a_l = B_l a_{l+1} with fixed random B_l."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods.base import StepResult, loss_precision, step_result
from creditaudit.methods.feedback import FixedFeedbackRule, LocalFeedbackOptions, state_width
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import local_backward, local_forward
from creditaudit.models.contract import ResidualNet, feature_rows, from_feature_rows


def readout_gradient(model: ResidualNet, h_last: Tensor, y: Tensor, *, create_graph: bool = False
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """(a_L = ∂CE/∂h_L through the readout, logits, batch-mean CE) on a detached h_L.

    The readout's own parameter graph is kept (``retain_graph``) so the caller can still
    backpropagate CE into the readout parameters.
    """
    h = h_last.detach().requires_grad_(True)
    with torch.enable_grad():
        logits = checked_logits(model, model.readout(h), y)
        ce = F.cross_entropy(loss_precision(logits), y)
        (grad,) = torch.autograd.grad(ce, h, retain_graph=True, create_graph=create_graph)
    return grad.detach(), logits, ce


@register
class FA(FixedFeedbackRule[LocalFeedbackOptions]):
    """``feedback[l]`` is a d×d matrix B_l; per sample a_l = a_{l+1} @ B_lᵀ (column form B_l a).

    With B_l set to the transposed Jacobian of block l (e.g. (I + W_l)ᵀ in a linear
    residual net) the credits are exactly backprop's.
    """

    name = "fa"
    residual_reason = ("its d×d B_l stands for one block's whole Jacobian, skip included "
                       "(per-layer FA on any model: fa-linear)")
    label = "FA"
    credit_formula = "a_l = B_l a_{l+1}, a_L exact"
    local = True
    color, marker = "#F1932D", "s"
    rank = 10
    stacked_step = "fa"

    def feedback_shapes(self) -> list[tuple[int, ...]]:
        d = state_width(self.model)
        return [(d, d)] * self.model.n_blocks

    def propagate(self, top: Tensor) -> list[Tensor]:
        """[a_0 … a_L] from a_L by the fixed feedback chain, along the feature axis (per
        token of token states, per position of feature maps)."""
        rows = [feature_rows(top)]
        for b in reversed(self.feedback):
            rows.append(rows[-1] @ b.to(device=top.device, dtype=top.dtype).T)
        return [from_feature_rows(a, top) for a in rows[::-1]]

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, _ = self.model.forward_states(x)
        top, _, _ = readout_gradient(self.model, states[-1], y)
        return self.propagate(top)

    def credits_under(self, x: Tensor, y: Tensor, feedbacks: Iterable[list[Tensor]]
                      ) -> Iterator[list[Tensor]]:
        """One forward pass for every feedback set: a_L is exact, only the chain below it
        uses the feedback."""
        with torch.no_grad():
            states, _ = self.model.forward_states(x)
            top, _, _ = readout_gradient(self.model, states[-1], y)
        for feedback in feedbacks:
            with self.using_feedback(feedback), torch.no_grad():
                yield self.propagate(top)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x, with_readout=False)
            top, logits, ce = readout_gradient(self.model, local.states[-1], y)
            local.logits = logits
            credit_grads = [self.credit_gradient(a, y.shape[0]) for a in self.propagate(top)]
        result = step_result(ce, logits, y, local.states[-1])
        if result.finite:
            # ce's readout graph was kept by readout_gradient: the readout params get ∂CE.
            local_backward(local, ce, credit_grads, self.options.penalty)
            optimizer.step()
        return result
