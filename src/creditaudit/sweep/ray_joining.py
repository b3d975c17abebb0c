"""Joining a Ray cluster without hanging, and without Ray's signal handlers.

``ray.init`` retries a head that is gone for about 13 minutes without reacting to Ctrl-C,
so the address it would use (``--address``, ``RAY_ADDRESS``, or the cluster file a ``ray
start`` left, e.g. /tmp/ray/ray_current_cluster) is first checked to accept a connection
(:func:`check_address_answers`). Ray replaces the process's SIGTERM handler (with an
abort); :func:`keep_signal_handlers` puts the handlers back, so SIGTERM interrupts a sweep
like Ctrl-C. Used by :class:`creditaudit.sweep.ray_cluster.RayExecutor`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator

from creditaudit.errors import ConfigError

# How long the address ray.init would join may take to accept a TCP connection.
PROBE_SECONDS = 5.0


def _address_answers(address: str, timeout: float = PROBE_SECONDS) -> str | None:
    """None when something accepts a TCP connection at ``host:port``, else why not
    (``"Connection refused"``). An address of another form is left to ``ray.init``."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as err:
        return err.strerror or str(err) or type(err).__name__


def _cluster_file() -> str | None:
    """Where ``ray start`` records the head that ``ray.init()`` joins (Ray's own lookup:
    RAY_TMPDIR, TMPDIR or /tmp, then ray/ray_current_cluster); None if Ray moved it."""
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:
        return None
    return get_ray_address_file(None)


def check_address_answers(address: str | None) -> None:
    """Raise ConfigError (one line, with the fix) when the Ray head that ``ray.init(address)``
    would join does not accept a connection: ``address`` itself, else RAY_ADDRESS, else the
    address in the cluster file a ``ray start`` left (``None`` starts a new local Ray only
    when there is no such file)."""
    if address and address != "auto":
        why = _address_answers(address)
        if why:
            raise ConfigError(f"the Ray cluster at {address} does not answer ({why}): check "
                              "--address, or start its head there with `ray start --head`")
        return
    env = os.environ.get("RAY_ADDRESS")
    if env:
        why = _address_answers(env)
        if why:
            raise ConfigError(f"RAY_ADDRESS={env} names a Ray cluster that does not answer "
                              f"({why}): start it, or unset RAY_ADDRESS")
        return
    path = _cluster_file()
    if path is None:
        return
    try:
        with open(path, encoding="utf-8") as file:
            recorded = file.read().strip()
    except OSError:  # no file: ray.init starts a local Ray (or finds one, for "auto")
        return
    why = _address_answers(recorded) if recorded else None
    if why:
        raise ConfigError(f"Ray's cluster file {path} names a head at {recorded} that does not "
                          f"answer ({why}): a Ray started with `ray start` ended without `ray "
                          "stop`. Run `ray stop` (it removes the file) or delete the file, "
                          "then run again; or give --address")



@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Restore SIGINT's and SIGTERM's handlers after the body: ``ray.init`` installs its own
    (SIGTERM → SystemExit, then an abort in Ray's core), which would end a sweep without
    cancelling its runs or saying why."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set, and Ray only sets them, in the main thread
        return
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)
