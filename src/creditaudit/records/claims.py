"""Claims: at most one process trains a run, across sweeps and machines sharing a folder.

A process claims a run (a sweep's worker, ``train``, a ``Recorder``: :func:`holding_run`) by
creating ``OUT/RUN_ID/claim.json`` with ``O_CREAT | O_EXCL`` (pid,
host, time, token), refreshes its mtime while the run trains and removes it at the end. A
claim whose process is gone (same host, pid not alive) or whose mtime is older than
``stale_after`` seconds is broken and retaken (what a claim says is read by
:mod:`creditaudit.records.claim_files`, which reports read too).

A holder stopped for longer than another process's ``stale_after`` (Ctrl-Z, SIGSTOP, a
suspended laptop, a stalled file system) finds its claim broken when it goes on: its
heartbeat then never touches the claim file again (it is the other process's), and the
holder checks its claim before each write of the run's files (:func:`check_held`), so it
stops with one line and writes nothing more beside the process that now trains the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.errors import RunBusyError
from creditaudit.files.safe_files import describe_os_error, ensure_folder, write_error
from creditaudit.records import CLAIM_FILE
from creditaudit.records.claim_files import (  # what a claim says: read by reports too
    DEFAULT_STALE_AFTER,
    MAX_CLAIM_BYTES,
    claim_is_stale,
    holder_name,
    process_start_ticks,
    read_claim,
)

log = logging.getLogger(__name__)

HOLD_BEAT = 5.0  # most seconds between the heartbeats of any claim this process holds
# The claims this process holds (run folder, resolved → claim): a run this process has
# claimed (a sweep's worker) trains under that claim (:func:`holding_run`).
_HELD: dict[Path, Claim] = {}

BREAK_LOCK_FILE = f"{CLAIM_FILE}.break"
# A break lock left by a process that died while breaking a claim.
BREAK_LOCK_STALE = 60.0


# --- claims ------------------------------------------------------------------------------
@dataclass
class Claim:
    """A held claim on one run folder; ``lost`` once another process broke it (this one
    made no heartbeat for longer than that one's ``stale_after``): the run is then the
    other's, and this process writes nothing more to it. ``broke``: taking it broke the
    claim of a dead (or stale) process, which was at work on the run when it stopped.
    ``pid``: the process that took it, the only one that releases it (a child forked while
    it was held shares it, and ends without touching it)."""

    path: Path
    token: str
    lost: bool = False
    broke: bool = False
    pid: int = field(default_factory=os.getpid)


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
            try:
                path.unlink()
            except OSError as err:  # a folder stands there: no claim can be taken
                raise write_error(err)(f"cannot remove the stale claim "
                                       f"{describe_os_error(err, path)}: remove it by hand"
                                       ) from None
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
                       # a reused pid is told by these, which no step of the clock moves
                       "start_ticks": process_start_ticks(os.getpid()),
                       "token": token}).encode()
    holder: dict[str, Any] | None = None
    broke = False
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
                log.warning("broke the %s claim on %s (%s)", reason, run_dir,
                            holder_name(holder))
                broke = True
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
        claim = Claim(path, token, broke=broke)
        _HELD[run_dir.resolve()] = claim
        return claim, None
    return None, holder


def release_claim(claim: Claim) -> None:
    """Remove the claim file if it is still ours (and this is the process that took it: a
    forked child that ends leaves its parent's claim alone)."""
    folder = claim.path.parent.resolve()
    if _HELD.get(folder) is claim:
        del _HELD[folder]
    if claim.lost or claim.pid != os.getpid():  # another process's claim stands there now
        return
    holder, _, _ = read_claim(claim.path)
    if holder is not None and holder.get("token") == claim.token:
        claim.path.unlink(missing_ok=True)


def beat_every(stale_after: float) -> float:
    """Seconds between a held claim's heartbeats: well within ``stale_after``, and never
    more than :data:`HOLD_BEAT`, whatever ``stale_after`` (that of this process): another
    process's shorter ``--stale-after`` (above ``HOLD_BEAT``) never breaks a live claim."""
    return max(1.0, min(HOLD_BEAT, stale_after / 4))


def _refresh(claim: Claim) -> bool:
    """Refresh the claim file's mtime if it is still ``claim``'s (its token); False, touching
    nothing, when it is gone or another process's. The file read is the file touched (by
    its descriptor): a claim retaken in between is never refreshed by this process."""
    try:
        fd = os.open(claim.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:  # unreadable for now (a stalled file system): try again next beat
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        holder = json.loads(os.read(fd, MAX_CLAIM_BYTES))
        if not isinstance(holder, dict) or holder.get("token") != claim.token:
            return False
        os.utime(fd if os.utime in os.supports_fd else claim.path)
        return True
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return False  # ours is never rewritten: an unreadable claim is another's, being written
    except OSError:
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def heartbeat(claim: Claim, every: float) -> Iterator[None]:
    """Refresh the claim's mtime while a run trains, so long runs never look stale. Once
    the claim is gone or another process's (this one was stopped past that one's
    ``stale_after``), ``claim.lost`` is set and the file is never touched again."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            if not _refresh(claim):
                claim.lost = True
                return

    thread = threading.Thread(target=beat, name="creditaudit-claim-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _who(holder: dict[str, Any] | None) -> str:
    """The process a claim names, in words (``holder``: the claim, None while written)."""
    return ("another process (its claim is being written)" if holder is None else
            f"{holder_name(holder)} (since {holder.get('time', '?')})")


def broke_a_claim(run_dir: Path) -> bool:
    """Whether this process's claim on ``run_dir`` broke that of a process that had stopped
    (killed while it held the run)."""
    claim = _HELD.get(Path(run_dir).resolve())
    return claim is not None and claim.broke


def lost_claim(run_dir: Path) -> str | None:
    """One line when this process held ``run_dir``'s claim and another process has broken
    it since (this one was stopped for longer than that one's ``stale_after``): who holds
    the run now, and that this process wrote nothing more to it. None while the claim is
    still this process's, or when this process holds no claim on ``run_dir``."""
    claim = _HELD.get(Path(run_dir).resolve())
    if claim is None:
        return None
    holder, raw, _ = read_claim(claim.path)
    if not claim.lost and holder is not None and holder.get("token") == claim.token:
        return None
    claim.lost = True
    now = (f"no process holds it now (its claim {claim.path} was removed), and its record "
           "says how far the other process took it (--resume goes on from there)"
           if raw is None else f"it is trained by {_who(holder)} now: let that process "
           "finish it")
    return (f"run {run_dir} was taken over by another process while this one was stopped "
            "(no heartbeat for longer than that process's --stale-after), so this process "
            f"wrote nothing more to the run and stopped: {now}")


def check_held(run_dir: Path) -> None:
    """Before a write of a run's files: RunBusyError (one line, :func:`lost_claim`) when
    this process held ``run_dir``'s claim and another process has broken it since. A run
    folder this process holds no claim on is not checked."""
    message = lost_claim(run_dir)
    if message is not None:
        raise RunBusyError(message)


def busy_message(run_dir: Path, holder: dict[str, Any] | None) -> str:
    """One line: which process holds ``run_dir`` (``holder``: its claim, None while being
    written) and what to do."""
    return (f"run {run_dir} is being trained by {_who(holder)}: wait for it to finish or stop that "
            f"process, then run this again (a claim whose process has died is broken "
            f"automatically; {run_dir / CLAIM_FILE} says who holds it)")


@contextlib.contextmanager
def holding_run(run_dir: Path, *, stale_after: float = DEFAULT_STALE_AFTER) -> Iterator[None]:
    """Hold ``run_dir``'s claim while the block runs (``train``, a ``Recorder``): at most one
    process writes a run's folder. Held by this process already (a sweep's worker, which
    claimed the run before training it), the block runs under that claim. RunBusyError
    (one line naming the holder) when another live process holds it; a dead holder's claim
    (kill -9) or one without a heartbeat for ``stale_after`` seconds is broken. The claim
    is refreshed while held and released however the block ends; the folders the claim
    created are removed again when nothing else was written to them."""
    run_dir = Path(run_dir)
    if run_dir.resolve() in _HELD:
        yield
        return
    # The folders the claim creates (deepest first), removed again when left empty.
    created = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    claim, holder = try_claim(run_dir, stale_after=stale_after)
    if claim is None:
        raise RunBusyError(busy_message(run_dir, holder))
    try:
        # Often: a sweep on the same folder may break claims older than its --stale-after.
        with heartbeat(claim, every=beat_every(stale_after)):
            yield
    finally:
        release_claim(claim)
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the run wrote its files
                break
