"""Datasets held in memory, their loaders and the fixed evaluation subset, and the registry
of datasets that load them (:mod:`creditaudit.data.registry`).

Images are kept as uint8 ``(N, C, H, W)`` and normalised (and augmented) per batch;
feature datasets (synthetic, mnist1d) are float32 ``(N, D)``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from creditaudit.data.dataset import EVAL_SUBSET_SEED, Dataset
from creditaudit.data.identity import changed_files
from creditaudit.data.loader import InMemoryLoader, samples_problem
from creditaudit.data.registry import (
    DATASETS,
    DatasetSpec,
    FileDataset,
    GeneratedDataset,
    dataset_spec,
    register,
)
from creditaudit.data.rows import HELD_OUT_CHECK, held_out_problem
from creditaudit.data.spec import digest_text
from creditaudit.data.synthetic import make_teacher_student
from creditaudit.data.transforms import normalization
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError, DataError, LoadedDataError


def load_dataset(options: Any, *, seed: int, spec: DatasetSpec[Any] | None = None
                 ) -> Dataset:
    """Load (or generate) the dataset ``options.name`` selects (``options``: a config's data
    section; ``spec``: the dataset holding those options, when the caller has resolved it
    and computed its identity — a run plan); ``seed``: the run seed (generated data uses
    ``data.data_seed`` when set).

    Without ``spec`` the dataset's identity is computed here first
    (:meth:`~creditaudit.data.spec.DatasetSpec.identity`), so the data a run would refuse is
    refused here too (e.g. Fashion-MNIST's files given as ``mnist``); a file's digest is
    computed once per machine (:func:`~creditaudit.data.identity.file_digest`). Checks what
    was loaded against what the dataset declares (sample shape, classes, equal train and
    test shapes: :func:`check_loaded`; the sizes of ``sizes()``: :func:`check_sizes`) and
    applies ``data.train_subset`` (ConfigError when it keeps training samples of one class).
    """
    if spec is None:
        spec = dataset_spec(options.name)(options)
    spec.check()
    identity = spec.identity(spec.data_seed(seed))
    dataset = spec.load(spec.data_seed(seed))
    check_loaded(spec, dataset)
    check_sizes(spec, dataset)
    check_held_out_split(spec, dataset)
    if options.train_subset is not None:
        check_train_subset(options, spec.name, dataset.train_x.shape[0])
        dataset.train_x = dataset.train_x[: options.train_subset]
        dataset.train_y = dataset.train_y[: options.train_subset]
        if bool((dataset.train_y == dataset.train_y[0]).all()):  # the whole split has 2+
            raise ConfigError(f"data.train_subset={options.train_subset} keeps training "
                              f"samples of {spec.name} labelled {int(dataset.train_y[0])} only "
                              f"(its first {options.train_subset}): {ONE_CLASS_WHY}; use a larger "
                              "subset")
    dataset.loaded_as = (_loading(options, identity.fingerprint), dataset.content_digest(),
                         _handling(dataset))
    return dataset


# What a Dataset holds besides its arrays that a run reads: how its batches become model
# inputs (normalisation, augmentation), its classes, and what its record says of it.
HANDLING = ("name", "n_classes", "mean", "std", "augment", "augment_padding", "augment_flip",
            "provenance")


def _handling(dataset: Dataset) -> dict[str, Any]:
    """The :data:`HANDLING` fields of ``dataset``, copied (a later edit leaves them)."""
    return copy.deepcopy({key: getattr(dataset, key) for key in HANDLING})


def _same(value: Any, loaded: Any) -> bool:
    """Whether a :data:`HANDLING` field still holds the value it was loaded with (a value a
    caller put there that ``==`` cannot compare, e.g. a tensor of several numbers, is
    another value)."""
    try:
        return bool(value == loaded)
    except (RuntimeError, TypeError, ValueError):
        return False


def _loading(options: Any, fingerprint: str) -> str:
    """What a load was asked for: the data options (a config's data section) and the
    fingerprint of the data they name."""
    return digest_text({"options": dataclasses.asdict(options), "fingerprint": fingerprint})


def check_handed(dataset: Dataset, options: Any, fingerprint: str) -> None:
    """ConfigError (one line) unless ``dataset`` — handed to a run (``train(config,
    dataset=…)``) instead of loaded by it — is what the run would load: returned by
    :func:`load_dataset` for the same data options (``options``: the run's data section;
    ``fingerprint``: its data's) and unchanged since, its arrays and its :data:`HANDLING`
    fields alike. The run's id and record name the data its config names; other arrays, or
    the same ones normalised or augmented otherwise, under that name would be a record of
    data it never saw."""
    fix = ("pass what load_dataset(config.data, seed=config.run.seed) returns for this "
           "config, unchanged, or leave dataset= out (other data: register it as a dataset)")
    if dataset.loaded_as is None:
        raise ConfigError(f"the data handed to the run ({dataset.name}) was not loaded by "
                          f"load_dataset: {fix}")
    if not (isinstance(dataset.loaded_as, tuple) and len(dataset.loaded_as) == 3):
        raise ConfigError(f"the data handed to the run ({dataset.name}) was loaded by another "
                          "version of creditaudit (a copy kept since, e.g. pickled or cached), "
                          f"which left no record this one can check: {fix}")
    asked, digest, handling = dataset.loaded_as
    if asked != _loading(options, fingerprint):
        raise ConfigError(f"the data handed to the run ({dataset.name}) was loaded for other "
                          f"data than the run's (another dataset, data option or seed): {fix}")
    if dataset.content_digest() != digest:
        raise ConfigError(f"the data handed to the run ({dataset.name}) changed after it was "
                          f"loaded (its arrays were replaced or edited): {fix}")
    edited = [key for key, loaded in handling.items() if not _same(getattr(dataset, key), loaded)]
    if edited:  # same arrays, other inputs or another record under the config's run id
        raise ConfigError(f"the data handed to the run ({dataset.name}) changed after it was "
                          f"loaded (its {', '.join(edited)} edited): {fix}")


def check_same_files(spec: DatasetSpec[Any], identity: DataIdentity, seed: int) -> None:
    """DataError (one line) when the files of ``spec`` (a file dataset holding its options)
    no longer hold what ``identity`` — their fingerprint taken when the run was planned —
    says: called once they are loaded, so the arrays a run trains on are the data its run
    id names (a sweep planned before its data folder changed would record one dataset's id
    beside another's arrays). Generated datasets are identified by their arguments: no-op."""
    if spec.kind != "files":
        return
    now = spec.identity(seed)
    if now.fingerprint == identity.fingerprint:
        return
    changed = changed_files(identity.provenance, now.provenance)
    where = spec.folder() if isinstance(spec, FileDataset) else "its data folder"
    raise DataError(f"the files of {spec.name} in {where} changed after the run was planned "
                    f"({', '.join(changed) or 'their content'}: fingerprint "
                    f"{identity.fingerprint[:12]}… planned, {now.fingerprint[:12]}… loaded), so "
                    "its run id would name other data than it trains on: plan the run again "
                    "once the data stops changing")


def check_train_subset(options: Any, name: str, available: int) -> None:
    """ConfigError (one line) when ``data.train_subset`` (of ``options``, a data section)
    asks for more than the ``available`` training samples of dataset ``name``."""
    subset = options.train_subset
    if subset is not None and subset > available:
        raise ConfigError(f"data.train_subset={subset} exceeds the {available} training "
                          f"samples of {name}; use at most {available}")


# Why a training split of one class is refused, like a dataset of one class (check_declared).
ONE_CLASS_WHY = ("a network trained on one class learns to answer it whatever its input, "
                 "so no rule's credit is compared on learning to tell classes apart")
ONE_CLASS = f"{ONE_CLASS_WHY}; give training labels of at least 2 classes"


def _refuse_one_class(spec: DatasetSpec[Any], dataset: Dataset, label: int) -> None:
    """Refuse a training split whose labels are all ``label``: a ConfigError naming
    ``data.n_train`` when a built-in generator drew it (a few samples of its teacher or
    digits may all be of one class: the user's size, not the data, is at fault); a
    LoadedDataError asking for labels of 2 classes otherwise (a plugin is named by
    :func:`creditaudit.run.run_code.dataset_at_fault`)."""
    found = (f"the training labels of {spec.name} are all {label} (of its "
             f"{dataset.n_classes} classes)")
    n_train = getattr(getattr(spec, "options", None), "n_train", None)
    if (type(spec) in DATASETS.builtin_classes() and isinstance(spec, GeneratedDataset)
            and _whole(n_train)):
        raise ConfigError(f"data.n_train={n_train}: {found}: {ONE_CLASS_WHY}; use a larger "
                          "data.n_train")
    raise LoadedDataError(f"{found}: {ONE_CLASS}")


def _whole(value: Any) -> bool:
    """Whether ``value`` is a Python int >= 1 (not a bool, not a numpy number)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_declared(spec: DatasetSpec[Any]) -> tuple[tuple[int, ...], int]:
    """The sample shape and the number of classes ``spec`` declares (``input_shape()``,
    ``n_classes()``); LoadedDataError (one line) unless they are Python ints >= 1 — the
    model is sized by them and every record holds them as JSON — and the classes at least
    2: the cross-entropy of one class is 0 whatever the network computes, so no credit
    reaches a layer and a run would record every rule's verdicts on zero gradients."""
    shape, classes = spec.input_shape(), spec.n_classes()
    if not (isinstance(shape, tuple | list) and shape and all(map(_whole, shape))):
        raise LoadedDataError(f"input_shape() of {spec.name} is {shape!r}: return a "
                              "tuple of Python ints >= 1, (C, H, W) or (D,) (int() of a "
                              "numpy or float number)")
    if not _whole(classes):
        raise LoadedDataError(f"n_classes() of {spec.name} is {classes!r}: return a "
                              "Python int >= 1 (int() of a numpy or float number)")
    if classes < 2:
        raise LoadedDataError(f"n_classes() of {spec.name} is 1: the cross-entropy of one "
                              "class is 0 whatever the network computes, so no credit reaches "
                              "any layer; give labels of at least 2 classes")
    return tuple(shape), classes


def _holding_problem(array: torch.Tensor) -> str | None:
    """Why ``array`` holds no values the loader and the checks can read (a sparse layout,
    the meta device), as the end of a sentence with its fix; None when it holds them."""
    if array.layout != torch.strided:
        return (f"a sparse tensor ({array.layout}), but every batch is indexed from dense "
                "arrays: give dense tensors (.to_dense())")
    if array.is_meta:
        return ("on the meta device, which holds shapes but no values: give tensors "
                "holding the data (on the CPU)")
    return None


def check_loaded(spec: DatasetSpec[Any], dataset: Dataset) -> None:
    """LoadedDataError (one line) when what ``spec`` (a dataset holding its options)
    declares is not whole numbers (:func:`check_declared`), or the loaded arrays are not
    what it declares (sample shape, classes, labels within them, training labels of 2
    classes or more, finite features) or what the loader reads (uint8 images or features
    in torch's default dtype, int64 labels), or their normalisation
    (:func:`check_normalisation`) or augmentation is one the loader cannot apply. A
    built-in generator's training split of one class is a ConfigError naming its
    ``data.n_train`` instead (:func:`_refuse_one_class`)."""
    declared, classes = check_declared(spec)
    wrong = LoadedDataError
    if not _whole(dataset.n_classes) or dataset.n_classes != classes:
        raise wrong(f"{spec.name} loaded {dataset.n_classes!r} classes but declares {classes}"
                    + ("" if _whole(dataset.n_classes) else ": give Dataset(..., n_classes=) "
                       "a Python int"))
    for split, x, y in (("training", dataset.train_x, dataset.train_y),
                        ("test", dataset.test_x, dataset.test_y)):
        for what, array in (("samples", x), ("labels", y)):
            if not isinstance(array, torch.Tensor):  # a numpy array's float32 is no torch's
                kind = type(array)
                raise wrong(f"the {split} {what} of {spec.name} are a {kind.__module__}."
                            f"{kind.__qualname__}, not a torch.Tensor: give tensors "
                            "(torch.from_numpy(array))")
            if (held := _holding_problem(array)) is not None:  # no value could be read
                raise wrong(f"the {split} {what} of {spec.name} are {held}")
        if x.shape[0] == 0:
            raise wrong(f"the {split} split of {spec.name} holds 0 samples: nothing to train "
                        "or evaluate on")
        if tuple(x.shape[1:]) != declared:
            channels_last = (len(declared) == 3 and x.dim() == 4
                             and tuple(x.shape[1:]) == (*declared[1:], declared[0]))
            raise wrong(f"the {split} samples of {spec.name} have shape {tuple(x.shape[1:])}, "
                        f"but {spec.name} declares {declared}: "
                        + (CHANNELS_FIRST if channels_last else
                           "point data.data_dir at the dataset's own files"))
        if y.shape != (x.shape[0],):
            raise wrong(f"the {split} labels of {spec.name} have shape {tuple(y.shape)} for "
                        f"{x.shape[0]} samples")
        if (problem := samples_problem(x)) is not None:  # what the loader reads
            raise wrong(f"the {split} samples of {spec.name}: {problem}")
        if y.dtype != torch.int64:  # what the loss takes as class indices
            raise wrong(f"the {split} labels of {spec.name} are {y.dtype}, not int64: give "
                        f"int64 labels (N,)")
        if x.is_floating_point():
            finite = torch.isfinite(x.flatten(1)).all(dim=1)
            if not bool(finite.all()):
                bad, first = int((~finite).sum()), int((~finite).nonzero()[0])
                raise wrong(f"the {split} samples of {spec.name} hold NaN or infinite values "
                            f"({bad} of {x.shape[0]}, the first at index {first}): training "
                            "on them would diverge; give finite features")
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= dataset.n_classes:  # the loss would index out of its logits
            raise wrong(f"the {split} labels of {spec.name} run {low} … {high}, outside 0 … "
                        f"{dataset.n_classes - 1} (its {dataset.n_classes} classes)")
        if split == "training" and low == high:
            _refuse_one_class(spec, dataset, low)
    padding = dataset.augment_padding
    if dataset.augment and (isinstance(padding, bool) or not isinstance(padding, int)
                            or padding < 0 or not isinstance(dataset.augment_flip, bool)):
        raise wrong(f"{spec.name} loaded data augmented with a crop padding of {padding!r} "
                    f"and flip={dataset.augment_flip!r}: the padding must be a whole number "
                    "of pixels >= 0 and flip true or false")
    side = min(dataset.train_x.shape[2:], default=None)
    if dataset.augment and dataset.is_image and side is not None and padding >= side:
        raise wrong(f"{spec.name} loaded images augmented with a crop padding of {padding} "
                    f"pixels, as wide as their {side}-pixel side, so a crop could hold padding "
                    f"only: use at most {side - 1}")
    check_normalisation(spec, dataset)


def check_held_out_split(spec: DatasetSpec[Any], dataset: Dataset) -> None:
    """LoadedDataError (one line) when the test split of ``dataset`` (as ``spec`` loaded it,
    before ``data.train_subset``: the data, whatever part of it a run trains on) is not held
    out from its training split (:func:`~creditaudit.data.rows.held_out_problem`: exact and
    near copies, the one check of a load), unless ``spec`` declares that by design
    (``expected_failures``). A file dataset's refusal names its folder and, when it says
    which (``test_files``), the files its test split is read from (t10k files or a test
    batch copied from the training files); a plugin's is named by the caller
    (:func:`creditaudit.run.run_code.dataset_at_fault`). The door checks it at tiny sizes
    only, and a test split cut from the training arrays at a run's sizes would record
    memorisation as test accuracy."""
    if HELD_OUT_CHECK in getattr(spec, "expected_failures", {}):
        return
    problem = held_out_refusal(spec, dataset)
    if problem is not None:
        raise LoadedDataError(problem)


def held_out_refusal(spec: DatasetSpec[Any], dataset: Dataset) -> str | None:
    """Why the test split of ``dataset`` (as ``spec`` loaded it) is not held out, as one
    line naming what was read — a file dataset's folder and the files its test split is
    read from (``test_files``) — or None when it is held out; what a load refuses
    (:func:`check_held_out_split`) and the conformance check ``test_split_is_held_out``
    asserts, whatever ``spec`` declares."""
    files = spec.test_files if isinstance(spec, FileDataset) else None
    problem = held_out_problem(dataset.train_x, dataset.train_y, dataset.test_x,
                               dataset.test_y, files=files)
    if problem is None:
        return None
    where = (f"{spec.name} folder {spec.folder()}" if isinstance(spec, FileDataset)
             else f"the data {spec.name} loaded")
    return f"{where}: {problem}"


def check_sizes(spec: DatasetSpec[Any], dataset: Dataset) -> None:
    """LoadedDataError (one line) when ``spec.sizes()`` declares (training, test) sizes that
    the arrays ``dataset`` holds are not: a run plan fits the evaluation set and the
    training subset to the declared sizes before anything is loaded."""
    declared = spec.sizes()
    if declared is None:
        return
    loaded = (int(dataset.train_x.shape[0]), int(dataset.test_x.shape[0]))
    if tuple(declared) != loaded:
        train, test = declared
        raise LoadedDataError(
            f"{spec.name} loaded {loaded[0]} training and {loaded[1]} test samples, but its "
            f"sizes() says {train} and {test}: make sizes() return what load() gives (or None "
            "when the sizes are known only once loaded)")


# How images given channels-last are fixed (what check_loaded and check_normalisation say).
CHANNELS_FIRST = ("give images as (N, C, H, W) — x.permute(0, 3, 1, 2) of (N, H, W, C) "
                  "arrays — and declare input_shape() (C, H, W)")


def check_normalisation(spec: DatasetSpec[Any], dataset: Dataset) -> None:
    """LoadedDataError (one line) unless ``dataset`` turns its samples into model inputs the
    way the loader can: uint8 images with a mean and a positive std per channel (every batch
    is standardised with them); float features with neither, and not augmented (they pass
    unchanged)."""
    name, mean, std = spec.name, dataset.mean, dataset.std
    wrong = LoadedDataError
    given = f"mean={mean!r} and std={std!r}"
    if dataset.train_x.dtype == torch.uint8:
        channels = dataset.train_x.shape[1]
        fix = (f"set mean and std, one value per channel ({channels}) of the [0, 1]-scaled "
               "pixels (a FileDataset: its class attributes mean and std; a Dataset built by "
               "hand: Dataset(..., mean=..., std=...))")
        if mean is not None and std is not None and not (
                isinstance(mean, tuple | list) and isinstance(std, tuple | list)):
            raise wrong(f"{name} loaded uint8 images with a mean of type "
                        f"{type(mean).__name__} and a std of type {type(std).__name__}: "
                        f"{fix}, as tuples of floats")
        if not mean or not std:
            raise wrong(f"{name} loaded uint8 images but no normalisation for them ({given}): "
                        f"{fix}")
        try:
            normalization(mean, std, channels)
        except (ValueError, TypeError) as err:  # TypeError: a value that is no number
            if len(mean) == dataset.train_x.shape[-1] != channels:  # (N, H, W, C) arrays?
                if channels > len(mean):  # a side longer than the channels it would hold
                    fix = (f"its images look channels-last, (N, H, W, {len(mean)}): "
                           f"{CHANNELS_FIRST}")
                else:  # e.g. 1×3×3 with 3 values: C×H×W, or H×W×C of 1×3 pixels
                    fix = (f"{fix}; or, if they are channels-last images (N, H, W, "
                           f"{len(mean)}), {CHANNELS_FIRST}")
            raise wrong(f"{name} loaded {channels}-channel images with {given}: {err}; "
                        f"{fix}") from None
        return
    if dataset.augment:
        raise wrong(f"{name} loaded float features with augment=True, but only uint8 images "
                    "are augmented: set data.augment=false (a Dataset built by hand: "
                    "augment=False)")
    if mean is not None or std is not None:
        raise wrong(f"{name} loaded float features with {given}, but features pass to the "
                    "model unchanged: leave mean and std unset (None)")


def data_dir(options: Any) -> Any:
    """The dataset folder of a file dataset (DataError when none is configured)."""
    spec = dataset_spec(options.name)(options)
    if not isinstance(spec, FileDataset):
        raise DataError(f"dataset {spec.name!r} is generated; it has no data folder")
    return spec.folder()


__all__ = ["Dataset", "DatasetSpec", "GeneratedDataset", "FileDataset", "DATASETS",
           "InMemoryLoader", "EVAL_SUBSET_SEED", "load_dataset", "check_declared", "check_loaded",
           "check_sizes", "check_train_subset", "check_same_files", "check_handed",
           "check_normalisation", "check_held_out_split", "held_out_refusal",
           "make_teacher_student", "data_dir", "dataset_spec", "register"]
