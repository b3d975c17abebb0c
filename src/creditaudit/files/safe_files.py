"""Files a user points the tool at: atomic writes and reads that fail with one clear line.

Every write goes to a temporary file in the same folder and is renamed over the target, so a
reader sees the old file or the new one, never half of one; a failed write (disk full,
read-only folder, a file where a folder should be) leaves no partial file and raises
:class:`~creditaudit.errors.OutputError` naming the path. Reads of a user's text files turn
missing, folder, binary and unreadable files into one line too, and read only regular files,
boundedly (:func:`read_text`).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from creditaudit.errors import CreditAuditError, DiskFullError, OutputError, RunRecordError
from creditaudit.files import strict_json

# Records and configs are a few MB at most; a larger file is refused unread, and no read
# takes more (parsed, 64 MiB of JSON can already fill 0.1 to 1 GB of memory).
MAX_TEXT_BYTES = 64 * 2**20


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's files are 0600
_TMP = ".tmp"  # the suffix of a temporary file beside its target (``.NAME.XXXXXXXX.tmp``)


def describe_os_error(err: OSError, path: Path | str | None = None) -> str:
    """``"<path>: <what went wrong>"`` for an OSError, naming the path it concerns."""
    where = err.filename if err.filename is not None else path
    reason = err.strerror or str(err) or type(err).__name__
    hints = {
        "EROFS": "the file system is read-only",
        "EACCES": "permission denied: choose a folder you can write to",
        "ENOSPC": "no space left on the device: free some space and retry",
        "ENOTDIR": "a file stands where a folder is needed",
        "EISDIR": "it is a folder, not a file",
        "EDQUOT": "disk quota exceeded",
    }
    name = errno.errorcode.get(err.errno or 0, "")
    if name in hints:
        reason = hints[name]
    return f"{where}: {reason}"


def ensure_folder(path: Path) -> None:
    """Create ``path`` (and parents) or raise OutputError naming what is in the way."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{path}: a file stands where a folder is needed; move it away or "
                          "choose another output folder") from None
    except OSError as err:
        raise OutputError(f"cannot create folder {describe_os_error(err, path)}") from None


def check_output_folder(path: Path) -> None:
    """Refuse, before any work and creating nothing, a folder :func:`ensure_folder` could not
    create: a file where it or a folder above it is needed, or a folder above it that this
    process cannot write to (its nearest existing one)."""
    for folder in (path, *path.parents):
        if not folder.exists():
            continue
        if not folder.is_dir():
            raise OutputError(f"{folder}: a file stands where a folder is needed; move it away "
                              "or choose another output folder")
        if folder != path and not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(f"cannot create folder {path}: {folder}: permission denied: "
                              "choose a folder you can write to")
        return


def check_output_file(path: Path) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, or a path
    below a file. (Read-only folders and full disks still surface when writing.)"""
    if path.is_dir():
        raise OutputError(f"{path} is a folder: give a file name to write to")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{parent}: a file stands where a folder is needed; choose "
                                  "another output path")
            return


def write_error(err: OSError) -> type[OutputError]:
    """The error class of a failed write: DiskFullError when space ran out (the writer may
    go on once space is freed), else OutputError."""
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    return DiskFullError if full else OutputError


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    The file gets the permissions of a plainly created one (0666 minus the umask), so a
    results folder shared by a group or a cluster stays readable. Raises OutputError (one
    line naming the path) when the folder cannot be written; no partial file is left.
    """
    atomic_write_files({path: data})


def atomic_write_files(files: Mapping[Path | str, bytes]) -> None:
    """Write several files (path → bytes) as :func:`atomic_write_bytes` writes one, and as
    a set: each is written and synced to a temporary file beside it before any replaces its
    old file, in the order given, so a write that fails (a full disk, a folder where a file
    should be, a read-only folder) leaves every one of them old. Raises OutputError (one
    line naming the path); no temporary file is left."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            staged.append((_staged(path, data), path))
        for tmp, path in staged:
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise write_error(err)(f"cannot write {describe_os_error(err, path)}") from None
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def remove_leftovers(folder: Path, names: Iterable[str]) -> None:
    """Remove the temporary files of ``names`` in ``folder`` that a write killed before its
    rename left (``kill -9``: nothing could remove them; ``.NAME.XXXXXXXX.tmp``, hidden).
    Only for a folder no other process writes these files in at the same time (a run's
    folder while its trainer starts): another writer's file would be taken from it."""
    for name in names:
        for tmp in folder.glob(f".{glob.escape(name)}.*{_TMP}"):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _staged(path: Path, data: bytes) -> str:
    """A temporary file beside ``path`` holding ``data``, synced (its name)."""
    if path.is_dir():
        raise OutputError(f"{path} is a folder: give a file name to write to")
    ensure_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP)
    except OSError as err:
        raise write_error(err)(f"cannot write {describe_os_error(err, path.parent)}") from None
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(err)(f"cannot write {describe_os_error(err, path)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def json_bytes(obj: Any) -> bytes:
    """Strict JSON (no NaN/Infinity tokens: see :mod:`creditaudit.files.strict_json`) and a
    final newline, as :func:`atomic_write_json` writes it."""
    return (strict_json.dumps(obj) + "\n").encode()


def atomic_write_json(path: Path | str, obj: Any) -> None:
    """Strict JSON (no NaN/Infinity tokens: see :mod:`creditaudit.files.strict_json`)."""
    atomic_write_bytes(path, json_bytes(obj))


def _kind_of(mode: int) -> str | None:
    """What a file that is not a regular file is (None for a regular file)."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
             (stat.S_ISSOCK, "a socket"))
    return next((text for test, text in kinds if test(mode)), None)


def read_text(path: Path, what: str, error: type[CreditAuditError] = RunRecordError) -> str:
    """A user's text file, UTF-8, with every failure turned into one line. A leading UTF-8
    byte-order mark (which some Windows editors write) is dropped: it is no text of the file,
    and TOML and JSON readers refuse it.

    Only a regular file (after following symlinks) is read: a folder, a named pipe (opening
    one blocks until a writer appears), a device such as /dev/zero (endless) or a socket is
    refused from its ``stat``, without being opened. At most :data:`MAX_TEXT_BYTES` are read,
    so a file that grows while it is read cannot exhaust memory either.
    """
    limit = f"{MAX_TEXT_BYTES // 2**20} MiB"
    try:
        info = os.stat(path)
        kind = _kind_of(info.st_mode)
        if kind is not None:
            target = os.path.realpath(path)
            shown = f"{path} (→ {target})" if target != os.path.abspath(path) else str(path)
            raise error(f"{what} {shown} is {kind}, not a file: creditaudit reads only "
                        "regular files")
        if info.st_size > MAX_TEXT_BYTES:
            raise error(f"{what} {path} is {info.st_size} bytes, over the {limit} creditaudit "
                        f"reads (its files are a few MB); is it the right file?")
        # O_NONBLOCK: should a pipe replace the file after the stat, opening it cannot block.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise error(f"{what} {path} changed into something other than a regular "
                            "file while it was opened; pass a regular file")
            data = handle.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise error(f"{what} {path} is over the {limit} creditaudit reads (its files are "
                        "a few MB); is it the right file?")
        return data.decode("utf-8-sig")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text (a binary file?)") from None
    except OSError as err:
        raise error(f"cannot read {what} {describe_os_error(err, path)}") from None
