"""Load CIFAR-10 / CIFAR-100 from the official "python version" folders, optionally downloading.

CIFAR-10 (``cifar-10-batches-py``): pickled dicts ``data_batch_1..5`` and ``test_batch``.
CIFAR-100 (``cifar-100-python``): pickled dicts ``train`` and ``test``. Each dict holds
``b"data"`` — (N, 3072) uint8, rows are the R, G and B 32×32 planes — and the labels under
``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100).

The batch files are pickles, and a plain unpickler runs whatever code a file names. They are
read with :class:`~creditaudit.data.cifar_pickle.BatchUnpickler`, which admits only what the
official files contain (dicts, lists, bytes, strings, numbers and numpy arrays): a file naming
anything else — a planted payload — is refused before any of it runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch import Tensor

from creditaudit.caller import set_key
from creditaudit.data.cifar_pickle import BatchUnpickler, RefusedContent
from creditaudit.errors import DataError

logger = logging.getLogger(__name__)

BASE_URL = "https://www.cs.toronto.edu/~kriz/"
_IMAGE_SHAPE = (3, 32, 32)
_ROW_LEN = 3 * 32 * 32
_CHUNK = 1 << 20
_DOWNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CifarSpec:
    """Where one CIFAR variant lives and how its files are laid out."""

    label: str
    folder: str
    archive: str
    md5: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_key: bytes

    @property
    def url(self) -> str:
        return BASE_URL + self.archive

    @property
    def files(self) -> tuple[str, ...]:
        return self.train_files + self.test_files


SPECS: dict[int, CifarSpec] = {
    10: CifarSpec(
        label="CIFAR-10",
        folder="cifar-10-batches-py",
        archive="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        label_key=b"labels",
    ),
    100: CifarSpec(
        label="CIFAR-100",
        folder="cifar-100-python",
        archive="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        train_files=("train",),
        test_files=("test",),
        label_key=b"fine_labels",
    ),
}


def _spec(n_classes: int) -> CifarSpec:
    if n_classes not in SPECS:
        raise ValueError(f"n_classes must be 10 or 100 for CIFAR, got {n_classes}")
    return SPECS[n_classes]


def _layout_hint(spec: CifarSpec) -> str:
    return (
        f"expected the standard python-batch folder {spec.folder} with "
        f"{', '.join(spec.files)} (download {spec.url} and extract it, or add "
        f"{set_key('--set data.download=true', 'data.download', True)} on a machine with "
        "internet)"
    )


# ---------------------------------------------------------------------------------------------
# download helpers


def file_md5(path: Path) -> str:
    """Hex md5 of a file, read in 1 MiB chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_md5(path: Path, expected: str) -> None:
    """Check ``path`` against ``expected``; on a mismatch delete the file and raise DataError."""
    actual = file_md5(path)
    if actual != expected:
        path.unlink(missing_ok=True)
        raise DataError(
            f"downloaded archive {path} has md5 {actual}, expected {expected}; the file was "
            "deleted (interrupted or tampered download): run again, or download it by hand"
        )


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a tar archive into ``dest``, refusing members that could escape it.

    Rejects absolute paths, ``..`` components, links and device/fifo members before anything
    is written.
    """
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith(("/", "\\")) or ".." in parts or ":" in member.name:
                    raise DataError(
                        f"archive {archive} has an unsafe member path {member.name!r}; "
                        "refusing to extract it"
                    )
                if not (member.isfile() or member.isdir()):
                    raise DataError(
                        f"archive {archive} has a link or special member {member.name!r}; "
                        "refusing to extract it"
                    )
            dest.mkdir(parents=True, exist_ok=True)
            # The "data" filter (Python ≥ 3.11.4 / 3.10.12) adds a second line of defence.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - old Python patch releases only
                tar.extractall(dest, members=members)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"could not extract archive {archive}: {exc}; delete it and retry") from exc


def _fetch(url: str, dest: Path, *, md5: str, folder_hint: Path) -> None:
    """Download ``url`` to ``dest`` via a temp file in the same folder, verified by md5."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp,
        ):
            for chunk in iter(lambda: resp.read(_CHUNK), b""):
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        reason = getattr(exc, "reason", exc)
        raise DataError(
            f"could not download {url}: {reason}; this machine may have no internet: put the "
            f"extracted folder at {folder_hint} instead"
        ) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    verify_md5(tmp, md5)
    # Rename only after the checksum passes, so a partial archive is never mistaken for whole.
    os.replace(tmp, dest)


def download_cifar(root: str | Path, *, n_classes: int = 10) -> Path:
    """Fetch, verify and extract the official archive into ``root``; return the data folder.

    An archive already in ``root`` with the right md5 is reused instead of downloaded.
    """
    spec = _spec(n_classes)
    root = Path(root)
    folder = root / spec.folder
    archive = root / spec.archive
    if archive.is_file() and file_md5(archive) == spec.md5:
        logger.info("reusing verified archive %s", archive)
    else:
        logger.info("downloading %s to %s", spec.url, archive)
        _fetch(spec.url, archive, md5=spec.md5, folder_hint=folder)
    safe_extract(archive, root)
    return folder


# ---------------------------------------------------------------------------------------------
# reading


def _locate(root: Path, spec: CifarSpec) -> Path:
    """The batch folder: ``root`` itself when it holds the batches, else ``root/<folder>``."""
    nested = root / spec.folder
    if nested.is_dir():
        return nested
    if root.name == spec.folder or any((root / name).exists() for name in spec.files):
        return root
    return nested


def _unpickle(path: Path, spec: CifarSpec) -> dict[Any, Any]:
    try:
        with open(path, "rb") as f:
            obj = BatchUnpickler(f, encoding="bytes").load()
    except OSError as exc:
        raise DataError(f"could not read {spec.label} file {path}: {exc}") from exc
    except RefusedContent as exc:  # a planted payload, or a pickle of something else
        raise DataError(f"{spec.label} file {path} is no CIFAR batch: {exc} (nothing it "
                        f"names was run); {_layout_hint(spec)}") from None
    # Corrupt pickles fail with many exception types (EOFError, UnpicklingError, ValueError,
    # KeyError, ...); all of them mean the same thing to the user.
    except Exception as exc:
        raise DataError(
            f"{spec.label} file {path} is truncated or corrupt ({type(exc).__name__}: {exc}); "
            f"{_layout_hint(spec)}"
        ) from exc
    if not isinstance(obj, dict):
        raise DataError(
            f"{spec.label} file {path} holds a {type(obj).__name__}, not a batch dict; "
            f"{_layout_hint(spec)}"
        )
    return obj


def _as_uint8_rows(data: Any, path: Path, spec: CifarSpec) -> np.ndarray:
    arr = np.asarray(data)
    if arr.ndim != 2 or arr.shape[1] != _ROW_LEN:
        raise DataError(
            f"{spec.label} file {path} has b'data' of shape {arr.shape}; expected (N, {_ROW_LEN})"
        )
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype.kind in "iu" and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= 255)):
        return arr.astype(np.uint8)
    raise DataError(
        f"{spec.label} file {path} has b'data' of dtype {arr.dtype} that is not uint8 pixels "
        "in [0, 255]"
    )


def _as_labels(labels: Any, n_rows: int, n_classes: int, path: Path, spec: CifarSpec) -> np.ndarray:
    arr = np.asarray(labels)
    key = spec.label_key.decode()
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise DataError(
            f"{spec.label} file {path} has b'{key}' of dtype {arr.dtype} and shape "
            f"{arr.shape}; expected a list of N integer labels"
        )
    if arr.shape[0] != n_rows:
        raise DataError(f"{spec.label} file {path} has {n_rows} images but {arr.shape[0]} labels")
    if arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        raise DataError(
            f"{spec.label} file {path} has labels in [{arr.min()}, {arr.max()}]; "
            f"expected 0..{n_classes - 1}"
        )
    return arr.astype(np.int64)


def _read_batch(path: Path, spec: CifarSpec, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch file → (N, 3072) uint8 rows and (N,) int64 labels."""
    batch = _unpickle(path, spec)
    for key in (b"data", spec.label_key):
        if key not in batch:
            raise DataError(f"{spec.label} file {path} has no {key!r} entry; {_layout_hint(spec)}")
    data = _as_uint8_rows(batch[b"data"], path, spec)
    labels = _as_labels(batch[spec.label_key], data.shape[0], n_classes, path, spec)
    return data, labels


def _read_split(
    folder: Path, names: tuple[str, ...], spec: CifarSpec, n_classes: int
) -> tuple[Tensor, Tensor]:
    parts = [_read_batch(folder / name, spec, n_classes) for name in names]
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    x = torch.from_numpy(data).reshape(-1, *_IMAGE_SHAPE)
    return x, torch.from_numpy(labels)


def cifar_files(root: str | Path, n_classes: int, *, download: bool = False) -> list[Path]:
    """The batch files of a CIFAR folder (train then test), DataError when any is missing
    (with ``download``, missing files are fetched first)."""
    spec = _spec(n_classes)
    root = Path(root)
    folder = _locate(root, spec)
    if download and not all((folder / name).is_file() for name in spec.files):
        folder = download_cifar(root.parent if root.name == spec.folder else root,
                                n_classes=n_classes)
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DataError(f"{spec.label} folder {folder} {state}; {_layout_hint(spec)}")
    for name in spec.files:
        if not (folder / name).is_file():
            raise DataError(f"{spec.label} folder {folder} is missing {name}; {_layout_hint(spec)}")
    return [folder / name for name in spec.files]


def load_cifar(
    root: str | Path, *, n_classes: int = 10, download: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Load CIFAR-10 or CIFAR-100 into memory.

    Args:
        root: the ``cifar-10-batches-py`` / ``cifar-100-python`` folder itself, or its parent.
        n_classes: 10 for CIFAR-10, 100 for CIFAR-100 (fine labels).
        download: fetch and extract the official archive into ``root`` when files are missing.

    Returns:
        train_x uint8 (N, 3, 32, 32), train_y int64 (N,), test_x uint8 (M, 3, 32, 32),
        test_y int64 (M,). N = 50000, M = 10000 for the official data.

    Raises:
        DataError: missing folder or files, corrupt pickles, wrong shapes or labels, or a
            failed download.
    """
    spec = _spec(n_classes)
    folder = cifar_files(root, n_classes, download=download)[0].parent
    train_x, train_y = _read_split(folder, spec.train_files, spec, n_classes)
    test_x, test_y = _read_split(folder, spec.test_files, spec, n_classes)
    logger.info(
        "loaded %s from %s: %d train, %d test", spec.label, folder, len(train_y), len(test_y)
    )
    return train_x, train_y, test_x, test_y
