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

import contextlib
import json
import logging
import re
import signal
import socket
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from creditaudit.config import config_from_dict
from creditaudit.errors import CreditAuditError, OutputError, error_line
from creditaudit.records import FINISHED
from creditaudit.records.claims import CLAIM_FILE, read_claim, release_claim, try_claim
from creditaudit.sweep.claiming import SWEEP_LOG_FILE, append_event, disk_status
from creditaudit.sweep.outcome import FOREIGN, NEWER, Outcome, left_alone
from creditaudit.sweep.worker import failed_outcome, write_failed_record

log = logging.getLogger(__name__)

# A run whose worker process dies this often is failed (an out-of-memory kill repeats).
MAX_DEATHS = 2


# What ends a worker process that nothing of the sweep ended (its cause's hints).
RUN_ENDED_IT = ("code the run ran — a model factory, a plugin, or a library they call — ended "
                "the process, e.g. with os._exit; a run's code must return or raise")
LOCAL_MEMORY = "fewer --workers leave each run more memory"


def death_cause(pid: int | None, exitcode: int | None, *, memory: str = LOCAL_MEMORY) -> str:
    """``"worker process 123 was killed by SIGKILL (…)"`` from a process's exit code
    (negative: the signal that ended it, as multiprocessing reports it; 0 or more: the
    process ended itself, which no run's code may do). ``memory``: how to give each run
    more memory, for a SIGKILL."""
    who = "worker process" + (f" {pid}" if pid is not None else "")
    if exitcode is None:
        return f"{who} exited"
    if exitcode >= 0:
        return f"{who} exited with code {exitcode} ({RUN_ENDED_IT})"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    why = (f" (as the kernel's out-of-memory killer does: {memory})"
           if -exitcode == signal.SIGKILL else "")
    return f"{who} was killed by {name}{why}"


RAY_MEMORY = "fewer runs at once (more --threads-per-worker each) leave each run more memory"


def ray_exit_code(detail: str) -> int | None:
    """The exit code a Ray error's text gives its worker (``exit code 3``; negative for a
    signal: ``signal 9``, ``SIGKILL``), None when it gives none (Ray's WorkerCrashedError)."""
    if found := re.search(r"exit code:?\s*(-?\d+)", detail, re.IGNORECASE):
        return int(found[1])
    if found := re.search(r"\bsignal:?\s*(\d+)", detail, re.IGNORECASE):
        return -int(found[1])
    for found in re.finditer(r"\b(SIG[A-Z]+)\b", detail):
        with contextlib.suppress(KeyError):
            return -int(signal.Signals[found[1]])
    return None


def ray_task_reason(err: BaseException) -> str:
    """Why a Ray task failed, in one line: what the task raised (a RayTaskError's ``cause``,
    e.g. a full disk's DiskFullError), else the first line of Ray's error (whose first line
    of a RayTaskError names only Ray's function, its pid and node, in terminal colours)."""
    cause = getattr(err, "cause", None)
    text = (error_line(cause) if isinstance(cause, CreditAuditError)  # its own sentence
            else f"{type(cause).__name__}: {cause}" if isinstance(cause, Exception)
            else str(err))
    return (text.strip().splitlines() or [type(err).__name__])[0]


def ray_death_cause(pid: int | None, reason: str) -> str:
    """Why a Ray worker that had started a run died, in the words of :func:`death_cause`
    (``pid``: the worker's, from the task's start marker; ``reason``: Ray's error line).
    Ray's error rarely says how the worker ended: then both usual causes are named."""
    code = ray_exit_code(reason)
    if code is not None:
        return f"Ray {death_cause(pid, code, memory=RAY_MEMORY)}"
    who = "Ray worker process" + (f" {pid}" if pid is not None else "")
    return (f"{who} died ({reason.rstrip('.')}): it was killed (e.g. by the kernel's "
            f"out-of-memory killer: {RAY_MEMORY}), or {RUN_ENDED_IT}")


def last_start(out_dir: Path, run_id: str, pids: Collection[int],
               host: str | None = None) -> str | None:
    """The action (trained, resumed, restarted) of the last ``start`` of ``run_id`` in
    OUT/sweep_log.jsonl by one of the processes ``pids`` of ``host`` (default: this
    machine); None when none of them started it (or the log cannot be read)."""
    host = host or socket.gethostname()
    action = None
    try:
        with (out_dir / SWEEP_LOG_FILE).open(encoding="utf-8") as log_file:
            for line in log_file:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict) and event.get("event") == "start" \
                            and event.get("run_id") == run_id \
                            and event.get("pid") in pids and event.get("host") == host:
                        action = str(event.get("action"))
    except OSError:
        return None
    return action


def left_outcome(run_id: str, run_dir: Path, cause: str, action: str) -> Outcome:
    """The outcome of a run a sweep gives up on without an outcome from its worker (the
    workers died): ``action`` what its last attempt did (``not started``: none started it);
    the status its record gives, and ``cause`` with what the next sweep does with it."""
    from creditaudit.records import CHECKPOINT_FILE

    status, error = disk_status(run_dir)
    outcome = failed_outcome({"run_id": run_id}, cause, action=action)
    if status in FINISHED or status in (NEWER, FOREIGN):
        outcome.update(status=status, action=left_alone(status), error=error)
    elif status is None:
        outcome["error"] = (f"{cause}; it never started, so the next sweep trains it"
                            if action == "not started" else
                            f"{cause}; it has no record, so the next sweep trains it")
    elif status in ("running", "interrupted"):
        goes_on = ("resumes it from its last checkpoint"
                   if (run_dir / CHECKPOINT_FILE).exists() else "starts it over")
        outcome.update(status="interrupted",
                       error=f"{cause}; it was started and interrupted, so the next sweep "
                             f"{goes_on}")
    elif status == "failed":
        outcome["error"] = f"{cause}; it failed before ({error}): --retry-failed runs it again"
    else:  # an unreadable record
        outcome["error"] = f"{cause}; the next sweep starts it over ({error})"
    return outcome


def _runs(task: dict[str, Any]) -> list[tuple[str, dict[str, Any], Path]]:
    """(run id, config dict, run folder) of each run of a task (one, or a stacked group)."""
    if "run_ids" in task:
        pairs = list(zip(task["run_ids"], task["configs"], strict=True))
    else:
        pairs = [(task["run_id"], task["config"])]
    return [(run_id, config, Path(config["run"]["out_dir"]) / run_id)
            for run_id, config in pairs]


def held_by_dead(task: dict[str, Any], dead: Collection[int]) -> dict[str, int]:
    """run id → pid for the task's runs whose claim names a dead worker (pid in ``dead``)
    of this machine. A run whose record was final before its worker died (a stacked
    group's run that ended before the next one's code ended the process: the group
    releases its claims at its end) is not one: its dead claim is cleared."""
    held = {}
    for run_id, _, run_dir in _runs(task):
        holder, _, _ = read_claim(run_dir / CLAIM_FILE)
        if holder is not None and holder.get("host") == socket.gethostname() \
                and holder.get("pid") in dead:
            if disk_status(run_dir)[0] in FINISHED:
                with contextlib.suppress(OutputError):
                    claim, _ = try_claim(run_dir)  # breaks the dead worker's claim
                    if claim is not None:
                        release_claim(claim)
                continue
            held[run_id] = holder["pid"]
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
        for run_id, pid in held.items():
            deaths.setdefault(run_id, []).append(dead[pid])
            out_dir = _runs(task)[0][2].parent
            append_event(out_dir, "worker_died", run_id, cause=dead[pid],
                          deaths=len(deaths[run_id]))
        if not any(len(deaths[run_id]) >= MAX_DEATHS for run_id in held):
            for run_id, pid in held.items():
                log.warning("warning: %s: its %s; the run goes on in a new worker from "
                            "its last checkpoint", run_id, dead[pid])
            retry.append(task)
            continue
        failed.extend(_fail(task, held, dead, deaths))
    return retry, failed


def record_lost(task: dict[str, Any], cause: str, pid: int | None, host: str | None
                ) -> Outcome | list[Outcome]:
    """Record the runs of a task whose worker (``pid`` on ``host``) died with no outcome
    and no second chance (a Ray worker: Ray does not run the task again) as failed with
    ``cause``, so that record, summary and the next sweep agree; their outcomes (a list for
    a stacked group), each with the action the worker had begun and an error that says how
    to go on."""
    error = f"{cause}; --retry-failed runs it again (from its last checkpoint)"
    outcomes = []
    for run_id, config, run_dir in _runs(task):
        _record_failed(config, run_dir, error, dying_seconds=DYING_SECONDS)
        action = last_start(run_dir.parent, run_id, () if pid is None else (pid,), host)
        outcomes.append(failed_outcome({"run_id": run_id}, error,
                                       action=action or "not started"))
    return outcomes if "run_ids" in task else outcomes[0]


def left_outcomes(task: dict[str, Any], cause: str, pids: Collection[int]) -> list[Outcome]:
    """:func:`left_outcome` of each run of a task given up on; its action is that of the
    last start by one of the sweep's workers ``pids`` (this machine's), if any."""
    return [left_outcome(run_id, run_dir, cause,
                         last_start(run_dir.parent, run_id, pids) or "not started")
            for run_id, _, run_dir in _runs(task)]


def _fail(task: dict[str, Any], held: dict[str, int], dead: dict[int, str],
          deaths: dict[str, list[str]]) -> list[Outcome]:
    """Record the task's runs held by a dead worker (``held``: run id → its pid) as failed;
    their outcomes, each with the action the dead worker had begun (``not started``: it
    died before it began the run)."""
    outcomes = []
    for run_id, config, run_dir in _runs(task):
        if run_id not in held:  # a stacked group's run the worker did not hold
            outcomes.extend(left_outcomes({"run_id": run_id, "config": config},
                                          "its worker process died", dead))
            continue
        error = (f"its worker process died {len(deaths[run_id])} times: "
                 f"{'; '.join(deaths[run_id])}; --retry-failed runs it again (from its last "
                 "checkpoint)")
        _record_failed(config, run_dir, error)
        action = last_start(run_dir.parent, run_id, (held[run_id],)) or "not started"
        outcomes.append(failed_outcome({"run_id": run_id}, error, action=action))
    return outcomes
