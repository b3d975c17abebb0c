"""A :class:`~creditaudit.run.recorder.Recorder`'s progress lines (``progress=``)."""

from __future__ import annotations

import time

from creditaudit.formatting import duration
from creditaudit.measures.progress import Say, say_to


class RecorderProgress:
    """The recorder's progress lines: an epoch's diagnostics are announced when they may
    take a while (the first epoch, and any after one that took ``SLOW_SECONDS`` or more,
    with that time as the estimate) and their time said when they did."""

    SLOW_SECONDS = 2.0

    def __init__(self, progress: bool | Say) -> None:
        self.say = say_to(progress)  # ConfigError for a wrong progress= at once
        self.prefix = "Recorder: "
        self.last: float | None = None

    def line(self, text: str) -> None:
        if self.say is not None:
            self.say(self.prefix + text)

    def epoch_starts(self, epoch: int, samples: int) -> float:
        if self.last is None or self.last >= self.SLOW_SECONDS:
            about = "" if self.last is None else f", about {duration(self.last)}"
            self.line(f"epoch {epoch}: diagnostics on {samples} samples{about} …")
        return time.perf_counter()

    def epoch_ends(self, epoch: int, seconds: float, verdict: str | None) -> None:
        if seconds >= self.SLOW_SECONDS:
            self.line(f"epoch {epoch} recorded in {duration(seconds)}"
                      + (f" ({verdict})" if verdict else ""))
        self.last = seconds


__all__ = ["RecorderProgress"]
