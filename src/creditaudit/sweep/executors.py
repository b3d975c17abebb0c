"""Where runs execute: this process, local worker processes, or Ray tasks
(:mod:`creditaudit.sweep.ray_cluster`).

Every executor has ``slots`` (runs at once), ``connect()``/``close()`` (also as a context
manager; only Ray has anything to join) and ``map(fn, tasks)``, which yields each task's
outcome as it ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.sweep.deaths import MAX_DEATHS, after_break, death_cause, left_outcomes
from creditaudit.sweep.outcome import Outcome
from creditaudit.sweep.ray_cluster import RayExecutor
from creditaudit.sweep.worker import pool_call
from creditaudit.sweep.worker_process import init_worker, sigint_held

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, Any]], Outcome]
# After an interrupt: how long the workers may take to record 'interrupted' and release
# their claims before they are killed (a second interrupt kills them at once; a killed run
# resumes from its last checkpoint all the same).
UNWIND_SECONDS = 30.0


# Where Linux shows the process's control groups, and their CPU limits.
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cpus() -> int:
    """The CPUs this process may run on: its CPU affinity (``taskset``, a Slurm job's or a
    container's cpuset), not every CPU of the machine, which ``os.cpu_count()`` counts —
    and no more than its CPU quota allows (:func:`cpu_quota`: ``docker run --cpus``, a
    Kubernetes CPU limit), rounded up."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity to read (macOS, Windows)
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def cpu_quota(root: Path | None = None, proc: Path | None = None) -> float | None:
    """The CPUs' worth of time per second the process's control groups grant it (quota /
    period, the smallest along its group's path and at ``root``, the group a container
    sees as its own), or None where none is set or none can be read: cgroup v2's
    ``cpu.max`` ("max 100000" or "200000 100000"), v1's ``cpu.cfs_quota_us`` (-1: none)
    over ``cpu.cfs_period_us``. ``root``, ``proc``: where to read them (default
    :data:`CGROUP_ROOT`, :data:`PROC_CGROUP`)."""
    root = CGROUP_ROOT if root is None else root
    try:
        lines = (PROC_CGROUP if proc is None else proc).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: one tree
            base, read = root, _v2_limit
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's tree
            base, read = root / controllers, _v1_limit
        else:
            continue
        folder = base / path.lstrip("/")
        for where in (folder, *folder.parents):
            if where == base or base in where.parents:
                limit = read(where)
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def default_workers(threads_per_worker: int = 1) -> int:
    """The worker processes a local sweep starts when not told: as many as fill the usable
    CPUs (:func:`usable_cpus`) with ``threads_per_worker`` torch threads each, at least 1."""
    return max(1, usable_cpus() // max(1, threads_per_worker))


def _shut_down(pool: Any, processes: list[Any], seconds: float, *,
               patient: bool = False) -> KeyboardInterrupt | None:
    """``pool.shutdown`` once the interrupted worker ``processes`` are done; those still
    running after ``seconds``, or at a KeyboardInterrupt while waiting, are killed, so a
    sweep never waits on a worker that does not stop. ``patient``: the sweep was not
    interrupted yet (a dead worker broke the pool, which interrupted the others): a first
    KeyboardInterrupt while waiting lets the workers finish recording it, a second kills
    them. Returns the KeyboardInterrupt that arrived, if one did (the caller must then raise
    it: Ctrl-C and SIGTERM end the sweep with different exit codes)."""
    import threading
    import time

    # An Event, not Thread.is_alive(): a join interrupted by KeyboardInterrupt can leave the
    # thread reading as finished while it still runs (CPython), and the workers unkilled.
    done = threading.Event()

    def close() -> None:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            done.set()

    threading.Thread(target=close, name="creditaudit-pool-shutdown", daemon=True).start()
    deadline = time.monotonic() + seconds
    interrupted: KeyboardInterrupt | None = None
    while not done.is_set() and time.monotonic() < deadline:
        try:
            done.wait(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt as interrupt:
            if interrupted or not patient:
                log.warning("interrupted again: killing the sweep's worker processes")
                interrupted = interrupted or interrupt
                break
            interrupted = interrupt
            log.warning("interrupted: waiting for the sweep's worker processes to record "
                        "it (interrupt again to kill them)")
    if not done.is_set():
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()
        done.wait(5)
    return interrupted


class InlineExecutor:
    """Runs one run after another in this process (debugging, benchmarks, tests)."""

    name = "inline"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads
        self.slots = 1

    def connect(self) -> InlineExecutor:
        """Nothing to join: the executor is ready (the same interface as RayExecutor)."""
        return self

    def close(self) -> None:
        return None

    def __enter__(self) -> InlineExecutor:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
        for task in tasks:
            yield fn(task)


class LocalExecutor:
    """``workers`` spawned processes on this machine, each with ``threads_per_worker`` torch
    threads (workers × threads should not exceed the cores; None: :func:`default_workers`)."""

    name = "local"

    def __init__(self, workers: int | None = None, threads_per_worker: int = 1) -> None:
        if threads_per_worker < 1:
            raise ConfigError(f"--threads-per-worker must be >= 1, got {threads_per_worker}")
        workers = default_workers(threads_per_worker) if workers is None else workers
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        self.workers, self.threads = workers, threads_per_worker
        self.slots = workers

    def connect(self) -> LocalExecutor:
        """Nothing to join: the executor is ready (the same interface as RayExecutor)."""
        return self

    def close(self) -> None:
        return None

    def __enter__(self) -> LocalExecutor:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        """Each task's outcome as it ends. A worker process that dies breaks the pool: the
        tasks without an outcome go to a new pool (:mod:`creditaudit.sweep.deaths`), so
        one dead worker does not end the sweep, and a task is never run after its
        outcome came back."""
        left = list(tasks)
        deaths: dict[str, list[str]] = {}  # run id → causes of its workers' deaths
        unblamed = 0  # pools in a row that broke with no run to blame (death at start-up)
        workers: set[int] = set()  # the pids of the pools' workers so far
        while left:
            unfinished, dead, ended = yield from self._pool_round(fn, left)
            if not unfinished:
                return
            workers.update(dead)
            known = sum(map(len, deaths.values()))
            retry, failed = after_break(
                unfinished, {pid: death_cause(pid, code) for pid, code in dead.items()},
                deaths)
            yield from failed
            progress = ended or sum(map(len, deaths.values())) > known
            unblamed = 0 if progress else unblamed + 1
            if unblamed >= MAX_DEATHS:  # the workers die before any run: no new pool helps
                cause = "; ".join(death_cause(pid, code) for pid, code in dead.items()
                                  if code != 0) or "worker process died"
                for task in retry:  # runs never started, and runs the breaks interrupted
                    yield from left_outcomes(task, f"{cause} before it started a run",
                                             workers)
                return
            left = retry

    def _pool_round(self, fn: RunFn, tasks: list[dict[str, Any]]
                    ) -> Generator[Outcome, None,
                                   tuple[list[dict[str, Any]], dict[int, int], int]]:
        """Run ``tasks`` on one pool, yielding outcomes; returns the tasks left without an
        outcome when a worker died (in submission order), the workers that ended (pid →
        exit code: also 0, as a run's code calling ``os._exit(0)`` ends its worker; a
        claim still naming one is a run it died holding) and how many outcomes came back."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=init_worker,
                                   initargs=(self.threads, os.getpid()))
        unfinished: set[int] = set()
        ended = 0
        try:
            with sigint_held():  # a Ctrl-C reaches the workers once they can take it
                futures = {pool.submit(pool_call, fn, task): i
                           for i, task in enumerate(tasks)}
            # Every worker is spawned by now (one per submit up to max_workers).
            processes = list(getattr(pool, "_processes", {}).values())
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    unfinished.add(futures[future])
                    continue
                ended += 1
                yield outcome
        except BaseException:
            # Interrupt the workers (SIGTERM → KeyboardInterrupt: they record 'interrupted'
            # and release their claims), drop what has not started.
            processes = list(getattr(pool, "_processes", {}).values())
            for process in processes:
                with contextlib.suppress(Exception):
                    process.terminate()
            _shut_down(pool, processes, UNWIND_SECONDS)
            raise
        if not unfinished:
            pool.shutdown(wait=True)
            return [], {}, ended
        # The pool interrupted its other workers: wait until they have recorded it. A
        # Ctrl-C meanwhile is the sweep's: it stops here, no new pool is started.
        if interrupt := _shut_down(pool, processes, UNWIND_SECONDS, patient=True):
            raise interrupt
        dead = {process.pid: process.exitcode
                for process in processes if process.exitcode is not None}
        return [tasks[i] for i in sorted(unfinished)], dead, ended


Executor = InlineExecutor | LocalExecutor | RayExecutor


