"""A local sweep's worker process that died (SIGKILL from the out-of-memory killer, a crash):
which runs it held, why it died, and what the sweep does with those runs.

A dead worker breaks the whole ``ProcessPoolExecutor``: the pool interrupts its other
workers (their runs record ``interrupted`` and release their claims) and fails every task
without a result. The sweep then gives those tasks to a new pool: interrupted runs resume
from their checkpoints, runs not started start, finished runs are skipped by their records.
The run the dead worker held is the one whose ``claim.json`` still names that worker's pid
(its claim is broken as "dead process" when the run is taken again); it is given to the
new pool too, until its worker has died :data:`MAX_DEATHS` times: then it is recorded as
failed with the cause, so a run that always exhausts the memory cannot loop the sweep.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

from creditaudit.config import config_from_dict
from creditaudit.errors import OutputError
from creditaudit.sweep.claims import CLAIM_FILE, read_claim, release_claim, try_claim
from creditaudit.sweep.outcome import FOREIGN, NEWER, Outcome
from creditaudit.sweep.worker import (
    FINISHED,
    append_event,
    disk_status,
    failed_outcome,
    write_failed_record,
)

log = logging.getLogger(__name__)

# A run whose worker process dies this often is failed (an out-of-memory kill repeats).
MAX_DEATHS = 2


def death_cause(pid: int, exitcode: int | None) -> str:
    """``"worker process 123 was killed by SIGKILL (…)"`` from a process's exit code
    (negative: the signal that ended it, as multiprocessing reports it; 0 or more: the
    process ended itself, which no run's code may do)."""
    if exitcode is None:
        return f"worker process {pid} exited"
    if exitcode >= 0:
        return (f"worker process {pid} exited with code {exitcode} (code the run ran — a "
                "model factory, a plugin, or a library they call — ended the process, e.g. "
                "with os._exit; a run's code must return or raise)")
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    why = (" (as the kernel's out-of-memory killer does: fewer --workers leave each run "
           "more memory)") if -exitcode == signal.SIGKILL else ""
    return f"worker process {pid} was killed by {name}{why}"


def _runs(task: dict[str, Any]) -> list[tuple[str, dict[str, Any], Path]]:
    """(run id, config dict, run folder) of each run of a task (one, or a stacked group)."""
    if "run_ids" in task:
        pairs = list(zip(task["run_ids"], task["configs"], strict=True))
    else:
        pairs = [(task["run_id"], task["config"])]
    return [(run_id, config, Path(config["run"]["out_dir"]) / run_id)
            for run_id, config in pairs]


def held_by_dead(task: dict[str, Any], dead: dict[int, str]) -> dict[str, str]:
    """run id → death cause for the task's runs whose claim names a dead worker of this
    machine (``dead``: pid → cause)."""
    held = {}
    for run_id, _, run_dir in _runs(task):
        holder, _, _ = read_claim(run_dir / CLAIM_FILE)
        if holder is not None and holder.get("host") == socket.gethostname() \
                and holder.get("pid") in dead:
            held[run_id] = dead[holder["pid"]]
    return held


# How long a worker reported dead may still look alive: SIGKILL closes its sockets (how Ray
# learns of the death) before the kernel has finished the process, which then holds its claim.
DYING_SECONDS = 10.0


def _record_failed(config: dict[str, Any], run_dir: Path, error: str,
                   dying_seconds: float = 0.0) -> None:
    """Mark a run failed on disk (its log and checkpoint kept: ``--retry-failed`` resumes
    it), under a claim of this process; nothing when another process holds the run now
    (``dying_seconds``: how long to wait for a holder reported dead to be gone)."""
    from creditaudit.records import load_record, save_record

    deadline = time.monotonic() + dying_seconds
    try:
        claim, _ = try_claim(run_dir)  # breaks the dead worker's claim
        while claim is None and time.monotonic() < deadline:
            time.sleep(0.1)
            claim, _ = try_claim(run_dir)
    except OutputError as err:
        log.warning("warning: cannot record %s as failed: %s", run_dir.name, err)
        return
    if claim is None:
        return
    try:
        status, _ = disk_status(run_dir)
        if status in FINISHED or status in ("failed", NEWER, FOREIGN):
            return
        if status in (None, "corrupt"):
            write_failed_record(config_from_dict(config), run_dir, error)
        else:
            record = load_record(run_dir)
            record.status, record.error = "failed", error
            save_record(run_dir, record)
    except OutputError as err:  # the outcome still says why the run failed
        log.warning("warning: cannot record %s as failed: %s", run_dir.name, err)
    finally:
        release_claim(claim)


def after_break(unfinished: list[dict[str, Any]], dead: dict[int, str],
                deaths: dict[str, list[str]]) -> tuple[list[dict[str, Any]], list[Outcome]]:
    """After a pool broke: the tasks to give to a new pool, and the outcomes of runs whose
    worker died :data:`MAX_DEATHS` times (recorded failed). ``deaths`` (run id → causes) is
    updated; ``dead`` maps the pool's dead workers' pids to their causes."""
    retry: list[dict[str, Any]] = []
    failed: list[Outcome] = []
    for task in unfinished:
        held = held_by_dead(task, dead)
        for run_id, cause in held.items():
            deaths.setdefault(run_id, []).append(cause)
            out_dir = _runs(task)[0][2].parent
            append_event(out_dir, "worker_died", run_id, cause=cause,
                          deaths=len(deaths[run_id]))
        if not any(len(deaths[run_id]) >= MAX_DEATHS for run_id in held):
            for run_id, cause in held.items():
                log.warning("warning: %s: its %s; the run goes on in a new worker from "
                            "its last checkpoint", run_id, cause)
            retry.append(task)
            continue
        failed.extend(_fail(task, held, deaths))
    return retry, failed


def record_lost(task: dict[str, Any], cause: str) -> str:
    """Record the runs of a task whose worker died with no outcome and no second chance (a
    Ray worker: Ray does not run the task again) as failed with ``cause``, so that record,
    summary and the next sweep agree; the error they get, which says how to go on."""
    error = f"{cause}; --retry-failed runs it again (from its last checkpoint)"
    for _, config, run_dir in _runs(task):
        _record_failed(config, run_dir, error, dying_seconds=DYING_SECONDS)
    return error


def _fail(task: dict[str, Any], held: dict[str, str],
          deaths: dict[str, list[str]]) -> list[Outcome]:
    """Record the task's runs held by the dead worker as failed; their outcomes."""
    outcomes = []
    for run_id, config, run_dir in _runs(task):
        if run_id not in held:  # a stacked group's run the worker did not hold
            status, error = disk_status(run_dir)
            outcome = failed_outcome({"run_id": run_id}, error or "its worker process died",
                                     action="not started")
            if status in FINISHED:
                outcome.update(status=status, action="skipped")
            outcomes.append(outcome)
            continue
        error = (f"its worker process died {len(deaths[run_id])} times: "
                 f"{'; '.join(deaths[run_id])}; --retry-failed runs it again (from its last "
                 "checkpoint)")
        _record_failed(config, run_dir, error)
        outcomes.append(failed_outcome({"run_id": run_id}, error))
    return outcomes
