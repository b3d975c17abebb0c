"""The executor ``creditaudit sweep``'s flags ask for: the flags checked against it
(:func:`check_flags`), built (:func:`build_executor`) and described — before anything starts
(the dry run) and once connected (the header).
"""

from __future__ import annotations

import argparse
from typing import Any

from creditaudit.cli.sweep_output import at_once
from creditaudit.errors import ConfigError

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


def gpus_per_run(args: argparse.Namespace) -> float:
    """The GPUs each Ray task asks for: --gpus-per-run, else 1 with --device cuda, else 0."""
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
                           num_gpus_per_run=gpus_per_run(args), **extra)
    if args.workers == 0:
        return InlineExecutor(threads=args.threads_per_worker)
    return LocalExecutor(workers=args.workers, threads_per_worker=args.threads_per_worker)


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
                f"{gpus_per_run(args):g} GPU (--dry-run does not contact Ray)")
    if args.workers == 0:
        return f"inline executor: one run after another in this process, {per_run}"
    from creditaudit.sweep.executors import default_workers

    workers = min(args.workers or default_workers(threads), len(tasks))
    if not workers:
        return "local executor, no worker process (nothing to train)"
    return (f"local executor, {workers} worker process{'es' if workers != 1 else ''} × "
            f"{per_run}{at_once(tasks, workers)}")


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


__all__ = ["RAY_ONLY", "check_flags", "gpus_per_run", "build_executor",
           "describe_planned_executor", "describe_executor"]
