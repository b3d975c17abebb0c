"""``OUT/sweep_summary.json``: the runs of every sweep and experiment written into a results
folder, merged — two invocations on one folder (two experiments, an experiment and a
``creditaudit sweep``, two sweeps on two machines) each keep their runs in it.

The file is read, merged and replaced under a lock on the folder
(:func:`~creditaudit.files.folder_lock.folder_lock`), atomically: the runs an invocation
wrote replace their own entries, the entries of other runs stay — their status read again
from their records, as :func:`~creditaudit.sweep.runner.reported_status` reads it — and
``n_runs`` and ``counts`` are of all of them (a run whose record is gone since reads
``not started``). The other top-level fields (``updated``,
``sweep_file`` or ``experiments``, ``scale``) are the last writer's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.files import strict_json
from creditaudit.files.folder_lock import folder_lock
from creditaudit.files.safe_files import atomic_write_json, read_text
from creditaudit.records import STATUSES
from creditaudit.sweep.claiming import disk_status
from creditaudit.sweep.outcome import NEWER

# Statuses only a record on disk gives a run (its own, or an unreadable or newer one's)
_FROM_A_RECORD = (*STATUSES, "corrupt", NEWER)
# (recorded status, outcome) → the status to report (runner.reported_status)
StatusFn = Callable[[str | None, Mapping[str, Any]], str]


def _earlier_runs(path: Path, schema: str) -> list[dict[str, Any]]:
    """The run entries of the summary at ``path`` ([] without a readable one of ``schema``:
    the file is only an index of the folder's records, rebuilt by the next sweep)."""
    if not path.is_file():
        return []
    try:
        summary = strict_json.loads(read_text(path, "sweep summary", ConfigError))
    except (ConfigError, ValueError, RecursionError):
        return []
    if not isinstance(summary, dict) or summary.get("schema") != schema \
            or not isinstance(summary.get("runs"), list):
        return []
    return [run for run in summary["runs"]
            if isinstance(run, dict) and isinstance(run.get("run_id"), str)]


def _as_recorded(entry: dict[str, Any], out_dir: Path, status_of: StatusFn
                 ) -> dict[str, Any]:
    """An earlier invocation's ``entry`` with its status read again from its record."""
    run_id = entry["run_id"]
    if Path(run_id).name != run_id or run_id in ("", ".", ".."):
        return entry  # not a run folder's name: as it was written
    recorded, error = disk_status(out_dir / run_id)
    if recorded is None and entry.get("status") in _FROM_A_RECORD:
        # its record was deleted (or the folder moved) since: it has no result now
        return {**entry, "status": "not started", "error": None}
    status = status_of(recorded, entry)
    return {**entry, "status": status,
            "error": error if recorded is not None else entry.get("error")}


def merged_summary(summary: dict[str, Any], earlier: list[dict[str, Any]], out_dir: Path,
                   status_of: StatusFn) -> dict[str, Any]:
    """``summary`` (one invocation's) with the ``earlier`` entries of other runs kept, in
    their order, before its own; ``n_runs`` and ``counts`` of all."""
    own = {run["run_id"] for run in summary["runs"]}
    runs = [_as_recorded(run, out_dir, status_of) for run in earlier
            if run["run_id"] not in own] + list(summary["runs"])
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run.get("status"))] = counts.get(str(run.get("status")), 0) + 1
    return {**summary, "n_runs": len(runs), "counts": counts, "runs": runs}


def write_summary(path: Path, summary: dict[str, Any], status_of: StatusFn) -> None:
    """Write ``summary`` (one invocation's: ``schema``, ``runs``, …) into the summary file
    at ``path``, merged with the runs already listed there (:func:`merged_summary`), under
    a lock on its folder and atomically."""
    with folder_lock(path.parent):
        earlier = _earlier_runs(path, summary["schema"])
        atomic_write_json(path, merged_summary(summary, earlier, path.parent, status_of))


__all__ = ["merged_summary", "write_summary"]
