"""Fixed random-magnitude sign-concordant feedback (frSF; Moskovitz et al. 2018, BioTorch)."""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.methods.base import FeedbackOptions
from creditaudit.methods.feedback import FixedFeedbackRule
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    SignFeedback,
    draw_layer_feedback,
    sign_feedback,
    weight_shapes,
)
from creditaudit.methods.registry import register


@register
class FRSF(FixedFeedbackRule[FeedbackOptions], LinearFeedbackRule[FeedbackOptions]):
    """B = |M| ∘ sign(W) for every Linear and Conv2d, with magnitudes |M| drawn once and kept.

    ``feedback[i]`` holds the magnitudes |M| (W's shape, |N(0, s²/n)| with n the fan-in of
    the backward map as for ``fa-linear``, never trained);
    the signs follow the current W at every step, so B changes when a weight changes sign.
    The fresh-feedback null redraws the magnitudes and keeps the signs.
    """

    name = "frsf"
    label = "frSF"
    credit_formula = "backprop with each layer's W^T replaced by (|M| o sign W)^T, M fixed"
    color, marker = "#90C987", "h"
    rank = 14

    def feedback_shapes(self) -> list[tuple[int, ...]]:
        return weight_shapes(self.layers)

    def draw_feedback(self, generator: torch.Generator) -> list[Tensor]:
        return [m.abs() for m in draw_layer_feedback(
            self.layers, scale=self.options.feedback_scale, generator=generator)]

    def feedback_matrices(self) -> list[Tensor]:
        return sign_feedback(self.feedback, self.weights())

    def step_feedback(self) -> list[SignFeedback]:
        # Built in the backward pass, and only where a layer's input gradient is needed.
        return [SignFeedback(m, w) for m, w in zip(self.feedback, self.weights(), strict=True)]
