"""ConvMixer: a convolutional family that keeps the residual contract.

After Trockman & Kolter (2022, "Patches are all you need?"), rewritten so that every block
is one residual step h_{l+1} = h_l + f_l(h_l):

    h_0 = BN(GELU(Conv_{p×p, stride p}(x)))              patch embedding, (B, d, H/p, W/p)
    f_l(h) = PW(BN(GELU(DW(h))))                         DW: depthwise k×k, same padding;
                                                         PW: pointwise 1×1, N(0, w2_std) init
    logits = head(LN(mean over H, W of h_L))             LN only with ``out_ln``

The branch is ConvMixer's own residual sub-block (depthwise → GELU → BN) followed by its
pointwise convolution, which ends the branch with a small init as the other families'
second linear layer does, so every block starts close to the identity map of the stream.
The blocks hold no LayerNorm: BatchNorm is the only normalisation inside the network.
States are feature maps ``(B, d, H/p, W/p)``; diagnostics read their spatial average.

BatchNorm couples the samples of a batch in training mode (each sample is normalised with
the batch's statistics). Diagnostics run the model in eval mode, where BatchNorm applies its
running statistics — a fixed per-channel affine map — so no operation mixes samples and one
backward pass of a sum-reduced loss gives every sample's exact gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.models.contract import ResidualNet
from creditaudit.models.images import ImageShape, as_images


class ConvStem(nn.Module):
    """(B, C, H, W) images (or (B, C·H·W) viewed as such) → (B, d, H/p, W/p):
    p×p convolution with stride p → GELU → BatchNorm."""

    def __init__(self, image_shape: ImageShape, patch: int, d: int) -> None:
        super().__init__()
        channels, height, width = image_shape
        if height % patch or width % patch:
            raise ValueError(f"patch {patch} does not divide the {height}×{width} image")
        self.image_shape: ImageShape = (channels, height, width)
        self.proj = nn.Conv2d(channels, d, kernel_size=patch, stride=patch)
        self.bn = nn.BatchNorm2d(d)

    def forward(self, x: Tensor) -> Tensor:
        x = as_images(x, self.image_shape)
        # Channels-last memory (the logical shape stays (B, d, H, W)): every later conv,
        # BatchNorm and skip keeps it, and CPU depthwise convolutions run ~3× faster in it.
        return self.bn(F.gelu(self.proj(x))).contiguous(memory_format=torch.channels_last)


class ConvMixerBranch(nn.Module):
    """One block's branch: depthwise k×k conv → GELU → BatchNorm → pointwise 1×1 conv.

    (B, d, H, W) → (B, d, H, W); returns the branch only (the model adds the skip). The
    pointwise conv starts N(0, ``w2_std``) with zero bias, so f_l ≈ 0 at init.
    """

    def __init__(self, d: int, kernel: int, w2_std: float = 0.01) -> None:
        super().__init__()
        self.dw = nn.Conv2d(d, d, kernel_size=kernel, groups=d, padding="same")
        self.bn = nn.BatchNorm2d(d)
        self.pw = nn.Conv2d(d, d, kernel_size=1)
        nn.init.normal_(self.pw.weight, std=w2_std)
        nn.init.zeros_(self.pw.bias)

    def forward(self, h: Tensor) -> Tensor:
        return self.pw(self.bn(F.gelu(self.dw(h))))


class ConvMixer(ResidualNet):
    """Input ``(B, C, H, W)``; states ``(B, d, H/p, W/p)``; logits from the pooled state.

    Parameter names: ``embed.proj.*``, ``embed.bn.*``, ``blocks.{l}.dw.*``,
    ``blocks.{l}.bn.*``, ``blocks.{l}.pw.*``, ``out_ln.*`` (if ``out_ln``), ``out_head.*``;
    BatchNorm's running statistics are buffers (saved with every checkpoint).
    """

    def __init__(
        self,
        n_classes: int = 10,
        d: int = 128,
        n_blocks: int = 4,
        patch: int = 4,
        kernel: int = 5,
        image_shape: ImageShape = (3, 32, 32),
        out_ln: bool = True,
        residual: bool = True,
        w2_std: float = 0.01,
    ) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = d, n_classes, residual
        self.embed = ConvStem(image_shape, patch, d)
        self.blocks = nn.ModuleList(ConvMixerBranch(d, kernel, w2_std) for _ in range(n_blocks))
        self.out_ln = nn.LayerNorm(d) if out_ln else None
        self.out_head = nn.Linear(d, n_classes)

    state_layout = "maps"

    @property
    def terminal_ln(self) -> bool:
        return self.out_ln is not None

    def readout(self, h: Tensor) -> Tensor:
        """(B, d, H, W) maps → global average pool → terminal LN (if any) → head."""
        pooled = h.mean(dim=(2, 3))
        if self.out_ln is not None:
            pooled = self.out_ln(pooled)
        return self.out_head(pooled)
