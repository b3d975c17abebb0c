"""Kolen–Pollack (Akrout et al. 2019): feedback that takes every update of its forward weight.

Each Linear's and Conv2d's backward uses its own B (W's shape, drawn like ``fa-linear``'s). After
every optimiser step B takes the same step W took and the same decoupled weight decay:

    B ← B + (W_new − W_old) − lr·wd·(B − W_old),

so B − W shrinks by the factor (1 − lr·wd) at every step, whatever the gradient was, and B
converges to W (in Lillicrap's column form: B → Wᵀ). For AdamW this is exactly "B gets the
optimiser's step of W plus its own decay"; for plain SGD with coupled decay (wd·W in the
gradient) it is too. lr and wd are read from W's parameter group at the step (schedules
included). A parameter outside the optimiser, e.g. a frozen block's, leaves its B alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.config import MethodConfig
from creditaudit.errors import ModelContractError
from creditaudit.methods.base import FeedbackOptions, StepResult
from creditaudit.methods.linear_feedback import (
    LinearFeedbackRule,
    draw_layer_feedback,
)
from creditaudit.methods.registry import register
from creditaudit.models.contract import ResidualNet


def group_of(optimizer: torch.optim.Optimizer, param: Tensor) -> dict | None:
    """The parameter group holding ``param`` (None when the optimiser does not train it)."""
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    return None


def check_weights_are_parameters(layers: list[tuple[str, Any]]) -> None:
    """ModelContractError (one line, naming the layer) for a layer whose ``weight`` is not a
    parameter of its own but computed from others on each forward (a
    ``torch.nn.utils.parametrize`` parametrization, ``weight_norm``, ``spectral_norm``): the
    optimiser steps those others, so no group holds W and its B would never take W's step —
    the rule would silently be fa-linear there."""
    for name, layer in layers:
        if not isinstance(layer.weight, nn.Parameter):
            raise ModelContractError(
                f"--method kp cannot mirror the updates of {name!r} "
                f"({type(layer).__name__}): its weight is computed from other parameters on "
                "each forward (a parametrization such as weight_norm or spectral_norm), not a "
                "parameter the optimiser steps, so its B would never take W's step; use a "
                "plain layer there, or a rule with fixed or sign feedback (fa-linear, usf)")


@register
class KolenPollack(LinearFeedbackRule[FeedbackOptions]):
    """Per-layer feedback B trained to mirror W (see the module docstring)."""

    name = "kp"
    label = "Kolen–Pollack"
    credit_formula = "backprop with each layer's W^T replaced by B^T, B mirroring W's updates"
    feedback_kind = "learned"
    color, marker = "#882E72", "*"
    rank = 16

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        check_weights_are_parameters(self.layers)
        drawn = draw_layer_feedback(self.layers, scale=self.options.feedback_scale,
                                    generator=generator)
        # The same initial B as fa-linear for the same seed; in W's dtype, as it is updated
        # with W's steps.
        self.feedback = [b.to(device=w.device, dtype=w.dtype)
                         for b, w in zip(drawn, self.weights())]
        self._gap_buffers: list[Tensor] | None = None  # B − W_old, kept between steps

    def feedback_matrices(self) -> list[Tensor]:
        return self.feedback

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        self.follow_weights()
        gaps = self.gaps_before_step(optimizer)
        result = super().train_step(x, y, optimizer)
        if result.finite:
            self.mirror_step(gaps, optimizer)
        return result

    def follow_weights(self) -> None:
        """Each B in its W's dtype and on its device: a model converted after the rule was
        bound (``net.to(torch.float64)``) would otherwise keep float32 B and round every mirror
        step to float32 while the run is float64. Converting up is exact; nothing changes when
        the dtypes already agree."""
        self.feedback = [b if (b.dtype, b.device) == (w.dtype, w.device)
                         else b.to(device=w.device, dtype=w.dtype)
                         for b, w in zip(self.feedback, self.weights(), strict=True)]

    @torch.no_grad()
    def gaps_before_step(self, optimizer: torch.optim.Optimizer) -> list[Tensor | None]:
        """B − W_old per layer the optimiser trains (None for the others), written into
        buffers kept between steps: fresh W-sized temporaries every step cost more than the
        arithmetic (the allocator returns large blocks to the system and faults them in
        again)."""
        buffers = self._gap_buffers
        if buffers is None or any(g.shape != b.shape or g.dtype != b.dtype
                                  or g.device != b.device
                                  for g, b in zip(buffers, self.feedback, strict=True)):
            buffers = self._gap_buffers = [torch.empty_like(b) for b in self.feedback]
        return [torch.sub(b, w.detach(), out=gap) if group_of(optimizer, w) is not None
                else None
                for b, w, gap in zip(self.feedback, self.weights(), buffers, strict=True)]

    @torch.no_grad()
    def mirror_step(self, gaps: list[Tensor | None], optimizer: torch.optim.Optimizer) -> None:
        """B ← W + (1 − lr·wd)·(B − W_old) for every W the optimiser trains, from the gaps of
        :meth:`gaps_before_step` (overwritten)."""
        for b, w, gap in zip(self.feedback, self.weights(), gaps, strict=True):
            group = group_of(optimizer, w)
            if gap is None or group is None:
                continue
            shrink = float(group["lr"]) * float(group.get("weight_decay", 0.0))
            torch.add(w.detach(), gap.mul_(1.0 - shrink), out=b)

    def state_dict(self) -> dict[str, object]:
        return {"feedback": [b.clone() for b in self.feedback]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.feedback = [b.clone() for b in state["feedback"]]

    def to(self, device: torch.device) -> KolenPollack:
        super().to(device)
        self.feedback = [b.to(device) for b in self.feedback]
        return self
