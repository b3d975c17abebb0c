"""Direct Feedback Alignment: a_l = B_lᵀ e with a fixed random B_l (C × d) per state."""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.config import MethodConfig
from creditaudit.methods.base import (
    CreditRule,
    StepResult,
    local_forward,
    local_objective,
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

    def credits_from_error(self, error: Tensor, states: list[Tensor]) -> list[Tensor]:
        return [state_credit_shape(error @ b.to(device=error.device, dtype=error.dtype), h)
                for b, h in zip(self.feedback, states)]

    @torch.no_grad()
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        states, logits = self.model.forward_states(x)
        return self.credits_from_error(output_error(logits, y), states)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x)
            credits = self.credits_from_error(output_error(local.logits, y), local.states)
            objective, ce = local_objective(self.model, local, credits, y, self.config.penalty)
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            objective.backward()
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
