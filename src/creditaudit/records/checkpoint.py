"""Checkpoints and initial parameters: tensors and plain containers only, never pickled code.

A checkpoint (``checkpoint.pt``) is a dict of tensors, numbers, strings and nested dicts,
lists and tuples of them::

    format     "creditaudit.checkpoint/1"
    method     the rule's name
    epoch      last finished epoch
    model      the model's state_dict
    optimizer  the optimiser's state_dict          scheduler  the schedule's state_dict
    rule       the rule's state_dict (feedback matrices, auxiliary nets and their optimisers)
    rng        {"torch": CPU RNG state, "data": data-order generator state} (uint8 tensors)
    record     the run record as of that epoch (a plain dict)

Files are read with ``torch.load(weights_only=True)``, whose unpickler admits exactly those
types: a file holding any other object (which could run code while being unpickled) is
refused with one line, as is anything that is not laid out as above.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from creditaudit.caller import FORCE
from creditaudit.errors import RunRecordError
from creditaudit.files.safe_files import atomic_write_bytes

CHECKPOINT_FORMAT = "creditaudit.checkpoint/1"
CHECKPOINT_KEYS: dict[str, type | tuple[type, ...]] = {
    "epoch": int, "model": Mapping, "optimizer": Mapping, "scheduler": Mapping,
    "rule": Mapping, "rng": Mapping, "record": Mapping,
}


def atomic_torch_save(path: Path | str, obj: Any) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def safe_load(path: Path | str, what: str, *, map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` with every failure as one RunRecordError line."""
    path = Path(path)
    if not path.is_file():
        kind = ("a folder, not a file torch.save wrote" if path.is_dir() else
                "not a regular file (creditaudit reads only regular files)" if path.exists()
                else "missing")
        raise RunRecordError(f"{what} {path} is {kind}: start the run again with {FORCE}"
                             + (" once the folder is removed" if path.is_dir() else ""))
    inflated = _compressed_bytes(path)
    if inflated:
        raise RunRecordError(f"{what} {path} holds compressed entries ({inflated} bytes once "
                             "inflated), which torch.save never writes: it is not a creditaudit "
                             f"file; delete it or start the run again with {FORCE}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "unsupported global" in str(err).lower():  # the file names a class or function
            # (torch says "Unsupported global: GLOBAL x" of a class it does not allow, and
            # "Trying to load unsupported GLOBAL os.system whose module os is blocked" of one
            # of sys, os, posix or nt: the classic payload)
            raise RunRecordError(
                f"{what} {path} holds objects other than tensors and plain containers; "
                "creditaudit never unpickles such files (they can run code): it is not a "
                f"creditaudit file, delete it or start the run again with {FORCE}") from None
        raise RunRecordError(f"{what} {path} cannot be read (not a file torch.save wrote); "
                             "it is corrupt or not a creditaudit file: start the run again "
                             f"with {FORCE}") from None
    except Exception as err:  # noqa: BLE001 - whatever the bytes make torch's reader raise
        # (IndexError, struct.error, … for a text file or a truncated legacy pickle)
        # (the first sentence: torch's zip reader goes on about miniz and its bug tracker)
        reason = str(err).splitlines()[0].split(". ")[0] if str(err) else type(err).__name__
        raise RunRecordError(f"{what} {path} cannot be read ({reason[:120]}); it is "
                             "truncated or not a creditaudit file: start the run again with "
                             f"{FORCE}") from None


def _compressed_bytes(path: Path) -> int:
    """How many bytes the compressed entries of the zip archive at ``path`` inflate to (0
    for none, or for a file that is not a zip archive: torch's reader says what is wrong
    with it). torch.save stores every entry as it is, so a compressed one is another
    tool's, and torch would inflate it in memory before finding it the wrong size (a
    600 KB file can hold 512 MiB of zeros)."""
    try:
        if not zipfile.is_zipfile(path):
            return 0
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist()
                       if info.compress_type != zipfile.ZIP_STORED)
    except (OSError, zipfile.BadZipFile, ValueError):
        return 0


def load_checkpoint(path: Path | str, *, map_location: Any = "cpu") -> dict[str, Any]:
    """A validated checkpoint dict (see the module docstring)."""
    state = safe_load(path, "checkpoint", map_location=map_location)
    if not isinstance(state, Mapping):
        raise RunRecordError(f"checkpoint {path} holds a {type(state).__name__}, not a "
                             "creditaudit checkpoint")
    # one without a format (written before formats were named) is checked by its layout
    layout = state.get("format", CHECKPOINT_FORMAT)
    if layout != CHECKPOINT_FORMAT:
        raise RunRecordError(f"checkpoint {path} is of format {layout!r}, which this "
                             f"creditaudit does not read (it reads {CHECKPOINT_FORMAT!r}): "
                             "read it with the creditaudit that wrote it, or start the run "
                             f"again with {FORCE}")
    for key, kind in CHECKPOINT_KEYS.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise RunRecordError(f"checkpoint {path} is not a creditaudit checkpoint: its "
                                 f"{key!r} entry is missing or malformed")
    rng = state["rng"]
    if not all(isinstance(rng.get(k), Tensor) for k in ("torch", "data")):
        raise RunRecordError(f"checkpoint {path} has no RNG states; start the run again "
                             f"with {FORCE}")
    return dict(state)


def load_parameters(path: Path | str, *, map_location: Any = "cpu") -> dict[str, Tensor]:
    """The ``init.pt`` parameter snapshot: a dict of parameter name → tensor."""
    state = safe_load(path, "parameter file", map_location=map_location)
    if not isinstance(state, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise RunRecordError(f"parameter file {path} is not a name → tensor snapshot")
    return dict(state)


def structure_mismatch(expected: Any, got: Any, where: str = "") -> str | None:
    """Where ``got`` differs in layout from ``expected`` (keys, tensor shapes, list lengths),
    or None when they match. Scalars are not compared, nor the content of a mapping that is
    empty in ``expected`` (e.g. an optimiser's state before its first step)."""
    if isinstance(expected, Tensor):
        if not isinstance(got, Tensor):
            return f"{where or 'value'} is not a tensor"
        if tuple(expected.shape) != tuple(got.shape):
            return (f"{where or 'tensor'} has shape {tuple(got.shape)}, expected "
                    f"{tuple(expected.shape)}")
        return None
    if isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            return f"{where or 'value'} is not a dict"
        if not expected:
            return None
        missing = [k for k in expected if k not in got]
        extra = [k for k in got if k not in expected]
        if missing or extra:
            key = (missing or extra)[0]
            return (f"{where + '.' if where else ''}{key} is "
                    f"{'missing' if missing else 'unexpected'}")
        for key in expected:
            found = structure_mismatch(expected[key], got[key],
                                       f"{where + '.' if where else ''}{key}")
            if found:
                return found
        return None
    if isinstance(expected, list | tuple) and expected and isinstance(expected[0], Tensor):
        if not isinstance(got, list | tuple) or len(got) != len(expected):
            return f"{where or 'list'} has {len(got) if isinstance(got, list | tuple) else 0}" \
                   f" entries, expected {len(expected)}"
        for index, (a, b) in enumerate(zip(expected, got)):
            found = structure_mismatch(a, b, f"{where}[{index}]")
            if found:
                return found
    return None
