"""ResidualMLP: the main audited model (science.md §3)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.models.contract import ResidualNet
from creditaudit.models.fused import layer_norm_linear


class MLPBlock(nn.Module):
    """Pre-LN branch LN → Linear(d,d) → GELU → Linear(d,d); returns the branch only."""

    def __init__(self, d: int, w2_std: float = 0.01) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, d)
        self.w2 = nn.Linear(d, d)
        # A small second layer starts every block close to the identity map of the stream.
        nn.init.normal_(self.w2.weight, std=w2_std)
        nn.init.zeros_(self.w2.bias)

    @property
    def output_layer(self) -> nn.Linear:
        """The branch's last layer: f(h) = output_layer(hidden(h)) (the contract's optional
        split, :func:`~creditaudit.models.contract.split_branch`)."""
        return self.w2

    def hidden(self, h: Tensor) -> Tensor:
        """GELU(w1(LN(h))): (…, d) → (…, d), what ``w2`` reads."""
        # LN and w1 fused: with a detached h (local rules) their backward skips ∂h entirely.
        return F.gelu(layer_norm_linear(h, self.ln, self.w1))

    def forward(self, h: Tensor) -> Tensor:
        return self.w2(self.hidden(h))


class ResidualMLP(ResidualNet):
    """Embed Linear(in_dim, d); ``n_blocks`` pre-LN MLP blocks; terminal LN; head.

    Input ``(B, in_dim)`` float; states ``(B, d)``; logits ``(B, n_classes)``.
    Parameter names: ``embed.*``, ``blocks.{l}.ln.*``, ``blocks.{l}.w1.*``,
    ``blocks.{l}.w2.*``, ``out_ln.*`` (if ``out_ln``), ``out_head.*``.
    """

    def __init__(
        self,
        in_dim: int,
        d: int,
        n_classes: int,
        n_blocks: int,
        out_ln: bool = True,
        residual: bool = True,
        w2_std: float = 0.01,
    ) -> None:
        super().__init__()
        self.in_dim, self.d, self.n_classes = in_dim, d, n_classes
        self.residual = residual
        self.embed = nn.Linear(in_dim, d)
        self.blocks = nn.ModuleList(MLPBlock(d, w2_std) for _ in range(n_blocks))
        self.out_ln = nn.LayerNorm(d) if out_ln else None
        self.out_head = nn.Linear(d, n_classes)

    state_layout = "vectors"

    @property
    def terminal_ln(self) -> bool:
        return self.out_ln is not None

    def readout(self, h: Tensor) -> Tensor:
        """Terminal LN (if any) and head: (B, d) → (B, n_classes)."""
        if self.out_ln is not None:
            h = self.out_ln(h)
        return self.out_head(h)


def flatten_input(x: Tensor) -> Tensor:
    """(B, …) → (B, prod(…)) for MLPs."""
    return torch.flatten(x, start_dim=1)
