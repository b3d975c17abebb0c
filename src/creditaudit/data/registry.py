"""Datasets: self-describing loaders found by name — the built-ins, and the lookup.

The dataset component (:class:`~creditaudit.data.spec.DatasetSpec` and the two kinds it is
built on, generated and file datasets) is :mod:`creditaudit.data.spec`, re-exported here.
A package adds one through the ``creditaudit.datasets`` entry-point group (see
docs/extending.md); the built-ins register with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from creditaudit.caller import set_key
from creditaudit.config import opt
from creditaudit.data import transforms
from creditaudit.data.dataset import Dataset
from creditaudit.data.spec import (
    DATASETS,
    MAX_DATA_SEED,
    CifarOptions,
    DatasetSpec,
    FileDataset,
    FileOptions,
    GeneratedDataset,
    GeneratedOptions,
    digest_text,
    register,
)
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError
from creditaudit.registry import defines


# --- the built-ins --------------------------------------------------------------------------
@dataclass
class SyntheticOptions(GeneratedOptions):
    in_dim: int = opt(256, "input dimension (3072 = what ViT-Mini and ConvMixer view as "
                      "3×32×32 images)", min=1)
    alpha: float = opt(1.0, "teacher nonlinearity φ_α mix (0 linear, 1 tanh)", min=0.0,
                       max=1.0)
    teacher_width: int = opt(256, "teacher hidden width", min=1)
    teacher_depth: int = opt(2, "teacher hidden layers", min=1)


@register
class SyntheticData(GeneratedDataset[SyntheticOptions]):
    """The teacher–student task: Gaussian inputs labelled by a fixed random teacher."""

    name = "synthetic"
    label = "synthetic teacher–student"
    rank = 0
    hints = {**GeneratedDataset.hints,
             "images": "set data.in_dim=3072 to view its inputs as 3×32×32 images"}

    def input_shape(self) -> tuple[int, ...]:
        return (self.options.in_dim,)

    def provenance(self, seed: int) -> dict[str, Any]:
        from creditaudit.data.synthetic import synthetic_provenance

        options = self.options
        return synthetic_provenance(
            n_train=options.n_train, n_test=options.n_test, in_dim=options.in_dim,
            alpha=options.alpha, seed=seed, teacher_width=options.teacher_width,
            teacher_depth=options.teacher_depth)

    def load(self, seed: int) -> Dataset:
        from creditaudit.data.synthetic import make_teacher_student

        provenance = self.provenance(seed)
        return Dataset(self.name, *make_teacher_student(**provenance["args"]), n_classes=10,
                       provenance=provenance)


@register
class MNIST1D(GeneratedDataset[GeneratedOptions]):
    """MNIST-1D (Greydanus 2020): a procedurally generated 1-D digit task, cached on disk."""

    name = "mnist1d"
    label = "MNIST-1D"
    rank = 10
    LENGTH = 40

    def input_shape(self) -> tuple[int, ...]:
        return (self.LENGTH,)

    def check(self) -> None:
        if (self.options.n_train + self.options.n_test) % 10:
            raise ConfigError(f"data.name='mnist1d' generates equally many samples per digit: "
                              f"data.n_train + data.n_test must be a multiple of 10, got "
                              f"{self.options.n_train} + {self.options.n_test}")

    def data_seed(self, run_seed: int) -> int:
        """The seed the data is generated from; ConfigError (before anything is generated)
        when the run seed it defaults to does not fit the generator's 32-bit seed."""
        seed = super().data_seed(run_seed)
        if seed > MAX_DATA_SEED:  # data.data_seed's own range is checked by the config
            raise ConfigError(f"run.seed={run_seed} is also the data seed, but {self.name} "
                              f"draws its data with a 32-bit seed (0 … {MAX_DATA_SEED}): "
                              "set data.data_seed explicitly (e.g. "
                              f"{set_key('--set data.data_seed=0', 'data.data_seed', 0)})")
        return seed

    def provenance(self, seed: int) -> dict[str, Any]:
        from creditaudit.data.mnist1d import mnist1d_provenance

        return mnist1d_provenance(self.options, seed)

    def load(self, seed: int) -> Dataset:
        from creditaudit.data.mnist1d import load_mnist1d

        arrays, provenance = load_mnist1d(self.options, seed=seed)
        return Dataset(self.name, *arrays, n_classes=10, provenance=provenance)


class IDXDataset(FileDataset[FileOptions]):
    """MNIST-format IDX files (raw or gzip): 60 000 + 10 000 grey 28×28 images."""

    test_files = "the t10k files"
    # The hooks whose own code sizes() takes the headers to describe (not a subclass's).
    READS: ClassVar[tuple[str, ...]] = ("folder", "files", "arrays", "load")

    def input_shape(self) -> tuple[int, ...]:
        return (1, 28, 28)

    def sizes(self) -> tuple[int, int] | None:
        """(training, test) images, as the image files' headers declare them (a few bytes
        read: a run plan knows them before loading, so ``data.train_subset`` equal to the
        whole training split is the default's run); None without a readable folder, and
        for a subclass that reads or loads otherwise (it declares its own sizes)."""
        from creditaudit.data.idx import idx_sizes

        if self.options.data_dir is None or any(
                defines(type(self), hook, IDXDataset) for hook in self.READS):
            return None
        return idx_sizes(self.folder(), self.name)

    def folder_hint(self) -> str:
        from creditaudit.data.idx import folder_hint

        return folder_hint(self.name)

    def files(self) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        from creditaudit.data.idx import idx_files, read_idx_bytes

        return [(stem, p, read_idx_bytes) for stem, p in idx_files(self.folder(),
                                                                   self.name)]

    def identity(self, seed: int) -> DataIdentity:
        """The files' fingerprint; DataError when the folder holds the other built-in IDX
        dataset's official files (:func:`~creditaudit.data.idx.check_own_files`)."""
        from creditaudit.data.idx import check_own_files

        identity = super().identity(seed)
        check_own_files(self.name, identity.provenance["files"], self.folder())
        return identity

    def arrays(self) -> tuple[Any, Any, Any, Any]:
        from creditaudit.data.idx import load_idx_dataset

        return load_idx_dataset(self.folder(), name=self.name, side=self.input_shape()[-1])


@register
class MNIST(IDXDataset):
    name = "mnist"
    label = "MNIST"
    mean, std = transforms.MNIST_MEAN, transforms.MNIST_STD
    rank = 20


@register
class FashionMNIST(IDXDataset):
    name = "fashion-mnist"
    label = "Fashion-MNIST"
    mean, std = transforms.FASHION_MNIST_MEAN, transforms.FASHION_MNIST_STD
    rank = 30


class CIFAR(FileDataset[CifarOptions]):
    """CIFAR python batches (downloaded on request): 50 000 + 10 000 colour 32×32 images."""

    augment_default = True
    classes: ClassVar[int] = 10
    test_files = "the test batch"

    def input_shape(self) -> tuple[int, ...]:
        return (3, 32, 32)

    def n_classes(self) -> int:
        return self.classes

    def files(self) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        from creditaudit.data.cifar import cifar_files

        return [(p.name, p, None) for p in cifar_files(self.folder(), self.classes,
                                                       download=self.options.download)]

    def arrays(self) -> tuple[Any, Any, Any, Any]:
        from creditaudit.data.cifar import load_cifar

        return load_cifar(self.folder(), n_classes=self.classes, download=self.options.download)


@register
class CIFAR10(CIFAR):
    name = "cifar10"
    label = "CIFAR-10"
    mean, std = transforms.CIFAR10_MEAN, transforms.CIFAR10_STD
    rank = 40


@register
class CIFAR100(CIFAR):
    name = "cifar100"
    label = "CIFAR-100"
    classes = 100
    mean, std = transforms.CIFAR100_MEAN, transforms.CIFAR100_STD
    rank = 50


def dataset_spec(name: str) -> type[DatasetSpec[Any]]:
    """The dataset class called ``name`` (ConfigError naming the choices otherwise);
    ``dataset_spec(name)(config.data)`` is the instance that loads."""
    return DATASETS.get(name)


__all__ = ["DatasetSpec", "GeneratedDataset", "FileDataset", "GeneratedOptions", "FileOptions",
           "register", "dataset_spec", "digest_text", "DATASETS"]
