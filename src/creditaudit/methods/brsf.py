"""Batchwise random-magnitude sign-concordant feedback (brSF; Moskovitz et al. 2018)."""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.config import MethodConfig
from creditaudit.methods.base import FeedbackOptions
from creditaudit.methods.feedback import draw_dtype
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    SignFeedback,
    draw_layer_feedback,
    sign_feedback,
)
from creditaudit.methods.registry import register
from creditaudit.models.contract import ResidualNet


@register
class BRSF(LinearFeedbackRule[FeedbackOptions]):
    """B = |M_t| ∘ sign(W) for every Linear and Conv2d, magnitudes redrawn before every step.

    |M_t| has W's shape, entries |N(0, s²/n)| (n: the fan-in of the backward map, as for
    ``fa-linear``), drawn from the rule's own generator (seeded
    by ``method.feedback_seed``), never from torch's global RNG. ``credits`` — and so every
    per-epoch record — use the magnitudes of the last training step (the initial draw before
    any step); the magnitudes and the generator are checkpointed.
    """

    name = "brsf"
    label = "brSF"
    credit_formula = "backprop with each layer's W^T replaced by (|M_t| o sign W)^T, M_t per batch"
    feedback_kind = "sign_concordant"
    color, marker = "#D1BBD7", ">"
    rank = 15

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        self.generator = generator
        # Each step's draw goes into these (CPU, each weight's draw_dtype): fresh W-sized
        # tensors every step cost more than drawing them (large blocks are faulted in again
        # each time).
        self.draws = [torch.empty(tuple(layer.weight.shape), dtype=draw_dtype(layer.weight))
                      for _, layer in self.layers]
        self.magnitudes = self.draw_magnitudes()

    def draw_magnitudes(self) -> list[Tensor]:
        """A fresh |M| per layer from the rule's generator (W's dtype and device); on the CPU
        in float32 the tensors are the draw buffers, overwritten by the next draw. A buffer
        whose dtype is no longer its weight's draw dtype (the model converted with
        ``.to(torch.float64)`` after the rule was bound) is made anew in that dtype."""
        self.draws = [d if d.dtype == draw_dtype(w) else torch.empty_like(d, dtype=draw_dtype(w))
                      for d, w in zip(self.draws, self.weights(), strict=True)]
        drawn = draw_layer_feedback(self.layers, scale=self.options.feedback_scale,
                                    generator=self.generator, out=self.draws)
        return [m.abs_().to(device=w.device, dtype=w.dtype)
                for m, w in zip(drawn, self.weights())]

    def feedback_matrices(self) -> list[Tensor]:
        return sign_feedback(self.magnitudes, self.weights())

    def step_feedback(self) -> list[SignFeedback]:
        # Every layer's magnitudes are drawn (the generator's stream stays the same); the
        # products are built in the backward pass, only where an input gradient is needed.
        self.magnitudes = self.draw_magnitudes()
        return [SignFeedback(m, w) for m, w in zip(self.magnitudes, self.weights(), strict=True)]

    def state_dict(self) -> dict[str, object]:
        return {"magnitudes": [m.clone() for m in self.magnitudes],
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.magnitudes = [m.clone() for m in state["magnitudes"]]
        self.generator.set_state(state["generator"].cpu())

    def to(self, device: torch.device) -> BRSF:
        super().to(device)
        self.magnitudes = [m.to(device) for m in self.magnitudes]
        return self
