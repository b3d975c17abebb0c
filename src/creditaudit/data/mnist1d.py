"""MNIST-1D (Greydanus 2020): a procedurally generated 1-D digit task, cached on disk.

Each sample is one of ten fixed 12-point digit templates, padded, dilated, rescaled,
translated, sheared, overlaid with correlated and i.i.d. noise and resampled to 40 points
(the ``mnist1d`` package's ``make_dataset``). Unlike the teacher–student task, depth and
architecture matter on it: a trained residual MLP clearly beats one whose blocks stay at
initialisation.

Generation runs at about 3 samples/ms on one core (60 000 samples ≈ 19 s), so the arrays
are cached as ``.npz`` in :func:`cache_dir`, keyed by a hash of the generator arguments and
the package version. The cache is an optimisation only: a corrupt file is regenerated and an
unwritable folder means no cache (both with a warning).

A run never trains on cached arrays it has not verified. Beside each file, a digest of the
arrays the generator produced is stored, signed with the cache's per-machine key
(:func:`creditaudit.files.cache.sign`). Arrays that do not match it (edited labels, NaN features)
are generated again, with one warning; a file without a valid digest (written by an earlier
version, or its digest edited) is checked against a fresh generation. The digest of the
arrays used goes into the dataset's provenance (``content_sha256``), so the run record says
which arrays it trained on.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import io
import json
import logging
import random
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from creditaudit.config import DataConfig
from creditaudit.descriptions import CONTENT_DIGEST
from creditaudit.errors import DataError, OutputError
from creditaudit.files.cache import (
    cache_dir,
    load_json_cache,
    read_cache_json,
    sign,
    store_json_cache,
    verify,
)
from creditaudit.files.safe_files import atomic_write_bytes

log = logging.getLogger(__name__)

CACHE_ENV = "CREDITAUDIT_CACHE"
# Bump when the cached file's contents change for the same generator arguments.
CACHE_FORMAT = 1
N_CLASSES = 10
_KEYS = ("train_x", "train_y", "test_x", "test_y")
# What a cache file's digest is signed for (a signature of another cache never verifies).
DIGEST_SCOPE = "mnist1d-arrays"

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _import_error(exc: ImportError) -> DataError:
    return DataError(f"dataset 'mnist1d' needs the mnist1d package ({exc}): "
                     "pip install 'mnist1d>=0.0.2'")


def package_version() -> str:
    """The installed ``mnist1d`` version (part of the cache key: a new generator, new data)."""
    try:
        return metadata.version("mnist1d")
    except metadata.PackageNotFoundError as exc:
        raise _import_error(ImportError(str(exc))) from None


DEFAULTS_CACHE = "mnist1d-defaults.json"


def _generator_source() -> str | None:
    """sha256 of the installed ``mnist1d/data.py`` (found without importing the package),
    or None when it cannot be read."""
    try:
        spec = importlib.util.find_spec("mnist1d")
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    try:
        return hashlib.sha256((Path(folders[0]) / "data.py").read_bytes()).hexdigest()
    except (IndexError, OSError):
        return None


def package_defaults() -> dict[str, Any]:
    """The package's ``get_dataset_args(as_dict=True)`` without its ``url`` (only the
    package's download path reads it; it does not change a generated sample).

    Importing ``mnist1d.data`` imports scipy.interpolate and matplotlib (1.5–3 s in every
    process that plans a run), so the defaults are cached, signed, under the package version
    and the digest of its ``data.py``: an upgraded or edited generator is asked again.
    """
    source = _generator_source()
    key = f"{package_version()}:{source}"
    cached = load_json_cache(DEFAULTS_CACHE)
    args = cached.get("args")
    if (source is not None and cached.get("key") == key and isinstance(args, dict)
            and verify(cached.get("signature"), key, json.dumps(args, sort_keys=True))):
        return args
    try:
        from mnist1d.data import get_dataset_args
    except ImportError as exc:
        raise _import_error(exc) from None
    args = get_dataset_args(as_dict=True)
    args.pop("url", None)
    signature = sign(key, json.dumps(args, sort_keys=True))
    if source is not None and signature is not None:
        store_json_cache(DEFAULTS_CACHE, {"key": key, "args": args, "signature": signature})
    return args


def mnist1d_generator_args(config: DataConfig, seed: int) -> dict[str, Any]:
    """The arguments ``make_dataset`` gets, as a plain JSON-able dict: the package's
    defaults (:func:`package_defaults`) except ``num_samples = n_train + n_test``,
    ``train_split = n_train / num_samples`` and ``seed``."""
    num_samples = config.n_train + config.n_test
    if num_samples % N_CLASSES:
        raise DataError(f"mnist1d generates the same number of samples per digit, so "
                        f"data.n_train + data.n_test must be a multiple of {N_CLASSES}, got "
                        f"{config.n_train} + {config.n_test}")
    args = package_defaults()
    args.update(num_samples=num_samples, train_split=config.n_train / num_samples, seed=seed)
    return args


def generate_mnist1d(args: dict[str, Any]) -> Arrays:
    """Run the package's generator: (train_x, train_y, test_x, test_y).

    x: float32 ``(N, final_seq_length)`` (40 by default), standardised over the whole
    generated set; y: int64 ``(N,)`` digits 0–9, ``num_samples / 10`` of each in total.
    ``make_dataset`` reseeds numpy's and Python's global RNGs; both are restored here, so
    generating data never changes what a seeded caller draws next.
    """
    try:
        from mnist1d.data import make_dataset
        from mnist1d.utils import ObjectView
    except ImportError as exc:
        raise _import_error(exc) from None
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(ObjectView(copy.deepcopy(args)))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    # Split here rather than trusting the package's int(N · train_split), which truncates
    # n_train / N · N to n_train − 1 for some sizes (e.g. 29 of 50).
    n_train = round(args["train_split"] * args["num_samples"])
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def cache_path(args: dict[str, Any], version: str) -> Path:
    """Where the arrays for ``args`` generated by mnist1d ``version`` are cached."""
    key = json.dumps({"args": args, "mnist1d": version, "format": CACHE_FORMAT}, sort_keys=True)
    return cache_dir() / f"mnist1d-{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"


def is_cached(config: DataConfig, seed: int) -> bool:
    """Whether a cache file for this config and seed exists (it may still be damaged)."""
    return cache_path(mnist1d_generator_args(config, seed), package_version()).exists()


def _expected_shapes(args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    n_train = round(args["train_split"] * args["num_samples"])
    n_test, length = args["num_samples"] - n_train, args["final_seq_length"]
    return {"train_x": (n_train, length), "train_y": (n_train,), "test_x": (n_test, length),
            "test_y": (n_test,)}


def _read_cache(path: Path, args: dict[str, Any]) -> Arrays | None:
    """The cached arrays, or None when there is no usable file (a bad one is logged)."""
    if not path.exists():
        return None
    shapes = _expected_shapes(args)
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy file: one array
            raise ValueError(f"it holds a single {type(loaded).__name__}, not an .npz archive")
        with loaded as npz:
            arrays = {key: npz[key] for key in _KEYS}
        for key, array in arrays.items():
            dtype = np.int64 if key.endswith("_y") else np.float32
            if array.shape != shapes[key] or array.dtype != dtype:
                raise ValueError(f"{key} is {array.dtype} {array.shape}, expected {dtype.__name__} "
                                 f"{shapes[key]}")
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        log.warning("MNIST-1D cache file %s is unreadable (%s); generating the data again",
                    path, exc)
        return None
    return tuple(arrays[key] for key in _KEYS)


def arrays_digest(arrays: Arrays) -> str:
    """sha256 (hex) of the four arrays: each one's name, dtype, shape and bytes in C order."""
    digest = hashlib.sha256()
    for key, array in zip(_KEYS, arrays):
        array = np.ascontiguousarray(array)
        digest.update(json.dumps([key, array.dtype.str, list(array.shape)]).encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def digest_path(path: Path) -> Path:
    """The file beside cache file ``path`` holding the signed digest of its arrays."""
    return path.with_name(f"{path.stem}.digest.json")


def _recorded_digest(path: Path) -> str | None:
    """The digest recorded when the arrays in ``path`` were generated, or None when there
    is none this machine signed (missing, unreadable, or edited since)."""
    entry = read_cache_json(digest_path(path))
    digest = entry.get("sha256") if isinstance(entry, dict) else None
    if isinstance(digest, str) and verify(entry.get("mac"), DIGEST_SCOPE, path.name, digest):
        return digest
    log.debug("the digest beside %s is not signed by this machine's cache key", path)
    return None


def _write_cache(path: Path, arrays: Arrays, digest: str) -> None:
    """Write the arrays, then their signed digest, atomically (temp file + rename in the
    cache folder); failures only warn. The old digest goes first, so no crash can leave a
    digest beside arrays it does not describe."""
    buffer = io.BytesIO()
    np.savez(buffer, **dict(zip(_KEYS, arrays)))
    try:
        digest_path(path).unlink(missing_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
    except (OutputError, OSError) as exc:
        log.warning("could not cache MNIST-1D in %s (%s); it will be generated again next "
                    "time (set %s to a writable folder)", path.parent, exc, CACHE_ENV)
        return
    _write_digest(path, digest)


def _write_digest(path: Path, digest: str) -> None:
    mac = sign(DIGEST_SCOPE, path.name, digest)
    if mac is None:  # no cache key: the file cannot be trusted next time anyway
        return
    try:
        atomic_write_bytes(digest_path(path), json.dumps({"sha256": digest, "mac": mac},
                                                         sort_keys=True).encode())
    except OutputError as exc:
        log.debug("MNIST-1D digest not cached: %s", exc)


def _verified_cache(path: Path, args: dict[str, Any]) -> tuple[Arrays, str] | None:
    """The cached arrays and their digest when they are what the generator makes for
    ``args``; None (after one warning if the file is not) when they must be generated."""
    arrays = _read_cache(path, args)
    if arrays is None:
        return None
    digest = arrays_digest(arrays)
    recorded = _recorded_digest(path)
    if recorded is None:  # no trustworthy digest: generating once more decides
        fresh = generate_mnist1d(args)
        fresh_digest = arrays_digest(fresh)
        if fresh_digest != digest:
            log.warning("MNIST-1D cache file %s does not hold the data its generator makes "
                        "(it was changed); generating the data again", path)
            _write_cache(path, fresh, fresh_digest)
        else:
            _write_digest(path, digest)
        return fresh, fresh_digest
    if recorded != digest:
        log.warning("MNIST-1D cache file %s does not match the digest recorded when it was "
                    "generated (it was changed); generating the data again", path)
        return None
    return arrays, digest


def load_mnist1d(config: DataConfig, *, seed: int
                 ) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], dict[str, Any]]:
    """MNIST-1D generated from ``seed`` (cached): tensors and their provenance.

    Returns ``((train_x, train_y, test_x, test_y), provenance)``: float32 ``(N, 40)`` and
    int64 ``(N,)``; provenance = ``{"generator", "version", "args", "content_sha256"}`` (the
    exact ``make_dataset`` arguments, and the digest of the arrays returned — verified
    against the generator's: see the module docstring).
    """
    args = mnist1d_generator_args(config, seed)
    version = package_version()
    path = cache_path(args, version)
    verified = _verified_cache(path, args)
    if verified is None:
        arrays = generate_mnist1d(args)
        digest = arrays_digest(arrays)
        _write_cache(path, arrays, digest)
    else:
        arrays, digest = verified
    train_x, train_y, test_x, test_y = (torch.from_numpy(np.ascontiguousarray(a))
                                        for a in arrays)  # in _KEYS order
    provenance = {**mnist1d_provenance(config, seed), CONTENT_DIGEST: digest}
    return (train_x, train_y, test_x, test_y), provenance


def mnist1d_provenance(config: DataConfig, seed: int) -> dict[str, Any]:
    """What determines the generated arrays: ``{"generator", "version", "args"}``."""
    return {"generator": "mnist1d.data.make_dataset", "version": package_version(),
            "args": mnist1d_generator_args(config, seed)}
