"""What a :class:`~creditaudit.run.recorder.Recorder` is handed, checked before it records
anything: the run's folder name and whether it may be claimed, the numbers a loop reports
for an epoch, and the version counters that tell whether the evaluation arrays were changed
in place since."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import Tensor

from creditaudit.errors import ConfigError, OutputError, RunRecordError
from creditaudit.files.safe_files import describe_os_error
from creditaudit.records import RECORD_FILE, RUN_FILES


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


def folder_name(name: Any) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name:
        raise ConfigError(f"name={name!r} must be one folder name (no / or \\), e.g. "
                          "'resnet20-dfa'")
    return name


def claim_folder(run_dir: Path, overwrite: bool) -> None:
    """Refuse a folder that holds a record unless ``overwrite``; then clear every run file
    (:data:`~creditaudit.records.RUN_FILES`). Files without a record — a run killed before
    its record was written, one whose record was deleted — belong to no record, and must not
    lie beside the new one (an audit or a resume would take another run's checkpoint or
    initial weights for this run's), so they go too."""
    if (run_dir / RECORD_FILE).exists() and not overwrite:
        raise RunRecordError(f"{run_dir} holds a run record already: pass another name= or "
                             "overwrite=True to replace it")
    for file in RUN_FILES:
        try:
            (run_dir / file).unlink(missing_ok=True)
        except OSError as err:
            raise OutputError(f"cannot clear {describe_os_error(err, run_dir / file)}: "
                              "remove it, or pass another name=") from None


def checked_number(name: str, value: Any, *, fraction: bool = False, loss: bool = False
            ) -> float | None:
    """``value`` as a float (None stays None); ConfigError for a non-number, an accuracy
    outside [0, 1] (NaN and ±inf included: a count of right answers is never NaN, even a
    diverged network's) or a negative cross-entropy. A loss's NaN and ±inf are kept: the
    record marks the run diverged."""
    if value is None:
        return None
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if fraction and not math.isfinite(number):
        raise ConfigError(f"{name}={value!r} is not a fraction in [0, 1]: an accuracy counts "
                          "right answers, so it is never NaN or Inf; pass the fraction your "
                          "loop measured (a diverged network still scores one)")
    if fraction and not 0.0 <= number <= 1.0:
        raise ConfigError(f"{name}={value!r} is not a fraction in [0, 1]: pass e.g. 0.349, not "
                          "34.9")
    if loss and number < 0:
        raise ConfigError(f"{name}={value!r} is negative; a cross-entropy is ≥ 0")
    return number


__all__ = ["folder_name", "claim_folder", "checked_number", "tensor_versions"]
