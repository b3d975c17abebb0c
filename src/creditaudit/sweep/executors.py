"""Where runs execute: this process, local worker processes, or Ray tasks."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.sweep.worker import failed_outcome, init_worker, pool_call

log = logging.getLogger(__name__)

RAY_MISSING = "the ray executor needs ray: pip install 'creditaudit[ray]'"

Outcome = dict[str, Any]
RunFn = Callable[[dict[str, Any]], Outcome]


class InlineExecutor:
    """Runs one run after another in this process (debugging, benchmarks, tests)."""

    name = "inline"

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads
        self.slots = 1

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

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        if not tasks:
            return
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)),
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=init_worker, initargs=(self.threads,))
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
            for process in list(getattr(pool, "_processes", {}).values()):
                with contextlib.suppress(Exception):
                    process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _call(fn: RunFn, task: dict[str, Any]) -> Outcome:
    """A Ray task body (Ray wraps functions, not partials)."""
    return fn(task)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


class RayExecutor:
    """One Ray task per run, with ``num_cpus_per_run`` CPUs (= torch threads) and
    ``num_gpus_per_run`` GPUs each.

    ``address=None`` uses a running ``ray.init`` of this process, else starts a local Ray;
    ``"auto"`` joins the cluster started by ``ray start --head``. The results folder must be
    on a filesystem every node sees.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus_per_run: float = 1,
                 num_gpus_per_run: float = 0) -> None:
        self.ray = _import_ray()
        if num_cpus_per_run <= 0:
            raise ConfigError(f"CPUs per Ray run must be > 0, got {num_cpus_per_run}")
        if num_gpus_per_run < 0:
            raise ConfigError(f"GPUs per Ray run must be >= 0, got {num_gpus_per_run}")
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus_per_run, num_gpus_per_run
        self.slots = 1

    def _connect(self) -> bool:
        """Initialise Ray if needed; True if this executor started it."""
        if self.ray.is_initialized():
            return False
        try:
            self.ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise ConfigError(f"cannot connect to Ray at {self.address or 'a new local'} "
                              f"instance: {err}; start one with `ray start --head`") from None
        return True

    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        if not tasks:
            return
        ray = self.ray
        started = self._connect()
        try:
            total_cpus = ray.cluster_resources().get("CPU", 1)
            self.slots = max(1, int(total_cpus // self.num_cpus))
            remote = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                max_retries=0)(_call)
            refs = {remote.remote(fn, task): task for task in tasks}
            try:
                while refs:
                    done, _ = ray.wait(list(refs), num_returns=1)
                    for ref in done:
                        task = refs.pop(ref)
                        try:
                            yield ray.get(ref)
                        except ray.exceptions.RayError as err:
                            reason = str(err).splitlines()[0]
                            yield failed_outcome(task, f"Ray task failed: {reason}")
            except BaseException:
                for ref in refs:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)
                raise
        finally:
            if started:
                ray.shutdown()


Executor = InlineExecutor | LocalExecutor | RayExecutor


