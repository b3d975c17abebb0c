"""``creditaudit sweep``: train a grid of runs on local worker processes or a Ray cluster.

Its flags, the dry run and the command; the executor its flags ask for is in
:mod:`creditaudit.cli.sweep_executor`, the progress line and the tables it prints in
:mod:`creditaudit.cli.sweep_output`.
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
from typing import Any

from creditaudit.cli import interrupted_exit_code
from creditaudit.cli.common import (
    ENV_OVERRIDES,
    add_device_options,
    device_flags,
    env_overrides,
    finite_float,
    folder,
    refusals_in_flags,
)
from creditaudit.cli.sweep_executor import (
    build_executor,
    check_flags,
    describe_executor,
    describe_planned_executor,
)
from creditaudit.cli.sweep_output import (
    SweepProgress,
    describe_plan,
    describe_stacks,
    format_sweep_table,
    plans_to_train,
    task_sizes,
)
from creditaudit.config import device_overrides
from creditaudit.formatting import counted, duration


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
                        help="local executor: worker processes (default: the CPUs this "
                             "process may run on ÷ --threads-per-worker; "
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
                             "and record (rules that declare a stacked step; local executor "
                             "only; default 1: every run alone). Meant for a GPU, where 8 "
                             "stacked runs took about half the time per run; on a CPU it "
                             "does not pay (docs/benchmarks.md)")
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
def _dry_run(sweep: Any, expansion: Any, plans: list[Any], args: argparse.Namespace,
             stale_after: float) -> int:
    """Print what the sweep would do with its ``plans`` (one per config, before run ids
    are deduplicated: a run of two data folders is shown on both rows)."""
    from creditaudit.run.defaults import why_default
    from creditaudit.run.unresumable import checkpointed_epoch
    from creditaudit.sweep import results_folder, run_labels, run_states
    from creditaudit.sweep.plans import same_run_reasons

    out_dir = results_folder(plans)
    rows = run_states(plans, retry_failed=args.retry_failed, stale_after=stale_after)
    to_train = plans_to_train(plans, rows)  # what the sweep would group and hand out
    print(describe_plan(sweep, expansion, out_dir, len({plan.run_id for plan in plans})))
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
        # no readable record, but a checkpoint of a trained epoch: the sweep resumes it
        trained = (checkpointed_epoch(plans[index].run_dir) or 0
                   if status in (None, "corrupt") else 0)
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
        elif status in ("newer", "refused"):  # a newer version's, or another run's record
            state = f"refused: {row['error']}"
        elif trained > 0:
            missing = ("no record" if status is None
                       else f"unreadable record: {row['error']}")
            state = f"to resume from its checkpoint of epoch {trained} ({missing})"
        elif status == "corrupt":
            state = f"to restart (unreadable record: {row['error']})"
        else:
            state = "to run"
        print(f"{label:<{width}}  {row['run_id']:<{id_width}}  {state}")
    unique = {row["run_id"]: row for row in rows}.values()
    n_todo = sum(row["todo"] for row in unique)
    # held by another process: the sweep waits for it, and trains it only if it is let go
    n_held = sum(row["todo"] and row["holder"] is not None for row in unique)
    held = f", {n_held} running now elsewhere (waited for)" if n_held else ""
    print(f"\n{len(unique)} run{'s' if len(unique) != 1 else ''}: {len(unique) - n_todo} "
          f"done or skipped, {n_todo - n_held} to run{held} "
          f"(results in {out_dir})")
    return 0


# --- the command ---------------------------------------------------------------------------
@contextlib.contextmanager
def exit_on_signal(message: str, grace: float = 2.0) -> Iterator[None]:
    """While the body runs, SIGINT or SIGTERM end the process within ``grace`` seconds with
    ``creditaudit: MESSAGE`` and exit code 130 (SIGINT) or 143 (SIGTERM), even when the body
    is blocked in C code that does not return to Python (``ray.init`` retrying a head for
    minutes, deaf to Ctrl-C).

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
            received = b""
            with contextlib.suppress(OSError):
                received = reader.recv(64)
            stops = [signum for signum in received if signum in (signal.SIGINT, signal.SIGTERM)]
            if stops and not done.wait(grace):
                print(f"creditaudit: {message}", file=sys.stderr, flush=True)
                os._exit(interrupted_exit_code(stops[0]))

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


@contextlib.contextmanager
def watching(plans: list[Any], grid_keys: list[str], say: Any) -> Iterator[None]:
    """While the block runs, a RunWatch line over the sweep's runs (labelled by their grid
    values) whenever a run finishes an epoch, and at least every few seconds."""
    from creditaudit.cli.run_watch import RunWatch
    from creditaudit.records import RECORD_FILE
    from creditaudit.sweep import run_labels

    labels = run_labels(plans, grid_keys)
    runs = {label: plan.run_dir / RECORD_FILE for plan, label in zip(plans, labels)}
    epochs = {label: plan.config.optim.epochs for plan, label in zip(plans, labels)}
    watch = RunWatch(runs, epochs, say).start()
    try:
        yield
    finally:
        watch.stop()


def run(args: argparse.Namespace) -> int:
    from creditaudit.sweep import (
        AFTER_THE_RECORD,
        DEFAULT_MAX_RUNS,
        DEFAULT_STALE_AFTER,
        check_devices,
        check_loggers,
        load_sweep,
        plan_runs,
        prepare_configs,
        results_folder,
        run_states,
        run_sweep,
        sweep_threads,
        unique_plans,
    )

    check_flags(args)
    stale_after = DEFAULT_STALE_AFTER if args.stale_after is None else args.stale_after
    max_runs = DEFAULT_MAX_RUNS if args.max_runs is None else args.max_runs
    sweep = load_sweep(args.sweep_file, max_runs=max_runs, validate=False)
    overrides = device_overrides(args.device, args.precision)
    if args.out is not None:
        overrides["run.out_dir"] = args.out
    shrink = env_overrides()
    overrides.update(shrink)  # after every flag, as train and demo apply it
    expansion = sweep.expand(overrides, max_runs=max_runs)
    # one count for every run, which the executor reserves and sets (flag, file's, else 1)
    threads_flag = ({"run.threads": (args.threads_per_worker,
                                     f"--threads-per-worker {args.threads_per_worker}")}
                    if args.threads_per_worker is not None else {})
    args.threads_per_worker, warning = sweep_threads(
        expansion.configs, args.threads_per_worker,
        set_by=ENV_OVERRIDES if "run.threads" in shrink else None)
    expansion.warnings.extend([warning] if warning else [])
    with refusals_in_flags(threads_flag):  # --threads-per-worker 10**30, not run.threads=…
        configs = prepare_configs(expansion.configs, threads=args.threads_per_worker)
    grid_keys = sweep.grid_keys
    # Every run planned before any trains: a run that cannot (a rule that cannot train the
    # model, missing data) stops the sweep here, and its dry run, in one line naming it.
    with refusals_in_flags(device_flags(args)):  # --device cuda, not run.device='cuda'
        plans = plan_runs(configs, grid_keys)
        check_devices(plans, args.executor)  # a missing GPU: the dry run says so too
        check_loggers(plans, args.executor)  # wandb missing, a file as the TensorBoard folder
    results_folder(plans)  # runs in two folders: the dry run says so too
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
            print(f"sweep {args.sweep_file}: {counted(len(plans), 'run')}, {len(to_train)} to "
                  "train → "
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
                               stack=args.stack, written_by=str(args.sweep_file))
    except KeyboardInterrupt as interrupt:
        if progress is not None:
            progress.close()
        print("creditaudit: sweep interrupted; finished epochs are checkpointed: run the same "
              "command again to resume", file=sys.stderr)
        return interrupted_exit_code(interrupt)
    finally:
        if progress is not None:
            progress.close()
    print()
    print(format_sweep_table(plans, grid_keys, {run["run_id"]: run["status"]
                                                for run in result.summary["runs"]}))
    problems = [run for run in result.summary["runs"]
                if run["status"] not in ("completed", "diverged")]
    noted = [run for run in result.summary["runs"]  # a logger failed after its final record
             if run["status"] in ("completed", "diverged")
             and AFTER_THE_RECORD in (run["error"] or "")]
    for entry in problems + noted:
        print(f"{entry['status']}: {entry['run_id']}"
              + (f": {entry['error']}" if entry["error"] else ""))
    skipped_failed = [o for o in result.outcomes
                      if o.get("action") == "skipped" and o.get("status") == "failed"]
    if skipped_failed:
        print(f"skipped {counted(len(skipped_failed), 'run')} that failed before: run the "
              "same command with --retry-failed to train failed runs again")
    counts = ", ".join(f"{n} {status}" for status, n in result.summary["counts"].items())
    took = duration(time.perf_counter() - started)
    print(f"\n{counted(len(plans), 'run')} ({counts}) in {took}; "
          f"summary: {result.summary_path}")
    return 1 if problems else 0
