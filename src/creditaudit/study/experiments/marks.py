"""The marks of the headline numbers in the experiments' tables, and their footnotes.

An experiment's tables are rendered from its summary (JSON, read back and rendered again at
any time), not from its records, so the marks of each number are read from the records when
the summary is made — by :func:`creditaudit.report.runs.headline_cell`, the one function that
marks a headline number in every table — and kept beside the numbers: a row's ``marks`` (kind
of number, :data:`KINDS` → the marks a number of that kind averaged over the row's runs
carries: ``"‡ (unverified)"``; kinds without marks left out) and the summary's ``footnotes``
(mark → what it means). :class:`TableMarks` puts them after the numbers a table shows and
gives the footnotes of the marks that appear.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from creditaudit.protocol import UNVERIFIED_MARK, Judgement
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord
from creditaudit.report.runs import (
    ACC,
    DEEP_COS,
    DIVERGED_MARK,
    G_NORM,
    GAMMA,
    H_NORM,
    deep_cos_footnotes,
    diverged_footnote,
    headline_cell,
    unverified_footnote,
)

# The kinds of headline number (by the marks each can carry): accuracy and what is computed
# from it ((d)'s margin, test error), norms of hidden states (‖h_L‖, block growth), norms of
# the reference gradient (‖g_L‖, ‖g_2‖), the deep cosine, Γ.
KINDS = (ACC, H_NORM, G_NORM, DEEP_COS, GAMMA)
# The marks in the order headline_cell writes them, which the footnotes follow.
ORDER = ("§", "*", "†", DIVERGED_MARK, UNVERIFIED_MARK)
# Any number: headline_cell marks every number of one kind of the same runs alike.
_NUMBER = "0"


def row_marks(records: Sequence[RunRecord], judgements: Sequence[Judgement]
              ) -> dict[str, str]:
    """Kind (:data:`KINDS`) → the marks :func:`headline_cell` gives a number of that kind
    of ``records`` (a row's runs; a mark of one marks the row) with their ``judgements``;
    kinds without a mark are left out (a clean row: ``{}``)."""
    marks = {}
    for what in KINDS:
        cell = headline_cell(_NUMBER, what, records, judgements)
        if cell != _NUMBER:
            marks[what] = cell[len(_NUMBER):]
    return marks


def judgements_of(records: Sequence[RunRecord], index: RecordSet | None = None
                  ) -> list[Judgement]:
    """Each record's judgement, (d) against its recipe's frozen runs in ``index`` (default:
    ``records`` themselves) — the judgement every reader of the records gives."""
    index = RecordSet(records) if index is None else index
    return [index.verdict(r).judgement for r in records]


def marks_of(records: Sequence[RunRecord], index: RecordSet | None = None) -> dict[str, str]:
    """:func:`row_marks` of ``records`` judged in ``index`` (default: among themselves)."""
    return row_marks(records, judgements_of(records, index))


def footnotes(records: Sequence[RunRecord], judgements: Sequence[Judgement]
              ) -> dict[str, str]:
    """Mark → its footnote, for every mark ``records`` (with their ``judgements``) give a
    number; a table shows those of the marks it shows (:meth:`TableMarks.footnotes`)."""
    notes = dict(deep_cos_footnotes(records))
    diverged = diverged_footnote(records)
    if diverged is not None:
        notes[DIVERGED_MARK] = diverged
    unverified = unverified_footnote([f"{r.method}: {j.reference_note}"
                                      for r, j in zip(records, judgements)
                                      if j.reference_verified is False])
    if unverified is not None:
        notes[UNVERIFIED_MARK] = unverified
    return {mark: notes[mark] for mark in ORDER if mark in notes}


class TableMarks:
    """The marks of one experiment's tables, from its summary: ``marks(text, row, kind)``
    is ``text`` with the marks ``row["marks"]`` holds for ``kind`` (a missing value, ``—``,
    is no number: as it is); :meth:`footnotes`, the footnotes of the marks shown."""

    def __init__(self, summary: Mapping[str, Any]) -> None:
        self._notes: Mapping[str, str] = summary.get("footnotes") or {}
        self._shown: set[str] = set()

    def __call__(self, text: str, row: Mapping[str, Any] | None, what: str) -> str:
        if row is None or text.strip() in ("", "—"):
            return text
        marks = (row.get("marks") or {}).get(what, "")
        self._shown.update(mark for mark in ORDER if mark in marks)
        return text + marks

    def footnotes(self) -> list[str]:
        """The footnote of each mark shown so far, in :data:`ORDER`."""
        return [self._notes[mark] for mark in ORDER
                if mark in self._shown and mark in self._notes]

    def notes_text(self) -> str:
        """The footnotes as Markdown paragraphs, each after a blank line ("" when none)."""
        return "".join(f"\n\n{note}." for note in self.footnotes())


__all__ = ["KINDS", "row_marks", "marks_of", "judgements_of", "footnotes", "TableMarks"]
