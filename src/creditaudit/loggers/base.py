"""The logger interface every backend implements, and a group that fans out to several."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.errors import CreditAuditError, GuestError, ended_by_ray, pytest_outcome
from creditaudit.guests.blame import guest_error
from creditaudit.records import EpochEntry, RunRecord

log = logging.getLogger(__name__)

# The run whose event the loggers are handed now (LoggerGroup sets it around each call).
_CURRENT_RUN: ContextVar[str | None] = ContextVar("creditaudit_logged_run", default=None)


def current_run_id() -> str | None:
    """The id of the run whose event a logger's method is handling, inside any of its six
    methods (None outside them): a logger handed to several runs that train at once (the
    runs of one stack, :func:`~creditaudit.run.stacked.train_stacked`) tells them apart by
    it, as ``start(run)`` gave each its ``run.run_id``."""
    return _CURRENT_RUN.get()


@dataclass(frozen=True)
class RunStart:
    """What a logger learns when a run starts (or resumes, or is replayed).

    ``first_epoch`` is the first epoch this process trains (1 for a fresh run, k + 1 when
    resuming after epoch k); ``epochs`` the run's last epoch; ``steps_per_epoch`` the
    optimiser steps of one epoch; ``elapsed_before`` the seconds the epochs before
    ``first_epoch`` took (their ``seconds`` in the record; 0 for a fresh run), so a resumed
    run's elapsed time goes on from where it stopped. ``replayed``: the run had finished
    before and its record is replayed (every epoch, then ``finish``; nothing trains, so
    ``log_step`` and ``log_stage`` are not called and ``steps_per_epoch`` is 0).
    ``reference``: the run's reference check (the record's ``reference`` block), which
    every verdict a logger shows is judged with (:func:`~creditaudit.protocol.judge`).
    ``resumed_after``: for a resumed part, the record's last epoch (k, the one its
    checkpoint saved; None otherwise). It is not passed to ``log_epoch``: the earlier part
    saved it before logging it and may have been stopped in between, so it may hold it or
    not; a backend that can replace an earlier part's points (TensorBoard) logs it again.
    ``logged_before``: for a resumed part, the record's epochs before ``resumed_after``,
    which the earlier parts logged if they had this logger: TensorBoard logs them into a
    folder that lacks them (the run resumed with ``--tensorboard`` first asked for then).
    """

    config: RunConfig
    run_id: str
    run_dir: Path
    first_epoch: int
    epochs: int
    steps_per_epoch: int
    elapsed_before: float = 0.0
    replayed: bool = False
    reference: dict[str, Any] | None = None
    resumed_after: EpochEntry | None = None
    logged_before: tuple[EpochEntry, ...] = ()

    @property
    def resumed(self) -> bool:
        return self.first_epoch > 1


class RunLogger:
    """Where a run reports as it trains. The training loop calls, in order:

    - ``start(run)`` once, before the first epoch it logs;
    - ``log_epoch(entry)`` for every evaluated epoch (epoch 0 — the untrained network — of
      a fresh run included), after the epoch's diagnostics and protocol are in ``entry``;
    - ``log_step(loss)`` after every optimiser step (training cross-entropy, nats; NaN
      where it is not read back: a stack on a GPU, captured steps);
    - ``log_stage(text)`` as each end-of-run stage starts (ρ, nudging, the null: minutes on
      a large run);
    - ``finish(record)`` once the record is final (completed, diverged, failed or
      interrupted), with the end-of-run metrics of completed and diverged runs; a run
      stopped between saving an epoch and logging it calls ``log_epoch`` for the saved
      epochs the logger missed first (:meth:`LoggerGroup.catch_up`);
    - ``close()`` always, last.

    A run that had finished before is replayed from its record (:func:`replay`): ``start``
    (with ``replayed`` set), ``log_epoch`` for every epoch of the record, ``finish``,
    ``close`` — what a live run logs, with no training.

    Logging reads what training computed and never changes it. A backend that cannot work
    (missing package, unusable folder) raises a ConfigError in its constructor, before the
    run writes anything.
    """

    def start(self, run: RunStart) -> None:
        """The run starts (or resumes)."""

    def log_step(self, loss: float) -> None:
        """One optimiser step ended with training loss ``loss``."""

    def log_epoch(self, entry: EpochEntry) -> None:
        """One evaluated epoch."""

    def log_stage(self, text: str) -> None:
        """An end-of-run stage starts (one line saying what it computes)."""

    def finish(self, record: RunRecord) -> None:
        """The run ended; ``record`` is final."""

    def close(self) -> None:
        """Release files and processes (idempotent)."""


# What the training loop calls on every logger.
METHODS = ("start", "log_step", "log_epoch", "log_stage", "finish", "close")


class LoggerGroup(RunLogger):
    """Several loggers as one. ``finish`` and ``close`` reach every logger even when one
    raises (the first error is raised afterwards), so one broken backend cannot leave
    another's files open. It keeps the last epoch handed to each logger, so that
    :meth:`catch_up` gives a stopped part's loggers the saved epochs they missed.

    A user's logger (one whose class is not creditaudit's) is a guest: it gets its own
    copy of what it is given (the run, an epoch entry, the record), so a logger that changes
    them cannot change the record, and an exception out of it — or a ``sys.exit`` — is one
    :class:`~creditaudit.errors.GuestError` line naming the logger
    (:func:`~creditaudit.guests.blame.guest_error`)."""

    def __init__(self, loggers: Sequence[RunLogger]) -> None:
        self.loggers = list(loggers)
        self.handed: dict[int, int] = {}  # a logger's index → the last epoch handed to it
        self.first_epoch = 0  # the first epoch this part logs
        self.run_id: str | None = None  # the run started (current_run_id() in its calls)
        # While ``keep_step_errors``: log_step's error is kept here, not raised (the run's
        # step goes on; its loggers hear no more steps of it) — see :meth:`kept_step_error`.
        self.keep_step_errors = False
        self.step_error: Exception | None = None

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def start(self, run: RunStart) -> None:
        """Checks first that every logger has every method (GuestError naming the missing
        ones: before the run writes or trains anything), then starts each."""
        for logger in self.loggers:
            missing = [name for name in METHODS if not callable(getattr(logger, name, None))]
            if missing:
                raise GuestError(
                    f"logger {type(logger).__qualname__} has no {', '.join(missing)} "
                    f"method{'s' if len(missing) > 1 else ''}: a logger needs all of "
                    f"{', '.join(METHODS)}; subclass creditaudit.loggers.RunLogger, whose "
                    "methods do nothing unless you override them")
        self.handed = {}
        self.first_epoch = run.first_epoch if run.resumed else 0
        self.run_id = run.run_id
        with self._current():
            for logger in self.loggers:
                _call(logger, "start", run)

    def log_step(self, loss: float) -> None:
        if self.step_error is not None:
            return
        try:
            with self._current():
                for logger in self.loggers:
                    _call(logger, "log_step", loss)
        except Exception as err:
            self.step_failed(err)

    def step_failed(self, err: Exception) -> None:
        """A logger raised ``err`` in ``log_step``: raised, or kept for the epoch's end while
        :attr:`keep_step_errors` is set."""
        if not self.keep_step_errors:
            raise err
        self.step_error = err

    @contextlib.contextmanager
    def kept_step_error(self) -> Iterator[list[Exception]]:
        """In the block, a logger's ``log_step`` error does not stop the step that logged it
        (as in a stack, where one run's logger cannot stop the shared step): it is kept, the
        loggers hear no more steps, and it is in the yielded list after the block."""
        kept: list[Exception] = []
        self.keep_step_errors, self.step_error = True, None
        try:
            yield kept
        finally:
            if self.step_error is not None:
                kept.append(self.step_error)
            self.keep_step_errors, self.step_error = False, None

    def log_epoch(self, entry: EpochEntry) -> None:
        with self._current():
            for index, logger in enumerate(self.loggers):
                self.handed[index] = entry.epoch  # before: one stopped inside is not retried
                _call(logger, "log_epoch", entry)

    @contextlib.contextmanager
    def _current(self) -> Iterator[None]:
        """:func:`current_run_id` is this group's run inside the block."""
        token = _CURRENT_RUN.set(self.run_id)
        try:
            yield
        finally:
            _CURRENT_RUN.reset(token)

    def catch_up(self, saved: Sequence[EpochEntry]) -> None:
        """Hand each logger the epochs of ``saved`` (the record's epochs its checkpoint holds)
        from this part's first on that it was not handed yet: the part was stopped (Ctrl-C,
        SIGTERM, an error) after saving an epoch and before logging it. Called before
        ``finish`` while the stop unwinds: a logger's own error ends its catching up
        quietly."""
        for index, logger in enumerate(self.loggers):
            missed = [entry for entry in saved if entry.epoch >= self.first_epoch
                      and entry.epoch > self.handed.get(index, -1)]
            with contextlib.suppress(Exception), self._current():
                for entry in missed:
                    self.handed[index] = entry.epoch
                    _call(logger, "log_epoch", entry)

    def log_stage(self, text: str) -> None:
        with self._current():
            for logger in self.loggers:
                _call(logger, "log_stage", text)

    def finish(self, record: RunRecord) -> None:
        self._each("finish", record)

    def close(self) -> None:
        self._each("close")

    def close_quietly(self) -> None:
        """``close`` while another error unwinds (the run's own, which must reach the
        caller): a logger's close failure is logged, one warning line naming it, and not
        raised."""
        self._each("close", quietly=True)

    def _each(self, method: str, *args: object, quietly: bool = False) -> None:
        error: BaseException | None = None
        for logger in self.loggers:
            try:
                with self._current():
                    _call(logger, method, *args)
            except Exception as err:  # noqa: BLE001 — re-raised below, after the others
                if quietly:
                    log.warning("warning: %s (not raised: the error that stopped the "
                                "run is)", _one_line(logger, method, err))
                error = error or err
        if error is not None and not quietly:
            raise error

    def finish_quietly(self, record: RunRecord, *, saved_through: int | None = None) -> None:
        """``finish`` while another error unwinds: a logger's own error must not hide it.
        First, the epochs of ``record`` up to ``saved_through`` (the last one its checkpoint
        holds) that a logger missed (:meth:`catch_up`)."""
        if saved_through is not None:
            self.catch_up([entry for entry in record.log if entry.epoch <= saved_through])
        with contextlib.suppress(Exception):
            self.finish(record)


def _one_line(logger: RunLogger, method: str, err: BaseException) -> str:
    """``err``, raised by ``logger.method``, as one line naming the logger (a guest's
    GuestError already is that line)."""
    if isinstance(err, GuestError):
        return str(err)
    text = str(err).strip().splitlines()
    return (f"logger {type(logger).__qualname__}.{method} raised {type(err).__name__}"
            + (f": {text[0]}" if text else ""))


def _call(logger: RunLogger, method: str, *args: object) -> None:
    """``logger.method(*args)``; for a user's logger (a guest), on copies of ``args``, and
    its exception or ``sys.exit`` named as its own (a CreditAuditError it raises on purpose,
    or an interrupt, passes unchanged)."""
    if type(logger).__module__.startswith("creditaudit."):
        getattr(logger, method)(*args)
        return
    try:
        getattr(logger, method)(*copy.deepcopy(args))
    except (CreditAuditError, KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:  # noqa: BLE001 — the guest's (an Exception, a sys.exit, a
        # BaseException subclass of its own), named as its own
        if ended_by_ray(err) or pytest_outcome(err):  # Ray's shutdown; pytest.skip
            raise
        raise guest_error(f"logger {type(logger).__qualname__}.{method}", err) from err


def replay(record: RunRecord, run_dir: Path, logger: RunLogger) -> None:
    """Log a finished run from its record, as its training logged it: ``start``, every epoch
    (epoch 0 included), ``finish`` with the final record and its end-of-run metrics, and
    ``close``. Reads only the record: nothing is trained or recomputed. A logger's error
    before ``close`` is the one raised (a close failure after it is logged)."""
    group = logger if isinstance(logger, LoggerGroup) else LoggerGroup([logger])
    try:
        group.start(RunStart(
            config=record.config, run_id=record.run_id, run_dir=run_dir, first_epoch=1,
            epochs=record.config.optim.epochs, steps_per_epoch=0,
            elapsed_before=0.0, replayed=True, reference=record.reference.to_dict()))
        for entry in record.log:
            group.log_epoch(entry)
        group.finish(record)
    except BaseException:
        group.close_quietly()
        raise
    group.close()
