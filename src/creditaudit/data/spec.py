"""The dataset component: what a ``data.name`` is, before any one dataset.

A :class:`DatasetSpec` is the ``data.name`` a config selects, used as an instance holding
its options (``SyntheticData(config.data)``). Its ``Options`` are the
``data.*`` keys it reads; it declares what one sample looks like and how many classes there
are before anything is loaded (:meth:`~DatasetSpec.input_shape`, :meth:`~DatasetSpec.n_classes`
— what a run plan checks an architecture against), computes the identity of the data it
would load once (:meth:`~DatasetSpec.identity`: a fingerprint of the files' content, or of
the generator's arguments) and loads it (:meth:`~DatasetSpec.load`), checking that what it
loaded is what it declared. :class:`GeneratedDataset` and :class:`FileDataset` are the two
kinds a dataset is built on (made from a seed, read from files); the built-in datasets are
in :mod:`creditaudit.data.registry`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from creditaudit.caller import DATA_DIR, Option, on_command_line
from creditaudit.config import opt
from creditaudit.config.keys import signless_zeros
from creditaudit.data import transforms
from creditaudit.data.dataset import Dataset
from creditaudit.data.identity import file_digest
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError, DataError, LoadedDataError
from creditaudit.files import strict_json
from creditaudit.registry import DATASETS, Component, defines

KINDS = ("generated", "files")
MAX_DATA_SEED = 2**32 - 1  # numpy's generators (mnist1d) take 32-bit seeds


def digest_text(payload: Any) -> str:
    """sha256 of a JSON-able payload (sorted keys; every float −0.0 in it hashed as 0.0, as
    in run ids: a generator's argument −0.0 makes the data 0.0 makes)."""
    return hashlib.sha256(json.dumps(signless_zeros(payload), sort_keys=True).encode()
                          ).hexdigest()


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
    hints = {"data_dir": Option("it is generated from its seed, not read from a folder: drop "
                                "--data-dir", "it is generated from its seed, not read from "
                                "a folder: drop data.data_dir")}

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
        check_provenance(self.name, provenance)
        seedless = {**provenance, "args": {k: v for k, v in provenance["args"].items()
                                           if k != "seed"}}
        return DataIdentity(self.name, digest_text(provenance), digest_text(seedless),
                            n_classes=self.n_classes(),
                            input_shape=list(self.input_shape()), provenance=provenance)


def check_provenance(name: str, provenance: Any) -> None:
    """LoadedDataError (one line) unless ``provenance`` — what a generated dataset ``name``
    returns from ``provenance()`` — is a dict holding its generator's arguments as a dict
    under ``"args"``, all strict JSON, no two keys of one object written alike (``1`` and
    ``"1"``): it is hashed into the run id and kept in the record."""
    shape = ("{'generator': ..., 'version': ..., 'args': {every argument that determines "
             "the arrays, the seed included}}")
    if not isinstance(provenance, dict) or not isinstance(provenance.get("args"), dict):
        what = (f"a dict without an 'args' dict (keys {sorted(map(str, provenance))})"
                if isinstance(provenance, dict) else f"a {type(provenance).__name__}")
        raise LoadedDataError(f"provenance() of {name} returned {what}: return {shape}")
    try:
        json.dumps(provenance, allow_nan=False)
    except (TypeError, ValueError) as err:  # a numpy number, a NaN
        raise LoadedDataError(f"provenance() of {name} is not strict JSON ({err}), but it "
                              "goes into the run id and the record: give Python ints, finite "
                              "floats, strings, lists and dicts (int() or float() of a numpy "
                              "number)") from None
    clash = strict_json.keys_spelled_alike(provenance)  # written twice, the record unreadable
    if clash is not None:
        (first, second), spelled = clash
        raise LoadedDataError(f"provenance() of {name} holds the keys {first!r} and {second!r} "
                              f"in one object, which JSON writes alike ({spelled!r}), so the "
                              "record would lose one value: name each with a string of its own")


class FileDataset(DatasetSpec[FileOptionsT]):
    """Read from files: identity = sha256 of the decoded content of every file read."""

    kind = "files"
    Options: ClassVar[type] = FileOptions
    hints = FILE_HINTS
    mean: ClassVar[tuple[float, ...]] = ()
    std: ClassVar[tuple[float, ...]] = ()
    augment_default: ClassVar[bool] = False
    # How messages name the files its test split is read from (e.g. "the t10k files"): a
    # test split that is not held out is then refused as those files of its folder, to be
    # replaced there; None: as what its code loaded from the folder.
    test_files: ClassVar[str | None] = None

    def folder(self) -> Path:
        """The dataset folder (DataError when none is configured)."""
        if self.options.data_dir is None:
            raise DataError(f"dataset {self.name!r} needs a data folder: pass {DATA_DIR}")
        return Path(self.options.data_dir).expanduser()

    def augments(self) -> bool:
        """Whether training images are augmented (``data.augment``, else the default)."""
        augment = self.options.augment
        return self.augment_default if augment is None else augment

    def folder_hint(self) -> str:
        """Where this dataset's files are found or got, said by the error that asks for a
        folder ("" when there is nothing to say)."""
        return ""

    def check(self) -> None:
        if self.options.data_dir is None:
            flag = " (--data-dir)" if on_command_line() else ""
            hint = self.folder_hint()
            raise ConfigError(f"data.name={self.name!r} needs data.data_dir{flag} "
                              f"pointing at the dataset folder{f'; {hint}' if hint else ''}")
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
        files = [(name, Path(path), decode) for name, path, decode in self.files()]
        if not files:  # the fingerprint would be the same for every folder's data
            raise LoadedDataError(f"files() of {self.name} lists no file, so its run ids would "
                                  "not follow the data: list every file arrays() reads, as "
                                  "(name, path, decoder or None)")
        names = [name for name, _, _ in files]
        if twice := sorted({name for name in names if names.count(name) > 1}):
            # one digest per name: the other files' content would be left out of the id
            raise LoadedDataError(f"files() of {self.name} lists more than one file as "
                                  f"{', '.join(map(repr, twice))}: give every file it reads "
                                  "a name of its own")
        digests = {name: file_digest(path, decode) for name, path, decode in files}
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



__all__ = ["DatasetSpec", "GeneratedDataset", "FileDataset", "GeneratedOptions", "FileOptions",
           "CifarOptions", "FILE_HINTS", "check_provenance", "KINDS", "MAX_DATA_SEED",
           "register", "digest_text", "DATASETS"]
