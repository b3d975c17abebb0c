"""Who reads a message, and how it spells an option for them: the command line's flag
(``--resume``) or the Python argument (``resume=True``).

The ``creditaudit`` command runs its subcommands inside :func:`for_command_line` (and a sweep
carries its caller into its workers); everything else — a script or notebook calling
:func:`creditaudit.train`, ``RunConfig.replace``, a
:class:`~creditaudit.run.recorder.Recorder` — is a Python caller. A message raised to the
caller spells its advice with the constants and functions here, at the moment it is
formatted::

    raise RunRecordError(f"run {run_dir} exists: pass {RESUME} to continue it")
    # command line: "pass --resume to continue it"; Python: "pass resume=True to continue it"

An error a run records (``record.error``) keeps the words its caller was told: the Python
spelling names the same option as the flag (``force=True``, ``--force``), so a later
``creditaudit report`` reads either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

_COMMAND_LINE: ContextVar[bool] = ContextVar("creditaudit_command_line", default=False)


@contextmanager
def for_command_line(on: bool = True) -> Iterator[None]:
    """While the body runs (in this thread or task), messages are spelled for the command
    line (``on``) or for a Python caller; the caller before is put back after."""
    token = _COMMAND_LINE.set(on)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def on_command_line() -> bool:
    """Whether messages are spelled for the command line now."""
    return _COMMAND_LINE.get()


@dataclass(frozen=True)
class Option:
    """One option, as each caller spells it; formatting it (``f"{RESUME}"``, ``str``)
    spells it for the caller now."""

    flag: str  # the command line's: "--resume"
    argument: str  # Python's: "resume=True"

    def __str__(self) -> str:
        return self.flag if on_command_line() else self.argument

    def named_in(self, text: str) -> bool:
        """Whether ``text`` (a message, whoever it was spelled for) names this option."""
        return self.flag in text or self.argument in text


RESUME = Option("--resume", "resume=True")
FORCE = Option("--force", "force=True")
# A run's data folder: the config key data.data_dir, which the command line sets with a flag.
DATA_DIR = Option("--data-dir", "data.data_dir")
# A run's results folder: the config key run.out_dir, set on the command line with --out.
OUT = Option("--out", "run.out_dir")


def set_key(flag: str, key: str, value: Any) -> str:
    """How to set config key ``key`` to ``value``: ``flag``, the command line's words as a
    shell line writes them (``--set 'model.none_args=["w"]'``), or
    ``RunConfig.replace(**{'key': value})``."""
    return flag if on_command_line() else f"RunConfig.replace(**{{{key!r}: {value!r}}})"


def train_again(config: str | None = None, *, option: Option = RESUME) -> str:
    """The call that trains a run with ``option``: ``creditaudit train --config FILE
    --resume`` (``config`` None: ``creditaudit train … --resume``), or
    ``train(load_config('FILE'), resume=True)`` (``train(…, resume=True)``)."""
    if on_command_line():
        return f"creditaudit train {'…' if config is None else f'--config {config}'} {option}"
    given = "…" if config is None else f"load_config({config!r})"
    return f"train({given}, {option})"
