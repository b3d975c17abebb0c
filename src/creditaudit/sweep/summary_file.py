"""``OUT/sweep_summary.json``: the runs of every sweep and experiment written into a results
folder, merged — two invocations on one folder (two experiments, an experiment and a
``creditaudit sweep``, two sweeps on two machines) each keep their runs in it.

The file is read, merged and replaced under a lock on the folder
(:func:`~creditaudit.files.folder_lock.folder_lock`), atomically: the runs an invocation
ended or left replace their own entries (a run taken over from it keeps the entry of the
process that took it over, and a run another process held all along that process's entry:
:func:`merged_summary`), the entries of other runs stay — their
status read again from their records and claims (:func:`_as_recorded`) — and
``n_runs`` and ``counts`` are of all of them. Each entry's ``written_by`` names the
invocation that wrote it (none in entries written before it was added); the other
top-level fields (``updated``, ``sweep_file`` or ``experiments``, ``scale``) are the last
writer's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from creditaudit.config import config_value
from creditaudit.errors import ConfigError
from creditaudit.files import strict_json
from creditaudit.files.folder_lock import folder_lock
from creditaudit.files.safe_files import atomic_write_json, read_text
from creditaudit.records import FINISHED
from creditaudit.records.claim_files import claim_state
from creditaudit.sweep.claiming import disk_status
from creditaudit.sweep.outcome import FOREIGN, NEWER, TAKEN_OVER, Outcome
from creditaudit.sweep.worker import AFTER_THE_RECORD

if TYPE_CHECKING:
    from creditaudit.run.plan import RunPlan

SUMMARY_FILE = "sweep_summary.json"
SUMMARY_SCHEMA = "creditaudit.sweep/1"

# (recorded status, outcome) → the status to report (reported_status)
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
    """An earlier invocation's ``entry`` with its status read again from what its folder
    holds now: ``busy`` while a live claim holds an unfinished run; ``not started`` without
    a record (deleted since, or never written by a holder that has gone), unless the entry
    is a failure its sweep saw without one; ``interrupted`` for a record left ``running``
    by a process that has gone (``failed`` where the entry says its run failed there);
    else as ``status_of`` reads the record."""
    run_id = entry["run_id"]
    if Path(run_id).name != run_id or run_id in ("", ".", ".."):
        return entry  # not a run folder's name: as it was written
    run_dir = out_dir / run_id
    recorded, error = disk_status(run_dir)
    claim = claim_state(run_dir)
    if claim is not None and claim.stale is None \
            and recorded not in (*FINISHED, NEWER, FOREIGN):
        return {**entry, "status": "busy", "error": None}  # another process holds it now
    if recorded is None:
        if entry.get("status") == "failed":  # e.g. refused by its worker, never scheduled
            return entry
        return {**entry, "status": "not started", "error": None}
    # No process holds it now: a "busy" of then is no longer true, and a record left
    # "running" since is a run stopped (unless the entry says how that run ended).
    said = entry.get("status")
    if said == "busy" or (recorded == "running" and said not in ("failed", "interrupted")):
        said = None
    status = status_of(recorded, {**entry, "status": said})
    return {**entry, "status": "interrupted" if status == "running" else status,
            "error": error}


def merged_summary(summary: dict[str, Any], earlier: list[dict[str, Any]], out_dir: Path,
                   status_of: StatusFn, held: Collection[str] = ()) -> dict[str, Any]:
    """``summary`` (one invocation's) with the ``earlier`` entries of other runs kept, in
    their order, before its own; ``n_runs`` and ``counts`` of all. An invocation writes the
    entries of the runs it ended or left: a run another process took over from it
    (:data:`~creditaudit.sweep.outcome.TAKEN_OVER`), or one of ``held`` (run ids another
    process held for the whole invocation, which never claimed them), keeps the entry that
    process (or an earlier invocation) wrote, its status read again; this invocation's only
    where there is none."""
    listed = {run["run_id"] for run in earlier}
    yielded = {run["run_id"] for run in summary["runs"]
               if (run.get("action") == TAKEN_OVER or run["run_id"] in held)
               and run["run_id"] in listed}
    own = {run["run_id"] for run in summary["runs"]} - yielded
    runs = [_as_recorded(run, out_dir, status_of) for run in earlier
            if run["run_id"] not in own] + [run for run in summary["runs"]
                                            if run["run_id"] not in yielded]
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run.get("status"))] = counts.get(str(run.get("status")), 0) + 1
    return {**summary, "n_runs": len(runs), "counts": counts, "runs": runs}


def write_summary(path: Path, summary: dict[str, Any], status_of: StatusFn,
                  held: Collection[str] = ()) -> None:
    """Write ``summary`` (one invocation's: ``schema``, ``runs``, …) into the summary file
    at ``path``, merged with the runs already listed there (:func:`merged_summary`; ``held``:
    the runs another process held all along), under a lock on its folder and atomically."""
    with folder_lock(path.parent):
        earlier = _earlier_runs(path, summary["schema"])
        atomic_write_json(path, merged_summary(summary, earlier, path.parent, status_of,
                                               held))


def reported_status(recorded: str | None, outcome: Outcome | dict[str, Any]) -> str:
    """A run's status after the sweep: its record's (``recorded``; None without one), except
    ``busy`` for an unfinished run another process holds, and the sweep's own ``outcome``
    for a record left ``running`` by a run that ended (a record says running only while a
    process holds its claim; one whose worker died, or whose last record write failed on a
    full disk, could not be updated)."""
    said = outcome.get("status")
    if said == "busy" and recorded not in FINISHED:
        return "busy"  # another process holds it right now
    if recorded == "running" and said is not None and said != "running":
        return said
    return recorded or said or "not started"


def sweep_summary(plans: Sequence[RunPlan], outcomes: list[Outcome], grid_keys: list[str],
                  *, extra: dict[str, Any] | None = None,
                  written_by: str | Mapping[str, str] | None = None) -> dict[str, Any]:
    """The content of sweep_summary.json: one entry per run, status read from its record
    (:func:`reported_status`), ``written_by`` naming what wrote it (:func:`run_sweep`)."""
    runs = []
    counts: dict[str, int] = {}
    for plan, outcome in zip(plans, outcomes):
        run_dir = plan.run_dir
        status, error = disk_status(run_dir)
        status = reported_status(status, outcome)
        said = outcome.get("error")
        if error is None or (said or "").startswith(AFTER_THE_RECORD):
            error = said if error is None else f"{error}; {said}"
        counts[status] = counts.get(status, 0) + 1
        runs.append({"run_id": run_dir.name,
                     # as the user wrote them (trainable_blocks=2, not the default's None)
                     "grid": {key: config_value(plan.as_given(), key) for key in grid_keys},
                     "status": status, "error": error, "action": outcome.get("action"),
                     "written_by": (written_by if written_by is None or isinstance(
                         written_by, str) else written_by.get(run_dir.name)),
                     "seconds": round(float(outcome.get("seconds") or 0.0), 3),
                     "record": str(run_dir / "record.json")})
    return {"schema": SUMMARY_SCHEMA, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "n_runs": len(runs), "counts": counts, **(extra or {}), "runs": runs}


__all__ = ["SUMMARY_FILE", "SUMMARY_SCHEMA", "merged_summary", "reported_status",
           "sweep_summary", "write_summary"]
