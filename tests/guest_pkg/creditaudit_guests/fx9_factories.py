"""``module`` factories whose layers a per-layer feedback rule (fa-linear, usf, brsf, frsf,
kp) cannot replace (tests/test_adapted_layer_refusals.py). Each reads flat features
(``in_features``) and has named states ``stem``, ``b1``, ``b2``.
"""

import torch
from torch import nn
from torch.nn import functional as F

STATES = ["stem", "b1", "b2"]


class MaskedLinear(nn.Linear):
    """A Linear with a fixed binary mask on its weight: a forward of its own."""

    def __init__(self, d):
        super().__init__(d, d)
        self.register_buffer("mask", (torch.arange(d * d).reshape(d, d) % 3 > 0).float())

    def forward(self, x):
        return F.linear(x, self.weight * self.mask, self.bias)


class MaskedNet(nn.Module):
    def __init__(self, in_features=40, n_classes=10):
        super().__init__()
        self.stem, self.b1 = nn.Linear(in_features, 8), MaskedLinear(8)
        self.b2, self.head = nn.Linear(8, 8), nn.Linear(8, n_classes)

    def forward(self, x):
        return self.head(self.b2(torch.tanh(self.b1(torch.tanh(self.stem(x))))))


class AuxHeadNet(MaskedNet):
    """An auxiliary classifier that runs only in training mode (as Inception's)."""

    def __init__(self, in_features=40, n_classes=10):
        super().__init__(in_features, n_classes)
        self.b1, self.aux = nn.Linear(8, 8), nn.Linear(8, n_classes)

    def forward(self, x):
        h = self.b1(torch.tanh(self.stem(x)))
        if self.training:
            self.aux_logits = self.aux(h)
        return self.head(self.b2(torch.tanh(h)))
