"""An experiment's options as its caller spells them in a message: the command line's flags
(``--rules dfa,kp``, ``--no-train``) or the arguments of ``run_experiment``
(``Choices(rules=('dfa', 'kp'))``, ``train=False``), decided when the message is formatted
(:mod:`creditaudit.caller`)."""

from __future__ import annotations

from collections.abc import Sequence

from creditaudit.caller import Option, on_command_line

# The Choices field of each option the command line names: --arch is Choices(archs=…).
CHOICES_FIELD = {"rules": "rules", "arch": "archs"}

# How to summarise the runs again without training any.
SUMMARISE_AGAIN = Option("run the same command with --no-train",
                         "call it again with train=False")
# Summarising only, training nothing.
NO_TRAIN = Option("--no-train", "train=False")
LIST = Option("creditaudit experiment --list",
              "get_experiment(name).takes and .refuses")


def chosen(option: str, names: Sequence[str] | None = None) -> str:
    """Choosing ``names`` for ``option`` (``rules``, ``arch``), as the caller spells it:
    ``--rules dfa,kp`` or ``Choices(rules=('dfa', 'kp'))``; without ``names`` the option
    alone (``--rules``, ``Choices(rules=…)``)."""
    if on_command_line():
        return f"--{option}" if names is None else f"--{option} {','.join(names)}"
    given = "…" if names is None else repr(tuple(names))
    return f"Choices({CHOICES_FIELD.get(option, option)}={given})"


def argument(name: str) -> str:
    """A plain option of the command (``dataset``, ``data_dir``), as the caller spells it:
    ``--data-dir``, or the argument's name ``data_dir``."""
    return f"--{name.replace('_', '-')}" if on_command_line() else name


__all__ = ["CHOICES_FIELD", "LIST", "NO_TRAIN", "SUMMARISE_AGAIN", "argument", "chosen"]
