"""The ``creditaudit`` command (its entry, which takes Ctrl-C from the first moment, is
:mod:`creditaudit.cli`): one module per subcommand.

Each subcommand module defines ``add_parser(subparsers)`` and ``run(args) -> int``. User
errors (:class:`~creditaudit.errors.CreditAuditError`, and operating-system errors on the
user's files) end in one line on stderr and exit code 2; an interrupted run exits 130
(Ctrl-C) or 143 (SIGTERM); a reader that closed stdout (``| head -1``) ends the command
quietly, exit 141. An
unexpected error — or a ``sys.exit`` — out of a guest's code (a plugin, a model factory:
:mod:`creditaudit.guests.blame`) is that guest's, named in one line (exit 2); any other unexpected
error (a bug) prints one line asking for a report (exit 1). ``--verbose`` shows the
traceback of either. While a command runs, what guest code writes to stdout goes to stderr,
so machine-readable output stays parseable; and the working folder is on the import path,
as ``python -m`` puts it there, so a factory in a file beside the config is found.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import difflib
import importlib
import logging
import os
import select
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from creditaudit.caller import for_command_line
from creditaudit.cli import INTERRUPTED, interrupted_exit_code, sigterm_interrupts
from creditaudit.cli.common import refused_together
from creditaudit.errors import CreditAuditError, GuestError, error_line, unrecorded_note
from creditaudit.files.safe_files import describe_os_error
from creditaudit.formatting import plain_line
from creditaudit.guests.blame import guest_failure, guest_output_to_stderr
from creditaudit.version import __version__

SUBCOMMANDS = ("demo", "train", "audit", "sweep", "experiment", "export", "figures", "report")


class UsageError(Exception):
    """A command line argparse refused (unknown flag, bad choice, missing argument)."""


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line (``creditaudit: error: …``, exit 2)
    like every other user error, instead of the usage block; subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, except that arguments no parser knows are refused by the parser of
        the command they were given to (``see creditaudit train --help``, not the top
        level's help), with the closest option of that command when one is close
        (``--epoks``: did you mean --epochs?); and two flags the command would ignore one of
        when given together (:func:`~creditaudit.cli.common.refuse_together`) are refused
        as argparse refuses two of a mutually exclusive group."""
        parsed, extras = self.parse_known_args(args, namespace)
        parser = self.subcommand_parser(getattr(parsed, "command", None)) or self
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}"
                         f"{closest_option([parser, self], extras)}")
        conflict = refused_together(parser, parsed)  # flags one would ignore with the other
        if conflict is not None:
            parser.error(conflict)
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's, except that a misspelled command is told the closest one
        (``trian``: did you mean train?)."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            close = difflib.get_close_matches(str(value), list(action.choices), n=1)
            if close:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r}; did you "
                                                     f"mean {close[0]}? (choose from "
                                                     f"{', '.join(action.choices)})")
        super()._check_value(action, value)

    def subcommand_parser(self, command: str | None) -> argparse.ArgumentParser | None:
        """The parser of subcommand ``command`` (None when there is none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command is not None:
                return action.choices.get(command)
        return None


def closest_option(parsers: Sequence[argparse.ArgumentParser], extras: Sequence[str]) -> str:
    """``; did you mean --epochs?`` for the first unknown option in ``extras`` that is
    close to an option of one of ``parsers`` (a command's, the top level's); empty when
    none is."""
    options = [s for parser in parsers for action in parser._actions
               for s in action.option_strings if s.startswith("--")]
    for word in extras:
        if not word.startswith("--"):
            continue
        match = difflib.get_close_matches(word.partition("=")[0], options, n=1, cutoff=0.7)
        if match:
            return f"; did you mean {match[0]}?"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="creditaudit",
        description="Train local credit-assignment rules (BP, FA, DFA, …) with per-epoch "
                    "diagnostics, and audit whether their accuracy and alignment numbers "
                    "can be trusted.",
    )
    parser.add_argument("--version", action="version", version=f"creditaudit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        importlib.import_module(f"creditaudit.cli.{name}").add_parser(sub)
        # also after the command, where the advice "rerun with --verbose" is usually
        # followed; not given there, it leaves the top level's value alone
        sub.choices[name].add_argument("-v", "--verbose", action="store_true",
                                       default=argparse.SUPPRESS, help="log debug messages "
                                       "and show the traceback of an unexpected error")
    return parser


class PlainFormatter(logging.Formatter):
    """The command's log lines as the terminal gets them: a message on one line with no
    control character (:func:`plain_line`), a ``--verbose`` traceback each of its lines
    so. A warning names what it read — a record's path, a run id, a plugin's origin — and
    a folder name or a guest's text may hold terminal escape sequences (``\\x1b[2J``
    cleared the screen) or a carriage return that overwrote the line."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 — logging's
        return plain_line(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 — logging's name
        return "\n".join(map(plain_line, super().formatException(ei).splitlines()))


def main(argv: Sequence[str] | None = None) -> int:
    """The command with arguments ``argv`` (default: the process's); its exit code."""
    args = start(argv)
    return args if isinstance(args, int) else run(args)


def start(argv: Sequence[str] | None = None) -> argparse.Namespace | int:
    """What runs before the command does: its arguments parsed (an exit code instead when
    argparse refused them; ``--help``, ``--version`` exit), its log set up, the working
    folder on the import path. :func:`creditaudit.cli.main` holds Ctrl-C off this."""
    any_encoding()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(f"creditaudit: error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler()
    handler.setFormatter(PlainFormatter("%(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        handlers=[handler])
    working_folder_on_path()
    return args


def run(args: argparse.Namespace) -> int:
    """The command ``args`` (from :func:`start`) names, run: its exit code, and one line
    on stderr for what ended it otherwise (see the module's docstring)."""
    try:
        with for_command_line(), sigterm_interrupts(), guest_output_to_stderr():
            code = int(args.handler(args) or 0)
            if sys.stdout is not None:  # None: stdout closed (``>&-``), nothing printed
                sys.stdout.flush()  # a reader that closed stdout is met here, not at exit
            return code
    except BrokenPipeError as err:
        if not stdout_closed():
            print(f"creditaudit: error: {_one_line(describe_os_error(err))}", file=sys.stderr)
            return 2
        return quiet_after_closed_stdout()
    except CreditAuditError as err:
        if args.verbose and isinstance(err, GuestError) and err.__cause__ is not None:
            traceback.print_exception(err.__cause__, file=sys.stderr)
        print(f"creditaudit: error: {_one_line(error_line(err))}", file=sys.stderr)
        return 2
    except SystemExit as err:
        blamed = guest_failure(err)
        if blamed is None:
            raise
        print(f"creditaudit: error: {_one_line(blamed)}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"creditaudit: error: {_one_line(describe_os_error(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        # A run says what it saved (creditaudit.run.trainer.Trainer.interrupted_note); nothing
        # else is claimed.
        notes = getattr(interrupt, "__notes__", None)
        print(f"{INTERRUPTED}{'; ' + notes[-1] if notes else ''}", file=sys.stderr)
        return interrupted_exit_code(interrupt)
    except Exception as err:
        if args.verbose:
            raise
        blamed = guest_failure(err)
        if blamed is not None:
            print(f"creditaudit: error: {_one_line(blamed + unrecorded_note(err))}",
                  file=sys.stderr)
            return 2
        print(f"creditaudit: internal error: {type(err).__name__}: {_one_line(str(err))}; "
              "rerun with --verbose for the traceback and please report it"
              f"{_one_line(unrecorded_note(err))}", file=sys.stderr)
        return 1
    except BaseException as err:  # not an Exception: a guest's own BaseException subclass
        blamed = None if args.verbose else guest_failure(err)
        if blamed is None:
            raise
        print(f"creditaudit: error: {_one_line(blamed + unrecorded_note(err))}",
              file=sys.stderr)
        return 2


def _u_escape(err: UnicodeError) -> tuple[str, int]:
    """An encoding error handler writing each character the stream cannot encode as
    ``\\uXXXX`` (a UTF-16 surrogate pair past U+FFFF): readable on a terminal, and within
    a JSON string the same character again (``audit --format json`` stays JSON)."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    units = err.object[err.start:err.end].encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}"
                   for i in range(0, len(units), 2)), err.end


ESCAPES = "creditaudit-u-escape"
codecs.register_error(ESCAPES, _u_escape)


def any_encoding() -> None:
    """Let stdout and stderr write what they cannot encode as ``\\uXXXX`` escapes
    (:func:`_u_escape`): a terminal or pipe set to ASCII or Latin-1
    (``PYTHONIOENCODING=ascii``) would otherwise end any command at its first ‖ or σ with an
    internal UnicodeEncodeError. Files are written in UTF-8 whatever the terminal's."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and getattr(stream, "errors", None) == "strict" \
                and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # closed, or not a text stream
                stream.reconfigure(errors=ESCAPES)


def stdout_closed() -> bool:
    """Whether whoever reads stdout has closed it (``creditaudit … | head -1``): the write
    end of a pipe without a reader polls as an error (a broken pipe elsewhere — a worker's —
    is no such thing). Where stdout cannot be polled, flushing it tells."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no file descriptor
        pass
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    return False


# What a shell reports for a writer that a closed pipe ended (128 + SIGPIPE).
CLOSED_STDOUT_EXIT = 128 + 13


def quiet_after_closed_stdout() -> int:
    """End without a word when the reader of stdout has gone: what is left unwritten is
    dropped (stdout pointed at the null device, so the interpreter's last flush does not
    complain either); the exit status is a closed pipe's, :data:`CLOSED_STDOUT_EXIT`."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return CLOSED_STDOUT_EXIT


def working_folder_on_path() -> None:
    """Put the working folder first on the import path, as ``python -m`` does (the
    ``creditaudit`` script's own folder is there instead), so ``model.factory`` finds a
    module beside the user's config."""
    here = os.getcwd()
    if not any(entry in ("", here) for entry in sys.path):
        sys.path.insert(0, here)


def _one_line(text: str) -> str:
    """``text`` on one line, its runs of spaces as one, no control character (a guest's
    error message may hold terminal escape sequences: :func:`plain_line`)."""
    return " ".join(plain_line(text).split())

