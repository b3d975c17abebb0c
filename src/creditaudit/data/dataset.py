"""The data of a run, held in memory: train/test tensors plus what turns a batch into model
inputs, and the fixed evaluation subset every run of a dataset audits.

Images are kept as uint8 ``(N, C, H, W)`` and normalised (and augmented) per batch;
feature datasets are float32 ``(N, D)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from creditaudit.data import transforms
from creditaudit.data.identity import tensor_digest, tensor_versions
from creditaudit.data.loader import InMemoryLoader
from creditaudit.errors import ConfigError

# A fixed permutation seed: every run on a dataset audits the same held-out samples.
EVAL_SUBSET_SEED = 20240


@dataclass
class Dataset:
    """Train/test tensors plus what is needed to turn a batch into model inputs."""

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    n_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    augment: bool = False
    # How a generated dataset was made ({"generator", "version", "args"}); empty for files.
    provenance: dict[str, Any] = field(default_factory=dict)
    # When ``augment``: the random crop's zero padding (pixels) and whether it also flips
    # (after ``provenance``: a Dataset built with positional arguments reads as before).
    augment_padding: int = transforms.CROP_PADDING
    augment_flip: bool = True
    # (the arrays hashed, their versions, their digest): hashed once while they stay put
    _digest: tuple[tuple[Tensor, ...], tuple[int | None, ...], str] | None = field(
        default=None, init=False, repr=False, compare=False)
    # (what load_dataset was asked for: its data options and the data's fingerprint, the
    # arrays' digest then, the other fields a run reads then: creditaudit.data.HANDLING):
    # a run handed this Dataset checks it is what it would load
    loaded_as: tuple[str, str, dict[str, Any]] | None = field(default=None, init=False,
                                                              repr=False, compare=False)

    def content_digest(self) -> str:
        """sha256 of the four arrays as held now (train_x, train_y, test_x, test_y: dtype,
        shape and bytes; :func:`~creditaudit.data.identity.tensor_digest`) — what a run
        record says it trained and evaluated on. Computed once while the arrays stay the
        same objects, unmodified (an inference-mode tensor keeps no version counter, so
        arrays holding one are hashed on every call)."""
        arrays = (self.train_x, self.train_y, self.test_x, self.test_y)
        versions = tensor_versions(*arrays)
        held = self._digest
        if held is None or None in versions or held[1] != versions or any(
                a is not b for a, b in zip(held[0], arrays)):
            held = self._digest = (arrays, versions, tensor_digest(*arrays))
        return held[2]

    @property
    def is_image(self) -> bool:
        return self.train_x.dtype == torch.uint8

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def augmentation(self) -> dict[str, Any] | None:
        """How training batches are augmented, as a record states it: ``{"crop_padding":
        pixels of zero padding of the random crop, "flip": random horizontal flips}``, or
        None when they are not (test batches never are)."""
        if not (self.augment and self.is_image):
            return None
        return {"crop_padding": self.augment_padding, "flip": self.augment_flip}

    def loader(self, split: str, batch_size: int, *, flatten: bool, shuffle: bool = False,
               generator: torch.Generator | None = None, random_targets: int | None = None,
               draw_per_epoch: bool | None = None) -> InMemoryLoader:
        """Batches of model-ready inputs: normalised, augmented (train only), flattened
        (``random_targets`` and ``draw_per_epoch``: see :class:`InMemoryLoader`)."""
        x, y = (self.train_x, self.train_y) if split == "train" else (self.test_x, self.test_y)
        return InMemoryLoader(
            x, y, batch_size, shuffle=shuffle, generator=generator,
            augment=self.augment and split == "train", crop_padding=self.augment_padding,
            flip=self.augment_flip, mean=self.mean, std=self.std,
            flatten=flatten, random_targets=random_targets, draw_per_epoch=draw_per_epoch,
        )

    def to(self, device: torch.device) -> Dataset:
        """The same data with its four tensors on ``device`` (not copied where they are):
        as loaded as these (:attr:`loaded_as`), so a run may be handed the copy."""
        moved = replace(self, train_x=self.train_x.to(device), train_y=self.train_y.to(device),
                        test_x=self.test_x.to(device), test_y=self.test_y.to(device))
        moved.loaded_as = self.loaded_as
        return moved

    def test_loader(self, batch_size: int, *, flatten: bool, exclude: Tensor | None = None
                    ) -> InMemoryLoader:
        """Batches of the test split in order, without the samples at positions ``exclude``
        (their raw rows are copied once here, so iterating costs no per-batch gather)."""
        if exclude is None:
            return self.loader("test", batch_size, flatten=flatten)
        keep = torch.ones(self.test_y.shape[0], dtype=torch.bool)
        keep[exclude] = False
        keep = keep.to(self.test_x.device)
        return InMemoryLoader(self.test_x[keep], self.test_y[keep], batch_size, shuffle=False,
                              mean=self.mean, std=self.std, flatten=flatten)

    def prepare(self, x: Tensor, *, flatten: bool) -> Tensor:
        """Model-ready inputs for raw samples (no augmentation)."""
        if self.is_image:
            assert self.mean is not None and self.std is not None
            x = transforms.normalize(x, self.mean, self.std)
        return torch.flatten(x, 1) if flatten else x

    def eval_indices(self, n: int) -> Tensor:
        """(n,) int64: the test-split positions of the first ``n`` samples of a fixed
        permutation (the same for every run).

        Raises ConfigError when the test split has fewer than ``n`` samples.
        """
        available = self.test_x.shape[0]
        if n > available:
            raise ConfigError(f"diagnostics.eval_samples={n} exceeds the {available} test "
                              f"samples of {self.name}; use at most {available}")
        return torch.randperm(available,
                              generator=torch.Generator().manual_seed(EVAL_SUBSET_SEED))[:n]

    def eval_subset(self, n: int, *, flatten: bool) -> tuple[Tensor, Tensor]:
        """Model-ready inputs and labels of the :meth:`eval_indices` samples."""
        order = self.eval_indices(n)
        return self.prepare(self.test_x[order], flatten=flatten), self.test_y[order]
