"""The frozen-blocks baseline of diagnostic (d): backprop with every block frozen at init."""

from __future__ import annotations

import torch

from creditaudit.config import MethodConfig
from creditaudit.methods.base import NoRuleOptions
from creditaudit.methods.bp import BackpropRule
from creditaudit.methods.registry import register
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet, set_trainable_blocks


@register
class Frozen(BackpropRule[NoRuleOptions]):
    """Blocks frozen at random init; embed, terminal LN and head trained by BP. What the
    trained blocks of any rule must beat by the (d) margin. On an adapted model everything
    but the readout is frozen."""

    name = "frozen"
    label = "Frozen blocks"
    credit_formula = "blocks frozen; readout by BP"
    color, marker = "#636363", "X"
    rank = 1000
    stacked_step = "end_to_end"
    baseline = True

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        if isinstance(model, AdaptedModel):
            model.freeze_all_but_readout()
        else:
            set_trainable_blocks(model, 0)
        super().__init__(model, config, n_classes=n_classes, generator=generator)
