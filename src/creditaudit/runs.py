"""Run records: one JSON file per run, a versioned schema, atomic writes, strict loading.

Layout of a run folder ``OUT_DIR/RUN_ID/``::

    record.json      the run record (config, environment, status, per-epoch log, results)
    checkpoint.pt    latest epoch: model, optimiser, scheduler, rule state, RNG states
    init.pt          the model's parameters at initialisation (for feature drift)
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from creditaudit.config import RunConfig, config_from_dict
from creditaudit.errors import CreditAuditError, RunRecordError

SCHEMA = "creditaudit.run/1"
STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
RECORD_FILE, CHECKPOINT_FILE, INIT_FILE = "record.json", "checkpoint.pt", "init.pt"
REQUIRED_KEYS = {
    "schema": str, "run_id": str, "config": dict, "environment": dict, "status": str,
    "log": list, "final": (dict, type(None)), "diagnostics": dict, "protocol": dict,
}
# Per-epoch fields that depend on wall-clock time, not on what was computed.
TIMING_KEYS = ("seconds",)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's files are 0600


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    The file gets the permissions of a plainly created one (0666 minus the umask), so a
    results folder shared by a group or a cluster stays readable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def atomic_torch_save(path: Path, obj: Any) -> None:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def environment() -> dict[str, Any]:
    """Package versions, device and threads: what a reader needs to reproduce the run."""
    import numpy

    from creditaudit import __version__

    cuda = torch.cuda.is_available()
    return {
        "creditaudit": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
    }


def new_record(config: RunConfig, *, device: str) -> dict[str, Any]:
    env = environment()
    env["device"] = device
    return {
        "schema": SCHEMA,
        "run_id": config.run_id,
        "config": config.to_dict(),
        "environment": env,
        "status": "running",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "log": [],
        "final": None,
        "diagnostics": {},
        "protocol": {},
        "error": None,
    }


def save_record(run_dir: Path, record: dict[str, Any]) -> Path:
    record["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = Path(run_dir) / RECORD_FILE
    atomic_write_json(path, record)
    return path


def load_record(path: str | Path) -> dict[str, Any]:
    """Read and validate a run record (a run folder or its record.json).

    Raises RunRecordError with a one-line reason for missing, truncated, malformed or
    foreign-schema files.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RunRecordError(f"no run record at {path}: pass a run folder that holds "
                             f"{RECORD_FILE} or the file itself") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunRecordError(f"run record {path} is truncated or not JSON ({err.msg} at line "
                             f"{err.lineno}); rerun or resume the run to rewrite it") from None
    validate_record(record, path)
    return record


def validate_record(record: Any, path: Path | str = "<record>") -> None:
    if not isinstance(record, dict):
        raise RunRecordError(f"run record {path} must be a JSON object")
    if record.get("schema") != SCHEMA:
        raise RunRecordError(f"run record {path} has schema {record.get('schema')!r}; this "
                             f"version of creditaudit reads {SCHEMA!r}")
    for key, kind in REQUIRED_KEYS.items():
        if key not in record:
            raise RunRecordError(f"run record {path} lacks the key {key!r}")
        if not isinstance(record[key], kind):
            raise RunRecordError(f"run record {path}: {key!r} has the wrong type "
                                 f"({type(record[key]).__name__})")
    if record["status"] not in STATUSES:
        raise RunRecordError(f"run record {path}: status {record['status']!r} is not one of "
                             f"{', '.join(STATUSES)}")
    for index, entry in enumerate(record["log"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("epoch"), int):
            raise RunRecordError(f"run record {path}: log entry {index} has no integer 'epoch'")
    try:
        config_from_dict(record["config"])
    except CreditAuditError as err:
        raise RunRecordError(f"run record {path} holds an invalid config: {err}") from None


def record_config(record: dict[str, Any]) -> RunConfig:
    return config_from_dict(record["config"])


def _nan_safe(value: Any) -> Any:
    """Replace NaN floats by a marker so equal records compare equal (NaN != NaN)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_safe(v) for v in value]
    return value


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """The record without wall-clock fields: equal for equal computations (tests, resume).

    NaN values (e.g. an undefined cosine) are replaced by the string "NaN" so that two
    identical records compare equal.
    """
    from creditaudit.config import NON_SEMANTIC

    out = {k: v for k, v in record.items()
           if k not in ("environment", "created", "updated", "timing")}
    out["config"] = {section: {k: v for k, v in values.items()
                               if (section, k) not in NON_SEMANTIC}
                     for section, values in record["config"].items()}
    out["log"] = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in record["log"]]
    return _nan_safe(out)


def find_records(root: str | Path) -> list[Path]:
    """Every record.json below ``root`` (sorted)."""
    return sorted(Path(root).rglob(RECORD_FILE))
