"""Direct Feedback Alignment: a_l = B_lᵀ e with a fixed random B_l (C × d) per state."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.methods.base import (
    CreditRule,
    StepResult,
    credit_gradient,
    local_backward,
    local_forward,
    output_error,
    state_credit_shape,
    step_result,
)
from creditaudit.models.contract import ResidualNet


def draw_feedback(shapes: list[tuple[int, int]], *, scale: float, generator: torch.Generator
                  ) -> list[Tensor]:
    """Fixed random feedback matrices, entries N(0, scale²/fan_in) with fan_in = shape[0]."""
    return [torch.randn(*shape, generator=generator) * (scale / shape[0] ** 0.5)
            for shape in shapes]


class DFA(CreditRule):
    """Every state gets the output error projected by its own fixed random matrix.

    ``feedback[l]`` has shape (C, d); a_l = e @ feedback[l] per sample (row form of B_lᵀ e),
    broadcast over the tokens of token states. The error e is detached, so nothing flows
    backwards through the network: one backward call trains every module locally.
    """

    name = "dfa"

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        d = _width(model)
        self.feedback = draw_feedback([(n_classes, d)] * (model.n_blocks + 1),
                                      scale=config.feedback_scale, generator=generator)

    def stacked_credits(self, error: Tensor) -> Tensor:
        """(B, L+1, d): every state's credit e @ B_l from one matmul with [B_0 … B_L]."""
        stacked = torch.cat(self.feedback, dim=1).to(device=error.device, dtype=error.dtype)
        return (error @ stacked).view(error.shape[0], len(self.feedback), -1)

    def credits_from_error(self, error: Tensor, states: list[Tensor]) -> list[Tensor]:
        """[a_0 … a_L], each shaped like its state (broadcast over tokens)."""
        return [state_credit_shape(a, h)
                for a, h in zip(self.stacked_credits(error).unbind(1), states)]

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, logits = self.model.forward_states(x)
        return self.credits_from_error(output_error(logits, y), states)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x)
            ce = F.cross_entropy(local.logits, y)
            # (B, d) per state; a token state's credit is the same for every token, so its
            # RMS over (T, d) is its RMS over d and the rows can be normalised all at once.
            credits = self.stacked_credits(output_error(local.logits, y))
            credit_grads = credit_gradient(credits.flatten(0, 1), y.shape[0])
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            local_backward(local, ce, credit_grads.view_as(credits).unbind(1),
                           self.config.penalty)
            optimizer.step()
        return result

    def state_dict(self) -> dict[str, object]:
        return {"feedback": [b.clone() for b in self.feedback]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.feedback = [b.clone() for b in state["feedback"]]  # type: ignore[union-attr]

    def to(self, device: torch.device) -> DFA:
        super().to(device)
        self.feedback = [b.to(device) for b in self.feedback]
        return self


def _width(model: ResidualNet) -> int:
    """Feature width d of the states (the embedding's output size)."""
    d = getattr(model, "d", None)
    if d is None:
        raise ValueError(f"{type(model).__name__} must expose its state width as `.d`")
    return int(d)
