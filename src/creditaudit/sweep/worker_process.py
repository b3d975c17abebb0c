"""A sweep's worker process: its start-up (torch threads; SIGTERM/SIGINT interrupt the
current run cleanly) and its end when the sweep that started it dies."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

# Per worker process: set by SIGTERM/SIGINT, so a worker stops after its current run;
# "starting" until its initializer has its signal handlers in place.
WORKER_STATE = {"terminating": False, "in_run": False, "starting": True}


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT off this thread while the block spawns a sweep's workers: they inherit
    the blocked signal, so a Ctrl-C while they import (seconds) waits until
    :func:`init_worker` can end them quietly, instead of a KeyboardInterrupt traceback out of
    the import; this process gets it when the block ends (the spawning takes milliseconds)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def init_worker(threads: int, parent: int) -> None:
    """Worker start-up: torch threads; SIGTERM/SIGINT interrupt the current run cleanly.

    ``parent`` is the pid of the sweep that started this worker, passed by the sweep: a
    worker whose sweep died while it was starting (``kill -9``: it is re-parented, so its
    own ``getppid()`` already names another process) leaves at once, before it could take
    a task still queued in the pipe, so it claims and trains nothing. A Ctrl-C while it
    started (SIGINT, held off by :func:`sigint_held` until here) ends it, quietly."""
    _leave_if_orphaned(parent)  # before the torch import: seconds on a busy machine
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)

    def terminate(signum: int, frame: object) -> None:
        if WORKER_STATE["starting"]:
            os._exit(0)  # no run yet; SystemExit out of an initializer prints a traceback
        if WORKER_STATE["terminating"]:
            # Already stopping: Ctrl-C reaches the workers with the sweep (one process
            # group), then the sweep's SIGTERM follows; a second KeyboardInterrupt would cut
            # short the 'interrupted' record and the claim's release (the sweep kills a
            # worker that does not stop, see executors.UNWIND_SECONDS).
            return
        WORKER_STATE["terminating"] = True
        if WORKER_STATE["in_run"]:
            raise KeyboardInterrupt  # the run records 'interrupted', the claim is released
        raise SystemExit(0)  # idle: leave quietly

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a pending one ends it here
    WORKER_STATE["starting"] = False
    _leave_if_orphaned(parent)  # the sweep may have died during the imports
    _watch_parent(parent)


def _leave_if_orphaned(parent: int) -> None:
    """Exit this worker at once (no run of its own yet) if ``parent`` is no longer its
    parent process; ``os._exit``: a normal exit could hang joining the pool's queues."""
    if os.getppid() != parent:
        os._exit(0)


PARENT_POLL_SECONDS = 1.0
# After the parent died: how long an interrupted run may take to record 'interrupted' and
# release its claim before the worker leaves anyway.
UNWIND_SECONDS = 60.0


def _watch_parent(parent: int) -> None:
    """End this worker when the sweep process that started it dies (kill -9 leaves its
    workers orphaned: they are re-parented, so ``getppid()`` changes). The current run is
    interrupted (SIGTERM → KeyboardInterrupt): it records 'interrupted' and releases its
    claim, so the next sweep resumes it. Then the worker exits at once — waiting for the
    next task would wait forever, as nobody is left to send one, and a normal interpreter
    exit can hang joining the pool's queue threads."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + UNWIND_SECONDS
        time.sleep(0.1)  # let the handler run before reading in_run
        while WORKER_STATE["in_run"] and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)

    threading.Thread(target=watch, name="creditaudit-parent-watch", daemon=True).start()


__all__ = ["init_worker", "sigint_held", "WORKER_STATE"]
