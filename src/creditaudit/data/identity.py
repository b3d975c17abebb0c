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

That fingerprint says what *would* be loaded, before anything is. What *was* loaded is
identified beside it by :func:`tensor_digest` of the arrays themselves (train and test,
after ``data.train_subset``): a run record keeps both, and a finished run is served, resumed
or audited only on arrays with its digest — a dataset whose ``load()`` returns other data
each call, or files changed under an unchanged fingerprint cache, are caught there.
Hashing the arrays costs about 65 ms for Fashion-MNIST's 55 MB and 6 ms for MNIST-1D's
10 MB (sha256 with the CPU's SHA instructions; measured on this project's 2-core machine).

Hashing Fashion-MNIST's 60k images takes a fraction of a second; each file's digest is cached
in memory and in ``fingerprints.json`` of the user cache folder (see
:func:`creditaudit.files.cache.cache_dir`), keyed by the file's resolved path, size, inode,
modification time and status-change time and by how it is read (raw, or the decoder's
name: a file hashed gunzipped is not served as its raw bytes' digest), so an unchanged file
is hashed once per machine. Only a module's own function is a name that says what it returns:
a closure or a method may read a dataset's options, so what they decode is hashed every time
(:func:`reader_name`).
The status-change time (ctime) cannot be set by programs, so a file rewritten with its old
modification time restored (``cp -p``, ``touch -r``, ``os.utime``) is hashed again; and a
file changed in the last few seconds is never cached, because two writes within one tick of
the file system's clock leave the same timestamps. Each cached digest is signed with the
cache's per-machine key (:func:`creditaudit.files.cache.sign`): an entry edited in
``fingerprints.json`` — another file's digest pasted in, so that other data would reuse a
finished run — does not verify and is hashed again.
"""

from __future__ import annotations

import hashlib
import logging
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from creditaudit.errors import DataError, LoadedDataError
from creditaudit.files.cache import load_json_cache, sign, store_json_cache, verify

log = logging.getLogger(__name__)

FINGERPRINT_CACHE = "fingerprints.json"
# A file whose timestamps are this recent may still change without changing them.
RACY_SECONDS = 2.0
_MEMORY: dict[tuple[str, int, int, int, int, str], str] = {}
READ_BLOCK = 1 << 20  # bytes of a raw file read and hashed at a time


def reader_name(decode: Callable[[Path], bytes] | None) -> str | None:
    """How a file is read, as its cached digest is keyed: ``"raw"``, a decoder's
    ``module.qualname``, or None for a decoder whose name does not say what it returns, whose
    digests are not cached: a lambda or a ``functools.partial`` (no name of its own), a
    bound method or a callable object (it reads its instance), a function defined in
    another (it may read what it encloses, e.g. a dataset's options) — one name, other
    content for each dataset holding other options."""
    if decode is None:
        return "raw"
    if not isinstance(decode, types.FunctionType) or decode.__closure__ is not None \
            or "<" in decode.__qualname__:  # <lambda>, <locals>
        return None
    return f"{decode.__module__}.{decode.__qualname__}"


def file_digest(path: Path, decode: Callable[[Path], bytes] | None = None) -> str:
    """sha256 of a file's content (``decode(path)`` if given, e.g. gunzip), cached by the
    file's state and how it is read (:func:`reader_name`)."""
    path = path.resolve()
    try:
        stat = path.stat()
    except OSError as err:
        raise DataError(f"cannot read data file {path}: {err.strerror}") from None
    reader = reader_name(decode)
    if reader is None:
        return _sha256(path, decode)
    key = (str(path), stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, reader)
    if key in _MEMORY:
        return _MEMORY[key]
    disk_key = "|".join(map(str, key))
    cache = load_json_cache(FINGERPRINT_CACHE)
    entry = cache.get(disk_key)
    if entry is not None:
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if isinstance(digest, str) and verify(entry.get("mac"), FINGERPRINT_CACHE, disk_key,
                                              digest):
            _MEMORY[key] = digest
            return digest
        log.debug("fingerprint cache entry for %s does not verify; hashing the file", path)
    digest = _sha256(path, decode)
    if time.time() - max(stat.st_mtime, stat.st_ctime) > RACY_SECONDS:
        _MEMORY[key] = digest
        mac = sign(FINGERPRINT_CACHE, disk_key, digest)
        if mac is not None:  # no key, no trustworthy entry: hash again next time
            cache[disk_key] = {"sha256": digest, "mac": mac}
            store_json_cache(FINGERPRINT_CACHE, cache)
    return digest


def _sha256(path: Path, decode: Callable[[Path], bytes] | None) -> str:
    """sha256 (hex) of the bytes a file is hashed by: ``decode(path)``, else its raw
    content, read in blocks of :data:`READ_BLOCK` bytes (a file larger than the memory free
    is hashed too: a dataset may map a file it reads only in part)."""
    if decode is not None:
        content = decode(path)
        if not isinstance(content, bytes):  # what sha256 takes, and what it means
            how = getattr(decode, "__qualname__", type(decode).__name__)
            raise LoadedDataError(f"the decoder {how} of data file {path} returned a "
                                  f"{type(content).__name__}, not bytes: return the decoded "
                                  "content as bytes")
        return hashlib.sha256(content).hexdigest()
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while block := file.read(READ_BLOCK):
                digest.update(block)
    except OSError as err:
        raise DataError(f"cannot read data file {path}: {err.strerror}") from None
    return digest.hexdigest()


def changed_files(then: Any, now: Any) -> list[str]:
    """The names of the files whose digests differ between two file datasets' provenances
    (``{"files": {name: sha256}}``, as their identities keep them), in name order; [] when
    either holds no such table."""
    before, after = (p.get("files") if isinstance(p, dict) else None for p in (then, now))
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    return sorted(str(name) for name in {*before, *after} if before.get(name) != after.get(name))


def tensor_digest(*tensors: Tensor) -> str:
    """sha256 (hex) over each tensor's dtype, shape and bytes (C order, copied to the CPU
    when elsewhere), in the order given: equal digests mean equal arrays, bit for bit."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def tensor_versions(*tensors: Tensor) -> tuple[int | None, ...]:
    """Each tensor's version counter (bumped by every in-place change; None for an
    inference-mode tensor, which keeps none)."""
    versions: list[int | None] = []
    for tensor in tensors:
        try:
            versions.append(tensor._version)
        except RuntimeError:
            versions.append(None)
    return tuple(versions)
