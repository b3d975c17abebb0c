"""Direct Feedback Alignment, a_l = B_lᵀ e with a fixed random B_l (C × d) per state, and
what it shares with DRTP (:class:`DirectFeedbackRule`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods import adapted
from creditaudit.methods.base import StepResult, output_error, step_result
from creditaudit.methods.feedback import FixedFeedbackRule, LocalFeedbackOptions, state_width
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.projected import credit_scales, projected_backward, projected_forward
from creditaudit.methods.registry import register
from creditaudit.methods.surrogate import state_credit_shape
from creditaudit.models.adapted import AdaptedModel

LocalFeedbackT = TypeVar("LocalFeedbackT", bound=LocalFeedbackOptions, covariant=True)


class DirectFeedbackRule(FixedFeedbackRule[LocalFeedbackT]):
    """What DFA and DRTP share (not a rule of its own): every state gets a (B, C) signal
    projected by its own fixed random matrix, a_l = s @ feedback[l].

    ``feedback[l]`` has shape (C, d); a_l = s @ feedback[l] per sample (row form of B_lᵀ s),
    broadcast over the tokens of token states. The signal s (:meth:`projected_signal`, each
    rule's own) is detached, so nothing flows backwards through the network: one backward
    call trains every module locally, through the projected outputs where a module ends in a
    Linear (:mod:`.projected`). On an adapted model B_l is (C, d_l) for each state's own
    width and every state's output takes its credit in one backward pass
    (:func:`.adapted.projected_local_step`).
    """

    local = True
    adapted_models = True
    Options = LocalFeedbackOptions  # for a subclass that names no options

    def feedback_shapes(self) -> list[tuple[int, ...]]:
        if isinstance(self.model, AdaptedModel):
            return adapted.state_feedback_shapes(self.model, self.n_classes)
        return [(self.n_classes, state_width(self.model))] * (self.model.n_blocks + 1)

    def stacked_credits(self, error: Tensor) -> Tensor:
        """(B, L+1, d): every state's credit e @ B_l from one matmul with [B_0 … B_L]."""
        stacked = torch.cat(self.feedback, dim=1).to(device=error.device, dtype=error.dtype)
        return (error @ stacked).view(error.shape[0], len(self.feedback), -1)

    def projected_signal(self, logits: Tensor, y: Tensor) -> Tensor:
        """(B, C): what the feedback matrices project, from the (B, C) logits and (B,)
        labels (each rule's own)."""
        raise NotImplementedError

    def credits_from_error(self, error: Tensor, states: list[Tensor]) -> list[Tensor]:
        """[a_0 … a_L], each shaped like its state (broadcast over tokens)."""
        if isinstance(self.model, AdaptedModel):  # states of different widths
            return adapted.projected_credits(error, self.feedback, states)
        return [state_credit_shape(a, h)
                for a, h in zip(self.stacked_credits(error).unbind(1), states)]

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, logits = self.model.forward_states(x)
        return self.credits_from_error(self.projected_signal(logits, y), states)

    def credits_under(self, x: Tensor, y: Tensor, feedbacks: Iterable[list[Tensor]]
                      ) -> Iterator[list[Tensor]]:
        """One forward pass for every feedback set: the projected signal does not depend
        on the feedback."""
        with torch.no_grad():
            states, logits = self.model.forward_states(x)
            signal = self.projected_signal(logits, y)
        for feedback in feedbacks:
            with self.using_feedback(feedback), torch.no_grad():
                yield self.credits_from_error(signal, states)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        if isinstance(self.model, AdaptedModel):
            return adapted.projected_local_step(self, x, y, optimizer)
        # The credits have rank C, so modules whose output is a Linear's take their update
        # from the projected output (methods/projected.py): no d-wide weight product.
        optimizer.zero_grad(set_to_none=True)
        penalty = self.options.penalty
        with self.autocast():
            local = projected_forward(self.model, x, self.feedback, keep_branches=penalty > 0)
            ce = F.cross_entropy(checked_logits(self.model, local.logits, y), y)
            signal = self.projected_signal(local.logits, y)
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            scales = credit_scales(signal, self.feedback, y.shape[0],
                                   normalise=self.options.normalise_credit)
            projected_backward(local, ce, signal, scales, self.feedback, penalty)
            optimizer.step()
        return result


@register
class DFA(DirectFeedbackRule[LocalFeedbackOptions]):
    """Every state gets the output error projected by its own fixed random matrix:
    a_l = e @ feedback[l], e the (B, C) output error (:class:`DirectFeedbackRule`)."""

    name = "dfa"
    label = "DFA"
    credit_formula = "a_l = B_l^T e"
    color, marker = "#DC050C", "D"
    rank = 20
    stacked_step = "projected"

    def projected_signal(self, logits: Tensor, y: Tensor) -> Tensor:
        """(B, C): what the feedback matrices project — the output error e here."""
        return output_error(logits, y)
