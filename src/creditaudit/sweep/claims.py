"""Claims: at most one process trains a run, across sweeps and machines sharing a folder.

A worker claims a run by creating ``OUT/RUN_ID/claim.json`` with ``O_CREAT | O_EXCL`` (pid,
host, time, token), refreshes its mtime while the run trains and removes it at the end. A
claim whose process is gone (same host, pid not alive) or whose mtime is older than
``stale_after`` seconds is broken and retaken (what a claim says is read by
:mod:`creditaudit.records.claim_files`, which reports read too).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.files.safe_files import describe_os_error, ensure_folder, write_error
from creditaudit.records import CLAIM_FILE
from creditaudit.records.claim_files import (  # what a claim says: read by reports too
    DEFAULT_STALE_AFTER,
    claim_is_stale,
    read_claim,
)

log = logging.getLogger(__name__)

BREAK_LOCK_FILE = f"{CLAIM_FILE}.break"
# A break lock left by a process that died while breaking a claim.
BREAK_LOCK_STALE = 60.0


# --- claims ------------------------------------------------------------------------------
@dataclass
class Claim:
    """A held claim on one run folder."""

    path: Path
    token: str


def _break_claim(path: Path, seen: bytes | None, stale_after: float) -> bool:
    """Remove a stale claim if it is still the one we saw; True if the caller may retry.

    Breaking is serialised by a second O_EXCL lock file, so two processes that both saw the
    same stale claim cannot remove each other's fresh claim.
    """
    lock = path.with_name(BREAK_LOCK_FILE)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > BREAK_LOCK_STALE:
                lock.unlink()
        return False
    try:
        holder, raw, mtime = read_claim(path)
        if raw is None:
            return True
        if raw == seen and claim_is_stale(holder, time.time() - mtime, stale_after):
            path.unlink()
            return True
        return False
    finally:
        os.close(fd)
        lock.unlink(missing_ok=True)


def try_claim(run_dir: Path, *, stale_after: float = DEFAULT_STALE_AFTER,
              events: Callable[..., None] | None = None
              ) -> tuple[Claim | None, dict[str, Any] | None]:
    """Atomically claim ``run_dir``: (claim, None), or (None, holder) if another holds it.

    ``holder`` is the other claim's content, None if that claim is still being written.
    OutputError (DiskFullError when space ran out) when the claim cannot be written: a
    file stands where the run's folder should be, a read-only folder, a full disk.
    """
    ensure_folder(run_dir)
    path = run_dir / CLAIM_FILE
    token = uuid.uuid4().hex
    body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "unix_time": time.time(),
                       "token": token}).encode()
    holder: dict[str, Any] | None = None
    for _ in range(5):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder, raw, mtime = read_claim(path)
            if raw is None:  # released between our open and our read
                continue
            reason = claim_is_stale(holder, time.time() - mtime, stale_after)
            if reason is None:
                return None, holder
            if _break_claim(path, raw, stale_after):
                if events is not None:
                    events("break_claim", reason=reason, holder=holder)
                log.warning("broke the %s claim on %s (%s)", reason, run_dir, holder)
                continue
            time.sleep(0.05)
            continue
        except OSError as err:  # a read-only folder, a full disk: the run cannot start here
            raise write_error(err)(f"cannot claim the run: "
                                   f"{describe_os_error(err, path)}") from None
        try:
            os.write(fd, body)
            os.fsync(fd)
        except OSError as err:  # full disk: no empty claim may block the run for others
            os.close(fd)
            path.unlink(missing_ok=True)
            raise write_error(err)(f"cannot write {describe_os_error(err, path)}") from None
        os.close(fd)
        return Claim(path, token), None
    return None, holder


def release_claim(claim: Claim) -> None:
    """Remove the claim file if it is still ours."""
    holder, _, _ = read_claim(claim.path)
    if holder is not None and holder.get("token") == claim.token:
        claim.path.unlink(missing_ok=True)


@contextlib.contextmanager
def heartbeat(claim: Claim, every: float) -> Iterator[None]:
    """Refresh the claim's mtime while a run trains, so long runs never look stale."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            with contextlib.suppress(OSError):
                os.utime(claim.path)

    thread = threading.Thread(target=beat, name="creditaudit-claim-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


