"""Where a running sweep stands, as its progress line says it (:class:`SweepState`): how
many runs ended and how (done, failed, interrupted, refused), how many another sweep holds,
which tasks the workers have, and the time left at the mean run's pace.
:func:`~creditaudit.sweep.runner.run_sweep` updates it as outcomes come back and hands it to
its ``on_progress`` callback."""

from __future__ import annotations

from dataclasses import dataclass, field

from creditaudit.records import FINISHED
from creditaudit.sweep.outcome import FOREIGN, NEWER


@dataclass
class SweepState:
    """Counts for the progress line: ``done`` (completed or diverged), ``failed``,
    ``interrupted`` (stopped by a signal; resumable), ``newer`` (refused: a newer
    creditaudit's run), ``refused`` (its folder holds another run's record), ``busy``
    (claimed by another sweep)."""

    total: int
    done: int = 0
    failed: int = 0
    interrupted: int = 0
    newer: int = 0
    refused: int = 0
    busy: int = 0
    outstanding: int = 0
    slots: int = 1
    run_seconds: list[float] = field(default_factory=list)
    # Runs a worker has started, where the executor knows (Ray); else the outstanding tasks
    # are assumed to fill the slots in the order they were handed out.
    started: int | None = None
    # The run ids of each task handed to the executor whose runs have not all ended, in
    # that order (a task: one run, or a --stack group that one worker trains at once).
    tasks: list[list[str]] = field(default_factory=list)

    @property
    def running(self) -> int:
        if self.started is not None:
            return self.started
        if self.tasks:
            return sum(len(task) for task in self.tasks[:self.slots])
        return min(self.slots, self.outstanding)

    def task_ended(self, run_id: str) -> None:
        """Run ``run_id`` ended: it leaves its task (a task of no run left leaves too)."""
        for task in self.tasks:
            if run_id in task:
                task.remove(run_id)
        self.tasks = [task for task in self.tasks if task]

    @property
    def left(self) -> int:
        return self.total - self.ended

    @property
    def ended(self) -> int:
        """Runs this sweep is finished with, whatever their status."""
        return self.done + self.failed + self.interrupted + self.newer + self.refused

    def count(self, status: str) -> None:
        """Count one run's end status (anything but completed/diverged/interrupted/newer/
        refused failed)."""
        if status in FINISHED:
            self.done += 1
        elif status == "interrupted":
            self.interrupted += 1
        elif status == NEWER:
            self.newer += 1
        elif status == FOREIGN:
            self.refused += 1
        else:
            self.failed += 1

    @property
    def eta_seconds(self) -> float | None:
        """Left tasks × mean run time / parallel slots, a stack of runs that train at once
        counting once (None before the first trained run)."""
        if not self.run_seconds:
            return None
        mean = sum(self.run_seconds) / len(self.run_seconds)
        left = self.left - sum(len(task) for task in self.tasks) + len(self.tasks)
        return mean * left / max(1, min(self.slots, left))


__all__ = ["SweepState"]
