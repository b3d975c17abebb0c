"""The files an export writes (:mod:`creditaudit.study.export`): what each holds (the
snapshot files' per-epoch entries as recorded, the results files' per-epoch lists and
end-of-run blocks) and the manifest entry written beside each — the run behind every key,
the copies left out, the runs that diverged or stopped early, unverified references and
missing keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.errors import OutputError
from creditaudit.files.safe_files import atomic_write_bytes, describe_os_error
from creditaudit.formatting import counted, plain_line
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord, record_path
from creditaudit.report.runs import status_text
from creditaudit.results import stopped_early_text
from creditaudit.study.export_runs import Family, Slot, end_of_run_parts, why_left_out

LOG_LIST_KEYS = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")


@dataclass
class ExportResult:
    """What an export wrote and skipped (paths relative to OUT); ``removed``: the files of
    an earlier export into OUT it removed (printed, not in the manifest, which depends on
    the records only)."""

    out: Path
    written: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    records_read: int = 0  # the finished records that may fill a file (the manifest's)
    records_found: int = 0  # every finished record read below the folder (printed)
    unreadable: list[str] = field(default_factory=list)
    unverified: list[dict[str, str]] = field(default_factory=list)
    not_exported: list[dict[str, str]] = field(default_factory=list)
    # runs that did not finish (running, interrupted, failed): no file reads them; ``status``
    # as their record says, ``printed`` as the output says it (a running one: whether a
    # process still holds it, which the manifest, of the records only, leaves out)
    unfinished: list[dict[str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"layout": "faeval", "out": str(self.out), "records_read": self.records_read,
                "unreadable": self.unreadable, "written": self.written,
                "skipped": self.skipped, "unverified": self.unverified,
                "not_exported": self.not_exported,
                "unfinished": [{key: entry[key] for key in ("run_id", "status", "epochs")}
                               for entry in self.unfinished]}

    def run_ids(self) -> set[str]:
        """The run ids the written files name: those that fill a key and the copies left
        out beside them."""
        return {*(run_id for entry in self.written for run_id in entry["runs"].values()),
                *(copy["run_id"] for entry in self.written
                  for copies in entry.get("left_out", {}).values() for copy in copies)}

    def format(self) -> str:
        used = ("" if self.records_found == self.records_read
                else f" ({self.records_read} of them of the layout's kind)")
        lines = [f"read {counted(self.records_found, 'finished run record')}{used}; wrote "
                 f"{counted(len(self.written), 'file')} under {self.out}"]
        for entry in self.written:
            extra = (f" (partial: missing {', '.join(entry['missing'])})"
                     if entry.get("missing") else "")
            if entry.get("reference"):
                extra += (f" (reference not verified: {', '.join(entry['reference'])}; "
                          "cosines marked in the manifest)")
            lines.append(f"  wrote   {entry['path']}{extra}")
            for key, note in (*entry.get("diverged", {}).items(),
                              *entry.get("stopped_early", {}).items(),
                              *entry.get("unmeasured", {}).items()):
                lines.append(f"    {key}: {note}")
            for key, copies in entry.get("left_out", {}).items():
                for copy in copies:
                    lines.append(f"    {key}: left out {copy['run_id']}: {copy['why']}")
        for entry in self.unverified:
            lines.append(f"  left out {entry['run_id']}: {entry['reason']}")
        for entry in self.not_exported:
            lines.append(f"  not exported {entry['run_id']}: {entry['reason']}")
        for entry in self.unfinished:
            lines.append(f"  not finished {entry['run_id']}: {entry['printed']} "
                         f"({entry['epochs']} epochs done): only a completed or diverged run "
                         "fills a file; export again once it has finished")
        for entry in self.skipped:
            lines.append(f"  skipped {entry['path']}: needs {entry['needs']}")
        for path in self.removed:
            lines.append(f"  removed {path}: the previous export into {self.out} wrote it, "
                         "this one has no run for it")
        if self.unreadable:  # each already named, with why, in its reader's one warning
            lines.append(f"  left out {counted(len(self.unreadable), 'unreadable record')} "
                         "(named in the warnings above; listed in the manifest)")
        return "\n".join(map(plain_line, lines))  # run ids and reasons: a guest's words


def unfinished_entry(record: RunRecord, path: Path) -> dict[str, Any]:
    """What the export says of an unfinished run read at ``path`` (its folder or
    record.json): its id, its status as recorded and as its claim tells it (a ``running``
    one's process alive or gone), and its epochs done of its recipe's (``"3 of 10"``)."""
    done = record.log[-1].epoch if record.log else 0
    return {"run_id": record.run_id, "status": record.status,
            "printed": status_text(record, record_path(path).parent),
            "epochs": f"{done} of {record.epochs}"}


def write_json(path: Path, obj: Any) -> None:
    """The original study's files are plain ``json.dump`` output: NaN stays a bare ``NaN``
    token, which its figure scripts (Python's ``json.load``) read back as a float."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode())


def previous_export(manifest: Path) -> list[str]:
    """The files (relative to OUT) the manifest of an earlier export into OUT lists as
    written; none when there is no readable manifest."""
    try:
        written = json.loads(manifest.read_text()).get("written", [])
        return [e["path"] for e in written if isinstance(e.get("path"), str)]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def remove_stale(out: Path, previous: Iterable[str], result: ExportResult) -> None:
    """Remove the files an earlier export into ``out`` wrote (``previous``) that this one
    did not, so that OUT never mixes two exports' files under one manifest, and the folders
    they leave empty; only files below ``out/results``. Adds each to ``result.removed``."""
    written = {e["path"] for e in result.written}
    root = (out / "results").resolve()
    for rel in sorted(set(previous) - written):
        path = out / rel
        if (root not in path.resolve().parents or path.is_symlink()
                or not path.is_file()):
            continue
        try:
            path.unlink()
            for folder in path.parents:
                if folder.resolve() == root or any(folder.iterdir()):
                    break
                folder.rmdir()
        except OSError as err:
            raise OutputError(f"cannot remove the previous export's {describe_os_error(err)}"
                              ) from None
        result.removed.append(rel)


# --- file contents ------------------------------------------------------------------------
def snapshot_log(record: RunRecord) -> list[dict[str, Any]]:
    """The per-epoch entries as recorded (the record's own keys)."""
    return record.log_dicts()


def results_log(record: RunRecord) -> dict[str, list[Any]]:
    """Per-epoch lists over the trained epochs (1 … E), the original ``log`` dict."""
    entries = [e for e in record.log if e.epoch >= 1]
    out = {key: [e.value(key) for e in entries] for key in LOG_LIST_KEYS}
    if any(e.value("state_pred_error") is not None for e in entries):
        out["state_pred_error"] = [e.value("state_pred_error") for e in entries]
    return out


def results_entry(record: RunRecord) -> dict[str, Any]:
    diagnostics = record.diagnostics.to_dict()
    drift = diagnostics.pop("drift", {})
    return {"log": results_log(record), "diagnostics": diagnostics, "drift": drift}


# --- writing files and their manifest entries ------------------------------------------
class FileWriter:
    """Writes the export's files into ``out`` and records each in ``result``'s manifest
    entries, with what ``index`` says of each run's reference gradient."""


    def __init__(self, out: Path, result: ExportResult, index: RecordSet) -> None:
        self.out, self.result, self.index = out, result, index

    def file(self, rel: str, slots: Sequence[Slot], family: Family,
             build: Callable[[dict[str, RunRecord]], Any], needs: Callable[[Slot], str],
             gaps: Callable[[RunRecord], list[str]] = lambda record: [],
             entries: bool = True) -> None:
        """Write ``rel`` from the runs of ``family`` that fill ``slots`` (``build``), and its
        manifest entry: the run behind each key, the copies left out, the runs that diverged
        or stopped early, as missing the keys without a run and the parts of a key its run
        leaves empty (``gaps``: ``diagnostics``, ``drift``), and, for a file of the runs'
        epoch ``entries``, the runs with epochs the diagnostics did not measure."""
        found = {s.key: family.runs[s.run_key] for s in slots if s.run_key in family.runs}
        missing = [s for s in slots if s.key not in found]
        if not found:
            self.result.skipped.append({"path": rel, "needs": "; ".join(needs(s)
                                                                       for s in missing)})
            return
        write_json(self.out / rel, build(found))
        entry: dict[str, Any] = {"path": rel,
                                 "runs": {key: r.run_id for key, r in found.items()}}
        left_out = {s.key: [{"run_id": r.run_id, "why": why_left_out(r, found[s.key])}
                            for r in family.left_out[s.run_key]]
                    for s in slots if s.key in found and s.run_key in family.left_out}
        if left_out:
            entry["left_out"] = left_out
        diverged = {key: diverged_note(r) for key, r in found.items() if r.status == "diverged"}
        if diverged:
            entry["diverged"] = diverged
        stopped = {key: f"{r.run_id} {stopped_early_text(r)}" for key, r in found.items()
                   if r.stopped_early}
        if stopped:
            entry["stopped_early"] = stopped
        unmeasured = {key: note for key, r in found.items()
                      if entries and (note := unmeasured_note(r)) is not None}
        if unmeasured:
            entry["unmeasured"] = unmeasured
        notes = {key: judged.reference_note for key, r in found.items()
                 if (judged := self.index.verdict(r).judgement).reference_verified is False}
        if notes:
            entry["reference"] = notes
        empty = [s for s in slots if s.key in found and gaps(found[s.key])]
        if missing or empty:
            entry["missing"] = [s.key for s in missing] + [
                f"{s.key}.{part}" for s in empty for part in gaps(found[s.key])]
            entry["needs"] = "; ".join([*(needs(s) for s in missing), *(
                f"{s.method} seed {s.seed} with its end-of-run block ({found[s.key].run_id} "
                f"{_why_no_block(found[s.key])})" for s in empty)])
        self.result.written.append(entry)


def diverged_note(record: RunRecord) -> str:
    """``dfa-…: diverged in epoch 2; its last finite epoch is 1`` (the original layout has no
    status: its scripts read the log as a whole run's). A record written before creditaudit
    kept a diverged run's last finite epoch holds the numbers of the one that overflowed:
    the note says so rather than call that epoch finite."""
    at = (record.divergence or {}).get("epoch")
    epoch = record.numbers_epoch
    return (f"{record.run_id} diverged" + (f" in epoch {at}" if at is not None else "")
            + ("; no epoch's evaluation was finite" if epoch is None
               else f"; its last finite epoch is {epoch}" if record.numbers_finite
               else f"; its numbers are of epoch {epoch}, whose evaluation was not finite "
               "(a record written before creditaudit kept a diverged run's last finite "
               "epoch)"))


def unmeasured_note(record: RunRecord) -> str | None:
    """``dfa-…: no diagnostics at epochs 1, 2 (diagnostics.every=3): …`` when some logged
    epoch has no measures (the original scripts read ``hidden_norms`` and the other
    measures at every epoch, and fail on such an entry); None when every epoch has them."""
    bare = [e.epoch for e in record.log if not e.has_diagnostics]
    if not bare:
        return None
    every = record.config.diagnostics.every
    return (f"{record.run_id} has no diagnostics at epoch{'s' if len(bare) > 1 else ''} "
            f"{', '.join(map(str, bare))} (diagnostics.every={every}): those entries hold no "
            "hidden_norms, bp_grad_norms_per_sample_med, cos_per_layer, …")


def results_gaps(record: RunRecord) -> list[str]:
    """The parts of a results-file entry ``record`` leaves without numbers: no end-of-run
    block, or one without its metrics (a diverged model's says why)."""
    return [part for part, held in zip(("diagnostics", "drift"), end_of_run_parts(record))
            if not held]


def _why_no_block(record: RunRecord) -> str:
    """Why ``record`` has no end-of-run metrics, and what to do."""
    error = record.diagnostics.credit_quality_error
    if error:
        return f"measured none: {error}"
    return "was trained with diagnostics.end_of_run=false: train it again without it"


def logs_of(found: dict[str, RunRecord]) -> dict[str, Any]:
    """The snapshot files' ``*_log`` of each run found, by key."""
    return {key: snapshot_log(record) for key, record in found.items()}


__all__ = ["ExportResult", "FileWriter", "LOG_LIST_KEYS", "write_json", "previous_export",
           "remove_stale", "snapshot_log", "results_log", "results_entry", "results_gaps",
           "diverged_note", "unmeasured_note", "logs_of"]
