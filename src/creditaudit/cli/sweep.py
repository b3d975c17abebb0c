"""``creditaudit sweep``: train a grid of runs on local worker processes or a Ray cluster.

Its flags, its executor, the dry run and the command; the progress line and the tables it
prints are in :mod:`creditaudit.cli.sweep_output`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from creditaudit.cli.common import add_device_options, env_overrides, finite_float, folder
from creditaudit.cli.sweep_output import (
    SweepProgress,
    at_once,
    describe_plan,
    describe_stacks,
    format_sweep_table,
    plans_to_train,
    task_sizes,
)
from creditaudit.config import device_overrides
from creditaudit.errors import ConfigError
from creditaudit.formatting import duration


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sweep", help="train a grid of runs (local worker processes or Ray)",
        description="Expand the grid of a sweep file ([base] run config, [grid] of dotted "
                    "keys → lists, optional [[include]] runs) and train every run not "
                    "finished yet. Runs are claimed (OUT/RUN_ID/claim.json) so concurrent "
                    "sweeps on one folder never train a run twice; completed or diverged "
                    "runs are skipped, interrupted ones resume from their checkpoint. "
                    "Writes OUT/sweep_summary.json. See docs/sweeps.md.")
    parser.add_argument("sweep_file", metavar="SWEEP.toml", help="the sweep file")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: worker processes on this machine (default); ray: one "
                             "Ray task per run")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="local executor: worker processes (default: number of CPUs; "
                             "0 = run in this process, one after another)")
    parser.add_argument("--threads-per-worker", type=int, default=None, metavar="T",
                        help="torch CPU threads per run (default: the sweep file's "
                             "run.threads, else 1); with --executor ray also the CPUs Ray "
                             "reserves per run")
    parser.add_argument("--gpus-per-run", type=finite_float, default=None, metavar="G",
                        help="ray executor: GPUs reserved per run, fractions allowed (default "
                             "1 with --device cuda, else 0)")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="ray executor: cluster address ('auto' = the cluster started by "
                             "`ray start --head` on this machine; default: a local Ray)")
    parser.add_argument("--unschedulable-after", type=finite_float, default=None,
                        metavar="SECONDS",
                        help="ray executor: runs that no Ray worker starts for this long, "
                             "while none of the sweep's runs is running, fail with the reason "
                             "(default 600)")
    parser.add_argument("--stack", type=int, default=1, metavar="K",
                        help="train up to K runs that differ only in seeds, learning rates, "
                             "weight decay, λ, feedback seeds/scales or diagnostics settings "
                             "as one stacked model in one worker, each with its own folder "
                             "and record (rules that declare a stacked step; default 1: every run "
                             "alone). Meant for a GPU (not yet measured there); on a CPU "
                             "it does not pay (docs/benchmarks.md)")
    parser.add_argument("--out", default=None, metavar="DIR", type=folder,
                        help="results folder, overrides run.out_dir of the sweep file")
    add_device_options(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would run: the grid's size, the executor, why some "
                             "combinations give no run of their own, every run and its "
                             "state; train nothing")
    parser.add_argument("--max-runs", type=int, default=None, metavar="N",
                        help="refuse a sweep of more than N runs, counted before the grid is "
                             "expanded (default 10000)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run failed runs again (resuming from their checkpoint if any); "
                             "by default they are skipped")
    parser.add_argument("--stale-after", type=finite_float, default=None, metavar="SECONDS",
                        help="break a claim not refreshed for this long (default 900; a "
                             "claim of a dead process on this host is broken at once)")
    parser.add_argument("--no-wait", action="store_true",
                        help="do not wait for runs another process is training; report them "
                             "as busy")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines while the sweep runs (the header, the final "
                             "table and errors are still printed)")
    parser.set_defaults(handler=run)


# --- dry run ------------------------------------------------------------------------------
def describe_planned_executor(args: argparse.Namespace, tasks: list[int]) -> str:
    """The executor the command line asks for, without starting or joining anything, for
    ``tasks`` (the runs each task to train trains at once: 1, or a --stack group's size):
    local worker processes are started for the tasks there are, at most ``--workers``."""
    threads = args.threads_per_worker
    per_run = f"{threads} thread{'s' if threads != 1 else ''}"
    if args.executor == "ray":
        where = (f"the Ray cluster at {args.address}" if args.address else
                 "a local Ray (or the one `ray start` left running here)")
        return (f"ray executor on {where}, each run asking for {threads} CPU, "
                f"{_gpus_per_run(args):g} GPU (--dry-run does not contact Ray)")
    if args.workers == 0:
        return f"inline executor: one run after another in this process, {per_run}"
    workers = min(args.workers or os.cpu_count() or 1, len(tasks))
    if not workers:
        return "local executor, no worker process (nothing to train)"
    return (f"local executor, {workers} worker process{'es' if workers != 1 else ''} × "
            f"{per_run}{at_once(tasks, workers)}")


def _dry_run(sweep: Any, expansion: Any, plans: list[Any], args: argparse.Namespace,
             stale_after: float) -> int:
    """Print what the sweep would do with its ``plans`` (one per config, before run ids
    are deduplicated: a run of two data folders is shown on both rows)."""
    from creditaudit.run.defaults import why_default
    from creditaudit.sweep import run_labels, run_states
    from creditaudit.sweep.plans import same_run_reasons

    out_dir = Path(plans[0].config.run.out_dir)
    rows = run_states(plans, retry_failed=args.retry_failed, stale_after=stale_after)
    to_train = plans_to_train(plans, rows)  # what the sweep would group and hand out
    print(describe_plan(sweep, expansion, out_dir))
    print(f"executor: {describe_planned_executor(args, task_sizes(to_train, args.stack))}")
    if args.stack > 1:
        print(f"stacks: {describe_stacks(to_train, args.stack)}")
    for line in expansion.warnings:
        print(f"warning: {line}")
    for line in expansion.notes:
        print(f"note: {line}")
    labels = run_labels(plans, sweep.grid_keys)
    for plan, label in zip(plans, labels):  # its run id is the default's: say why
        for key, value in plan.explicit_defaults.items():
            print(f"note: run {label}: {why_default(key, value)}")
    first: dict[str, int] = {}
    for index, row in enumerate(rows):
        first.setdefault(row["run_id"], index)
    width = max(len("run"), *(len(label) for label in labels))
    id_width = max(len(row["run_id"]) for row in rows)
    print(f"\n{'run':<{width}}  {'run id':<{id_width}}  state")
    for index, (label, row) in enumerate(zip(labels, rows)):
        status = row["status"]
        if first[row["run_id"]] != index:
            earlier = first[row["run_id"]]
            why = "; ".join(same_run_reasons(plans[index], plans[earlier]))
            state = f"the run of {labels[earlier]} ({why}): runs once"
        elif row["holder"] is not None:
            holder = row["holder"]
            state = f"running now (pid {holder.get('pid')} on {holder.get('host')})"
        elif status in ("completed", "diverged"):
            state = f"done ({status})"
        elif status == "failed":
            state = ("failed, will retry" if args.retry_failed else "failed, skipped (use "
                     "--retry-failed)") + f": {row['error']}"
        elif status in ("running", "interrupted"):
            state = "to resume (interrupted)"
        elif status == "newer":
            state = f"refused: {row['error']}"
        elif status == "corrupt":
            state = f"to restart (unreadable record: {row['error']})"
        else:
            state = "to run"
        print(f"{label:<{width}}  {row['run_id']:<{id_width}}  {state}")
    unique = {row["run_id"]: row for row in rows}.values()
    n_todo = sum(row["todo"] for row in unique)
    print(f"\n{len(unique)} runs: {len(unique) - n_todo} done or skipped, {n_todo} to run "
          f"(results in {out_dir})")
    return 0


# --- the command ---------------------------------------------------------------------------
RAY_ONLY = ("address", "gpus_per_run", "unschedulable_after")


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, in one line each, flags that do not apply to the chosen executor or have
    impossible values — before anything is read, so ``--dry-run`` checks them too."""
    if args.threads_per_worker is not None and args.threads_per_worker < 1:
        raise ConfigError(f"--threads-per-worker must be >= 1, got {args.threads_per_worker}")
    if args.stack < 1:
        raise ConfigError(f"--stack must be >= 1 (1 = every run alone), got {args.stack}")
    if args.max_runs is not None and args.max_runs < 1:
        raise ConfigError(f"--max-runs must be >= 1, got {args.max_runs}")
    if args.stale_after is not None and args.stale_after <= 0:
        raise ConfigError(f"--stale-after must be > 0 seconds, got {args.stale_after}")
    if args.executor == "ray":
        if args.stack > 1:
            raise ConfigError("--stack is for the local executor; Ray runs one run per task: "
                              "drop --stack, or use --executor local")
        if args.workers is not None:
            raise ConfigError("--workers is for --executor local; Ray runs as many runs as "
                              "the cluster has CPUs (see --threads-per-worker)")
        if args.gpus_per_run is not None and args.gpus_per_run < 0:
            raise ConfigError(f"--gpus-per-run must be >= 0, got {args.gpus_per_run:g}")
        if args.unschedulable_after is not None and args.unschedulable_after <= 0:
            raise ConfigError(f"--unschedulable-after must be a positive number of seconds, "
                              f"got {args.unschedulable_after:g}")
        return
    for name in RAY_ONLY:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is for --executor ray; the {args.executor} executor "
                              f"does not use it: drop {flag}, or add --executor ray")
    if args.workers is not None and args.workers < 0:
        raise ConfigError(f"--workers must be >= 0 (0 = in this process), got {args.workers}")


def _gpus_per_run(args: argparse.Namespace) -> float:
    if args.gpus_per_run is not None:
        return float(args.gpus_per_run)
    return 1.0 if args.device == "cuda" else 0.0


def build_executor(args: argparse.Namespace) -> Any:
    """The executor of ``args`` (checked by :func:`check_flags`); starts nothing."""
    from creditaudit.sweep import InlineExecutor, LocalExecutor, RayExecutor

    check_flags(args)
    if args.executor == "ray":
        if args.unschedulable_after is not None:
            extra = {"unschedulable_after": args.unschedulable_after}
        else:
            extra = {}
        return RayExecutor(address=args.address, num_cpus_per_run=args.threads_per_worker,
                           num_gpus_per_run=_gpus_per_run(args), **extra)
    if args.workers == 0:
        return InlineExecutor(threads=args.threads_per_worker)
    return LocalExecutor(workers=args.workers, threads_per_worker=args.threads_per_worker)


@contextlib.contextmanager
def exit_on_signal(message: str, grace: float = 2.0) -> Iterator[None]:
    """While the body runs, SIGINT or SIGTERM end the process within ``grace`` seconds with
    ``creditaudit: MESSAGE`` and exit code 130, even when the body is blocked in C code that
    does not return to Python (``ray.init`` retrying a head for minutes, deaf to Ctrl-C).

    Only for a body that starts nothing needing cleanup. Python's signal handlers run in
    the main thread only once it is back in Python; the wakeup fd is written by the
    low-level handler at once, and a watcher thread reads it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if not select.select([reader], [], [], 0.2)[0]:
                continue
            signals: set[int] = set()
            with contextlib.suppress(OSError):
                signals = set(reader.recv(64))
            if signals & {signal.SIGINT, signal.SIGTERM} and not done.wait(grace):
                print(f"creditaudit: {message}", file=sys.stderr, flush=True)
                os._exit(130)

    watcher = threading.Thread(target=watch, name="creditaudit-signal-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        watcher.join()
        reader.close()
        writer.close()


def describe_executor(executor: Any, tasks: list[int], threads: int) -> str:
    """``local executor, 2 parallel runs × 1 thread`` (Ray: with the cluster's resources),
    after ``executor.connect()``, for ``tasks`` (:func:`task_sizes` of the runs to train):
    tasks at once = the executor's slots, at most the tasks there are; with --stack groups,
    how many runs they train at once."""
    parallel = min(executor.slots, len(tasks))
    text = f"{executor.name} executor"
    if getattr(executor, "cluster", None) is not None:
        from creditaudit.sweep.ray_cluster import describe_resources

        text += f" on {describe_resources(executor.cluster)}"
    if not parallel:
        return f"{text}, nothing to train"
    unit = "run" if sum(tasks[:parallel]) == parallel else "task"
    return (f"{text}, {parallel} parallel {unit}{'s' if parallel != 1 else ''}"
            f"{at_once(tasks, parallel)} × {threads} thread{'s' if threads != 1 else ''}")


@contextlib.contextmanager
def watching(plans: list[Any], grid_keys: list[str], say: Any) -> Iterator[None]:
    """While the block runs, a RunWatch line over the sweep's runs (labelled by their grid
    values) whenever a run finishes an epoch, and at least every few seconds."""
    from creditaudit.cli.run_watch import RunWatch
    from creditaudit.records import RECORD_FILE
    from creditaudit.sweep import run_labels

    runs = {label: plan.run_dir / RECORD_FILE
            for plan, label in zip(plans, run_labels(plans, grid_keys))}
    watch = RunWatch(runs, max(plan.config.optim.epochs for plan in plans), say).start()
    try:
        yield
    finally:
        watch.stop()


def run(args: argparse.Namespace) -> int:
    from creditaudit.sweep import (
        DEFAULT_MAX_RUNS,
        DEFAULT_STALE_AFTER,
        check_devices,
        load_sweep,
        plan_runs,
        prepare_configs,
        run_states,
        run_sweep,
        sweep_threads,
        unique_plans,
    )

    check_flags(args)
    stale_after = DEFAULT_STALE_AFTER if args.stale_after is None else args.stale_after
    max_runs = DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs
    sweep = load_sweep(args.sweep_file, max_runs=max_runs)
    overrides = device_overrides(args.device, args.precision)
    overrides.update(env_overrides())
    if args.out is not None:
        overrides["run.out_dir"] = args.out
    expansion = sweep.expand(overrides, max_runs=max_runs)
    # one count for every run, which the executor reserves and sets (flag, file's, else 1)
    args.threads_per_worker, warning = sweep_threads(expansion.configs, args.threads_per_worker)
    expansion.warnings.extend([warning] if warning else [])
    configs = prepare_configs(expansion.configs, threads=args.threads_per_worker)
    grid_keys = sweep.grid_keys
    # Every run planned before any trains: a run that cannot (a rule that cannot train the
    # model, missing data) stops the sweep here, and its dry run, in one line naming it.
    plans = plan_runs(configs, grid_keys)
    check_devices(plans, args.executor)  # a missing GPU: the dry run says so too
    if args.dry_run:
        return _dry_run(sweep, expansion, plans, args, stale_after)
    for line in expansion.warnings:
        print(f"creditaudit: warning: {line}", file=sys.stderr)
    plans = unique_plans(plans)
    # What the sweep will hand out (runs not finished, grouped by --stack), for the header.
    to_train = plans_to_train(plans, run_states(plans, retry_failed=args.retry_failed,
                                                stale_after=stale_after))
    tasks = task_sizes(to_train, args.stack)
    executor = build_executor(args)
    progress: SweepProgress | None = None
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            # Joining Ray (and checking its resources) comes before any run is submitted:
            # a signal that ray.init does not let through may end the process there.
            with exit_on_signal("sweep interrupted while joining the executor; no run had "
                                "started"):
                stack.enter_context(executor)
            print(f"sweep {args.sweep_file}: {len(plans)} runs, {len(to_train)} to train → "
                  f"{plans[0].config.run.out_dir} "
                  f"({describe_executor(executor, tasks, args.threads_per_worker)}"
                  + (f"; {describe_stacks(to_train, args.stack)}" if args.stack > 1 else "")
                  + ")", flush=True)
            progress = SweepProgress(len(plans), quiet=args.quiet)
            if not args.quiet and executor.name != "ray":  # runs write records here: read
                stack.enter_context(watching(plans, grid_keys, progress.say))  # them
            result = run_sweep(plans, executor, retry_failed=args.retry_failed,
                               stale_after=stale_after, wait_for_others=not args.no_wait,
                               grid_keys=grid_keys, on_progress=progress,
                               summary_extra={"sweep_file": str(args.sweep_file),
                                              "executor": executor.name,
                                              "grid_keys": grid_keys},
                               stack=args.stack)
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        print("creditaudit: sweep interrupted; finished epochs are checkpointed: run the same "
              "command again to resume", file=sys.stderr)
        return 130
    finally:
        if progress is not None:
            progress.close()
    print()
    print(format_sweep_table(plans, grid_keys, {run["run_id"]: run["status"]
                                                for run in result.summary["runs"]}))
    problems = [run for run in result.summary["runs"]
                if run["status"] not in ("completed", "diverged")]
    for entry in problems:
        print(f"{entry['status']}: {entry['run_id']}"
              + (f": {entry['error']}" if entry["error"] else ""))
    skipped_failed = [o for o in result.outcomes
                      if o.get("action") == "skipped" and o.get("status") == "failed"]
    if skipped_failed:
        print(f"{len(skipped_failed)} run(s) failed before and were skipped: run the same "
              "command with --retry-failed to train them again")
    counts = ", ".join(f"{n} {status}" for status, n in result.summary["counts"].items())
    print(f"\n{len(plans)} runs ({counts}) in {duration(time.perf_counter() - started)}; "
          f"summary: {result.summary_path}")
    return 1 if problems else 0
