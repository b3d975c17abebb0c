"""Uniform sign-concordant feedback (uSF; Liao et al. 2016, as BioTorch defines it)."""

from __future__ import annotations

from torch import Tensor

from creditaudit.methods.base import ScaleOptions
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    SignFeedback,
    magnitude_scale,
)
from creditaudit.methods.registry import register


@register
class USF(LinearFeedbackRule[ScaleOptions]):
    """B = s_i · sign(W) for every Linear and Conv2d: W's signs, one magnitude per layer.

    s_i = feedback_scale/√n (n: the fan-in of the backward map — out for a Linear,
    (out_channels/groups)·kh·kw for a Conv2d) is the RMS of the random feedback entries of
    ``fa-linear`` (BioTorch scales sign(W) by its init's standard deviation for the same
    reason: a unit magnitude would multiply the backward signal by ~√n at every layer). Nothing is
    random, so the rule has no state and no ``feedback_seed`` (its options: ScaleOptions); B
    follows W at every step.
    """

    name = "usf"
    label = "uSF"
    credit_formula = "backprop with each layer's W^T replaced by (s sign W)^T"
    feedback_kind = "sign_concordant"
    color, marker = "#7BAFDE", "d"
    rank = 13

    def magnitudes(self) -> list[float]:
        """s_i per layer."""
        return [magnitude_scale(layer, self.options.feedback_scale) for _, layer in self.layers]

    def feedback_matrices(self) -> list[Tensor]:
        return [build() for build in self.step_feedback()]

    def step_feedback(self) -> list[SignFeedback]:
        # Built in the backward pass, and only where a layer's input gradient is needed.
        return [SignFeedback(s, w) for s, w in zip(self.magnitudes(), self.weights())]
