"""An in-memory batch loader: the whole data set sits in memory (RAM or a GPU) as tensors.

Every random draw (epoch permutation, crop offsets, flips, random targets) comes from one
caller-owned CPU ``torch.Generator``, so a run is reproducible from the generator seed alone
and the global RNG, which model initialisation may rely on, is left untouched. Data on a GPU
get the same batches as on the CPU: the epoch's draws are made on the host, in the order the
CPU path makes them, copied to the device once per epoch, and every batch is gathered,
cropped and normalised there without a host round trip.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from creditaudit.data.transforms import (
    CROP_PADDING,
    apply_normalization,
    crop_flip,
    crop_flip_draws,
    normalization,
)


# What a loader reads, and so what every dataset loads (features in the dtype models are
# built in: torch's default, float32 unless a caller changed it).
def samples_problem(x: Tensor) -> str | None:
    """Why ``x`` is not uint8 images (N, C, H, W) or features (N, D) in the dtype the
    models are built in (torch's default: float32), in one line; None when it is."""
    if x.dtype == torch.uint8:
        return None if x.dim() == 4 else (
            f"uint8 images must be (N, C, H, W), got {tuple(x.shape)}")
    features = str(torch.get_default_dtype()).removeprefix("torch.")
    if x.dtype == torch.get_default_dtype() and x.dim() == 2:
        return None
    return (f"x must be uint8 images (N, C, H, W) or {features} features (N, D), got "
            f"{x.dtype} with shape {tuple(x.shape)}")


@dataclass(frozen=True)
class EpochDraws:
    """Every random draw of one epoch, made on the host in the per-batch order
    (permutation; then per batch: crop rows, crop columns, flips, random targets). Each
    field is (N,) — int64, flips bool — or None when the loader does not draw it."""

    order: Tensor | None
    rows: Tensor | None
    cols: Tensor | None
    flips: Tensor | None
    targets: Tensor | None

    def to(self, device: torch.device) -> EpochDraws:
        """The same draws on ``device`` (one copy per field, once per epoch)."""
        return EpochDraws(*(None if t is None else t.to(device) for t in (
            self.order, self.rows, self.cols, self.flips, self.targets)))


class InMemoryLoader:
    """Iterate (x, y) batches over tensors held in RAM; one index permutation per epoch.

    Two kinds of input:

    * uint8 images (N, C, H, W): each batch is optionally augmented with
      :func:`random_crop_flip` (zero padding ``crop_padding`` pixels; horizontal flips
      unless ``flip`` is False), then converted to torch's default dtype (float32 unless a
      caller changed it) — standardised with ``mean``/``std`` when given, else scaled to
      [0, 1] — and flattened to (B, C·H·W) when ``flatten``.
    * features (N, D) in torch's default dtype: batches pass through unchanged (``augment``,
      ``mean`` and ``std`` are not allowed).

    Labels ``y`` (N,) are returned as stored (int64 for classification), or replaced by
    i.i.d. uniform labels in 0 … ``random_targets``−1 drawn afresh per batch (after the
    batch's augmentation draws) when ``random_targets`` is given. Each call to ``iter()`` is
    one epoch; with ``shuffle`` it draws a fresh permutation from ``generator``.

    ``draw_per_epoch`` (default: whenever ``x`` is not on the CPU) makes the epoch's draws at
    its start (:class:`EpochDraws`) instead of batch by batch: the same numbers from the same
    generator, so the same batches bit for bit, with no host work per batch.

    With ``flip=False`` the flips are still drawn, then ignored: the loader draws exactly
    the numbers a flipping one draws (permutations, crop offsets, random targets), so two
    runs that differ only in ``flip`` see the same samples, crops and labels in every batch.
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
        crop_padding: int = CROP_PADDING,
        flip: bool = True,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        flatten: bool = False,
        drop_last: bool = False,
        random_targets: int | None = None,
        draw_per_epoch: bool | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"y must be (N,) with N = len(x) = {x.shape[0]}, got shape {tuple(y.shape)}"
            )
        problem = samples_problem(x)
        if problem is not None:
            raise ValueError(problem)
        self._images = x.dtype == torch.uint8
        if not self._images:
            if augment:
                raise ValueError("augment=True needs uint8 images (N, C, H, W), got features")
            if mean is not None or std is not None:
                raise ValueError("mean/std apply to uint8 images only; features pass unchanged")
        if isinstance(crop_padding, bool) or not isinstance(crop_padding, int) or \
                crop_padding < 0:
            raise ValueError(f"crop_padding must be an integer >= 0, got {crop_padding!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and std is not None and not len(mean) == len(std) == x.shape[1]:
            raise ValueError(
                f"mean/std need one value per channel ({x.shape[1]}), "
                f"got {len(mean)} and {len(std)}"
            )
        if (shuffle or augment or random_targets) and generator is None:
            raise ValueError("shuffle, augment and random_targets draw from `generator`; pass "
                             "a torch.Generator")
        if random_targets is not None and random_targets < 1:
            raise ValueError(f"random_targets must be a number of classes >= 1, got "
                             f"{random_targets}")
        self.x = x
        self.y = y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.generator = generator
        self.augment = augment
        self.crop_padding = crop_padding
        self.flip = bool(flip)
        self.mean = tuple(mean) if mean is not None else None
        self.std = tuple(std) if std is not None else None
        self.flatten = flatten
        self.drop_last = drop_last
        self.random_targets = random_targets
        self.draw_per_epoch = (x.device.type != "cpu" if draw_per_epoch is None
                               else draw_per_epoch)
        # Images become model inputs in the dtype models are built in (torch's default, as
        # features must already be: samples_problem), fixed when the loader is made.
        self._dtype = torch.get_default_dtype()
        # Kept on the data's device: a batch then copies nothing from the host.
        self._normalization = None if self.mean is None or self.std is None else tuple(
            t.to(x.device) for t in normalization(self.mean, self.std, x.shape[1]))

    @property
    def n_samples(self) -> int:
        """Number of samples N held by the loader."""
        return int(self.x.shape[0])

    def __len__(self) -> int:
        """Number of batches in one epoch."""
        n, bs = self.n_samples, self.batch_size
        return n // bs if self.drop_last else -(-n // bs)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self.draw_per_epoch:
            yield from self._iter_drawn(self.epoch_draws())
            return
        # Drawn on the host (the generator's device) and moved: a CPU generator cannot draw
        # on a GPU, and the numbers are the CPU path's.
        order = (
            torch.randperm(self.n_samples, generator=self.generator).to(self.x.device)
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
            xb = self._prepare(xb)
            if self.random_targets is not None:
                yb = torch.randint(0, self.random_targets, yb.shape,
                                   generator=self.generator).to(yb.device)
            yield xb, yb

    def epoch_draws(self) -> EpochDraws:
        """One epoch's draws, in the order the per-batch path makes them, on the data's
        device."""
        gen = self.generator
        order = torch.randperm(self.n_samples, generator=gen) if self.shuffle else None
        crops: list[tuple[Tensor, Tensor, Tensor]] = []
        targets: list[Tensor] = []
        augment = self.augment and self._images
        for i in range(len(self)):
            size = min(self.batch_size, self.n_samples - i * self.batch_size)
            if augment:
                crops.append(self._crop_draws(size, torch.device("cpu")))
            if self.random_targets is not None:
                targets.append(torch.randint(0, self.random_targets, (size,), generator=gen))
        rows, cols, flips = (torch.cat(parts) for parts in zip(*crops)) if crops else (
            None, None, None)
        return EpochDraws(order, rows, cols, flips,
                          torch.cat(targets) if targets else None).to(self.x.device)

    def _iter_drawn(self, draws: EpochDraws) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(len(self)):
            start = i * self.batch_size
            stop = min(start + self.batch_size, self.n_samples)
            if draws.order is None:
                xb, yb = self.x[start:stop], self.y[start:stop]
            else:
                idx = draws.order[start:stop]
                xb, yb = self.x.index_select(0, idx), self.y.index_select(0, idx)
            if draws.rows is not None:
                assert draws.cols is not None and draws.flips is not None
                xb = crop_flip(xb, draws.rows[start:stop], draws.cols[start:stop],
                               draws.flips[start:stop], self.crop_padding)
            if draws.targets is not None:
                yb = draws.targets[start:stop]
            yield self._normalize(xb), yb

    def _prepare(self, xb: Tensor) -> Tensor:
        """Turn one raw batch into model input: (B, C, H, W) uint8 → floats (B, ...)."""
        if not self._images:
            return xb
        if self.augment:
            rows, cols, flips = (t.to(xb.device) for t in
                                 self._crop_draws(xb.shape[0], torch.device("cpu")))
            xb = crop_flip(xb, rows, cols, flips, self.crop_padding)
        return self._normalize(xb)

    def _crop_draws(self, size: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """One batch's crop offsets and flips ((size,) each); the flips are drawn even when
        ``flip`` is off (then all False), so the generator advances as a flipping loader's."""
        assert self.generator is not None  # checked in __init__
        rows, cols, flips = crop_flip_draws(size, self.generator, self.crop_padding, device)
        return rows, cols, flips if self.flip else torch.zeros_like(flips)

    def _normalize(self, xb: Tensor) -> Tensor:
        """uint8 (B, C, H, W) → model input in torch's default dtype (standardised or scaled
        to [0, 1], flattened when asked); features pass unchanged."""
        if not self._images:
            return xb
        if self._normalization is not None:
            out = apply_normalization(xb, *self._normalization)
        else:
            out = xb.to(self._dtype).div_(255.0)
        return out.reshape(out.shape[0], -1) if self.flatten else out
