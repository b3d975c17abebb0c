"""What the image architectures (ViT-Mini, ConvMixer) share: the image shape they read.

Both take ``(B, C, H, W)`` images. A flat ``(B, C·H·W)`` input is viewed as images of the
model's shape, which is how the synthetic teacher–student task (3072 Gaussian features) is
read as 3×32×32 images; the view copies nothing.
"""

from __future__ import annotations

from torch import Tensor

from creditaudit.errors import ConfigError

ImageShape = tuple[int, int, int]
FLAT_IMAGE: ImageShape = (3, 32, 32)  # how 3072 features are viewed
SYNTHETIC_IMAGE_DIM = 3 * 32 * 32  # features that image architectures view as FLAT_IMAGE


def image_view(input_shape: tuple[int, ...]) -> ImageShape | None:
    """(C, H, W) as an image architecture views samples of ``input_shape`` (without batch):
    ``(C, H, W)`` stays, ``(3072,)`` features are 3×32×32; None for any other shape."""
    shape = tuple(input_shape)
    if shape == (SYNTHETIC_IMAGE_DIM,):
        shape = FLAT_IMAGE
    return (shape[0], shape[1], shape[2]) if len(shape) == 3 else None


def image_shape(input_shape: tuple[int, ...], arch: str, patch: int) -> ImageShape:
    """(C, H, W) of inputs of ``input_shape`` (without batch) for an image architecture.

    ``(C, H, W)`` stays; ``(3072,)`` features are viewed as 3×32×32. Raises ConfigError for
    any other shape, or when ``patch`` does not divide H and W.
    """
    shape = image_view(input_shape)
    if shape is None:
        held = "feature vectors" if len(input_shape) == 1 else "inputs"
        raise ConfigError(f"model.arch={arch!r} needs images, and the data holds {held} of "
                          f"shape {tuple(input_shape)}: use C×H×W image data, "
                          f"{SYNTHETIC_IMAGE_DIM} features (viewed as 3×32×32), or a vector "
                          "architecture such as model.arch='resmlp'")
    channels, height, width = shape
    if height % patch or width % patch:
        fits = [p for p in range(1, height + 1) if height % p == 0 and width % p == 0]
        raise ConfigError(f"model.patch={patch} does not divide the {height}×{width} images: "
                          f"use one of {', '.join(map(str, fits))}")
    return channels, height, width


def as_images(x: Tensor, shape: ImageShape) -> Tensor:
    """(B, C, H, W) unchanged; (B, C·H·W) viewed as (B, C, H, W)."""
    return x.view(x.shape[0], *shape) if x.dim() == 2 else x
