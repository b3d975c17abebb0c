"""The identity of a run's data: a fingerprint of the data itself, not of where it lives.

Two runs with the same config on different data must never share a run id, and the same
data in another folder is the same run. So the run id carries a fingerprint of what was
actually loaded:

- file datasets (MNIST, Fashion-MNIST, CIFAR): sha256 over the *decoded* content of every
  file the loader reads (gzip IDX files are hashed after decompression, so ``.gz`` and raw
  copies of the same data agree), in a fixed order;
- generated datasets (the synthetic teacher–student task, MNIST-1D): sha256 of the
  generator, its version and its full argument set (seed included), which determine the
  arrays.

Hashing Fashion-MNIST's 60k images takes a fraction of a second; each file's digest is cached
in memory and in ``fingerprints.json`` of the user cache folder (see
:func:`creditaudit.cache.cache_dir`), keyed by the file's resolved path, size, inode,
modification time and status-change time, so an unchanged file is hashed once per machine.
The status-change time (ctime) cannot be set by programs, so a file rewritten with its old
modification time restored (``cp -p``, ``touch -r``, ``os.utime``) is hashed again; and a
file changed in the last few seconds is never cached, because two writes within one tick of
the file system's clock leave the same timestamps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.cache import load_json_cache, store_json_cache
from creditaudit.config import DataConfig
from creditaudit.errors import DataError

log = logging.getLogger(__name__)

FINGERPRINT_CACHE = "fingerprints.json"
GENERATED = ("synthetic", "mnist1d")
# A file whose timestamps are this recent may still change without changing them.
RACY_SECONDS = 2.0
_MEMORY: dict[tuple[str, int, int, int, int], str] = {}


@dataclass
class DataIdentity:
    """Which data a run trained on, independent of the folder it was read from.

    ``fingerprint`` identifies the exact arrays (part of the run id); ``source`` identifies
    where they come from regardless of the seed — equal to the fingerprint for file
    datasets, the generator's arguments without the seed for generated ones — so runs with
    different seeds on the same task share a recipe.
    """

    name: str = field(default="", metadata={"doc": "dataset name (data.name)"})
    fingerprint: str = field(default="", metadata={
        "doc": "sha256 of the data actually loaded: the decoded content of every file read, "
               "or the generator's arguments (seed included) for generated data; part of "
               "the run id"})
    source: str = field(default="", metadata={
        "doc": "the same without the seed (equal to `fingerprint` for file datasets): runs "
               "with different seeds on one task share a recipe"})
    n_train: int | None = field(default=None, metadata={
        "doc": "training samples used (after data.train_subset)"})
    n_test: int | None = field(default=None, metadata={"doc": "test samples"})
    provenance: dict[str, Any] = field(default_factory=dict, metadata={
        "doc": "per-file digests, or the generator's arguments"})


def _digest_text(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path, decode: Callable[[Path], bytes] | None = None) -> str:
    """sha256 of a file's content (``decode(path)`` if given, e.g. gunzip), cached."""
    path = path.resolve()
    try:
        stat = path.stat()
    except OSError as err:
        raise DataError(f"cannot read data file {path}: {err.strerror}") from None
    key = (str(path), stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
    if key in _MEMORY:
        return _MEMORY[key]
    disk_key = "|".join(map(str, key))
    cache = load_json_cache(FINGERPRINT_CACHE)
    digest = cache.get(disk_key)
    if isinstance(digest, str):
        _MEMORY[key] = digest
        return digest
    if decode is not None:
        content = decode(path)
    else:
        try:
            content = path.read_bytes()
        except OSError as err:
            raise DataError(f"cannot read data file {path}: {err.strerror}") from None
    digest = hashlib.sha256(content).hexdigest()
    if time.time() - max(stat.st_mtime, stat.st_ctime) > RACY_SECONDS:
        _MEMORY[key] = digest
        cache[disk_key] = digest
        store_json_cache(FINGERPRINT_CACHE, cache)
    return digest


def generated_provenance(config: DataConfig, seed: int) -> dict[str, Any]:
    """What determines a generated dataset's arrays: the generator, its version and its
    arguments (the seed included)."""
    if config.name == "synthetic":
        from creditaudit.data.synthetic import synthetic_provenance

        return synthetic_provenance(
            n_train=config.n_train, n_test=config.n_test, in_dim=config.in_dim,
            alpha=config.alpha, seed=seed, teacher_width=config.teacher_width,
            teacher_depth=config.teacher_depth)
    if config.name == "mnist1d":
        from creditaudit.data.mnist1d import mnist1d_provenance

        return mnist1d_provenance(config, seed)
    raise DataError(f"{config.name!r} is not a generated dataset")


def data_files(config: DataConfig) -> list[tuple[str, Path, Callable[[Path], bytes] | None]]:
    """(logical name, path, decoder) of every file a file dataset's loader reads."""
    from creditaudit.data import data_dir

    folder = data_dir(config)
    if config.name in ("cifar10", "cifar100"):
        from creditaudit.data.cifar import cifar_files

        n_classes = 10 if config.name == "cifar10" else 100
        return [(p.name, p, None) for p in cifar_files(folder, n_classes,
                                                       download=config.download)]
    from creditaudit.data.idx import idx_files, read_idx_bytes

    return [(stem, p, read_idx_bytes) for stem, p in idx_files(folder, config.name)]


def data_identity(config: DataConfig, seed: int) -> DataIdentity:
    """The fingerprint (and what it was computed from) of the data ``config`` loads.

    ``seed`` is the seed of generated datasets. Sizes are left to the caller (they are known
    only after loading). Raises DataError when the files are missing or unreadable.
    """
    if config.name in GENERATED:
        provenance = generated_provenance(config, seed)
        seedless = {**provenance, "args": {k: v for k, v in provenance["args"].items()
                                           if k != "seed"}}
        return DataIdentity(config.name, _digest_text(provenance), _digest_text(seedless),
                            provenance=provenance)
    files = data_files(config)
    digests = {name: file_digest(path, decode) for name, path, decode in files}
    digest = _digest_text({"name": config.name, "files": digests})
    return DataIdentity(config.name, digest, digest, provenance={"files": digests})
