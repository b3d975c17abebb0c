"""The conformance suite of datasets — ``check_dataset(DatasetClass, options)``.

A run plan trusts what a dataset declares before anything is loaded (sample shape, classes,
sizes), and a run id trusts its identity (the same id means the same data). The suite loads
the dataset — with tiny sizes (``n_train=40``, ``n_test=20``, ``in_dim=12``,
``teacher_width=16``) wherever it declares those options and the caller does not set them;
a file dataset needs its folder in ``options`` (``{"data_dir": …}``) — and checks each
declaration against what was loaded::

    from creditaudit.testing import check_dataset
    check_dataset(MyDataset)                               # a generated dataset
    check_dataset(MyFiles, {"data_dir": "tiny"}, other={"data_dir": "tiny-2"})
    check_dataset(MyDataset(my_options))                   # an instance: its own options

The checks:

- ``loads_what_it_declares``: ``check()`` accepts the options and ``load`` gives
  non-empty train and test splits of samples shaped ``input_shape()`` — uint8 images
  ``(N, C, H, W)`` or finite float32 features ``(N, D)`` — with int64 labels ``(N,)`` in
  0 … ``n_classes()`` − 1, as many classes as declared — the loader, the models and
  the records rely on these types;
- ``sizes_match_what_was_loaded``: ``sizes()``, when not None, is (training, test)
  samples as loaded — a run plan checks the evaluation set against it before loading;
- ``test_split_is_held_out``: at most half the test samples (input and label, exactly) are
  also training samples, and at most half are those or near copies of one (judged on 32
  drawn test samples of the others: a training sample of the same label far nearer than
  training samples lie to each other: :func:`~creditaudit.data.rows.near_copies`), or no
  more than chance puts that near (:func:`~creditaudit.data.rows.by_chance`) — a test split
  loaded from the training files, cut from the training arrays or made of them with noise
  added would report memorisation as test accuracy;
- ``identity_is_deterministic``: two calls of ``identity`` agree, name the dataset, declare
  its classes and sample shape, carry a fingerprint and a source (equal for file datasets)
  and a provenance that strict JSON can hold — it is part of every run id and record;
- ``identity_follows_the_seed``: a generated dataset (``kind == "generated"``) gives other
  arrays and another fingerprint, but the same source, under another seed; a file dataset
  gives the same arrays and identity whatever the seed — one id must mean one data set;
- ``identity_follows_the_data`` (when ``other`` options are given: other generator options,
  or another folder of files): other data, another fingerprint — a changed file must not
  reuse old runs;
- ``identity_follows_every_option``: each option that computes (not a folder or a
  download switch), set to another valid value (the next number within its bounds, the
  other bool, another choice), either loads the same arrays or changes the fingerprint —
  a record's fingerprint says which data the run trained on (and ``identity_follows_the_
  data`` runs only when the caller gives other options, which the door does not);
- ``load_is_deterministic_and_leaves_global_rngs_untouched``: two loads give identical arrays,
  the second leaves the first's arrays as they were (a load that keeps what it returned and
  edits it in place would change a run's data under it), and neither ``load`` nor
  ``identity`` moves (or reseeds) torch's, numpy's or Python's global RNG — training draws
  from them after the data is loaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import torch

from creditaudit.data import DATASETS, Dataset, DatasetSpec, check_loaded, held_out_refusal
from creditaudit.data.identity import tensor_digest
from creditaudit.descriptions import DataIdentity
from creditaudit.testing.common import (
    Check,
    Report,
    class_and_options,
    declared_failures,
    moved_rngs,
    reason_for,
    resolve_options,
    run_checks,
    watched_global_rngs,
)

TINY_DATA_OPTIONS: dict[str, Any] = {"n_train": 40, "n_test": 20, "in_dim": 12,
                                     "teacher_width": 16}
SEED = 0
FILES_KIND = "files"


def _load(cls: type[DatasetSpec[Any]], options: Any, seed: int = SEED) -> Dataset:
    spec = cls(options)
    spec.check()
    return spec.load(seed)


def _arrays(dataset: Dataset) -> tuple[torch.Tensor, ...]:
    return dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y


def _same_arrays(a: Dataset, b: Dataset) -> bool:
    return all(x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y))
               for x, y in zip(_arrays(a), _arrays(b)))


def _identity(cls: type[DatasetSpec], options: Any, seed: int = SEED) -> dict[str, Any]:
    return dataclasses.asdict(cls(options).identity(seed))


# --- the checks ---------------------------------------------------------------------------
def loads_what_it_declares(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    dataset = _load(cls, options)
    assert isinstance(dataset, Dataset), \
        f"load() returned a {type(dataset).__name__}, not a creditaudit.data.Dataset"
    # declared shape and classes, non-empty splits, finite features, labels within the
    # classes, the dtypes the loader reads and a normalisation it can apply
    check_loaded(cls(options), dataset)


def sizes_match_what_was_loaded(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    declared = cls(options).sizes()
    if declared is None:
        return
    dataset = _load(cls, options)
    loaded = (dataset.train_x.shape[0], dataset.test_x.shape[0])
    assert tuple(declared) == loaded, \
        f"sizes() says {tuple(declared)} (training, test) samples, load() gave {loaded}"


def identity_is_deterministic(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    spec = cls(options)
    identity = spec.identity(SEED)
    assert isinstance(identity, DataIdentity), \
        f"identity() returned a {type(identity).__name__}, not a DataIdentity"
    first, again = _identity(cls, options), _identity(cls, options)
    assert first == again, "two calls of identity() with the same options and seed differ"
    assert first["name"] == cls.name, f"identity() names {first['name']!r}, not {cls.name!r}"
    assert first["n_classes"] == spec.n_classes(), \
        f"identity() says {first['n_classes']} classes, n_classes() {spec.n_classes()}"
    assert first["input_shape"] == list(spec.input_shape()), \
        f"identity() says samples of shape {first['input_shape']}, input_shape() " \
        f"{list(spec.input_shape())}"
    for key in ("fingerprint", "source"):
        assert isinstance(first[key], str) and first[key], f"identity() has no {key}"
    if cls.kind == FILES_KIND:
        assert first["source"] == first["fingerprint"], \
            "a file dataset's source must equal its fingerprint"
    try:
        json.dumps(first["provenance"], allow_nan=False)
    except (TypeError, ValueError) as err:
        raise AssertionError(f"identity()'s provenance is not strict JSON: {err}") from None


def identity_follows_the_seed(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    base, reseeded = _identity(cls, options), _identity(cls, options, SEED + 1)
    data, data_reseeded = _load(cls, options), _load(cls, options, SEED + 1)
    if cls.kind == FILES_KIND:
        assert base == reseeded, "a file dataset's identity changes with the seed"
        assert _same_arrays(data, data_reseeded), "a file dataset's data changes with the seed"
        return
    assert not _same_arrays(data, data_reseeded), \
        "another seed generates the same arrays (the generator ignores its seed)"
    assert base["fingerprint"] != reseeded["fingerprint"], \
        "another seed generates other arrays under the same fingerprint"
    assert base["source"] == reseeded["source"], \
        "the source changes with the seed (it must identify the recipe without the seed)"


def identity_follows_the_data(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    data, data_other = _load(cls, options), _load(cls, other)
    assert not _same_arrays(data, data_other), \
        "the other options load the same arrays: give options that load other data"
    assert _identity(cls, options)["fingerprint"] != _identity(cls, other)["fingerprint"], \
        "other data has the same fingerprint"


def test_split_is_held_out(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    problem = held_out_refusal(cls(options), _load(cls, options))
    assert problem is None, problem


def identity_follows_every_option(cls: type[DatasetSpec], options: Any, other: Any) -> None:
    values = dataclasses.asdict(cls.options_from(options))
    data = _load(cls, options)
    fingerprint = _identity(cls, options)["fingerprint"]
    for field in dataclasses.fields(cls.Options):
        changed = _another_value(field, values[field.name])
        if changed is None:
            continue
        varied = cls.Options(**{**values, field.name: changed})
        try:
            varied_data = _load(cls, varied)
        except Exception:  # noqa: BLE001 - a value it refuses varies nothing
            continue
        if _same_arrays(data, varied_data):
            continue
        assert _identity(cls, varied)["fingerprint"] != fingerprint, (
            f"{field.name}={changed!r} loads other arrays than {field.name}="
            f"{values[field.name]!r} under the same fingerprint, which records then give as "
            "the data both runs trained on; put "
            f"{field.name} in what identity() hashes (a generated dataset's provenance args)")


def _another_value(field: dataclasses.Field, value: Any) -> Any:
    """A valid value of the option ``field`` other than ``value`` (another choice, the other
    bool, a number one step away within its bounds), or None for one not varied: an option
    of another role than computing (a folder, a download switch), or of no such value."""
    meta = field.metadata
    if meta.get("role", "compute") != "compute" or value is None:
        return None
    if meta.get("choices"):
        return next((c for c in meta["choices"] if c != value), None)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        candidates: list[Any] = [value + 1, value - 1]
    elif isinstance(value, float):
        candidates = [value / 2 if value else 0.5, value * 2 if value else -0.5]
    else:
        return None
    low, high = meta.get("min"), meta.get("max")
    return next((c for c in candidates if (low is None or c >= low)
                 and (high is None or c <= high)), None)


def load_is_deterministic_and_leaves_global_rngs_untouched(cls: type[DatasetSpec],
                                                           options: Any, other: Any) -> None:
    with watched_global_rngs() as states:
        first = _load(cls, options)
        # its content now: a load that hands back arrays it keeps and edits in place on the
        # next load would compare the same objects after
        first_digest = tensor_digest(*_arrays(first))
        cls(options).identity(SEED)
        again = _load(cls, options)
        moved = moved_rngs(states)
    assert not moved, (f"load() or identity() moved {' and '.join(moved)} global RNG (use a "
                       "generator of its own)")
    assert _same_arrays(first, again), "two loads with the same options and seed differ"
    assert tensor_digest(*_arrays(first)) == first_digest, (
        "a second load() changed the arrays the first one returned (they are kept and edited "
        "in place): return arrays of each load's own, or leave returned arrays alone")


DATASET_CHECKS = (
    loads_what_it_declares, sizes_match_what_was_loaded, test_split_is_held_out,
    identity_is_deterministic, identity_follows_the_seed, identity_follows_the_data,
    identity_follows_every_option, load_is_deterministic_and_leaves_global_rngs_untouched)


def dataset_checks(spec: type[DatasetSpec[Any]] | DatasetSpec[Any],
                   options: Mapping[str, Any] | Any = None, *,
                   other: Mapping[str, Any] | Any = None,
                   expected_failures: Mapping[str, str] | None = None) -> list[Check]:
    """The checks of ``spec`` (a class, or an instance holding its options), one by one
    (see :func:`check_dataset`)."""
    cls, options = class_and_options(spec, options)
    DATASETS.validate(cls, cls.__qualname__)
    resolved = resolve_options(cls, options, TINY_DATA_OPTIONS)
    resolved_other = None if other is None else resolve_options(cls, other, TINY_DATA_OPTIONS)
    failures = declared_failures(cls, expected_failures,
                                 (c.__name__ for c in DATASET_CHECKS))
    return [Check(check, cls, resolved, resolved_other,
                  expected_failure=reason_for(failures, check, ""))
            for check in DATASET_CHECKS
            if check is not identity_follows_the_data or resolved_other is not None]


def check_dataset(spec: type[DatasetSpec[Any]] | DatasetSpec[Any],
                  options: Mapping[str, Any] | Any = None, *,
                  other: Mapping[str, Any] | Any = None,
                  expected_failures: Mapping[str, str] | None = None) -> Report:
    """Load the dataset ``spec`` (a class, or an instance holding its options) and check it
    against what it declares (the module docstring lists the checks); AssertionError
    listing every check that failed, else a :class:`~creditaudit.testing.common.Report`.

    ``options``: its ``Options`` fields (a mapping laid over the tiny sizes, or an
    ``Options`` instance; a file dataset's folder as ``data_dir``; default: an instance's
    own options); ``other``: options that
    load other data (another folder, other generator options) for ``identity_follows_the_
    data``, which is skipped without them; ``expected_failures``: ``{check name: reason}``
    of checks it fails by design. ConfigError when the class does not describe itself or
    the options name one it does not have.
    """
    cls, options = class_and_options(spec, options)
    checks = dataset_checks(cls, options, other=other, expected_failures=expected_failures)
    return run_checks(checks, f"{cls.__name__} ({cls.name})")


__all__ = ["check_dataset", "dataset_checks", "DATASET_CHECKS", "TINY_DATA_OPTIONS"]
