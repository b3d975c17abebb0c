"""The per-run reporting templates of a folder report: the columns no run fills are left
out of every template, and one line says which and why."""

from __future__ import annotations

import re
from collections.abc import Sequence

from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS

_PIPE = re.compile(r"(?<!\\)\|")


def _split_row(line: str) -> list[str]:
    return [cell.strip() for cell in _PIPE.split(line.strip())[1:-1]]


def _table_blocks(lines: Sequence[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of the Markdown tables in ``lines``."""
    blocks, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.startswith("|") and start is None:
            start = i
        elif not line.startswith("|") and start is not None:
            blocks.append((start, i))
            start = None
    return blocks


Column = tuple[tuple[str, ...], str]  # (a table's header, one of its columns)


def unfilled_columns(templates: Sequence[str]) -> list[Column]:
    """The template tables' columns whose every cell, in every template, reads ``—``: what
    none of the runs recorded (in the order they first appear)."""
    filled: dict[Column, bool] = {}
    for text in templates:
        lines = text.splitlines()
        for first, end in _table_blocks(lines):
            header = tuple(_split_row(lines[first]))
            for row in (_split_row(line) for line in lines[first + 2:end]):
                for name, value in zip(header, row):
                    filled[header, name] = filled.get((header, name), False) or value != "—"
    return [column for column, any_filled in filled.items() if not any_filled]


def drop_columns(text: str, columns: Sequence[Column]) -> str:
    """``text`` with the given (table header, column) columns removed from its tables."""
    lines = text.splitlines()
    for first, end in _table_blocks(lines):
        header = tuple(_split_row(lines[first]))
        keep = [i for i, name in enumerate(header) if (header, name) not in columns]
        if len(keep) == len(header):
            continue
        for n in range(first, end):
            cells = _split_row(lines[n])
            lines[n] = ("|" + "---|" * len(keep) if n == first + 1 else
                        "| " + " | ".join(cells[i] for i in keep if i < len(cells)) + " |")
    return "\n".join(lines)


def unfilled_note(columns: Sequence[Column], runs: Sequence[RunRecord]) -> str:
    """One line: which template columns are left out, and why."""
    names = list(dict.fromkeys(name for _, name in columns))
    ids = {cls.id_label() for cls in DIAGNOSTICS.classes()}
    diagnostics = [name for name in names if name in ids]
    text = f"Left out of every template below, as no run fills them: {', '.join(names)}."
    if len(diagnostics) < len(names) and not any(r.config.diagnostics.end_of_run for r in runs):
        text += (" The runs were trained without end-of-run metrics (`diagnostics.end_of_run "
                 "= false`, as `creditaudit demo` trains them); `creditaudit audit RUN_DIR` "
                 "computes them for one run.")
    if diagnostics:
        text += (f" {''.join(diagnostics)} not evaluated in any run: each run's diagnostics "
                 "table says why.")
    return text




__all__ = ["unfilled_columns", "drop_columns", "unfilled_note", "Column"]
