"""The ``creditaudit`` command's entry (``creditaudit.cli:main``, ``python -m creditaudit``).

It imports the standard library only, so that Ctrl-C is taken from the first moment: the
command itself (:mod:`creditaudit.cli.command`) imports torch and the package, a second
or more, and a KeyboardInterrupt raised in there printed a traceback — when torch's own
import did not swallow it and run the command regardless. While the command starts
(imports, arguments, log), :func:`main` holds Ctrl-C and SIGTERM: either is answered,
once started, with the one line ``creditaudit: interrupted`` and exit code 130 (143 for
SIGTERM), as while the command runs; a second while it starts ends the process at once,
with that line.

The command's names (``build_parser``, ``sigterm_interrupts``, …) are read here as before,
from :mod:`creditaudit.cli.command`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command's names, read here on first use (__getattr__)
    from creditaudit.cli.command import (
        CLOSED_STDOUT_EXIT,
        ESCAPES,
        SUBCOMMANDS,
        Parser,
        PlainFormatter,
        UsageError,
        any_encoding,
        build_parser,
        closest_option,
        quiet_after_closed_stdout,
        run,
        start,
        stdout_closed,
        working_folder_on_path,
    )

# What an interrupted command says, on stderr (exit code: interrupted_exit_code).
INTERRUPTED = "creditaudit: interrupted"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt: a run stops the same way
    (records 'interrupted', says what it saved); only the exit code differs."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the body runs, SIGTERM interrupts it as Ctrl-C does (a run records
    'interrupted' and says what it saved). The handler before is put back after, so a
    caller of :func:`main` in its own process keeps its own; outside the main thread, which
    alone may set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python, left alone
            signal.signal(signal.SIGTERM, previous)


# The signals held while the command starts, each with the handler it is held from: Python's
# Ctrl-C handler, and SIGTERM's as the command takes it (:func:`sigterm_interrupts`, which
# :func:`main` sets before the hold, so that it is back the moment the hold ends).
_HELD = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, _terminate))


def interrupted_exit_code(interrupt: BaseException | int) -> int:
    """The exit code of a command stopped by ``interrupt`` (or by the signal numbered so):
    128 + the signal's number, as a shell reports it — 143 for SIGTERM, 130 for Ctrl-C."""
    terminated = isinstance(interrupt, Terminated) or interrupt == signal.SIGTERM
    return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``creditaudit`` command with arguments ``argv`` (default: the process's); its
    exit code (130, after one line on stderr, for a Ctrl-C at any moment; 143 for a
    SIGTERM)."""
    try:
        # SIGTERM raises Terminated from here on: held while the command starts, and raised
        # from the moment the hold ends (no gap in which it killed the process unheard).
        with sigterm_interrupts():
            with held_interrupts() as interrupted:
                try:
                    command = importlib.import_module("creditaudit.cli.command")
                    args = command.start(argv)
                except SystemExit:  # --help, --version: a Ctrl-C meanwhile still answers 130
                    if not interrupted:
                        raise
            if not interrupted:
                return args if isinstance(args, int) else int(command.run(args))
    except KeyboardInterrupt as interrupt:  # a Ctrl-C or SIGTERM as the hold ended, before
        stopped: BaseException | int = interrupt  # the command's own handling took over
    else:
        stopped = interrupted[0]
    print(INTERRUPTED, file=sys.stderr)
    return interrupted_exit_code(stopped)


@contextlib.contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """While the body runs, a SIGINT or SIGTERM is noted (in the list yielded), not raised:
    raised inside torch's import, a KeyboardInterrupt was printed as a traceback, or lost
    (torch's import clears errors it meets, and the command ran on); a SIGTERM ended the
    process without a word. A second signal ends the process at once (one line, exit code
    128 + the first's number; nothing of the command has run). The handlers are put back
    after. SIGTERM is held from the handler :func:`main` sets first
    (:func:`sigterm_interrupts`); a signal with another handler (ignored, or one the caller
    set) is not held, and outside the main thread, which alone may set handlers, nothing
    changes."""
    interrupted: list[int] = []
    held = [] if threading.current_thread() is not threading.main_thread() else \
        [signum for signum, handler in _HELD if signal.getsignal(signum) is handler]

    def note(signum: int, frame: object) -> None:
        if interrupted:
            os.write(2, f"{INTERRUPTED}\n".encode())
            os._exit(interrupted_exit_code(interrupted[0]))
        interrupted.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in held}
    try:
        yield interrupted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# Hidden from type checkers, which read the names imported above instead: to them a module
# __getattr__ makes any attribute exist (typed Any), so `creditaudit.cli.mian` would pass.
if not TYPE_CHECKING:
    def __getattr__(name: str) -> Any:
        """The command's names (:mod:`creditaudit.cli.command`), read here as before."""
        if name.startswith("__"):  # asked by tools (inspect, pickle): no reason to import it
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        command = importlib.import_module("creditaudit.cli.command")
        try:
            return getattr(command, name)
        except AttributeError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


# The entry's names, then the command's (read through __getattr__; typed from the imports
# under TYPE_CHECKING).
__all__ = ["INTERRUPTED", "Terminated", "interrupted_exit_code", "main", "held_interrupts",
           "sigterm_interrupts", "CLOSED_STDOUT_EXIT", "ESCAPES", "SUBCOMMANDS", "Parser",
           "PlainFormatter", "UsageError", "any_encoding", "build_parser", "closest_option",
           "quiet_after_closed_stdout", "run", "start", "stdout_closed",
           "working_folder_on_path"]
