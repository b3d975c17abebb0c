"""What runs training in other processes have done so far, from their record files.

A sweep's workers (``creditaudit demo``, ``creditaudit sweep``) say nothing to the command
until a run ends, which at the demo's size is a minute or more. Every run rewrites its
``record.json`` atomically after each epoch, so the command reads how far each run is from
there — nothing is sent between processes — and says it in one line as it changes, and at
least every :data:`QUIET_SECONDS` while a run trains.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from creditaudit.errors import CreditAuditError
from creditaudit.files.safe_files import read_text
from creditaudit.formatting import duration

Say = Callable[[str], None]
QUIET_SECONDS = 8.0
MAX_LISTED = 6  # more runs than this: a line lists only those training now


def epochs_done(record_file: Path) -> tuple[int, str] | None:
    """(the last recorded epoch, the status) of a run's record; None while there is none
    (a run not started, or a file another version wrote that does not parse or whose last
    epoch is no count: negative, fractional, infinite)."""
    try:  # a regular file only, boundedly: a named pipe or /dev/zero there is no record
        data = json.loads(read_text(record_file, "run record"))
        log = data.get("log") or []
        epoch = log[-1]["epoch"] if log else 0
        if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) \
                or not math.isfinite(epoch) or epoch < 0 or epoch != int(epoch):
            return None
        return int(epoch), str(data.get("status"))
    except (CreditAuditError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            RecursionError):
        return None


class RunWatch:
    """One line of progress over ``runs`` (label → record file) of ``epochs`` epochs each
    (or label → its epochs, for runs of different lengths):
    ``bp 3/8 · fa 2/8 · dfa – · frozen – | 0m45s elapsed, ETA 1m10s``.

    :meth:`poll` reads the records and returns the line when an epoch count changed or
    ``quiet_seconds`` passed since the last one (else None); :meth:`start` polls every
    ``every`` seconds on a daemon thread and hands each line to ``say``; :meth:`stop` ends
    it. The ETA is the epochs left × the seconds per epoch trained since the watch began
    (all runs together, so runs training in parallel count as they do); ``?`` before the
    first. A failed run reads ``failed`` at the epochs it did, and its epochs left are no
    longer waited for. Past :data:`MAX_LISTED` runs the line lists the runs training now
    and counts the others. A ``say`` that fails (stdout closed by its reader) ends the
    thread quietly: the command meets the closed stdout itself at its next write. A record
    is read again only once its file changed (:meth:`_epochs_done`): a sweep's finished
    runs are not parsed at every poll.
    """

    def __init__(self, runs: dict[str, Path], epochs: int | Mapping[str, int], say: Say, *,
                 every: float = 2.0, quiet_seconds: float = QUIET_SECONDS,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.runs, self.say = runs, say
        self.epochs = {label: max(1, epochs if isinstance(epochs, int) else epochs[label])
                       for label in runs}
        self.every, self.quiet_seconds = every, quiet_seconds
        self.clock = clock
        self.started = self.last_said = clock()
        self.last_seen: tuple[dict[str, int | None], frozenset[str], frozenset[str]] | None \
            = None
        self.finishing: set[str] = set()
        self.failed: set[str] = set()
        # record file → (its stat when read, what it said): read again once it changed
        self.read: dict[Path, tuple[tuple[int, ...], tuple[int, str] | None]] = {}
        # Epochs done before the watch began (runs finished earlier) do not pace the ETA.
        self.done_before = sum(c or 0 for c in self.counts().values())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def counts(self) -> dict[str, int | None]:
        """Each run's epochs done (None: not started; a finished run counts in full). Runs
        past their epochs but not finished (the end-of-run block) go into ``finishing``, runs
        whose record says failed into ``failed``."""
        out: dict[str, int | None] = {}
        self.finishing, self.failed = set(), set()
        for label, path in self.runs.items():
            done = self._epochs_done(path)
            if done is None:
                out[label] = None
                continue
            epoch, status = done
            total = self.epochs[label]
            out[label] = total if status in ("completed", "diverged") else epoch
            if status == "failed":
                self.failed.add(label)
            elif status not in ("completed", "diverged") and epoch >= total:
                self.finishing.add(label)
        return out

    def _epochs_done(self, path: Path) -> tuple[int, str] | None:
        """:func:`epochs_done` of ``path``, read again only when its file changed (another
        file, size or time: a run replaces its record atomically at each epoch), so a
        sweep's finished runs cost one ``stat`` per poll, not a parse of their records."""
        try:
            stat = path.stat()
        except OSError:  # none yet
            return None
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        seen = self.read.get(path)
        if seen is not None and seen[0] == key:
            return seen[1]
        done = epochs_done(path)
        self.read[path] = (key, done)
        return done

    def line(self, counts: dict[str, int | None], now: float) -> str:
        done = sum(c or 0 for c in counts.values())
        left = sum(self.epochs[label] - (c or 0) for label, c in counts.items()
                   if label not in self.failed)
        elapsed, trained = now - self.started, done - self.done_before
        # Past the last epoch, the end-of-run block's time is not known beforehand.
        eta = elapsed / trained * left if trained > 0 and (left or not self.finishing) \
            else None
        shown = counts
        if len(counts) > MAX_LISTED:  # a sweep: the runs training now, the others counted
            shown = {k: c for k, c in counts.items() if c is not None and k not in self.failed
                     and (c < self.epochs[k] or k in self.finishing)}

        def state(label: str, c: int | None) -> str:
            if c is None:
                return "–"
            if label in self.failed:
                return f"{c}/{self.epochs[label]} failed"
            return f"{c}/{self.epochs[label]}" + (" end of run" if label in self.finishing
                                                  else "")

        parts = " · ".join(f"{label} {state(label, c)}" for label, c in shown.items())
        if shown is not counts:
            finished = sum(c == self.epochs[k] and k not in self.finishing | self.failed
                           for k, c in counts.items())
            waiting = sum(c is None for c in counts.values())
            failed = sum(k in self.failed for k in counts)
            parts = ", ".join(p for p in (parts, f"{finished} finished",
                                          f"{failed} failed" if failed else "",
                                          f"{waiting} not started") if p)
        return f"  {parts} | {duration(elapsed)} elapsed, ETA {duration(eta)}"

    def poll(self) -> str | None:
        now = self.clock()
        counts = self.counts()
        seen = (counts, frozenset(self.finishing), frozenset(self.failed))
        if seen == self.last_seen and now - self.last_said < self.quiet_seconds:
            return None
        self.last_seen, self.last_said = seen, now
        return self.line(counts, now)

    def start(self) -> RunWatch:
        def loop() -> None:
            while not self._stop.wait(self.every):
                line = self.poll()
                if line is None:
                    continue
                try:
                    self.say(line)
                except (OSError, ValueError):  # stdout closed (BrokenPipeError) or gone
                    return

        self._thread = threading.Thread(target=loop, name="creditaudit-run-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
