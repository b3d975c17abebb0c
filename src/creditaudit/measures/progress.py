"""Progress of the end-of-run stages (ρ, nudging, the fresh-feedback null) and the memory
they hand back to the OS as they go.

The clock only paces progress lines and trims of the C heap: it never decides what is
computed.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

from creditaudit.errors import ConfigError
from creditaudit.formatting import duration

# At most one progress line per stage in this many seconds, and one trim of the C heap
# (release_freed_memory) in TRIM_SECONDS.
PROGRESS_SECONDS = 10.0
TRIM_SECONDS = 5.0

Say = Callable[[str], None]
Clock = Callable[[], float]


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (macOS, musl): nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> None:
    """Hand the memory glibc's allocator keeps after frees back to the OS.

    ρ's forwards on token states free tensors of many sizes between 1 and 20 MB; glibc
    keeps them in its heap, fragmented, and on ViT-Mini at the README's size the resident
    memory grew by 10–20 MB per sample of ρ (past 10 GB in 15 minutes) while the live
    tensors stayed under 2 GB. Trimming every few seconds keeps it flat at what is live.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def say_to(progress: bool | Say | None, prefix: str = "") -> Say | None:
    """Where progress lines go: ``True`` → standard error (flushed, as a progress bar
    writes), ``False``/None → nowhere, a function of one string → that function. Each
    line is led by ``prefix``. ConfigError for anything else."""
    if progress is None or progress is False:
        return None
    if progress is True:
        def say(text: str) -> None:
            print(prefix + text, file=sys.stderr, flush=True)
        return say
    if callable(progress):
        given = progress
        return lambda text: given(prefix + text)
    raise ConfigError(f"progress={progress!r} must be True (lines on standard error), False "
                      "(none) or a function taking one line, e.g. print or logging.info")


class StageProgress:
    """Progress of one end-of-run stage: ``update(done)`` says ``"{stage}: done/total
    samples, … elapsed, ETA …"`` at most once per :data:`PROGRESS_SECONDS`, and hands
    freed memory back to the OS (:func:`release_freed_memory`) at most once per
    :data:`TRIM_SECONDS` — rarely enough that the allocator's warm pages, which spare each
    forward its page faults, stay in use. The clock only paces these lines and trims: it
    never decides what is computed.
    """

    def __init__(self, say: Say | None, stage: str, total: int, *,
                 clock: Clock = time.perf_counter) -> None:
        self.say, self.stage, self.total = say, stage, total
        self.clock = clock
        self.started = self.last = self.trimmed = clock()

    def update(self, done: int, now: float) -> None:
        if now - self.trimmed >= TRIM_SECONDS:
            self.trimmed = now
            release_freed_memory()
        if self.say is None or done >= self.total or now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        elapsed = now - self.started
        eta = elapsed / done * (self.total - done) if done else None
        self.say(f"{self.stage}: {done}/{self.total} samples, {duration(elapsed)} elapsed, "
                 f"ETA {duration(eta)}")
