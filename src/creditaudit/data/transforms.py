"""Batched image transforms on (B, C, H, W) tensors: no per-sample Python loops.

Augmentation runs on uint8 before normalisation, as the standard CIFAR pipeline does: padding
with 0 is black, and moving bytes instead of floats keeps the loader cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

CIFAR10_MEAN: tuple[float, ...] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, ...] = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN: tuple[float, ...] = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: tuple[float, ...] = (0.2673, 0.2564, 0.2762)
MNIST_MEAN: tuple[float, ...] = (0.1307,)
MNIST_STD: tuple[float, ...] = (0.3081,)
FASHION_MNIST_MEAN: tuple[float, ...] = (0.2860,)
FASHION_MNIST_STD: tuple[float, ...] = (0.3530,)


def _check_images(x: Tensor, name: str = "x") -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must be (B, C, H, W), got shape {tuple(x.shape)}")


def normalize(x_uint8: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Scale uint8 pixels to [0, 1] and standardise per channel.

    Args:
        x_uint8: (B, C, H, W) uint8 pixels in [0, 255].
        mean: C per-channel means of the [0, 1]-scaled pixels.
        std: C per-channel standard deviations of the [0, 1]-scaled pixels (all > 0).

    Returns:
        (B, C, H, W) float32 ``(x / 255 - mean[c]) / std[c]``.
    """
    _check_images(x_uint8, "x_uint8")
    if x_uint8.dtype != torch.uint8:
        raise ValueError(f"normalize expects uint8 pixels, got {x_uint8.dtype}")
    n_channels = x_uint8.shape[1]
    if len(mean) != n_channels or len(std) != n_channels:
        raise ValueError(
            f"mean/std need one value per channel ({n_channels}), got {len(mean)} and {len(std)}"
        )
    if any(s <= 0 for s in std):
        raise ValueError(f"std must be positive, got {tuple(std)}")
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    out = x_uint8.to(torch.float32)
    # In-place ops on the fresh float copy avoid two extra batch-sized allocations.
    return out.div_(255.0).sub_(mean_t).div_(std_t)


def random_crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4) -> Tensor:
    """Zero-pad, take a random H×W crop per sample, then flip it horizontally with p = 0.5.

    Random draws, all from ``generator`` and in this order: row offsets (B,) and column
    offsets (B,) uniform in [0, 2·padding], then B uniforms in [0, 1) (flip where < 0.5).
    Output sample b is therefore ``pad(x)[b, :, oy:oy+H, ox:ox+W]``, reversed along the last
    axis when flipped.

    Args:
        x: (B, C, H, W) images of any dtype (uint8 in the data pipeline).
        generator: source of all randomness; the global RNG is not touched.
        padding: pixels of zeros added on each side (≥ 0).

    Returns:
        (B, C, H, W) tensor of the same dtype and device as ``x``.
    """
    _check_images(x)
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    b, c, h, w = x.shape
    dev = x.device
    row_off = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=dev)
    col_off = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=dev)
    flip = torch.rand(b, generator=generator, device=dev) < 0.5

    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding)) if padding else x
    wp = w + 2 * padding
    rows = row_off[:, None] + torch.arange(h, device=dev)  # (B, H)
    col_step = torch.arange(w, device=dev)
    # A flip is a crop read right-to-left, so fold it into the column indices.
    cols_in_crop = torch.where(flip[:, None], (w - 1) - col_step, col_step)
    cols = col_off[:, None] + cols_in_crop  # (B, W)
    # One gather over the flattened spatial axis does crop and flip for every sample at once.
    flat_idx = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w)
    out = torch.gather(padded.reshape(b, c, -1), 2, flat_idx.expand(b, c, h * w))
    return out.view(b, c, h, w)
