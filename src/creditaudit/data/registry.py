"""Datasets: self-describing loaders found by name.

A :class:`DatasetSpec` is the ``data.name`` a config selects. Its ``Options`` are the
``data.*`` keys it reads; it declares what one sample looks like and how many classes there
are before anything is loaded (:meth:`~DatasetSpec.input_shape`, :meth:`~DatasetSpec.n_classes`
— what a run plan checks an architecture against), computes the identity of the data it
would load once (:meth:`~DatasetSpec.identity`: a fingerprint of the files' content, or of
the generator's arguments) and loads it (:meth:`~DatasetSpec.load`), checking that what it
loaded is what it declared.

A package adds one through the ``creditaudit.datasets`` entry-point group (see
docs/extending.md); the built-ins register with :func:`register`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from creditaudit.config import opt
from creditaudit.data import transforms
from creditaudit.data.dataset import Dataset
from creditaudit.data.identity import file_digest
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError, DataError
from creditaudit.registry import DATASETS, Component

KINDS = ("generated", "files")
MAX_DATA_SEED = 2**32 - 1  # numpy's generators (mnist1d) take 32-bit seeds


def digest_text(payload: Any) -> str:
    """sha256 of a JSON-able payload (sorted keys)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class DatasetSpec(Component):
    """A dataset (see the module docstring).

    ``kind``: ``"generated"`` (made from a seed: ``data.data_seed``, default the run seed)
    or ``"files"`` (read from ``data.data_dir``). ``hints``: for keys a user may expect this
    dataset to read but it does not, what to use instead (shown in the error); under
    ``"images"``, how to make its samples readable by an image architecture.
    """

    kind: ClassVar[str] = "files"

    @classmethod
    def input_shape(cls, options: Any) -> tuple[int, ...]:
        """The shape of one sample: ``(C, H, W)`` images or ``(D,)`` features."""
        raise NotImplementedError

    @classmethod
    def n_classes(cls, options: Any) -> int:
        return 10

    @classmethod
    def sizes(cls, options: Any) -> tuple[int, int] | None:
        """(training, test) samples the dataset holds, before ``data.train_subset``, when
        they are known without reading the data (what a run plan checks the evaluation set
        against before anything is loaded); None otherwise."""
        return None

    @classmethod
    def check(cls, options: Any) -> None:
        """ConfigError (one line) for option values that cannot load."""

    @classmethod
    def identity(cls, options: Any, seed: int) -> DataIdentity:
        """Fingerprint of the data these options load (seed: of generated data)."""
        raise NotImplementedError

    @classmethod
    def load(cls, options: Any, seed: int) -> Dataset:
        """The data, in memory (``seed``: of generated data)."""
        raise NotImplementedError

    @classmethod
    def data_seed(cls, options: Any, run_seed: int) -> int:
        """The seed the data is made from (files: none; the run seed is passed through)."""
        return run_seed


def _validate(cls: type[DatasetSpec], source: str) -> None:
    if cls.kind not in KINDS:
        raise ConfigError(f"{source} ({cls.name}): kind must be one of "
                          f"{', '.join(KINDS)}")
    for method in ("input_shape", "identity", "load"):
        if getattr(cls, method).__func__ is getattr(DatasetSpec, method).__func__:
            raise ConfigError(f"{source} ({cls.name}) must implement {method}()")


DATASETS.configure(DatasetSpec, _validate)
register = DATASETS.register


# --- shared options -------------------------------------------------------------------------
@dataclass
class GeneratedOptions:
    """Generated datasets: sizes and the seed the arrays are made from."""

    n_train: int = opt(50000, "training samples to generate", min=1)
    n_test: int = opt(10000, "test samples to generate", min=1)
    data_seed: int | None = opt(None, "seed the data is generated from (None = run.seed)",
                                min=0, max=MAX_DATA_SEED)


@dataclass
class FileOptions:
    """Datasets read from files."""

    data_dir: str | None = opt(None, "folder holding the dataset files (--data-dir)",
                               role="place", path=True)
    augment: bool | None = opt(None, "random crop + flip of training images (default: on for "
                               "CIFAR, off otherwise)")


@dataclass
class CifarOptions(FileOptions):
    download: bool = opt(False, "download CIFAR if missing (needs internet)", role="place")


FILE_HINTS = {
    "n_train": "train on the first N training samples with data.train_subset=N",
    "n_test": "the test split is read whole from the files",
}


class GeneratedDataset(DatasetSpec):
    """Generated in memory from a seed: identity = the generator's arguments."""

    kind = "generated"
    hints = {"data_dir": "it is generated from its seed, not read from a folder: drop "
                         "--data-dir"}

    @classmethod
    def sizes(cls, options: Any) -> tuple[int, int] | None:
        return options.n_train, options.n_test

    @classmethod
    def data_seed(cls, options: Any, run_seed: int) -> int:
        """The seed the data is generated from: ``data.data_seed``, else the run seed."""
        return run_seed if options.data_seed is None else options.data_seed

    @classmethod
    def provenance(cls, options: Any, seed: int) -> dict[str, Any]:
        """``{"generator", "version"?, "args"}``: what determines the arrays."""
        raise NotImplementedError

    @classmethod
    def identity(cls, options: Any, seed: int) -> DataIdentity:
        provenance = cls.provenance(options, seed)
        seedless = {**provenance, "args": {k: v for k, v in provenance["args"].items()
                                           if k != "seed"}}
        return DataIdentity(cls.name, digest_text(provenance), digest_text(seedless),
                            n_classes=cls.n_classes(options),
                            input_shape=list(cls.input_shape(options)), provenance=provenance)


class FileDataset(DatasetSpec):
    """Read from files: identity = sha256 of the decoded content of every file read."""

    kind = "files"
    Options: ClassVar[type] = FileOptions
    hints = FILE_HINTS
    mean: ClassVar[tuple[float, ...]] = ()
    std: ClassVar[tuple[float, ...]] = ()
    augment_default: ClassVar[bool] = False

    @classmethod
    def folder(cls, options: Any) -> Path:
        """The dataset folder (DataError when none is configured)."""
        if options.data_dir is None:
            raise DataError(f"dataset {cls.name!r} needs a data folder: pass --data-dir")
        return Path(options.data_dir).expanduser()

    @classmethod
    def check(cls, options: Any) -> None:
        if options.data_dir is None:
            raise ConfigError(f"data.name={cls.name!r} needs data.data_dir (--data-dir) "
                              "pointing at the dataset folder")

    @classmethod
    def files(cls, options: Any) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        """(logical name, path, decoder) of every file the loader reads."""
        raise NotImplementedError

    @classmethod
    def identity(cls, options: Any, seed: int) -> DataIdentity:
        digests = {name: file_digest(path, decode) for name, path, decode in cls.files(options)}
        digest = digest_text({"name": cls.name, "files": digests})
        return DataIdentity(cls.name, digest, digest, n_classes=cls.n_classes(options),
                            input_shape=list(cls.input_shape(options)),
                            provenance={"files": digests})

    @classmethod
    def arrays(cls, options: Any) -> tuple[Any, Any, Any, Any]:
        """(train_x, train_y, test_x, test_y) as read from the files."""
        raise NotImplementedError

    @classmethod
    def load(cls, options: Any, seed: int) -> Dataset:
        augment = cls.augment_default if options.augment is None else options.augment
        return Dataset(cls.name, *cls.arrays(options), n_classes=cls.n_classes(options),
                       mean=cls.mean, std=cls.std, augment=augment)


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
class SyntheticData(GeneratedDataset):
    """The teacher–student task: Gaussian inputs labelled by a fixed random teacher."""

    name = "synthetic"
    label = "synthetic teacher–student"
    Options = SyntheticOptions
    rank = 0
    hints = {**GeneratedDataset.hints,
             "images": "set data.in_dim=3072 to view its inputs as 3×32×32 images"}

    @classmethod
    def input_shape(cls, options: Any) -> tuple[int, ...]:
        return (options.in_dim,)

    @classmethod
    def provenance(cls, options: Any, seed: int) -> dict[str, Any]:
        from creditaudit.data.synthetic import synthetic_provenance

        return synthetic_provenance(
            n_train=options.n_train, n_test=options.n_test, in_dim=options.in_dim,
            alpha=options.alpha, seed=seed, teacher_width=options.teacher_width,
            teacher_depth=options.teacher_depth)

    @classmethod
    def load(cls, options: Any, seed: int) -> Dataset:
        from creditaudit.data.synthetic import make_teacher_student

        provenance = cls.provenance(options, seed)
        return Dataset(cls.name, *make_teacher_student(**provenance["args"]), n_classes=10,
                       provenance=provenance)


@register
class MNIST1D(GeneratedDataset):
    """MNIST-1D (Greydanus 2020): a procedurally generated 1-D digit task, cached on disk."""

    name = "mnist1d"
    label = "MNIST-1D"
    Options = GeneratedOptions
    rank = 10
    LENGTH = 40

    @classmethod
    def input_shape(cls, options: Any) -> tuple[int, ...]:
        return (cls.LENGTH,)

    @classmethod
    def check(cls, options: Any) -> None:
        if (options.n_train + options.n_test) % 10:
            raise ConfigError(f"data.name='mnist1d' generates equally many samples per digit: "
                              f"data.n_train + data.n_test must be a multiple of 10, got "
                              f"{options.n_train} + {options.n_test}")

    @classmethod
    def provenance(cls, options: Any, seed: int) -> dict[str, Any]:
        from creditaudit.data.mnist1d import mnist1d_provenance

        return mnist1d_provenance(options, seed)

    @classmethod
    def load(cls, options: Any, seed: int) -> Dataset:
        from creditaudit.data.mnist1d import load_mnist1d

        arrays, provenance = load_mnist1d(options, seed=seed)
        return Dataset(cls.name, *arrays, n_classes=10, provenance=provenance)


class IDXDataset(FileDataset):
    """MNIST-format IDX files (raw or gzip): 60 000 + 10 000 grey 28×28 images."""


    @classmethod
    def input_shape(cls, options: Any) -> tuple[int, ...]:
        return (1, 28, 28)

    @classmethod
    def files(cls, options: Any) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        from creditaudit.data.idx import idx_files, read_idx_bytes

        return [(stem, p, read_idx_bytes) for stem, p in idx_files(cls.folder(options),
                                                                   cls.name)]

    @classmethod
    def arrays(cls, options: Any) -> tuple[Any, Any, Any, Any]:
        from creditaudit.data.idx import load_idx_dataset

        return load_idx_dataset(cls.folder(options), name=cls.name)


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


class CIFAR(FileDataset):
    """CIFAR python batches (downloaded on request): 50 000 + 10 000 colour 32×32 images."""

    Options = CifarOptions
    augment_default = True
    classes: ClassVar[int] = 10

    @classmethod
    def input_shape(cls, options: Any) -> tuple[int, ...]:
        return (3, 32, 32)

    @classmethod
    def n_classes(cls, options: Any) -> int:
        return cls.classes


    @classmethod
    def files(cls, options: Any) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        from creditaudit.data.cifar import cifar_files

        return [(p.name, p, None) for p in cifar_files(cls.folder(options), cls.classes,
                                                       download=options.download)]

    @classmethod
    def arrays(cls, options: Any) -> tuple[Any, Any, Any, Any]:
        from creditaudit.data.cifar import load_cifar

        return load_cifar(cls.folder(options), n_classes=cls.classes, download=options.download)


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


def dataset_spec(name: str) -> type[DatasetSpec]:
    """The dataset called ``name`` (ConfigError naming the choices otherwise)."""
    return DATASETS.get(name)


__all__ = ["DatasetSpec", "GeneratedDataset", "FileDataset", "GeneratedOptions", "FileOptions",
           "register", "dataset_spec", "digest_text", "DATASETS"]
