"""Running a sweep (:func:`run_sweep`): what is left to do (:func:`run_states`), handing
the runs to the executor's workers, waiting for runs another process holds, and when to
write ``sweep_summary.json`` (:mod:`~creditaudit.sweep.summary_file`). What it checks
before any run starts is :mod:`~creditaudit.sweep.preflight`; the counts its progress line
shows, :mod:`~creditaudit.sweep.progress`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from creditaudit.caller import on_command_line
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.files.safe_files import ensure_folder
from creditaudit.records import FINISHED, RECORD_FILE
from creditaudit.records.claims import CLAIM_FILE, DEFAULT_STALE_AFTER, claim_is_stale, read_claim
from creditaudit.run.plan import RunPlan
from creditaudit.sweep.executors import Executor
from creditaudit.sweep.outcome import FOREIGN, NEWER, TAKEN_OVER, Outcome, left_alone, new_outcome
from creditaudit.sweep.plans import plan_runs, unique_plans
from creditaudit.sweep.preflight import (  # noqa: F401 — importable from here as before
    DEFAULT_THREADS,
    check_devices,
    check_loggers,
    prepare_configs,
    results_folder,
    sweep_threads,
)
from creditaudit.sweep.progress import SweepState
from creditaudit.sweep.summary_file import (
    SUMMARY_FILE,
    reported_status,
    sweep_summary,
    write_summary,
)
from creditaudit.sweep.worker import disk_status, run_task, task_ids

log = logging.getLogger(__name__)


# --- the sweep ---------------------------------------------------------------------------
@dataclass
class SweepResult:
    """What a sweep did: one outcome per run (in sweep order), the summary written and the
    runs' plans."""

    outcomes: list[Outcome]
    summary: dict[str, Any]
    summary_path: Path
    plans: list[RunPlan] = field(default_factory=list)  # one per run, in sweep order


def run_states(plans: Sequence[RunPlan], *, retry_failed: bool = False,
               stale_after: float = DEFAULT_STALE_AFTER) -> list[dict[str, Any]]:
    """What a sweep would do with each run now: ``{"run_id", "status", "todo", "holder"}``.

    ``status`` is the record's status (None: not started); ``holder`` the live claim, if any.
    """
    rows = []
    for run in plans:
        status, error = disk_status(run.run_dir)
        holder, raw, mtime = read_claim(run.run_dir / CLAIM_FILE)
        live = raw is not None and claim_is_stale(holder, time.time() - mtime,
                                                  stale_after) is None
        todo = not (status in FINISHED or status in (NEWER, FOREIGN)
                    or (status == "failed" and not retry_failed))
        rows.append({"run_id": run.run_id, "status": status, "error": error, "todo": todo,
                     "holder": holder if live else None})
    return rows


def run_sweep(runs: Sequence[RunConfig | RunPlan], executor: Executor, *,
              retry_failed: bool = False, stale_after: float = DEFAULT_STALE_AFTER,
              wait_for_others: bool = True, poll_seconds: float = 1.0,
              grid_keys: list[str] | None = None,
              on_progress: Callable[[SweepState, Outcome | None], None] | None = None,
              summary_extra: dict[str, Any] | None = None, stack: int = 1,
              written_by: str | Mapping[str, str] | None = None) -> SweepResult:
    """Run every run not finished yet; write ``OUT/sweep_summary.json`` (merged with the
    runs other sweeps and experiments listed in it: :mod:`~creditaudit.sweep.summary_file`;
    the result's ``summary`` is this sweep's runs only).

    ``runs``: run configs, or their plans (:func:`~creditaudit.sweep.plans.plan_runs`).
    Every config is planned before any run starts (a run that cannot train is one error
    naming it, by its ``grid_keys`` values), and runs with one run id run once. Runs
    already completed or diverged (and failed ones unless ``retry_failed``) are skipped
    here without a worker. Runs another process holds are retried after the others until
    they are released (``wait_for_others``), or reported as busy. ``stack`` > 1 trains up
    to that many runs of one shape as one stacked model in one worker
    (:func:`creditaudit.run.stacked.stack_groups`; not with Ray). Each worker plans its run
    once from its config and refuses it when its run id differs from the plan's.
    ``written_by`` names, in each summary entry, what wrote it (the sweep file as given,
    ``experiment NAME``; by run id, or one for all; None: nothing named).
    """
    import functools

    if not runs:
        raise ConfigError("the sweep has no runs")
    plans = unique_plans(plan_runs(runs, grid_keys or []))
    out_dir = results_folder(plans)
    if stack > 1 and executor.name == "ray":
        raise ConfigError("--stack is for the local executor; Ray runs one run per task: "
                          "drop --stack, or use --executor local")
    check_devices(plans, executor.name)
    check_loggers(plans, executor.name)
    ensure_folder(out_dir)  # a file in the way is one line before any worker starts
    by_id = {plan.run_id: plan for plan in plans}
    outcomes: dict[str, Outcome] = {}
    # runs another process held for the whole sweep: their summary entries are the holder's
    held: set[str] = set()
    state = SweepState(total=len(plans), slots=executor.slots)

    def report(outcome: Outcome | None) -> None:
        if on_progress is not None:
            on_progress(state, outcome)

    todo = []
    for row in run_states(plans, retry_failed=retry_failed, stale_after=stale_after):
        if row["todo"]:
            todo.append(row["run_id"])
            continue
        outcomes[row["run_id"]] = {"run_id": row["run_id"], "status": row["status"],
                                   "action": left_alone(row["status"]), "error": row["error"],
                                   "seconds": 0.0}
        state.count(row["status"])
    report(None)

    def skipped(row: dict[str, Any]) -> None:
        """A run another process held, finished (or failed) now: skipped here (refused,
        if a newer version wrote it or another run's record is in its folder); one taken
        over from this sweep keeps what it did here (:data:`TAKEN_OVER`, its seconds)."""
        before = outcomes.get(row["run_id"])
        if before is not None and before.get("action") == TAKEN_OVER:
            outcome: Outcome = {**before, "status": row["status"]}
        else:
            held.add(row["run_id"])  # busy here until its holder finished it
            outcome = new_outcome(row["run_id"], status=row["status"],
                                  action=left_alone(row["status"]))
            outcome["error"] = row["error"]
        outcomes[row["run_id"]] = outcome
        state.busy -= 1
        state.count(row["status"])
        report(outcome)

    # the workers (other threads, processes, hosts) spell their messages for this caller,
    # and make their runs in its default dtype (a float64 caller's ids say float64)
    fn = functools.partial(run_task, retry_failed=retry_failed, stale_after=stale_after,
                           command_line=on_command_line(),
                           dtype=str(torch.get_default_dtype()).removeprefix("torch."))
    mapped: Iterator[Any] | None = None
    began = time.time()  # when the round of tasks being run began
    try:
        while todo:
            began = time.time()
            state.outstanding, state.busy = len(todo), 0
            tasks = _tasks([by_id[run_id] for run_id in todo], stack)
            state.tasks = [task_ids(task) for task in tasks]
            busy = []
            mapped = executor.map(fn, tasks)
            stream = (outcome for item in mapped
                      for outcome in (item if isinstance(item, list) else [item]))
            state.slots = executor.slots
            report(None)
            for outcome in stream:
                state.slots = executor.slots
                state.started = getattr(executor, "running", None)
                state.outstanding -= 1
                state.task_ended(outcome["run_id"])
                outcomes[outcome["run_id"]] = outcome
                if outcome["status"] == "busy":
                    busy.append(outcome["run_id"])
                    state.busy += 1
                else:
                    state.count(outcome["status"])
                if outcome["action"] in ("trained", "resumed", "restarted") \
                        and outcome["status"] in (*FINISHED, "failed") \
                        and outcome.get("pid") is not None:  # timed by its worker
                    state.run_seconds.append(outcome["seconds"])
                report(outcome)
            if not busy or not wait_for_others:
                break
            todo = _await_release(busy, by_id, poll_seconds, retry_failed=retry_failed,
                                  stale_after=stale_after, skipped=skipped)
    except KeyboardInterrupt:
        # Ctrl-C (SIGTERM): the executor stops its workers, which record their runs
        # 'interrupted'; the summary then says where each run stopped, and the interrupt
        # goes on to the caller.
        getattr(mapped, "close", lambda: None)()
        # this round's runs without an outcome yet: what an earlier round saw of one (busy:
        # held elsewhere, since released) is not where it stopped if this round trained it.
        # Its workers have stopped and let their runs go: a run still held is another
        # process's (a second sweep on the folder), busy, whatever its record's time says.
        left = [by_id[run_id] for task in state.tasks for run_id in task]
        for row in run_states(left, retry_failed=retry_failed, stale_after=stale_after):
            run_id = row["run_id"]
            if row["holder"] is not None:
                outcomes[run_id] = new_outcome(run_id, status="busy", action="busy")
            elif written_since(by_id[run_id].run_dir, began):
                outcomes[run_id] = {**new_outcome(run_id, action="interrupted"),
                                    "pid": None, "host": None}  # in a worker
        _summarise(plans, outcomes, held, out_dir, grid_keys, summary_extra, written_by)
        raise
    ordered, summary, path = _summarise(plans, outcomes, held, out_dir, grid_keys,
                                        summary_extra, written_by)
    return SweepResult(ordered, summary, path, plans)


def written_since(run_dir: Path, began: float) -> bool:
    """Whether the run's record was written since ``began`` (a ``time.time()``)."""
    try:
        return (run_dir / RECORD_FILE).stat().st_mtime >= began
    except OSError:
        return False


def _summarise(plans: list[RunPlan], outcomes: dict[str, Outcome], held: set[str],
               out_dir: Path, grid_keys: list[str] | None, extra: dict[str, Any] | None,
               written_by: str | Mapping[str, str] | None
               ) -> tuple[list[Outcome], dict[str, Any], Path]:
    """Write ``OUT/sweep_summary.json`` for the sweep's ``outcomes`` so far (a run without
    one: not started), merged with the runs other sweeps and experiments listed in it (run
    at once, or before); returns the outcomes in sweep order, the summary and its path."""
    ordered = [outcomes.get(plan.run_id, {"run_id": plan.run_id, "status": None,
                                          "action": "not started", "error": None})
               for plan in plans]
    summary = sweep_summary(plans, ordered, grid_keys or [], extra=extra,
                            written_by=written_by)
    path = out_dir / SUMMARY_FILE
    held.update(o["run_id"] for o in ordered if o["action"] == "busy" and o["run_id"])
    write_summary(path, summary, reported_status, held)
    return ordered, summary, path


def _await_release(busy: list[str], by_id: dict[str, RunPlan], poll_seconds: float, *,
                   retry_failed: bool, stale_after: float,
                   skipped: Callable[[dict[str, Any]], None]) -> list[str]:
    """Wait, in this process, until a run of ``busy`` (held by other processes) is released;
    the runs to give to workers again: those left to train, with those still held (a pool
    that starts for the first checks them too). Runs finished by their holder are
    ``skipped`` here; [] when all are. No worker is started only to find a claim still
    held: each would pay its start-up (spawn, torch import) every poll, for as long as the
    other process trains."""
    waiting = list(busy)
    while True:
        time.sleep(poll_seconds)
        rows = run_states([by_id[run_id] for run_id in waiting], retry_failed=retry_failed,
                          stale_after=stale_after)
        released = [row for row in rows if row["holder"] is None]
        for row in released:
            if not row["todo"]:
                skipped(row)
        left = {row["run_id"] for row in released if not row["todo"]}
        waiting = [run_id for run_id in waiting if run_id not in left]
        if not waiting or any(row["todo"] for row in released):
            return waiting


def _tasks(plans: list[RunPlan], stack: int) -> list[dict[str, Any]]:
    """One task per run, or with ``stack`` > 1 one per group of runs that train stacked
    (``{"configs", "run_ids"}``; a run that cannot stack is a task of its own). A task
    holds what a worker rebuilds the plan from — the config — and the run id (and the data
    fingerprint: what changed, when it differs) to check."""
    from creditaudit.run.stacked import stack_groups

    tasks: list[dict[str, Any]] = []
    for group in stack_groups(plans, stack):
        if len(group) == 1:
            tasks.append({"config": plans[group[0]].config.to_dict(),
                          "run_id": plans[group[0]].run_id,
                          "fingerprint": plans[group[0]].identity.fingerprint})
        else:
            tasks.append({"configs": [plans[i].config.to_dict() for i in group],
                          "run_ids": [plans[i].run_id for i in group],
                          "fingerprints": [plans[i].identity.fingerprint for i in group]})
    return tasks
