"""Datasets held in memory, their loaders and the fixed evaluation subset.

Images are kept as uint8 ``(N, C, H, W)`` and normalised (and augmented) per batch;
feature datasets (synthetic, mnist1d) are float32 ``(N, D)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from creditaudit.config import DataConfig
from creditaudit.data import transforms
from creditaudit.data.loader import InMemoryLoader
from creditaudit.data.synthetic import make_teacher_student, synthetic_provenance
from creditaudit.errors import ConfigError, DataError

# A fixed permutation seed: every run on a dataset audits the same held-out samples.
EVAL_SUBSET_SEED = 20240
CLASSES = {"cifar100": 100}  # every other dataset has 10 classes


def n_classes_of(name: str) -> int:
    """The number of classes of dataset ``name``."""
    return CLASSES.get(name, 10)


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

    @property
    def is_image(self) -> bool:
        return self.train_x.dtype == torch.uint8

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def loader(self, split: str, batch_size: int, *, flatten: bool, shuffle: bool = False,
               generator: torch.Generator | None = None) -> InMemoryLoader:
        """Batches of model-ready inputs: normalised, augmented (train only), flattened."""
        x, y = (self.train_x, self.train_y) if split == "train" else (self.test_x, self.test_y)
        return InMemoryLoader(
            x, y, batch_size, shuffle=shuffle, generator=generator,
            augment=self.augment and split == "train", mean=self.mean, std=self.std,
            flatten=flatten,
        )

    def test_loader(self, batch_size: int, *, flatten: bool, exclude: Tensor | None = None
                    ) -> InMemoryLoader:
        """Batches of the test split in order, without the samples at positions ``exclude``
        (their raw rows are copied once here, so iterating costs no per-batch gather)."""
        if exclude is None:
            return self.loader("test", batch_size, flatten=flatten)
        keep = torch.ones(self.test_y.shape[0], dtype=torch.bool)
        keep[exclude] = False
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


def load_dataset(config: DataConfig, *, seed: int) -> Dataset:
    """Load (or generate) the configured dataset.

    Generated datasets (synthetic, mnist1d) are seeded by ``config.data_seed``, else ``seed``.
    """
    data_seed = seed if config.data_seed is None else config.data_seed
    if config.name == "synthetic":
        provenance = synthetic_provenance(
            n_train=config.n_train, n_test=config.n_test, in_dim=config.in_dim,
            alpha=config.alpha, seed=data_seed, teacher_width=config.teacher_width,
            teacher_depth=config.teacher_depth)
        dataset = Dataset("synthetic", *make_teacher_student(**provenance["args"]),
                          n_classes=10, augment=bool(config.augment), provenance=provenance)
    elif config.name == "mnist1d":
        from creditaudit.data.mnist1d import load_mnist1d

        arrays, provenance = load_mnist1d(config, seed=data_seed)
        dataset = Dataset("mnist1d", *arrays, n_classes=10, augment=bool(config.augment),
                          provenance=provenance)
    elif config.name in ("cifar10", "cifar100"):
        from creditaudit.data.cifar import load_cifar

        n_classes = 10 if config.name == "cifar10" else 100
        arrays = load_cifar(data_dir(config), n_classes=n_classes, download=config.download)
        mean, std = ((transforms.CIFAR10_MEAN, transforms.CIFAR10_STD) if n_classes == 10
                     else (transforms.CIFAR100_MEAN, transforms.CIFAR100_STD))
        augment = True if config.augment is None else config.augment
        dataset = Dataset(config.name, *arrays, n_classes=n_classes, mean=mean, std=std,
                          augment=augment)
    else:
        from creditaudit.data.idx import load_idx_dataset

        arrays = load_idx_dataset(data_dir(config), name=config.name)
        mean, std = ((transforms.MNIST_MEAN, transforms.MNIST_STD) if config.name == "mnist"
                     else (transforms.FASHION_MNIST_MEAN, transforms.FASHION_MNIST_STD))
        dataset = Dataset(config.name, *arrays, n_classes=10, mean=mean, std=std,
                          augment=bool(config.augment))
    for split, x in (("training", dataset.train_x), ("test", dataset.test_x)):
        if x.shape[0] == 0:
            raise DataError(f"the {split} split of {config.name} holds 0 samples"
                            f"{_where(config)}: nothing to train or evaluate on")
    if config.train_subset is not None:
        available = dataset.train_x.shape[0]
        if config.train_subset > available:
            raise ConfigError(f"data.train_subset={config.train_subset} exceeds the {available} "
                              f"training samples of {config.name}{_where(config)}; use at "
                              f"most {available}")
        dataset.train_x = dataset.train_x[: config.train_subset]
        dataset.train_y = dataset.train_y[: config.train_subset]
    return dataset


def _where(config: DataConfig) -> str:
    return f" in {config.data_dir}" if config.data_dir else ""


def data_dir(config: DataConfig) -> Path:
    """The dataset folder of a file dataset (DataError when none is configured)."""
    if config.data_dir is None:
        raise DataError(f"dataset {config.name!r} needs a data folder: pass --data-dir")
    return Path(config.data_dir).expanduser()


__all__ = ["Dataset", "InMemoryLoader", "load_dataset", "make_teacher_student", "data_dir",
           "n_classes_of"]
