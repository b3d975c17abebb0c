"""The field tables of docs/records.md, generated from the typed record classes.

``python scripts/gen_records_doc.py`` rewrites the part of docs/records.md below the
``<!-- generated -->`` marker; a test checks the file is up to date.
"""

from __future__ import annotations

import dataclasses
import types
import typing

from creditaudit.descriptions import DataIdentity, ModelDescription
from creditaudit.records.parts import EndOfRun, EpochEntry, FinalResults, ProtocolState
from creditaudit.records.schema import SCHEMA, RunRecord

MARKER = "<!-- generated -->"
SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("Top level", RunRecord, "The keys of `record.json`."),
    ("Per-epoch entries (`log`)", EpochEntry,
     "One object per evaluated epoch. Rule-specific values (`extras`) are written as keys of "
     "the entry itself, beside the others."),
    ("Final results (`final`)", FinalResults, ""),
    ("End-of-run credit quality (`diagnostics`)", EndOfRun,
     "Computed once after the last epoch on the evaluation subset "
     "(`diagnostics.end_of_run`). Rule-specific metrics (`extras`) are keys of this object."),
    ("Protocol during training (`protocol`)", ProtocolState, ""),
    ("Data identity (`data`)", DataIdentity, ""),
    ("The model as built (`model`)", ModelDescription,
     "Asked of the model itself when the run started; records before schema 3 lack it "
     "(reports then build the model from the record's config on PyTorch's meta device and "
     "ask it)."),
)


def _type_text(tp: object) -> str:
    """``float | None`` → ``float or null``; classes by their name."""
    args = typing.get_args(tp)
    if type(tp) is type:
        return "null" if tp is type(None) else tp.__name__
    if args and typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a) for a in args)
    if args:
        inner = ", ".join(_type_text(a) for a in args)
        return f"{typing.get_origin(tp).__name__}[{inner}]"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def field_rows(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    rows = ["| key | type | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        doc = f.metadata.get("doc", "")
        rows.append(f"| `{f.name}` | `{_type_text(hints[f.name])}` | {doc.replace('|', '/')} |")
    return rows


def render_record_docs() -> str:
    """The generated part of docs/records.md (everything after the marker)."""
    out = [MARKER, "", f"Schema `{SCHEMA}`. Non-finite numbers are written as `null` and "
           "listed in a top-level `non_finite` object (JSON pointer → `NaN`, `Infinity` or "
           "`-Infinity`), so strict parsers read every record and nothing is lost."]
    for title, cls, intro in SECTIONS:
        out += ["", f"### {title}", ""]
        if intro:
            out += [intro, ""]
        out += field_rows(cls)
    return "\n".join(out) + "\n"
