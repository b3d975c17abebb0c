"""Per-layer Feedback Alignment (Lillicrap et al. 2016; BioTorch ``fa``): fixed random B."""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.config import MethodConfig
from creditaudit.methods.base import FeedbackOptions
from creditaudit.methods.feedback import FixedFeedbackRule
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    draw_layer_feedback,
    weight_shapes,
)
from creditaudit.methods.registry import register
from creditaudit.models.contract import ResidualNet


@register
class FALinear(FixedFeedbackRule[FeedbackOptions], LinearFeedbackRule[FeedbackOptions]):
    """Every Linear's and Conv2d's input gradient uses a fixed random B instead of its W.

    ``feedback[i]`` has the shape of the i-th layer's W — (out, in) for a Linear,
    (out_channels, in_channels/groups, kh, kw) for a Conv2d — entries N(0, s²/n) with n the
    fan-in of the backward map (out for a Linear; (out_channels/groups)·kh·kw for a Conv2d),
    drawn once from the feedback generator and never trained. LayerNorm, BatchNorm, GELU,
    attention and the identity skips stay exact, so the skip carries the exact gradient past
    every block: a different algorithm from the block-level ``fa``, whose B_l replaces the
    whole block Jacobian, skip included.
    """

    name = "fa-linear"
    label = "FA (per-layer)"
    credit_formula = "backprop with each layer's W^T replaced by a fixed random B"
    color, marker = "#F6C141", "p"
    rank = 12

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        # In the weights' dtype, so float64 models get float64 feedback.
        self.feedback = [b.to(w.dtype) for b, w in zip(self.feedback, self.weights())]

    def feedback_shapes(self) -> list[tuple[int, ...]]:
        return weight_shapes(self.layers)

    def draw_feedback(self, generator: torch.Generator) -> list[Tensor]:
        return draw_layer_feedback(self.layers, scale=self.options.feedback_scale,
                                   generator=generator)

    def feedback_matrices(self) -> list[Tensor]:
        return self.feedback
