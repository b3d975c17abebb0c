"""ViT-Mini: the second architecture family (science.md §3).

Patch p on C×H×W images → (H/p)·(W/p) patch tokens + CLS (patch 4: 64 + 1 on 3×32×32 CIFAR,
49 + 1 on 1×28×28 MNIST), d=128, 4 pre-LN transformer blocks (4 heads, MLP ratio 4),
terminal LN and a head on the CLS token. States are token tensors ``(B, T, d)``;
diagnostics read the CLS token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.models.contract import ResidualNet
from creditaudit.models.fused import layer_norm_linear
from creditaudit.models.images import ImageShape, as_images


class PatchEmbed(nn.Module):
    """(B, C, H, W) images (or (B, C·H·W) viewed as such) → (B, 1 + H·W/p², d) tokens:
    CLS + patches + position embedding."""

    def __init__(self, image_shape: ImageShape, patch: int, d: int) -> None:
        super().__init__()
        channels, height, width = image_shape
        if height % patch or width % patch:
            raise ValueError(f"patch {patch} does not divide the {height}×{width} image")
        self.image_shape: ImageShape = (channels, height, width)
        n_patches = (height // patch) * (width // patch)
        self.proj = nn.Conv2d(channels, d, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, d) * 0.02)

    def forward(self, x: Tensor) -> Tensor:
        x = as_images(x, self.image_shape)
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos


class TransformerBranch(nn.Module):
    """One pre-LN transformer block's branch: attn(LN(h)) + MLP(LN(h + attn(LN(h)))).

    The block is a single residual step h → h + f(h), so its branch includes the inner
    attention skip: f(h) = a + m(h + a) with a = attn(LN1(h)), m = MLP(LN2(·)).
    """

    def __init__(self, d: int, heads: int, mlp_ratio: int, w2_std: float = 0.01) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"width {d} is not divisible by {heads} heads")
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, mlp_ratio * d)
        self.w2 = nn.Linear(mlp_ratio * d, d)
        for out in (self.proj, self.w2):
            nn.init.normal_(out.weight, std=w2_std)
            nn.init.zeros_(out.bias)

    def attention(self, h: Tensor) -> Tensor:
        """attn(LN1(h)) for (B, T, d) tokens (LN1 and the qkv projection fused, see
        :func:`layer_norm_linear`)."""
        batch, tokens, d = h.shape
        qkv = layer_norm_linear(h, self.ln1, self.qkv)
        q, k, v = qkv.view(batch, tokens, 3, self.heads, d // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, d))

    @property
    def output_layer(self) -> nn.Linear:
        """The MLP's last Linear: f(h) = a + output_layer(u) with (u, a) = hidden(h) (the
        contract's optional split, :func:`~creditaudit.models.contract.split_branch`)."""
        return self.w2

    def hidden(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(u, a): the MLP's hidden GELU(w1(LN2(h + a))) (B, T, mlp_ratio·d) and the
        attention output a = attn(LN1(h)) (B, T, d)."""
        a = self.attention(h)
        return F.gelu(self.w1(self.ln2(h + a))), a

    def forward(self, h: Tensor) -> Tensor:
        u, a = self.hidden(h)
        return a + self.w2(u)


class ViTMini(ResidualNet):
    """Input ``(B, C, H, W)`` (default 3×32×32); states ``(B, 1 + H·W/p², d)``; logits from
    the CLS token."""

    def __init__(
        self,
        n_classes: int = 10,
        d: int = 128,
        n_blocks: int = 4,
        heads: int = 4,
        mlp_ratio: int = 4,
        patch: int = 4,
        image_shape: ImageShape = (3, 32, 32),
        out_ln: bool = True,
        residual: bool = True,
        w2_std: float = 0.01,
    ) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = d, n_classes, residual
        self.embed = PatchEmbed(image_shape, patch, d)
        self.blocks = nn.ModuleList(
            TransformerBranch(d, heads, mlp_ratio, w2_std) for _ in range(n_blocks)
        )
        self.out_ln = nn.LayerNorm(d) if out_ln else None
        self.out_head = nn.Linear(d, n_classes)

    state_layout = "tokens"

    @property
    def terminal_ln(self) -> bool:
        return self.out_ln is not None

    def readout(self, h: Tensor) -> Tensor:
        """(B, T, d) tokens → (B, n_classes) logits from the CLS token."""
        cls = h[:, 0]
        if self.out_ln is not None:
            cls = self.out_ln(cls)
        return self.out_head(cls)
