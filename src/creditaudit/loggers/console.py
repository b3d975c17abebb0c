"""Progress on the console: a run-level bar in a terminal, one line per epoch otherwise.

In a terminal (stdout and stderr are TTYs) a tqdm bar on stderr over every optimiser step
of the run shows the run's ETA, with the epoch, accuracy and verdict beside it. Piped to a
file (a cluster job; or stderr alone, ``2> err.log``), a bar would print nothing useful
until it ends, so each evaluated epoch prints one line on stdout::

    dfa epoch 3/10 | train loss 1.52 | test loss 1.61 | test acc 0.412 | ‖h_L‖ 3.1e+05 |
    ‖g_L‖ 2.4e-07 | needs walk-back (a) | 0m41s elapsed, ETA 1m36s

(on one line). A resumed part starts with the line of the epoch it resumes after (the part
before may have been stopped before it printed it), and its elapsed time counts the run's
earlier epochs too; the ETA is the mean time of the epochs this process trained so far
times the epochs left. The last line says how the run ended, and at which epoch and why
when ``--stop-on-walkback`` stopped it early.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from creditaudit.formatting import counted, duration, fmt
from creditaudit.loggers.base import RunLogger, RunStart
from creditaudit.loggers.scalars import verdict_text
from creditaudit.records import EpochEntry, RunRecord
from creditaudit.report.runs import stopped_early_text


def _open_or_none(stream: TextIO | None) -> TextIO | None:
    """``stream``, or None when it is None or closed (nothing can be printed there)."""
    try:
        return None if stream is None or stream.closed else stream
    except (AttributeError, OSError, ValueError):  # a stand-in without ``closed``
        return stream


def _is_terminal(stream: TextIO | None) -> bool:
    """Whether ``stream`` is a terminal (False for None, a stream closed meanwhile, or a
    stand-in without ``isatty``: a ``sys.stderr = Tee(...)`` object that only writes)."""
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def terminal_bar(total: int | None, stream: TextIO, **options: Any) -> Any:
    """A tqdm bar on the terminal ``stream`` that follows its width. A terminal that reports
    no size — a pseudo-terminal opened without one, as ``script -c`` makes when its own
    input is not a terminal — gets a fixed 80×24: tqdm draws nothing on a 0-row terminal,
    which left a whole run silent until it ended."""
    from tqdm.auto import tqdm

    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file: tqdm measures nothing
        size = os.terminal_size((0, 0))
    if size.columns > 0 and size.lines > 0:
        return tqdm(total=total, file=stream, dynamic_ncols=True, **options)
    return tqdm(total=total, file=stream, ncols=80, nrows=24, **options)


class ConsoleLogger(RunLogger):
    """Console progress of one run. ``stream`` (default stdout) receives the epoch lines;
    ``terminal`` picks the bar instead, drawn on ``bar_stream`` (default stderr). By default
    the bar is drawn when ``stream`` is a TTY and so is ``bar_stream``: with stderr sent to a
    file or a pipe (``2> err.log``, ``2>/dev/null``) a bar would fill it with frames and show
    nothing in the terminal, so the epoch lines are printed there instead. A stream closed
    (``>&-``, ``2>&-``, closed in Python) or whose reader has gone (``| head``) silences
    what it would show, and the run trains on.

    ``label`` leads every line and the bar: by default the run's method name; the runs of
    one stack, whose lines interleave, are labelled by their run ids
    (:func:`~creditaudit.loggers.build_loggers`)."""

    def __init__(self, stream: TextIO | None = None, *, terminal: bool | None = None,
                 bar_stream: TextIO | None = None, label: str | None = None) -> None:
        # None: nothing is printed there
        self.stream: TextIO | None = _open_or_none(stream or sys.stdout)
        self.bar_stream: TextIO | None = _open_or_none(bar_stream or sys.stderr)
        if terminal is None:  # a closed stderr (None) hides the bar: it leaves it chosen
            terminal = _is_terminal(self.stream) and (
                self.bar_stream is None or _is_terminal(self.bar_stream))
        self.terminal = terminal
        self.bar: Any = None
        self.label = label
        self.run: RunStart | None = None
        self.verdict = "no verdict yet"  # the latest: epochs between protocol runs keep it
        self.started = self.training_started = time.perf_counter()

    @property
    def name(self) -> str:
        """What leads each line: the label, else the run's method name."""
        return self.label or (self.run.config.method.name if self.run is not None else "")

    def _run_words(self, run_id: str) -> str:
        """``dfa run RUN_ID``; ``run RUN_ID`` when the label is the run id."""
        return f"run {run_id}" if self.name == run_id else f"{self.name} run {run_id}"

    def start(self, run: RunStart) -> None:
        self.run = run
        self.training_started = time.perf_counter()
        self.started = self.training_started - run.elapsed_before  # a resumed run's clock
        epochs_left = max(0, run.epochs - run.first_epoch + 1)
        if self.terminal:
            first = "" if run.resumed else " epoch 0: evaluation and diagnostics"
            with self._bar_drawn():
                if self.bar_stream is not None:
                    self.bar = terminal_bar(epochs_left * run.steps_per_epoch,
                                            self.bar_stream, desc=self.name + first,
                                            unit="step", leave=False)
        else:
            what = (f"resuming at epoch {run.first_epoch}" if run.resumed else
                    f"{counted(run.epochs, 'epoch')} of {counted(run.steps_per_epoch, 'step')}")
            self._print(f"{self._run_words(run.run_id)}: {what} → {run.run_dir}")
        if run.resumed_after is not None:  # where it goes on from, and the verdict so far
            self.log_epoch(run.resumed_after)

    def log_step(self, loss: float) -> None:
        if self.bar is None or self.run is None:
            return
        with self._bar_drawn():
            self.bar.update(1)
            steps = self.run.steps_per_epoch
            if steps and self.bar.n % steps == 0:  # the epoch's steps are done: its
                epoch = self.run.first_epoch - 1 + self.bar.n // steps  # evaluation runs
                self.bar.set_description_str(  # with the bar full
                    f"{self.name} epoch {epoch}: evaluation and "
                    "diagnostics", refresh=True)

    def log_epoch(self, entry: EpochEntry) -> None:
        if self.run is None:
            return
        verdict = verdict_text(entry, self.run.reference)
        if verdict is not None:
            self.verdict = verdict
        now = time.perf_counter()
        if entry.epoch < self.run.first_epoch:  # epoch 0: training starts after it
            self.training_started = now
        if self.terminal:
            with self._bar_drawn():
                if self.bar is not None:
                    self.bar.set_description_str(self.name, refresh=False)
                    self.bar.set_postfix_str(f"epoch {entry.epoch}/{self.run.epochs}, test "
                                             f"acc {fmt(entry.acc_eval, '.3f')}, "
                                             f"{self.verdict}", refresh=True)
            return
        self._print(self.epoch_line(entry, now))

    def epoch_line(self, entry: EpochEntry, now: float) -> str:
        """The line of one epoch (the non-terminal mode)."""
        run = self.run
        assert run is not None
        trained = entry.epoch - run.first_epoch + 1
        eta = None
        if trained >= 1:
            eta = (now - self.training_started) / trained * (run.epochs - entry.epoch)
        parts = [f"{self.name} epoch {entry.epoch}/{run.epochs}"]
        if entry.train_loss is not None:
            parts.append(f"train loss {fmt(entry.train_loss, '.4g')}")
        parts += [f"test loss {fmt(entry.test_loss, '.4g')}",
                  f"test acc {fmt(entry.acc_eval, '.3f')}",
                  f"‖h_L‖ {fmt(entry.value('h_L_norm'), '.3g')}",
                  f"‖g_L‖ {fmt(entry.value('g_L_norm'), '.3g')}",
                  self.verdict,
                  f"{duration(now - self.started)} elapsed, ETA {duration(eta)}"]
        return " | ".join(parts)

    def log_stage(self, text: str) -> None:
        if self.run is None:
            return
        line = f"{self.name} end of run: {text}"
        if self.terminal:
            with self._bar_drawn():
                if self.bar is not None:  # a line of its own above the full bar: a postfix
                    self.bar.write(line, file=self.bar_stream)  # at its end is cut off
                    self.bar.set_description_str(f"{self.name} end of run",
                                                 refresh=True)
        else:
            self._print(line)

    def finish(self, record: RunRecord) -> None:
        self._close_bar()
        if self.run is not None and not self.terminal:
            stopped = stopped_early_text(record)
            self._print(f"{self._run_words(record.run_id)}: {record.status} "
                        f"after {duration(time.perf_counter() - self.started)}"
                        + (f", {stopped}" if stopped else ""))

    def close(self) -> None:
        self._close_bar()

    def _close_bar(self) -> None:
        if self.bar is not None:
            with self._bar_drawn():
                self.bar.close()
            self.bar = None

    @contextlib.contextmanager
    def _bar_drawn(self) -> Iterator[None]:
        """Draw the bar in the block; a bar stream closed or without a reader (``2>&-``,
        ``2>&1 | head``) drops the bar — the console is silent from then on."""
        try:
            yield
        except (OSError, ValueError):  # BrokenPipeError, or a stream closed
            self.bar = self.bar_stream = None

    def _print(self, text: str) -> None:
        """Print one line; a stdout whose reader has gone (``creditaudit train … | head``)
        silences the console, and the run trains on."""
        if self.stream is None:
            return
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # BrokenPipeError, or a stream closed
            self.stream = None
