"""``model.factory`` networks whose residual stream grows before the first named state.

:class:`GrowingStem` is a small pre-LN residual network with a terminal LayerNorm whose stem
multiplies its output by ``growth`` at every training-mode forward (a buffer, not a
parameter: the growth is the same under every rule). Its named states are the block
outputs, so the stem sits before h_0: each block adds a branch of bounded size to an
ever larger stream (every block's ‖h_{l+1}‖/‖h_l‖ stays near 1), the terminal LayerNorm
hides the scale from the loss, and only ‖h_0‖ against its value at initialisation shows
the growth. ``growth=1.0`` is its healthy twin.

Adapt it with ``states=["blocks.0", "blocks.1"]``, ``readout=["norm", "head"]``.
"""

import torch
from torch import nn


class Block(nn.Module):
    """h → h + W₂ GELU(W₁ LN(h))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.branch = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.branch(self.norm(h))


class GrowingStem(nn.Module):
    """(B, in_dim) features → stem (Linear × gain) → 2 blocks → LayerNorm → Linear."""

    def __init__(self, in_dim: int = 8, width: int = 16, n_classes: int = 10,
                 growth: float = 1.5) -> None:
        super().__init__()
        self.growth = growth
        self.stem = nn.Linear(in_dim, width)
        self.register_buffer("gain", torch.ones(()))
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.gain.mul_(self.growth)  # the stem's scale grows with every training step
        h = self.stem(x.flatten(1)) * self.gain
        return self.head(self.norm(self.blocks(h)))
