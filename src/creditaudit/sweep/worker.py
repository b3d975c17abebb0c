"""One run of a sweep, as a worker process (or this one) executes it: claim
(:mod:`creditaudit.sweep.claiming`), train or resume or skip, release, and what it did (a
worker process starts with :func:`~creditaudit.sweep.worker_process.init_worker`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from creditaudit.caller import FORCE, for_command_line
from creditaudit.config import RunConfig, config_from_dict
from creditaudit.errors import (
    UNRECORDED,
    DiskFullError,
    OutputError,
    RunRecordError,
    ended_by_ray,
    error_line,
)
from creditaudit.guests.blame import guest_failure
from creditaudit.records import FINISHED
from creditaudit.records.claims import (
    DEFAULT_STALE_AFTER,
    beat_every,
    heartbeat,
    lost_claim,
    read_claim,
    release_claim,
)
from creditaudit.run.stack_checkpoints import resume_together
from creditaudit.sweep.claiming import (
    SWEEP_LOG_FILE,
    ClaimedRun,
    append_event,
    begin_run,
    disk_status,
    on_threads,
)
from creditaudit.sweep.outcome import TAKEN_OVER, Outcome, new_outcome
from creditaudit.sweep.worker_process import WORKER_STATE

log = logging.getLogger(__name__)


# --- one run -----------------------------------------------------------------------------
def write_failed_record(config: RunConfig, run_dir: Path, error: str) -> None:
    """Record a run that raised outside the training loop's own records: the record in
    ``run_dir`` marked failed when it is readable (a killed run's epochs stay in its log),
    else a new one."""
    from creditaudit.records import RECORD_FILE, load_record, new_record, save_record

    try:
        record = load_record(run_dir / RECORD_FILE)
    except RunRecordError:  # none, or unreadable: nothing of it can be kept
        record = new_record(config, device=config.run.device, run_id=run_dir.name)
    record.status = "failed"
    record.error = error
    save_record(run_dir, record)


# How a run's outcome notes an error raised after its record was final (a logger's finish
# or close): the run is counted as its record says, the error is said, not counted failed.
AFTER_THE_RECORD = "its record is final; raised after it"


def after_the_record(err: BaseException) -> str:
    """The outcome's error of a stacked run whose record was final when ``err`` was raised
    (a logger's ``finish`` or ``close``), as :func:`_failed` notes it for a run alone:
    :data:`AFTER_THE_RECORD`, then the guest it came out of, or its type and message."""
    return f"{AFTER_THE_RECORD}: {guest_failure(err) or f'{type(err).__name__}: {err}'}"


def _taken_over(run: ClaimedRun) -> bool:
    """Whether another process broke the run's claim (this worker was stopped for longer
    than that one's --stale-after): the run is then that process's, ``busy`` in the outcome
    (action :data:`TAKEN_OVER`, with the seconds trained here), and nothing more is written
    to its folder."""
    message = lost_claim(run.run_dir)
    if message is None:
        return False
    run.outcome.update(status="busy", action=TAKEN_OVER, error=message,
                       holder=read_claim(run.claim.path)[0])
    return True


def _failed(run: ClaimedRun, err: BaseException) -> None:
    """A run that raised (or whose guest called ``sys.exit``): its outcome, and a failed
    record where none says more. The outcome names the cause first, then a failed record
    that could not be written (a full disk): the write's error never replaces the cause. A
    run another process took over (:func:`_taken_over`) is busy, and nothing is written. A
    run whose record was final before the error (a logger's ``finish`` or ``close`` raised)
    keeps its record's status: the error is noted, after :data:`AFTER_THE_RECORD`."""
    if _taken_over(run):
        return
    error = guest_failure(err) or f"{type(err).__name__}: {err}"
    if FORCE.named_in(error):  # the advice of train, which a sweep has not
        from creditaudit.records import CHECKPOINT_FILE

        error += (f" (in a sweep: delete {run.run_dir / CHECKPOINT_FILE} and rerun the sweep "
                  "with --retry-failed to start this run over)")
    recorded = disk_status(run.run_dir)[0]
    if recorded in FINISHED:  # its record was final (a logger's finish/close raised after)
        run.outcome.update(status=recorded, error=f"{AFTER_THE_RECORD}: {error}")
        return
    run.outcome.update(status="failed", error=error)
    if recorded in (None, "running", "corrupt"):  # not "newer"
        _record_failure(run, error)
    log.debug("run %s failed", run.outcome["run_id"], exc_info=True)


def _record_failure(run: ClaimedRun, error: str) -> None:
    """Write ``run``'s failed record, saying ``error`` (its outcome's). Not even a failed
    record can replace a folder named record.json: the outcome still says why the run
    failed, and why it was not recorded."""
    try:
        write_failed_record(run.plan.config, run.run_dir, error)
    except OutputError as write_error:
        run.outcome["error"] = f"{error}; {UNRECORDED}: {write_error}"


def _stopped(run: ClaimedRun) -> None:
    """A run stopped by its worker's shutdown (:func:`ended_by_ray`): its record, left
    'running' by the training loop, says ``interrupted``."""
    from creditaudit.records import load_record, save_record

    with contextlib.suppress(RunRecordError, OutputError):  # no record: nothing to mark
        if lost_claim(run.run_dir) is None and disk_status(run.run_dir)[0] == "running":
            record = load_record(run.run_dir)
            record.status = "interrupted"
            save_record(run.run_dir, record)
    run.outcome.update(status="interrupted")
    run.event("end", status="interrupted")


def _end(run: ClaimedRun, started: float) -> Outcome:
    run.outcome["seconds"] = time.perf_counter() - started
    run.event("end", status=run.outcome["status"], seconds=run.outcome["seconds"],
              error=run.outcome["error"])
    return run.outcome


def run_one(config_dict: dict[str, Any], *, run_id: str | None = None,
            retry_failed: bool = False, stale_after: float = DEFAULT_STALE_AFTER,
            fingerprint: str | None = None) -> Outcome:
    """Claim, train (or resume, or skip) one run and release it; never raises for the run.

    ``run_id`` is the id the sweep computed for this config: a worker whose creditaudit
    computes another id (a different version on a cluster node) refuses the run instead of
    writing it to another folder; ``fingerprint`` (of the data the sweep planned it on) names
    data that changed since as the reason.

    Returns ``{"run_id", "status", "action", "error", "seconds", "pid", "host"}`` where
    status is the run's status afterwards (completed, diverged, failed, interrupted, busy)
    and action what this call did (trained, resumed, restarted, skipped, busy).
    """
    from creditaudit.run.trainer import train

    started = time.perf_counter()
    outcome, run = begin_run(config_dict, run_id, retry_failed=retry_failed,
                             stale_after=stale_after, fingerprint=fingerprint)
    if run is None:
        return outcome
    try:
        try:
            with heartbeat(run.claim, every=beat_every(stale_after)):
                result = train(run.plan, **run.kwargs)
            outcome.update(status=result.status, error=result.record.error)
        except DiskFullError as err:  # not the run's fault: it resumes once space is freed
            outcome.update(status="interrupted", error=error_line(err))
        except KeyboardInterrupt:
            outcome.update(status="interrupted")
            run.event("end", status="interrupted")
            raise
        except GeneratorExit:
            raise
        except BaseException as err:  # noqa: BLE001
            if ended_by_ray(err):
                _stopped(run)
                raise
            # One failing run must not stop the sweep, nor a guest's sys.exit or own
            # BaseException in it (a factory's forward): the run fails, named as the guest's.
            _failed(run, err)
        return _end(run, started)
    finally:
        release_claim(run.claim)


def _ended_before(run: ClaimedRun) -> bool:
    """Whether ``run``'s record says it ended (completed, diverged) before its stack
    stopped on another run's error (the shared step's, an interrupt): its outcome is then
    its record's, not that error."""
    status, error = disk_status(run.run_dir)
    if status not in FINISHED:
        return False
    run.outcome.update(status=status, error=error)
    return True


def run_group(config_dicts: list[dict[str, Any]], *, run_ids: list[str],
              retry_failed: bool = False, stale_after: float = DEFAULT_STALE_AFTER,
              fingerprints: list[str] | None = None) -> list[Outcome]:
    """:func:`run_one` for runs that train as one stack
    (:func:`creditaudit.run.stacked.train_stacked`): each is claimed, skipped or
    refused on its own; those claimed train together. Never raises for the runs."""
    from creditaudit.run.stacked import train_stacked

    started = time.perf_counter()
    prints = fingerprints or [None] * len(run_ids)
    begun: list[tuple[Outcome, ClaimedRun | None]] = []
    try:
        for c, r, f in zip(config_dicts, run_ids, prints, strict=True):
            begun.append(begin_run(c, r, retry_failed=retry_failed, stale_after=stale_after,
                                   fingerprint=f))
    except BaseException:  # an interrupt while one is planned: the runs claimed are not held
        for _, run in begun:
            if run is not None:
                release_claim(run.claim)
        raise
    runs = [run for _, run in begun if run is not None]
    # Killed between the stack's checkpoint writes: the runs ahead go back to the epoch of
    # the others now (train_stacked would, after their threads were chosen), and one put
    # back to its initial weights starts over on the sweep's count, as its twin does.
    sweep_threads = {run.run_dir: config_from_dict(c).run.threads
                     for c, (_, run) in zip(config_dicts, begun, strict=True) if run is not None}
    put_back = resume_together([run.run_dir for run in runs if run.kwargs.get("resume")])
    for run in runs:
        if run.run_dir in put_back:
            run.plan = on_threads(run.plan, sweep_threads[run.run_dir], put_back[run.run_dir])
    after_record: dict[str, Exception] = {}  # a logger's error once the run's record was final
    try:
        if runs:
            try:
                with contextlib.ExitStack() as stack:
                    for run in runs:
                        stack.enter_context(heartbeat(run.claim, every=beat_every(stale_after)))
                    results = train_stacked(
                        [run.plan for run in runs],
                        resume=[run.kwargs.get("resume", False) for run in runs],
                        force=[run.kwargs.get("force", False) for run in runs],
                        after_record=after_record)
                for run, result in zip(runs, results, strict=True):
                    # a run taken over in the stack failed there, writing nothing: busy
                    if result.record.is_finished or not _taken_over(run):
                        run.outcome.update(status=result.status, error=result.record.error)
                        if run.plan.run_id in after_record:  # noted, as for a run alone
                            run.outcome["error"] = after_the_record(
                                after_record[run.plan.run_id])
                        if result.status == "failed" and disk_status(run.run_dir)[0] is None:
                            # failed before its first record: recorded, as alone
                            _record_failure(run, str(result.record.error))
            except DiskFullError as err:  # as in run_one: the runs resume once space is freed
                for run in runs:
                    if not _ended_before(run):
                        run.outcome.update(status="interrupted", error=error_line(err))
            except KeyboardInterrupt:
                for run in runs:
                    if not _ended_before(run):
                        run.outcome.update(status="interrupted")
                    run.event("end", status=run.outcome["status"])
                raise
            except GeneratorExit:
                raise
            except BaseException as err:  # noqa: BLE001 — as in run_one
                for run in runs:
                    if ended_by_ray(err):
                        _stopped(run)
                    elif not _ended_before(run):
                        _failed(run, err)
                if ended_by_ray(err):
                    raise
            for run in runs:
                _end(run, started)
        return [outcome for outcome, _ in begun]
    finally:
        for run in runs:
            release_claim(run.claim)


# --- executors ---------------------------------------------------------------------------
RunFn = Callable[[dict[str, Any]], Outcome | list[Outcome]]


def interrupted_outcome(task: dict[str, Any]) -> Outcome | list[Outcome]:
    """The outcome of a task (a list for a stacked group's task) stopped by an interrupt."""
    outcomes = [new_outcome(run_id, status="interrupted", action="interrupted")
                for run_id in task_ids(task)]
    return outcomes if "run_ids" in task else outcomes[0]


def task_ids(task: dict[str, Any]) -> list[str]:
    return list(task["run_ids"]) if "run_ids" in task else [task["run_id"]]


def pool_call(fn: RunFn, task: dict[str, Any]) -> Outcome | list[Outcome]:
    """A task in a LocalExecutor worker. A worker told to stop (SIGTERM or SIGINT: the
    sweep's Ctrl-C, or a signal to this worker alone) starts no more runs: it leaves at
    its next task, which breaks the pool, so a sweep that goes on gives the task to a new
    worker (:mod:`creditaudit.sweep.deaths`; it holds no claim, so no run is blamed) and a
    sweep that stops reports it as the runs it never started."""
    if WORKER_STATE["terminating"]:
        os._exit(0)  # a normal exit could hang joining the pool's queues
    WORKER_STATE["in_run"] = True
    try:
        return fn(task)
    except KeyboardInterrupt:
        return interrupted_outcome(task)
    finally:
        WORKER_STATE["in_run"] = False


def failed_outcome(task: dict[str, Any], error: str, action: str = "trained"
                   ) -> Outcome | list[Outcome]:
    """The outcome of a task whose worker gave none (it died, or never started: action
    ``not started``); one per run, as a list, for a stacked group's task."""
    outcomes = [{"run_id": run_id, "status": "failed", "action": action, "error": error,
                 "seconds": 0.0, "pid": None, "host": None} for run_id in task_ids(task)]
    return outcomes if "run_ids" in task else outcomes[0]


def run_task(task: dict[str, Any], *, retry_failed: bool = False,
             stale_after: float = DEFAULT_STALE_AFTER, command_line: bool = False,
             dtype: str = "float32") -> Outcome | list[Outcome]:
    """What an executor runs: ``task = {"config": config dict, "run_id": id, "fingerprint":
    of its data}``, or a stacked group ``{"configs": [...], "run_ids": [...],
    "fingerprints": [...]}`` (one outcome per run, as a list; fingerprints optional).
    ``command_line``: the sweep's caller is the command line, whose flags its messages
    name (:mod:`creditaudit.caller`), in whichever thread or process runs the task.
    ``dtype``: torch's default dtype where the sweep planned its runs (a Python caller's
    float64 is in their run ids), which the task's runs are made in wherever it runs."""
    with for_command_line(command_line), _default_dtype(dtype):
        return _run_task(task, retry_failed=retry_failed, stale_after=stale_after)


@contextlib.contextmanager
def _default_dtype(name: str) -> Iterator[None]:
    """torch's default dtype ``name`` ("float32", "float64") inside; the one before after."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, name))
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _run_task(task: dict[str, Any], *, retry_failed: bool, stale_after: float
              ) -> Outcome | list[Outcome]:
    if "run_ids" in task:
        return run_group(task["configs"], run_ids=task["run_ids"], retry_failed=retry_failed,
                         stale_after=stale_after, fingerprints=task.get("fingerprints"))
    return run_one(task["config"], run_id=task["run_id"], retry_failed=retry_failed,
                   stale_after=stale_after, fingerprint=task.get("fingerprint"))


# The event log, disk_status and FINISHED live in claiming and records; re-exported here, where
# callers import them from
__all__ = ["AFTER_THE_RECORD", "FINISHED", "SWEEP_LOG_FILE", "RunFn", "append_event", "disk_status",
           "failed_outcome", "interrupted_outcome", "pool_call", "run_group",
           "run_one", "run_task", "task_ids", "write_failed_record"]
