"""The field tables of docs/records.md, generated from the typed record classes.

``python scripts/gen_records_doc.py`` rewrites the part of docs/records.md below the
``<!-- generated -->`` marker; a test checks the file is up to date.
"""

from __future__ import annotations

import dataclasses
import types
import typing

from creditaudit.descriptions import DataIdentity, ModelDescription
from creditaudit.descriptions.fields import DOMAIN_TOLERANCE, domain_text
from creditaudit.records.parts import EpochEntry
from creditaudit.records.reading import SCHEMA
from creditaudit.records.run_parts import (
    EndOfRun,
    FinalResults,
    ProtocolState,
    ReferenceState,
    ResumedPart,
)
from creditaudit.records.schema import RunRecord

MARKER = "<!-- generated -->"
SECTIONS: tuple[tuple[str, type, str], ...] = (
    ("Top level", RunRecord, "The keys of `record.json`."),
    ("Per-epoch entries (`log`)", EpochEntry,
     "One object per evaluated epoch. The diagnostics keys, `hidden_norms` to "
     "`feedback_norm_ratio`, are the epoch's measures (in Python `entry.measures`, an "
     "`EpochMeasures`): an epoch the diagnostics did not measure (`diagnostics.every`) has "
     "none of them, and one they measured has at least those whose type below is not "
     "`or null` (records from before `cos_valid`, `cos_invalid` and `cos_defined` lack "
     "those; rules "
     "without feedback matrices, the `feedback_` keys). Rule-specific values (`extras`) "
     "are written as keys "
     "of the entry itself, beside the others. Each number is stored once; values derived from "
     "the stored ones are read with `entry.value(key)` or `record.series(key)`: `test_acc` "
     "(= `acc_eval`), `h_L_norm` and `g_L_norm` (the deepest state's norms), `g_2_norm`, "
     "`max_block_growth` (the statistic of diagnostic (a)), `deep_cos` (mean cosine over "
     "l ≥ 1) and `deep_cos_valid`. For scripts that read record.json directly, `test_acc`, "
     "`h_L_norm`, `g_2_norm` (and `hidden_norms_cls` for token models) are also written "
     "under those names; reading derives them again. `g_2_norm` is not written where state "
     "2 is the deepest (it is ‖g_L‖), nor `g_L_nonzero_median` where no g_L is zero (it is "
     "then the median ‖g_L‖, and reads back as such; records before schema 4 stored both, "
     "and `creditaudit export` writes both)."),
    ("Final results (`final`)", FinalResults,
     "What `record.final` holds. record.json stores `epochs_completed` and `numbers_from`, "
     "the epoch whose entry holds the numbers below (null: no epoch was finite, there are "
     "none): they are read from that entry, not stored twice. Records before schema 4 "
     "stored every key below."),
    ("End-of-run credit quality (`diagnostics`)", EndOfRun,
     "Computed once after the last epoch on the evaluation subset "
     "(`diagnostics.end_of_run`). Rule-specific metrics (`extras`) are keys of this object."),
    ("Protocol during training (`protocol`)", ProtocolState,
     "What the training-time protocol decided, read back as written (`record.protocol`, "
     "`record.first_fired()`, `record.recorded_statuses()`, each entry's `protocol`); the "
     "run's verdict, as reports show it, is judged from them anew "
     "(`protocol.records.record_verdict`, `RecordSet.verdict`): a record written before (d) "
     "was left out at epoch 0 holds a 0-epoch run's (d) as fired (`first_fired` d = 0), "
     "which the verdict reads as not evaluated (`details.claimed` keeps what it said). "
     "`verdict` and `fired` are stored once, in `report`. The values of `report` that equal "
     "the entry of its epoch (the headline accuracy, (b)'s median over the non-zero "
     "gradients) are left out of the file and listed in `report_copies` (label → "
     "place in its object); reading puts them back from that entry. Records before schema "
     "4 stored them."),
    ("The reference gradient (`reference`)", ReferenceState,
     "Checked when the run started, on the model as built (float64 central differences "
     "of its forward on four evaluation samples, then the model's own backward — its dtype, "
     "a batch of up to 512 samples — against that verified one, and, where inputs are "
     "floating, the backward in training mode with dropout masks held fixed; "
     "docs/protocol.md). A model "
     "whose backward is not the gradient of its forward is refused before the run's folder "
     "is written, unless `diagnostics.allow_unverified_reference` is on; then `how` is "
     "`failed`, the verdict is *unverified* and every cosine, Γ and (b) is shown marked "
     "unverified. A run recorded from a loop of the user's own (`Recorder`), and a "
     "trained run of a network from outside creditaudit (a `model.factory`, a plugin "
     "architecture; resumed and stacked runs too), is checked again at each epoch, as its "
     "loop or forward may switch on a straight-through estimator later: "
     "a backward no longer the gradient stops that epoch, or, allowed, makes `how` "
     "`failed` with `detail` naming the epoch from which. Records written before "
     "creditaudit checked it have no block and read as `not checked`."),
    ("The parts of a resumed run (`resumed`)", ResumedPart,
     "One object per time the run was resumed, in order; absent for a run that never was "
     "(and in records written before the parts were kept). A resumed run goes on with the "
     "torch thread count its epochs ran on, so its numbers equal the uninterrupted run's; "
     "when `source` or `torch` differs between parts, its numbers come from more than one "
     "version of creditaudit or torch, and `creditaudit train`'s summary and "
     "`creditaudit report` say so."),
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


def _keys(cls: type) -> list[tuple[dataclasses.Field[object], object]]:
    """(field, type) of each JSON key of ``cls``'s object, in order: an inline field's own
    fields stand in its place."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[dataclasses.Field[object], object]] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("inline"):
            inner = next(a for a in typing.get_args(hints[f.name]) if a is not type(None))
            out += _keys(inner)
        else:
            out.append((f, hints[f.name]))
    return out


def field_rows(cls: type) -> list[str]:
    """The table of ``cls``'s keys; with a domain column when a field has a domain."""
    keys = _keys(cls)
    domains = [domain_text(f.metadata.get("domain")) for f, _ in keys]
    with_domain = any(domains)
    rows = (["| key | type | domain | meaning |", "|---|---|---|---|"] if with_domain
            else ["| key | type | meaning |", "|---|---|---|"])
    for (f, tp), domain in zip(keys, domains):
        doc = f.metadata.get("doc", "").replace("|", "/")
        cells = [f"`{f.name}`", f"`{_type_text(tp)}`",
                 *([domain] if with_domain else []), doc]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def render_record_docs() -> str:
    """The generated part of docs/records.md (everything after the marker)."""
    out = [MARKER, "", f"Schema `{SCHEMA}`. Non-finite numbers are written as `null` and "
           "listed in a top-level `non_finite` object (JSON pointer → `NaN`, `Infinity` or "
           "`-Infinity`), so strict parsers read every record and nothing is lost. The "
           "key `content_sha256` is the digest of everything else "
           "(`creditaudit.records.content_digest`, blind to key order and indentation): a "
           "record changed after it was written is refused when read (records written "
           "by earlier versions of creditaudit have none).", "",
           "A record with a number outside its field's *domain* (each number of a list or "
           "object field, or of the keys named) is refused when read. NaN (undefined) is "
           "allowed in every domain, +inf only in `≥ 0`; the bounds have a rounding slack "
           f"of {DOMAIN_TOLERANCE:.0e}.".replace("e-0", "e-")]
    for title, cls, intro in SECTIONS:
        out += ["", f"### {title}", ""]
        if intro:
            out += [intro, ""]
        out += field_rows(cls)
    return "\n".join(out) + "\n"
