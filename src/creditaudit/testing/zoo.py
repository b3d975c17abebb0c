"""Two networks written the way their papers describe them, with nothing of creditaudit in
them: plain ``nn.Module`` classes whose ``forward`` returns logits.

They are what :func:`creditaudit.adapt` is shown and tested on — networks nobody wrote for
the residual contract — and the conformance suite (:mod:`creditaudit.testing`) builds its
tiny adapted architectures from them, which is why they ship in the package rather than in
``examples/``.

- :class:`TransformerClassifier`: a ViT-style classifier whose blocks are PyTorch's own
  ``nn.TransformerEncoder`` layers, used as they are. Adapt it with the encoder layers'
  outputs as states: ``states=["encoder.layers.0", …]``.
- :class:`CifarResNet`: the CIFAR ResNet of He et al. (2016, §4.2) — a 3×3 convolution,
  three stages of ``n`` BasicBlocks with 16, 32 and 64 channels on feature maps of full,
  half and quarter size (the first block of stages 2 and 3 subsamples with stride 2),
  BatchNorm after every convolution, global average pooling and a linear head; ``n=3`` is
  ResNet-20 (:func:`resnet20`). Adapt it with the stem and the block outputs as states:
  ``states=["stem", "layer1.0", …, "layer3.{n-1}"]``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

SHORTCUTS = ("A", "B")


class TransformerClassifier(nn.Module):
    """(B, C, H, W) images → p×p patch tokens and a CLS token with learned positions →
    ``nn.TransformerEncoder`` (pre-LN layers, GELU MLP) → LayerNorm → Linear on the CLS token.

    ``image_shape`` (C, H, W), ``patch`` p (or (p_h, p_w); must divide H and W), width
    ``d``, ``depth`` encoder layers of ``heads`` heads and MLP width ``mlp_ratio·d``,
    ``n_classes`` logits. Flat (B, C·H·W) inputs are viewed as images of ``image_shape``
    (a 1-D signal of 40 values is ``image_shape=(1, 1, 40)`` with ``patch=(1, 4)``).
    ``dropout`` is the encoder layers' (0 here: PyTorch's default 0.1 would make two forward
    passes of one batch differ in training mode).
    """

    def __init__(self, image_shape: tuple[int, int, int] = (1, 28, 28),
                 patch: int | tuple[int, int] = 7, d: int = 64, depth: int = 4, heads: int = 4,
                 mlp_ratio: int = 4, n_classes: int = 10, dropout: float = 0.0) -> None:
        super().__init__()
        channels, height, width = image_shape
        self.image_shape = (channels, height, width)
        patch_h, patch_w = (patch, patch) if isinstance(patch, int) else tuple(patch)
        if height % patch_h or width % patch_w:
            raise ValueError(f"patch {patch} does not divide the {height}×{width} image")
        n_patches = (height // patch_h) * (width // patch_w)
        self.patch_embed = nn.Conv2d(channels, d, kernel_size=(patch_h, patch_w),
                                     stride=(patch_h, patch_w))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=mlp_ratio * d,
                                           dropout=dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(x.shape[0], *self.image_shape)  # flat inputs as images; images as they are
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, T, d)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        h = self.encoder(torch.cat([cls, tokens], dim=1) + self.pos)
        return self.head(self.norm(h[:, 0]))


class PadShortcut(nn.Module):
    """Option A of He et al.: the identity, subsampled by ``stride`` and zero-padded from
    ``in_channels`` to ``out_channels`` channels (no parameters)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.extra, self.stride = out_channels - in_channels, stride

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)) with 3×3 convolutions; conv1
    subsamples by ``stride``. Where the shape changes the shortcut is option A
    (:class:`PadShortcut`) or option B (a strided 1×1 convolution and BatchNorm)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1,
                 shortcut: str = "A") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = (PadShortcut(in_channels, out_channels, stride) if shortcut == "A"
                             else nn.Sequential(
                                 nn.Conv2d(in_channels, out_channels, 1, stride=stride,
                                           bias=False),
                                 nn.BatchNorm2d(out_channels)))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of He et al. (2016): 6n + 2 weight layers (see the module docstring).

    ``n`` BasicBlocks per stage, stage widths ``widths``, ``in_channels`` input channels,
    ``shortcut`` "A" (the paper's choice on CIFAR: zero-padded identity) or "B" (strided 1×1
    convolution + BatchNorm where the shape changes). Convolutions get He-normal
    initialisation, as in the paper.
    """

    def __init__(self, n: int = 3, widths: tuple[int, int, int] = (16, 32, 64),
                 in_channels: int = 3, n_classes: int = 10, shortcut: str = "A") -> None:
        super().__init__()
        if shortcut not in SHORTCUTS:
            raise ValueError(f"shortcut {shortcut!r} is not one of {', '.join(SHORTCUTS)}")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, channels = [], widths[0]
        for index, width in enumerate(widths):
            blocks = []
            for block in range(n):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(BasicBlock(channels, width, stride, shortcut))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(widths[-1], n_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def resnet20(in_channels: int = 3, n_classes: int = 10, shortcut: str = "A") -> CifarResNet:
    """ResNet-20: :class:`CifarResNet` with n = 3 (0.27M parameters on CIFAR-10)."""
    return CifarResNet(3, in_channels=in_channels, n_classes=n_classes, shortcut=shortcut)


__all__ = ["TransformerClassifier", "CifarResNet", "BasicBlock", "PadShortcut", "resnet20"]
