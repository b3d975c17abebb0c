"""The ``creditaudit`` command's entry (``creditaudit.cli:main``, ``python -m creditaudit``).

It imports the standard library only, so that Ctrl-C is taken from the first moment: the
command itself (:mod:`creditaudit.cli.command`) imports torch and the package, a second
or more, and a KeyboardInterrupt raised in there printed a traceback — when torch's own
import did not swallow it and run the command regardless. While the command starts
(imports, arguments, log), :func:`main` holds Ctrl-C: it is answered, once started, with
the one line ``creditaudit: interrupted`` and exit code 130, as a Ctrl-C while the command
runs is; a second Ctrl-C while it starts ends the process at once, with that line.

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
from typing import Any

# What an interrupted command says, on stderr (exit code INTERRUPTED_EXIT).
INTERRUPTED = "creditaudit: interrupted"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    """The ``creditaudit`` command with arguments ``argv`` (default: the process's); its
    exit code (130, after one line on stderr, for a Ctrl-C at any moment)."""
    try:
        with held_interrupts() as interrupted:
            try:
                command = importlib.import_module("creditaudit.cli.command")
                args = command.start(argv)
            except SystemExit:  # --help, --version: a Ctrl-C meanwhile still answers 130
                if not interrupted:
                    raise
        if not interrupted:
            return args if isinstance(args, int) else int(command.run(args))
    except KeyboardInterrupt:  # a Ctrl-C as Python's handler was put back, before the
        pass  # command's own (run's) took over
    print(INTERRUPTED, file=sys.stderr)
    return INTERRUPTED_EXIT


@contextlib.contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """While the body runs, a SIGINT is noted (in the list yielded), not raised: raised
    inside torch's import, a KeyboardInterrupt was printed as a traceback, or lost (torch's
    import clears errors it meets, and the command ran on). A second SIGINT ends the process
    at once (one line, exit code 130; nothing of the command has run). Python's handler is
    put back after. Where SIGINT has another handler (ignored, or one the caller set), or
    outside the main thread, which alone may set handlers, nothing changes."""
    interrupted: list[int] = []
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield interrupted
        return

    def note(signum: int, frame: object) -> None:
        if interrupted:
            os.write(2, f"{INTERRUPTED}\n".encode())
            os._exit(INTERRUPTED_EXIT)
        interrupted.append(signum)

    signal.signal(signal.SIGINT, note)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def __getattr__(name: str) -> Any:
    """The command's names (:mod:`creditaudit.cli.command`), read here as before."""
    if name.startswith("__"):  # asked by tools (inspect, pickle): no reason to import it
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    command = importlib.import_module("creditaudit.cli.command")
    try:
        return getattr(command, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
