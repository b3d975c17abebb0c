"""Where runs execute: this process, local worker processes, or Ray tasks
(:mod:`creditaudit.sweep.ray_cluster`).

Every executor has ``slots`` (runs at once), ``connect()``/``close()`` (also as a context
manager; only Ray has anything to join) and ``map(fn, tasks)``, which yields each task's
outcome as it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.sweep.outcome import Outcome
from creditaudit.sweep.ray_cluster import RayExecutor
from creditaudit.sweep.worker import failed_outcome, init_worker, pool_call

log = logging.getLogger(__name__)

RunFn = Callable[[dict[str, Any]], Outcome]
# After an interrupt: how long the workers may take to record 'interrupted' and release
# their claims before they are killed (a second interrupt kills them at once; a killed run
# resumes from its last checkpoint all the same).
UNWIND_SECONDS = 30.0


def _shut_down(pool: Any, processes: list[Any], seconds: float) -> None:
    """``pool.shutdown`` once the interrupted worker ``processes`` are done; those still
    running after ``seconds``, or at a second KeyboardInterrupt, are killed, so a sweep
    never waits on a worker that does not stop."""
    import threading

    closer = threading.Thread(target=pool.shutdown, kwargs={"wait": True,
                                                            "cancel_futures": True},
                              name="creditaudit-pool-shutdown", daemon=True)
    closer.start()
    try:
        closer.join(seconds)
    except KeyboardInterrupt:
        log.warning("interrupted again: killing the sweep's worker processes")
    if closer.is_alive():
        for process in processes:
            with contextlib.suppress(Exception):
                process.kill()
        closer.join(5)


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
    threads (workers × threads should not exceed the cores)."""

    name = "local"

    def __init__(self, workers: int | None = None, threads_per_worker: int = 1) -> None:
        workers = (os.cpu_count() or 1) if workers is None else workers
        if workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {workers}")
        if threads_per_worker < 1:
            raise ConfigError(f"--threads-per-worker must be >= 1, got {threads_per_worker}")
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
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        if not tasks:
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=init_worker,
                                   initargs=(self.threads, os.getpid()))
        try:
            futures = {pool.submit(pool_call, fn, task): task for task in tasks}
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BrokenProcessPool as err:
                    yield failed_outcome(futures[future], f"worker process died ({err}); the run "
                                                   "resumes from its checkpoint next time")
        except BaseException:
            # Interrupt the workers (SIGTERM → KeyboardInterrupt: they record 'interrupted'
            # and release their claims), drop what has not started.
            processes = list(getattr(pool, "_processes", {}).values())
            for process in processes:
                with contextlib.suppress(Exception):
                    process.terminate()
            _shut_down(pool, processes, UNWIND_SECONDS)
            raise
        pool.shutdown(wait=True)


Executor = InlineExecutor | LocalExecutor | RayExecutor


