"""Reading a run folder's claim: whether a process holds the run now.

The process that trains a run — a sweep's worker, ``creditaudit train``, a loop of one's own
(``Recorder``) — holds ``RUN_DIR/claim.json`` (pid, host, time, its process's start in
clock ticks since boot, token) while it trains the run, refreshes its mtime (a heartbeat)
and removes it at the end (:mod:`creditaudit.records.claims` takes, breaks and releases
claims). A claim whose process is gone (same host, pid not alive or now another process's,
which started at another tick) or whose mtime is older than ``stale_after`` seconds holds
nothing.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.records.files import CLAIM_FILE

DEFAULT_STALE_AFTER = 900.0  # seconds without a heartbeat after which a claim holds nothing
# A claim file that is empty or unreadable is being written right now, unless it is older.
UNREADABLE_CLAIM_GRACE = 30.0
MAX_CLAIM_BYTES = 1 << 16  # a claim is ~150 bytes; more is read as unreadable
# A claim's pid that belongs to a process started this many seconds after the claim was
# written was reused: the claim's process is gone (the start time is known to about 1 s).
# Only for a claim that does not say its process's start_ticks (written before they were).
PID_REUSE_MARGIN = 2.0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs; a zombie (killed, not yet reaped by its
    parent: a Ray worker until the raylet waits for it) does not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: past any pid there can be
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:  # Linux: the state follows the command name, which may hold spaces and ')'
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:  # gone meanwhile, unless there is no /proc (macOS)
        return not Path("/proc/self/stat").exists()
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` of this host started, in clock ticks since the host booted
    (/proc/PID/stat's starttime: no step of the wall clock moves it), or None where that
    cannot be told (no /proc: macOS; the process is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_started(pid: int) -> float | None:
    """When process ``pid`` of this host started (unix time, to about a second, as the wall
    clock reads now: a step of the clock since moves it), or None where that cannot be told
    (no /proc: macOS; the process is gone)."""
    ticks = process_start_ticks(pid)
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None if ticks is None else boot + ticks / os.sysconf("SC_CLK_TCK")


def holder_gone(holder: dict[str, Any]) -> bool:
    """Whether the process a claim of this host names is gone: not alive, or its pid now
    belongs to another process (the pid was reused: a restarted container, a reboot, many
    processes since): one whose start in clock ticks since boot is not the claim's
    ``start_ticks``, or — a claim that does not say them — one that started after the claim
    was written (``unix_time``; a step of the wall clock since can mislead this)."""
    pid = holder["pid"]
    if not process_alive(pid):
        return True
    ticks = holder.get("start_ticks")
    if isinstance(ticks, int) and not isinstance(ticks, bool):
        now = process_start_ticks(pid)
        return now is not None and now != ticks
    written = holder.get("unix_time")
    started = process_started(pid)
    return (isinstance(written, int | float) and not isinstance(written, bool)
            and started is not None
            and started > written + PID_REUSE_MARGIN)


def read_claim(path: Path) -> tuple[dict[str, Any] | None, bytes | None, float | None]:
    """(parsed claim or None if unreadable, raw bytes, mtime); (None, None, None) if gone
    (or if a file stands where the run's folder should be: no claim can be there)."""
    try:
        # O_NONBLOCK and a regular file only: a named pipe there would block the opening,
        # a symlink to /dev/zero the reading (such a claim reads as unreadable, so stale)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return None, None, None
    try:  # not os.fdopen, which refuses a folder there (read as unreadable, as a pipe)
        info = os.fstat(fd)
        raw = os.read(fd, MAX_CLAIM_BYTES) if stat.S_ISREG(info.st_mode) else b""
        mtime = info.st_mtime
    finally:
        os.close(fd)
    try:
        holder = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None, raw, mtime
    return (holder if isinstance(holder, dict) else None), raw, mtime


def claim_is_stale(holder: dict[str, Any] | None, age: float, stale_after: float) -> str | None:
    """Why a claim may be broken ("dead process", "stale"), or None while it holds.

    ``age`` is seconds since the claim file was last refreshed.
    """
    if holder is None:
        return "stale" if age > min(UNREADABLE_CLAIM_GRACE, stale_after) else None
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
            and holder_gone(holder):
        return "dead process"
    if age > stale_after:
        return "stale"
    return None


BEING_WRITTEN = "a process whose claim is being written"


def holder_name(holder: dict[str, Any] | None) -> str:
    """The process a claim names, in words, saying only what is known: ``pid 123 on
    host-a``; ``a process whose claim is being written`` for a claim not readable yet
    (None: empty, partly written, or no file, within :data:`UNREADABLE_CLAIM_GRACE`); ``pid
    123 (its host not named)``, ``a process on host-a (its pid not named)`` or ``a process
    its claim does not name`` for a claim without them."""
    if holder is None:
        return BEING_WRITTEN
    pid, host = holder.get("pid"), holder.get("host")
    if pid is not None and host is not None:
        return f"pid {pid} on {host}"
    if pid is not None:
        return f"pid {pid} (its host not named)"
    if host is not None:
        return f"a process on {host} (its pid not named)"
    return "a process its claim does not name"


@dataclass(frozen=True)
class ClaimState:
    """A run folder's claim as found: its content (None while unreadable), seconds since
    its last heartbeat, and why it holds nothing ("dead process", "stale") or None while a
    process holds the run."""

    holder: dict[str, Any] | None
    age: float
    stale: str | None

    @property
    def who(self) -> str:
        """The process the claim names (:func:`holder_name`)."""
        return holder_name(self.holder)

    def why_not_held(self) -> str:
        """Why a stale claim holds nothing, in words: ``pid 123 on host-a is gone``, or
        ``the claim of pid 123 on host-a has had no heartbeat for 20 min``; ``its claim has
        been unreadable for 2 min`` for one never readable."""
        if self.stale == "dead process":
            return f"{self.who} is gone"
        if self.holder is None:
            return f"its claim has been unreadable for {_duration(self.age)}"
        return f"the claim of {self.who} has had no heartbeat for {self.age / 60:.0f} min"


def _duration(seconds: float) -> str:
    """``45 s`` under two minutes, else ``20 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def claim_state(run_dir: Path, stale_after: float = DEFAULT_STALE_AFTER) -> ClaimState | None:
    """The claim on ``run_dir``, or None where there is none (no sweep's worker holds the
    run, or it was never trained by a sweep: then nothing tells whether a process does)."""
    holder, raw, mtime = read_claim(Path(run_dir) / CLAIM_FILE)
    if raw is None or mtime is None:
        return None
    age = max(0.0, time.time() - mtime)
    return ClaimState(holder, age, claim_is_stale(holder, age, stale_after))


__all__ = ["BEING_WRITTEN", "ClaimState", "DEFAULT_STALE_AFTER", "UNREADABLE_CLAIM_GRACE",
           "claim_is_stale", "claim_state", "holder_gone", "holder_name", "process_alive",
           "process_start_ticks", "process_started", "read_claim"]
