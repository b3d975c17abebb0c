"""Batched image transforms on (B, C, H, W) tensors: no per-sample Python loops.

Augmentation runs on uint8 before normalisation, as the standard CIFAR pipeline does: padding
with 0 is black, and moving bytes instead of floats keeps the loader cheap.
"""

from __future__ import annotations

import functools
import math
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
# Zero padding of the random crop by default, in pixels (the standard CIFAR augmentation).
CROP_PADDING = 4


def _check_images(x: Tensor, name: str = "x") -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must be (B, C, H, W), got shape {tuple(x.shape)}")


def normalize(x_uint8: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Scale uint8 pixels to [0, 1] and standardise per channel.

    Args:
        x_uint8: (B, C, H, W) uint8 pixels in [0, 255].
        mean: C per-channel means of the [0, 1]-scaled pixels (finite).
        std: C per-channel standard deviations of the [0, 1]-scaled pixels (finite, > 0).

    Returns:
        (B, C, H, W) ``(x / 255 - mean[c]) / std[c]`` in torch's default dtype, the dtype
        models are built in (float32 unless a caller changed it), to its rounding.
    """
    _check_images(x_uint8, "x_uint8")
    if x_uint8.dtype != torch.uint8:
        raise ValueError(f"normalize expects uint8 pixels, got {x_uint8.dtype}")
    scale, shift = normalization(mean, std, x_uint8.shape[1])
    return apply_normalization(x_uint8, scale.to(x_uint8.device), shift.to(x_uint8.device))


def normalization(mean: Sequence[float], std: Sequence[float], n_channels: int
                  ) -> tuple[Tensor, Tensor]:
    """(scale, shift), each (1, C, 1, 1) on the CPU in torch's default dtype (the dtype
    models are built in, and so the dtype of model inputs: float32, or a caller's float64),
    with ``x·scale + shift = (x / 255 − mean) / std`` to that dtype's rounding
    (:func:`normalize`).

    A loader that keeps its data on a GPU computes them once and keeps them there, so a
    batch costs no host-to-device copy.
    """
    if len(mean) != n_channels or len(std) != n_channels:
        raise ValueError(
            f"mean/std need one value per channel ({n_channels}), got {len(mean)} and {len(std)}"
        )
    if not all(math.isfinite(m) for m in mean):  # a NaN mean makes every input NaN
        raise ValueError(f"mean must be finite, got {tuple(mean)}")
    if not all(0 < s < math.inf for s in std):  # an infinite std zeroes its channel
        raise ValueError(f"std must be positive and finite, got {tuple(std)}")
    mean_t = torch.tensor(mean, dtype=torch.float64)
    std_t = torch.tensor(std, dtype=torch.float64)
    # Folded into one affine map (computed in float64, so only the final rounding to the
    # default dtype differs from the textbook formula): two in-place passes over the float
    # copy instead of three.
    dtype = torch.get_default_dtype()
    scale = (1.0 / (255.0 * std_t)).to(dtype).view(1, -1, 1, 1)
    shift = (-mean_t / std_t).to(dtype).view(1, -1, 1, 1)
    return scale, shift


def apply_normalization(x_uint8: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """(B, C, H, W) ``x·scale + shift`` of uint8 pixels, in the dtype of ``scale``
    (:func:`normalization`'s scale and shift, on ``x``'s device)."""
    # Converting first matters: a mixed uint8 × float32 mul is ~15x slower on CPU.
    return x_uint8.to(scale.dtype).mul_(scale).add_(shift)


def random_crop_flip(x: Tensor, generator: torch.Generator, padding: int = CROP_PADDING) -> Tensor:
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
    if x.shape[0] == 0:
        return x.clone()
    rows, cols, flip = crop_flip_draws(x.shape[0], generator, padding, x.device)
    return crop_flip(x, rows, cols, flip, padding)


def crop_flip_draws(b: int, generator: torch.Generator, padding: int = CROP_PADDING,
                    device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor]:
    """:func:`random_crop_flip`'s draws for ``b`` samples, in its order: (row offsets (B,)
    and column offsets (B,) int64 in [0, 2·padding], flips (B,) bool)."""
    rows = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=device)
    cols = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=device)
    flip = torch.rand(b, generator=generator, device=device) < 0.5
    return rows, cols, flip


def crop_flip(x: Tensor, row_off: Tensor, col_off: Tensor, flip: Tensor,
              padding: int = CROP_PADDING) -> Tensor:
    """The crops and flips of :func:`random_crop_flip` for given draws (no randomness).

    ``x`` (B, C, H, W); ``row_off``, ``col_off`` (B,) int64 in [0, 2·padding]; ``flip`` (B,)
    bool; all on ``x``'s device. Output sample b is ``pad(x)[b, :, oy:oy+H, ox:ox+W]``,
    reversed along the last axis where ``flip[b]``.
    """
    b, c, h, w = x.shape
    dev = x.device
    hp, wp = h + 2 * padding, w + 2 * padding
    # Stack the zero-padded batch and its mirror image. A flipped crop at column offset o is
    # the plain crop of the mirror at offset 2·padding − o, so every output row becomes one
    # contiguous run of w elements somewhere in this buffer.
    canvas = x.new_zeros((2 * b, c, hp, wp))
    inner = (..., slice(padding, padding + h), slice(padding, padding + w))
    canvas[:b][inner] = x
    canvas[b:][inner] = x.flip(-1)
    source = torch.arange(b, device=dev) + b * flip
    col = torch.where(flip, 2 * padding - col_off, col_off)
    corner = (source * (c * hp) + row_off) * wp + col  # (B,) flat offset of each crop's origin
    starts = corner[:, None] + _row_offsets(c, h, hp, wp, dev)  # (B, C·H)
    flat = canvas.view(-1)
    # An overlapping stride-1 view makes every w-long run of the buffer a "row", so a single
    # index_select copies whole output rows (~1.4x faster than an element-wise gather on CPU).
    runs = flat.as_strided((flat.numel() - w + 1, w), (1, 1))
    return runs.index_select(0, starts.view(-1)).view(b, c, h, w)


@functools.lru_cache(maxsize=16)
def _row_offsets(c: int, h: int, hp: int, wp: int, device: torch.device) -> Tensor:
    """(C·H,) int64 flat offsets of the first H rows of each channel plane in a (·, C, hp, wp)
    buffer; cached because the loader asks for the same shape every batch."""
    rows = torch.arange(c, device=device)[:, None] * hp + torch.arange(h, device=device)
    return (rows * wp).view(-1)
