"""An in-memory batch loader: the whole data set sits in RAM as tensors.

Every random draw (epoch permutation, crop offsets, flips) comes from one caller-owned
``torch.Generator``, so a run is reproducible from the generator seed alone and the global
RNG, which model initialisation may rely on, is left untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from creditaudit.data.transforms import normalize, random_crop_flip


class InMemoryLoader:
    """Iterate (x, y) batches over tensors held in RAM; one index permutation per epoch.

    Two kinds of input:

    * uint8 images (N, C, H, W): each batch is optionally augmented with
      :func:`random_crop_flip`, then converted to float32 — standardised with ``mean``/``std``
      when given, else scaled to [0, 1] — and flattened to (B, C·H·W) when ``flatten``.
    * float features (N, D): batches pass through unchanged (``augment``, ``mean`` and ``std``
      are not allowed).

    Labels ``y`` (N,) are returned as stored (int64 for classification). Each call to
    ``iter()`` is one epoch; with ``shuffle`` it draws a fresh permutation from ``generator``.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None = None,
        augment: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        flatten: bool = False,
        drop_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"y must be (N,) with N = len(x) = {x.shape[0]}, got shape {tuple(y.shape)}"
            )
        self._images = x.dtype == torch.uint8
        if self._images:
            if x.dim() != 4:
                raise ValueError(f"uint8 images must be (N, C, H, W), got {tuple(x.shape)}")
        elif x.is_floating_point() and x.dim() == 2:
            if augment:
                raise ValueError("augment=True needs uint8 images (N, C, H, W), got features")
            if mean is not None or std is not None:
                raise ValueError("mean/std apply to uint8 images only; features pass unchanged")
        else:
            raise ValueError(
                "x must be uint8 images (N, C, H, W) or float features (N, D), "
                f"got {x.dtype} with shape {tuple(x.shape)}"
            )
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and std is not None and not len(mean) == len(std) == x.shape[1]:
            raise ValueError(
                f"mean/std need one value per channel ({x.shape[1]}), "
                f"got {len(mean)} and {len(std)}"
            )
        if (shuffle or augment) and generator is None:
            raise ValueError("shuffle and augment draw from `generator`; pass a torch.Generator")
        self.x = x
        self.y = y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.augment = augment
        self.mean = tuple(mean) if mean is not None else None
        self.std = tuple(std) if std is not None else None
        self.flatten = flatten
        self.drop_last = drop_last

    @property
    def n_samples(self) -> int:
        """Number of samples N held by the loader."""
        return int(self.x.shape[0])

    def __len__(self) -> int:
        """Number of batches in one epoch."""
        n, bs = self.n_samples, self.batch_size
        return n // bs if self.drop_last else -(-n // bs)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        order = (
            torch.randperm(self.n_samples, generator=self.generator, device=self.x.device)
            if self.shuffle
            else None
        )
        for i in range(len(self)):
            start = i * self.batch_size
            stop = min(start + self.batch_size, self.n_samples)
            if order is None:
                xb, yb = self.x[start:stop], self.y[start:stop]
            else:
                idx = order[start:stop]
                xb, yb = self.x.index_select(0, idx), self.y.index_select(0, idx)
            yield self._prepare(xb), yb

    def _prepare(self, xb: Tensor) -> Tensor:
        """Turn one raw batch into model input: (B, C, H, W) uint8 → float32 (B, ...)."""
        if not self._images:
            return xb
        if self.augment:
            assert self.generator is not None  # checked in __init__
            xb = random_crop_flip(xb, self.generator)
        if self.mean is not None and self.std is not None:
            out = normalize(xb, self.mean, self.std)
        else:
            out = xb.to(torch.float32).div_(255.0)
        return out.reshape(out.shape[0], -1) if self.flatten else out
