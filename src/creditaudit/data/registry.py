"""Datasets: self-describing loaders found by name.

A :class:`DatasetSpec` is the ``data.name`` a config selects, used as an instance holding
its options (``SyntheticData(config.data)``). Its ``Options`` are the
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
from typing import Any, ClassVar, Generic, TypeVar

from creditaudit.config import opt
from creditaudit.data import transforms
from creditaudit.data.dataset import Dataset
from creditaudit.data.identity import file_digest
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError, DataError
from creditaudit.registry import DATASETS, Component, defines

KINDS = ("generated", "files")
MAX_DATA_SEED = 2**32 - 1  # numpy's generators (mnist1d) take 32-bit seeds


def digest_text(payload: Any) -> str:
    """sha256 of a JSON-able payload (sorted keys)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# Covariant: a dataset of SyntheticOptions is a dataset of GeneratedOptions.
OptionsT = TypeVar("OptionsT", covariant=True)


class DatasetSpec(Component, Generic[OptionsT]):
    """A dataset (see the module docstring), used as an instance holding its options
    (``self.options``: its config section, ``config.data``, or ``Options`` instance),
    declared as the parameter of the base (``class MyData(DatasetSpec[MyOptions])``).

    ``kind``: ``"generated"`` (made from a seed: ``data.data_seed``, default the run seed)
    or ``"files"`` (read from ``data.data_dir``). ``hints``: for keys a user may expect this
    dataset to read but it does not, what to use instead (shown in the error); under
    ``"images"``, how to make its samples readable by an image architecture.
    """

    kind: ClassVar[str] = "files"
    hooks = ("input_shape", "n_classes", "sizes", "check", "identity", "load", "data_seed",
             "provenance", "folder", "files", "arrays", "same_as_default")

    options: OptionsT

    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: ``(C, H, W)`` images or ``(D,)`` features."""
        raise NotImplementedError

    def n_classes(self) -> int:
        """How many classes the labels run over (0 … n_classes − 1)."""
        return 10

    def sizes(self) -> tuple[int, int] | None:
        """(training, test) samples the dataset holds, before ``data.train_subset``, when
        they are known without reading the data (what a run plan checks the evaluation set
        against before anything is loaded); None otherwise."""
        return None

    def check(self) -> None:
        """ConfigError (one line) for option values that cannot load."""

    def identity(self, seed: int) -> DataIdentity:
        """Fingerprint of the data these options load (seed: of generated data)."""
        raise NotImplementedError

    def load(self, seed: int) -> Dataset:
        """The data, in memory (``seed``: of generated data)."""
        raise NotImplementedError

    def data_seed(self, run_seed: int) -> int:
        """The seed the data is made from (files: none; the run seed is passed through)."""
        return run_seed

    def same_as_default(self, run_seed: int) -> dict[str, Any]:
        """Own options whose value, given explicitly, loads what their default loads, by
        name, with that default (the run is then the default's run: one id, one record)."""
        return {}


def _validate(cls: type[DatasetSpec], source: str) -> None:
    if cls.kind not in KINDS:
        raise ConfigError(f"{source} ({cls.name}): kind must be one of "
                          f"{', '.join(KINDS)}")
    for method in ("input_shape", "identity", "load"):
        if not defines(cls, method, DatasetSpec):
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
    augment_padding: int = opt(transforms.CROP_PADDING, "augmentation: zero padding of the "
                               "random crop in pixels (2 = the MNIST jitter of ±2 px; read "
                               "only when data.augment is on)", min=0)
    augment_flip: bool = opt(True, "augmentation: random horizontal flips (read only when "
                             "data.augment is on)")


@dataclass
class CifarOptions(FileOptions):
    download: bool = opt(False, "download CIFAR if missing (needs internet)", role="place")


FILE_HINTS = {
    "n_train": "train on the first N training samples with data.train_subset=N",
    "n_test": "the test split is read whole from the files",
}


GeneratedOptionsT = TypeVar("GeneratedOptionsT", bound=GeneratedOptions, covariant=True)
FileOptionsT = TypeVar("FileOptionsT", bound=FileOptions, covariant=True)


class GeneratedDataset(DatasetSpec[GeneratedOptionsT]):
    """Generated in memory from a seed: identity = the generator's arguments."""

    kind = "generated"
    hints = {"data_dir": "it is generated from its seed, not read from a folder: drop "
                         "--data-dir"}

    def sizes(self) -> tuple[int, int] | None:
        return self.options.n_train, self.options.n_test

    def data_seed(self, run_seed: int) -> int:
        """The seed the data is generated from: ``data.data_seed``, else the run seed."""
        return run_seed if self.options.data_seed is None else self.options.data_seed

    def same_as_default(self, run_seed: int) -> dict[str, Any]:
        """``data_seed`` equal to the run seed is its default (None = the run seed)."""
        return {"data_seed": None} if self.options.data_seed == run_seed else {}

    def provenance(self, seed: int) -> dict[str, Any]:
        """``{"generator", "version"?, "args"}``: what determines the arrays."""
        raise NotImplementedError

    def identity(self, seed: int) -> DataIdentity:
        provenance = self.provenance(seed)
        seedless = {**provenance, "args": {k: v for k, v in provenance["args"].items()
                                           if k != "seed"}}
        return DataIdentity(self.name, digest_text(provenance), digest_text(seedless),
                            n_classes=self.n_classes(),
                            input_shape=list(self.input_shape()), provenance=provenance)


class FileDataset(DatasetSpec[FileOptionsT]):
    """Read from files: identity = sha256 of the decoded content of every file read."""

    kind = "files"
    Options: ClassVar[type] = FileOptions
    hints = FILE_HINTS
    mean: ClassVar[tuple[float, ...]] = ()
    std: ClassVar[tuple[float, ...]] = ()
    augment_default: ClassVar[bool] = False

    def folder(self) -> Path:
        """The dataset folder (DataError when none is configured)."""
        if self.options.data_dir is None:
            raise DataError(f"dataset {self.name!r} needs a data folder: pass --data-dir")
        return Path(self.options.data_dir).expanduser()

    def augments(self) -> bool:
        """Whether training images are augmented (``data.augment``, else the default)."""
        augment = self.options.augment
        return self.augment_default if augment is None else augment

    def check(self) -> None:
        if self.options.data_dir is None:
            raise ConfigError(f"data.name={self.name!r} needs data.data_dir (--data-dir) "
                              "pointing at the dataset folder")
        self.check_augmentation()

    def check_augmentation(self) -> None:
        """ConfigError (one line) for an augmentation option set where no augmentation
        reads it — the run would train on images neither padded nor flipped, unlike what
        its config says — or a padding as wide as the images, whose crops could then hold
        padding only."""
        options = self.options
        changed = [key for key, default in (("augment_padding", transforms.CROP_PADDING),
                                            ("augment_flip", True))
                   if getattr(options, key) != default]
        if changed and not self.augments():
            given = " and ".join(f"data.{key}={json.dumps(getattr(options, key))}"
                                 for key in changed)
            why = ("data.augment=false" if options.augment is False
                   else f"{self.name} is not augmented by default")
            raise ConfigError(f"{given} {'is' if len(changed) == 1 else 'are'} read only when "
                              f"training images are augmented, and {why}: set "
                              f"data.augment=true, or drop "
                              f"{' and '.join(f'data.{key}' for key in changed)}")
        side = min(self.input_shape()[1:], default=None)
        if self.augments() and side is not None and options.augment_padding >= side:
            raise ConfigError(f"data.augment_padding={options.augment_padding} is as wide as "
                              f"the {side}-pixel side of {self.name}'s images, so a crop "
                              f"could hold padding only; use at most {side - 1}")

    def files(self) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        """(logical name, path, decoder) of every file the loader reads."""
        raise NotImplementedError

    def identity(self, seed: int) -> DataIdentity:
        digests = {name: file_digest(path, decode) for name, path, decode in self.files()}
        digest = digest_text({"name": self.name, "files": digests})
        return DataIdentity(self.name, digest, digest, n_classes=self.n_classes(),
                            input_shape=list(self.input_shape()),
                            provenance={"files": digests})

    def arrays(self) -> tuple[Any, Any, Any, Any]:
        """(train_x, train_y, test_x, test_y) as read from the files."""
        raise NotImplementedError

    def load(self, seed: int) -> Dataset:
        # mean/std left at () mean none: right for features; images are refused without them
        return Dataset(self.name, *self.arrays(), n_classes=self.n_classes(),
                       mean=self.mean or None, std=self.std or None, augment=self.augments(),
                       augment_padding=self.options.augment_padding,
                       augment_flip=self.options.augment_flip)


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
                              "set data.data_seed explicitly (e.g. --set data.data_seed=0)")
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

    def input_shape(self) -> tuple[int, ...]:
        return (1, 28, 28)

    def files(self) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
        from creditaudit.data.idx import idx_files, read_idx_bytes

        return [(stem, p, read_idx_bytes) for stem, p in idx_files(self.folder(),
                                                                   self.name)]

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

        return load_cifar(self.folder(), n_classes=self.classes,
                          download=self.options.download)


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
