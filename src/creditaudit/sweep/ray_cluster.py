"""The Ray executor: one Ray task per run, on a cluster whose resources are checked first.

A sweep on Ray must never wait forever. Before anything is submitted, :meth:`RayExecutor.connect`
reads the cluster's resources (``ray.cluster_resources()``, the nodes up now) and stops with
one line when a single run cannot fit at all (``--device cuda`` on a cluster without GPUs,
more CPUs per run than the cluster has). It also counts how many runs fit at once, which the
sweep header reports.

Each task first yields a "started" marker (a Ray streaming generator), so the executor knows
which runs a worker has picked up. When none of the sweep's runs is running and some still
wait — other jobs hold the resources, or the nodes that had them left — for longer than
``unschedulable_after`` seconds, the waiting runs are cancelled and reported as failed with
the reason (what each run asks for, what the cluster has and what is free). They have not
started, so the next sweep trains them.

Joining a cluster never waits for a head that is gone, and SIGTERM still interrupts a sweep
like Ctrl-C (:mod:`creditaudit.sweep.ray_joining`): the running tasks are cancelled and
given ``UNWIND_SECONDS`` to record 'interrupted' and release their claims.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.formatting import counted
from creditaudit.sweep.deaths import left_outcomes, ray_death_cause, ray_task_reason, record_lost
from creditaudit.sweep.outcome import Outcome
from creditaudit.sweep.ray_joining import check_address_answers, keep_signal_handlers
from creditaudit.sweep.worker import failed_outcome, pool_call

log = logging.getLogger(__name__)

RAY_MISSING = "the ray executor needs ray: pip install 'creditaudit[ray]'"
# A run that no Ray worker starts for this long, while none of the sweep's runs is
# running, fails (the default of --unschedulable-after).
DEFAULT_UNSCHEDULABLE_AFTER = 600.0
POLL_SECONDS = 1.0
# Say why the sweep waits once it has waited this long (or the deadline, if shorter).
WARN_AFTER = 30.0
STARTED = "creditaudit: run started"
# After an interrupt: how long the cancelled runs may take to record 'interrupted' and
# release their claims before Ray is shut down under them (a second interrupt stops waiting).
UNWIND_SECONDS = 30.0

RunFn = Callable[[dict[str, Any]], Outcome]


def _run_streaming(fn: RunFn, task: dict[str, Any]) -> Iterator[Any]:
    """The Ray task body: a marker as soon as a worker runs it (``(STARTED, pid, host)``:
    which process runs it), then the run's outcome (interrupted as in a local worker)."""
    yield STARTED, os.getpid(), socket.gethostname()
    yield pool_call(fn, task)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def describe_resources(resources: dict[str, float]) -> str:
    """``{"CPU": 2.0, "GPU": 0.5, …}`` → ``"2 CPU, 0.5 GPU"`` (the two a run asks for)."""
    return ", ".join(f"{resources.get(key, 0.0):g} {key}" for key in ("CPU", "GPU"))


def parallel_runs(total: dict[str, float], num_cpus: float, num_gpus: float) -> int:
    """How many runs asking ``num_cpus`` CPUs and ``num_gpus`` GPUs each fit in ``total``
    at once (0 when not even one fits)."""
    def fits(have: float, need: float) -> float:  # a whole number, or inf (needs none)
        # The small slack keeps 1.0 / 0.25 GPUs at 4 despite float rounding.
        return math.floor(have / need + 1e-9) if need > 0 else math.inf

    count = min(fits(total.get("CPU", 0.0), num_cpus), fits(total.get("GPU", 0.0), num_gpus))
    return int(count) if math.isfinite(count) else 0


def check_one_run_fits(total: dict[str, float], num_cpus: float, num_gpus: float,
                       where: str) -> None:
    """Raise ConfigError (one line) when a single run needs more than the whole cluster;
    ``where`` is `` at ADDRESS`` or empty."""
    have = describe_resources(total)
    if num_gpus > 0 and total.get("GPU", 0.0) < num_gpus:
        raise ConfigError(
            f"each run asks for {num_gpus:g} GPU (--device cuda / --gpus-per-run) but the Ray "
            f"cluster{where} has {total.get('GPU', 0.0):g} GPU ({have}): add GPU nodes, or "
            "run with --device cpu (or --gpus-per-run 0)")
    if total.get("CPU", 0.0) < num_cpus:
        raise ConfigError(
            f"each run asks for {num_cpus:g} CPU (--threads-per-worker) but the Ray cluster"
            f"{where} has {total.get('CPU', 0.0):g} CPU ({have}): lower --threads-per-worker "
            "or add nodes")


class RayExecutor:
    """One Ray task per run, with ``num_cpus_per_run`` CPUs (= torch threads) and
    ``num_gpus_per_run`` GPUs each.

    ``address=None`` uses a running ``ray.init`` of this process, else starts a local Ray;
    ``"auto"`` joins the cluster started by ``ray start --head``. The results folder must be
    on a filesystem every node sees. ``unschedulable_after`` (seconds): runs still waiting
    for resources this long while none of the sweep's runs is running fail with the reason.

    ``connect()`` (or ``with executor:``) joins Ray and checks the cluster before anything
    is submitted; ``map()`` connects itself when needed and then leaves Ray as it found it.
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus_per_run: float = 1,
                 num_gpus_per_run: float = 0, *,
                 unschedulable_after: float = DEFAULT_UNSCHEDULABLE_AFTER,
                 poll_seconds: float = POLL_SECONDS,
                 unwind_seconds: float = UNWIND_SECONDS) -> None:
        self.ray = _import_ray()
        if not num_cpus_per_run > 0:
            raise ConfigError(f"CPUs per Ray run must be > 0, got {num_cpus_per_run}")
        if not num_gpus_per_run >= 0:
            raise ConfigError(f"GPUs per Ray run must be >= 0, got {num_gpus_per_run}")
        if not (unschedulable_after > 0 and math.isfinite(unschedulable_after)):
            raise ConfigError(f"--unschedulable-after must be a positive number of seconds, "
                              f"got {unschedulable_after}")
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus_per_run, num_gpus_per_run
        self.unschedulable_after, self.poll_seconds = unschedulable_after, poll_seconds
        self.unwind_seconds = unwind_seconds
        self.slots = 1  # until connect() has read the cluster
        self.running: int | None = None  # runs a Ray worker has started (while mapping)
        self.cluster: dict[str, float] | None = None
        self._started_ray = False

    @property
    def where(self) -> str:
        """`` at ADDRESS`` for messages ("the Ray cluster at auto"), empty without one."""
        return f" at {self.address}" if self.address else ""

    @property
    def demand(self) -> str:
        return describe_resources({"CPU": self.num_cpus, "GPU": self.num_gpus})

    # --- lifecycle ----------------------------------------------------------------------
    def connect(self) -> RayExecutor:
        """Join (or start) Ray, check that one run fits the cluster and count how many fit
        at once (``slots``). Idempotent."""
        if self.cluster is not None:
            return self
        ray = self.ray
        if not ray.is_initialized():
            check_address_answers(self.address)
            try:
                with keep_signal_handlers():
                    ray.init(address=self.address, include_dashboard=False,
                             log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as err:
                raise ConfigError(f"cannot connect to Ray at {self.address or 'a new local'} "
                                  f"instance: {err}; start one with `ray start --head`"
                                  ) from None
            self._started_ray = True
        total = {key: float(value) for key, value in ray.cluster_resources().items()}
        try:
            check_one_run_fits(total, self.num_cpus, self.num_gpus, self.where)
        except ConfigError:
            self.close()
            raise
        self.cluster = total
        self.slots = max(1, parallel_runs(total, self.num_cpus, self.num_gpus))
        return self

    def close(self) -> None:
        """Shut Ray down if this executor started it."""
        if self._started_ray:
            self.ray.shutdown()
            self._started_ray = False
        self.cluster = None

    def __enter__(self) -> RayExecutor:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- running ------------------------------------------------------------------------
    def map(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        if not tasks:
            return
        opened_here = self.cluster is None
        self.connect()
        try:
            yield from self._run(fn, tasks)
        finally:
            if opened_here:
                self.close()

    def _run(self, fn: RunFn, tasks: list[dict[str, Any]]) -> Iterator[Outcome]:
        ray = self.ray
        remote = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0,
                            num_returns="streaming")(_run_streaming)
        waiting = {remote.remote(fn, task): task for task in tasks}  # no worker has it yet
        running: dict[Any, dict[str, Any]] = {}
        workers: dict[Any, tuple[int, str]] = {}  # a started task's worker: (pid, host)
        self.running = 0
        stalled_since: float | None = None
        warned = False
        try:
            while waiting or running:
                ready, _ = ray.wait([*waiting, *running], num_returns=1,
                                    timeout=self.poll_seconds)
                for generator in ready:
                    started = generator in running
                    task = waiting.pop(generator, None) or running.pop(generator)
                    item = self._next_item(generator, task, workers.pop(generator, None)
                                           if started else None, started=started)
                    marker = isinstance(item, tuple) and item[:1] == (STARTED,)
                    if marker:
                        running[generator], workers[generator] = task, item[1:]
                    self.running = len(running)
                    if not marker:
                        yield item
                if running or not waiting:
                    stalled_since, warned = None, False
                    continue
                now = time.monotonic()
                stalled_since = now if stalled_since is None else stalled_since
                stalled = now - stalled_since
                if not warned and WARN_AFTER <= stalled < self.unschedulable_after:
                    warned = True
                    log.warning("no run of this sweep has started on Ray for %.0f s: %s; "
                                "waiting runs fail after %.0f s (--unschedulable-after)",
                                stalled, self._room(), self.unschedulable_after)
                if stalled >= self.unschedulable_after:
                    reason = (f"unschedulable: no Ray worker started this run for "
                              f"{stalled:.0f} s (--unschedulable-after "
                              f"{self.unschedulable_after:g}): {self._room()}")
                    for generator, task in waiting.items():
                        with contextlib.suppress(Exception):
                            ray.cancel(generator)
                        yield from left_outcomes(task, reason, ())
                    waiting.clear()
        except BaseException:
            for generator in [*waiting, *running]:
                with contextlib.suppress(Exception):
                    ray.cancel(generator)
            self._unwind([*waiting, *running])
            raise
        finally:
            self.running = None

    def _unwind(self, generators: list[Any]) -> None:
        """Wait (at most ``unwind_seconds``; a second interrupt stops waiting) until the
        cancelled tasks have ended: a cancelled run records 'interrupted' and releases its
        claim, which a Ray shut down under it would not, leaving a claim that blocks the
        run for --stale-after seconds when it was on another node."""
        ray = self.ray
        # A task's end, not its next item: next() on a cancelled task's stream waits, with
        # no deadline, for the task to end, which a run hung in a guest's code never does.
        pending = [generator.completed() for generator in generators]
        deadline = time.monotonic() + self.unwind_seconds
        try:
            while pending and (left := deadline - time.monotonic()) > 0:
                _, pending = ray.wait(pending, num_returns=len(pending),
                                      timeout=min(left, 0.5), fetch_local=False)
            if pending:
                log.warning("%s did not end within %.0f s; their runs "
                            "resume from their last checkpoint next time",
                            counted(len(pending), "cancelled Ray task"),
                            self.unwind_seconds)
        except KeyboardInterrupt:
            log.warning("stopped waiting for %s; their runs resume from their last "
                        "checkpoint next time", counted(len(pending), "cancelled Ray task"))
        except Exception:  # noqa: BLE001 — the interrupt being handled matters, not this
            log.debug("waiting for cancelled Ray tasks failed", exc_info=True)

    def _next_item(self, generator: Any, task: dict[str, Any],
                   worker: tuple[int, str] | None, *, started: bool) -> Any:
        """The next item a task yielded: the start marker or its outcome (a failed outcome
        when the task itself failed). A run whose worker (``worker``: its pid and host)
        died under it (``started``: the worker had begun it) is recorded failed with the
        cause and the action the worker had begun: its record would say 'running' with
        nothing running it. A task whose worker died before it began the run did nothing:
        ``not started``."""
        ray = self.ray
        try:
            return ray.get(next(generator))
        except StopIteration:
            return failed_outcome(task, "Ray task ended without an outcome")
        except ray.exceptions.RayError as err:
            reason = ray_task_reason(err)
            error = f"Ray task failed: {reason}"
            # killed, crashed, its node lost, or ended by Ray's memory monitor (it says so)
            lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.OutOfMemoryError)
            if not started:  # nothing of the run ran: what its record says stands
                outcomes = left_outcomes(task, error + (" (its worker died before it began "
                                         "the run)" if isinstance(err, lost) else ""), ())
                return outcomes if "run_ids" in task else outcomes[0]
            pid, host = worker or (None, None)
            if not isinstance(err, lost):
                return failed_outcome(task, error)
            if isinstance(err, ray.exceptions.WorkerCrashedError):
                error = ray_death_cause(pid, reason)
            return record_lost(task, error, pid, host)

    def _room(self) -> str:
        """What a run asks for against what the cluster has now (for messages)."""
        try:
            total = self.ray.cluster_resources()
            free = self.ray.available_resources()
        except Exception as err:  # noqa: BLE001 — only for a message; say why it is missing
            return f"each run asks for {self.demand}; the cluster's resources are unknown ({err})"
        return (f"each run asks for {self.demand}, the cluster has {describe_resources(total)} "
                f"in all and {describe_resources(free)} free (other jobs hold them, or nodes "
                "left)")
