"""Each number of a record stored once (schema 4 on): how ``final`` and the protocol state
are written without the copies of epoch-entry values they hold in memory, and how reading
puts those back.

In memory a finished run's :class:`~creditaudit.records.run_parts.FinalResults` and its
:class:`~creditaudit.records.run_parts.ProtocolState` repeat numbers of an epoch entry (the
headline accuracy, ‖h_L‖, ‖g_L‖, the verdict), so that readers ask them of the record's
properties. In ``record.json`` ``final`` names the epoch its numbers are from
(``numbers_from``), and the stored protocol report leaves out the values that equal the
entry of the epoch it was evaluated at (the headline accuracy, (b)'s median over the
non-zero gradients), listing each under ``report_copies`` with its place in its object (so
the report reads back key for key, in order); the state's ``verdict`` and ``fired`` are the
report's. Records before schema 4 stored the copies and are read as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from creditaudit.errors import RunRecordError
from creditaudit.records.parts import EpochEntry
from creditaudit.records.run_parts import FinalResults, ProtocolState

# Values of the stored protocol report that copy the entry of the protocol's epoch: a label
# (as ``report_copies`` names it) → (its path in the report, the entry field it copies).
# (The report's verdict stays: the entry's is the epoch's, the report's the run's, read by
# scripts that rebuild the report from record.json.)
REPORT_COPIES: dict[str, tuple[tuple[str, ...], str]] = {
    "metadata.headline_acc": (("metadata", "headline_acc"), "acc_eval"),
    "diagnostics.d.details.headline_acc": (("diagnostics", "d", "details", "headline_acc"),
                                           "acc_eval"),
    "diagnostics.b.details.nonzero_median": (("diagnostics", "b", "details",
                                              "nonzero_median"), "g_L_nonzero_median"),
}


def _entry(log: Sequence[EpochEntry], epoch: Any) -> EpochEntry | None:
    return next((e for e in reversed(log) if e.epoch == epoch), None)


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (NaN is never the same: it stays where it was written)."""
    return type(a) is type(b) and a == b


def _parent(report: Any, path: tuple[str, ...]) -> dict[str, Any] | None:
    """The object holding ``path``'s last key (None when the path does not exist)."""
    node = report
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


# --- final ----------------------------------------------------------------------------------
def stored_final(final: FinalResults, log: Sequence[EpochEntry]) -> dict[str, Any]:
    """``final`` as record.json stores it: the last evaluated epoch and the epoch whose entry
    holds the headline numbers (null: none was finite, there are none); the numbers are the
    entry's. Numbers no entry holds (a record built by hand) are stored whole."""
    last = final.epochs_completed
    for numbers_from in (last if final.from_epoch is None else final.from_epoch, None):
        pointer = {"epochs_completed": last, "numbers_from": numbers_from}
        if (numbers_from is None or _entry(log, numbers_from) is not None) and \
                read_final(pointer, log) == final:
            return pointer
    return final.to_dict()


def read_final(raw: dict[str, Any], log: Sequence[EpochEntry], where: str = "run record"
               ) -> FinalResults:
    """``final`` of a schema-4 record: its numbers read from the entry it names."""
    if "numbers_from" not in raw or set(raw) - {"epochs_completed", "numbers_from"}:
        # stored whole (numbers no entry holds), or numbers written beside the pointer: the
        # numbers the file holds are read, and checked, as they are
        return FinalResults(**{k: v for k, v in raw.items() if k != "numbers_from"})
    epochs, numbers_from = raw.get("epochs_completed"), raw["numbers_from"]
    if isinstance(epochs, bool) or not isinstance(epochs, int):
        raise RunRecordError(f"{where}: final.epochs_completed must be an integer")
    if numbers_from is None:
        return FinalResults(epochs_completed=epochs)
    kept = _entry(log, numbers_from)
    if kept is None:
        raise RunRecordError(f"{where}: final.numbers_from {numbers_from!r} names no logged "
                             "epoch; the record was not written by creditaudit as it is")
    return final_from_entry(kept, epochs)


def final_from_entry(kept: EpochEntry, epochs_completed: int) -> FinalResults:
    """The final results of a run whose last evaluated epoch is ``epochs_completed``, read
    from the entry ``kept`` (that epoch's, or an earlier one's when it was not finite)."""
    measures = kept.measures
    return FinalResults(
        epochs_completed=epochs_completed, test_acc=kept.acc_eval, test_loss=kept.test_loss,
        h_L_norm=None if measures is None else measures.h_L_norm,
        g_L_norm=None if measures is None else measures.g_L_norm,
        deep_cos=None if measures is None else measures.deep_cos,
        from_epoch=None if kept.epoch == epochs_completed else kept.epoch)


# --- protocol -------------------------------------------------------------------------------
def stored_protocol(state: ProtocolState, log: Sequence[EpochEntry]) -> dict[str, Any]:
    """The protocol state as record.json stores it: the report without the values that
    equal its epoch's entry (listed in ``report_copies``), and without ``verdict`` and
    ``fired`` where they are the report's."""
    out = state.to_dict()
    entry = _entry(log, state.epoch)
    if not out or state.report is None or entry is None:
        return out
    report = copy.deepcopy(state.report)
    removed: dict[str, int] = {}
    for label, (path, source) in REPORT_COPIES.items():
        parent = _parent(report, path)
        if parent is not None and path[-1] in parent and _same(parent[path[-1]],
                                                               entry.value(source)):
            removed[label] = list(parent).index(path[-1])
            del parent[path[-1]]
    out["report"] = report
    if removed:
        out["report_copies"] = removed
    for key in ("verdict", "fired"):
        if _same(out[key], state.report.get(key)):
            del out[key]
    return out


def read_protocol(raw: dict[str, Any], log: Sequence[EpochEntry], where: str = "run record"
                  ) -> ProtocolState:
    """The protocol state of a schema-4 record, the copies put back where they were."""
    raw = dict(raw)
    copies = raw.pop("report_copies", {})
    report = raw.get("report")
    if copies:
        entry = _entry(log, raw.get("epoch"))
        if not isinstance(copies, dict) or not isinstance(report, dict) or entry is None:
            raise RunRecordError(f"{where}: protocol.report_copies needs an object, a report "
                                 "and a logged protocol epoch")
        report = raw["report"] = copy.deepcopy(report)
        for label, index in reversed(list(copies.items())):
            path, source = REPORT_COPIES.get(label, ((), ""))
            parent = _parent(report, path) if path else None
            if parent is None or isinstance(index, bool) or not isinstance(index, int) \
                    or not 0 <= index <= len(parent):
                raise RunRecordError(f"{where}: protocol.report_copies has an unexpected "
                                     f"entry {label!r}")
            items = list(parent.items())
            items.insert(index, (path[-1], entry.value(source)))
            parent.clear()
            parent.update(items)
    if isinstance(report, dict):
        raw.setdefault("verdict", report.get("verdict"))
        raw.setdefault("fired", list(report.get("fired") or []))
    return ProtocolState(**raw)
