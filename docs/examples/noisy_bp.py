"""A credit rule written outside creditaudit: backprop's gradient plus Gaussian noise.

``noisy-bp`` gives every state the exact gradient g_l plus noise of the same size,
a_l = g_l + σ·RMS(g_l)·ξ_l with ξ_l ~ N(0, I) per sample (σ = ``method.sigma``, its own
option, default 1), and trains every block locally on that credit. It is a calibration control:
its cosine with g_l is about 1/√(1 + σ²) whatever the depth, so it shows what a given Γ buys
in accuracy. docs/extending.md walks through it; install it as a plugin with one entry point:

    [project.entry-points."creditaudit.rules"]
    noisy-bp = "noisy_bp:NoisyBP"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from creditaudit.config import opt
from creditaudit.methods import CreditRule, bp_state_gradients
from creditaudit.methods.base import LocalOptions, SeededOptions


@dataclass
class NoisyBPOptions(SeededOptions, LocalOptions):
    sigma: float = opt(1.0, "noise size σ, relative to each sample's RMS(g_l)", min=0.0)


# method.sigma, plus feedback_seed (it draws noise from its generator) and normalise_credit
# (it trains on the local surrogate); CreditRule[NoisyBPOptions] sets its Options and types
# self.options
class NoisyBP(CreditRule[NoisyBPOptions]):
    name = "noisy-bp"
    label = "Noisy BP"
    credit_formula = "a_l = g_l + σ·RMS(g_l)·ξ_l"
    feedback_kind = "symmetric"  # the exact gradient, i.e. the forward weights' transposes
    local = True  # blocks train on the local surrogate with this rule's credit

    def __init__(self, model, config, *, n_classes, generator) -> None:
        super().__init__(model, config, n_classes=n_classes, generator=generator)
        # The noise comes from the rule's own generator (never torch's global RNG, which
        # training and data order use); its state is saved with every checkpoint.
        self.generator = generator

    def noisy(self, grads: list[Tensor], generator: torch.Generator) -> list[Tensor]:
        sigma = self.options.sigma
        out = []
        for g in grads:
            rms = g.flatten(1).pow(2).mean(dim=1).sqrt().view(-1, *[1] * (g.dim() - 1))
            noise = torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device)
            out.append(g + sigma * rms * noise)
        return out

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        # A copy of the generator: reporting credits must not move the training stream.
        generator = torch.Generator().set_state(self.generator.get_state())
        return self.noisy(bp_state_gradients(self.model, x, y), generator)

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer):
        return self.local_train_step(
            x, y, optimizer,
            lambda local: self.noisy(bp_state_gradients(self.model, x, y), self.generator))

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"].cpu())
