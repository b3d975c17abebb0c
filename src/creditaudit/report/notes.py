"""The notes under a report's tables: what each mark shown means (unverified references,
deep-cosine marks, (d) re-evaluated against frozen runs), runs resumed on another version,
the diagnostics' thresholds, and a diverged run's epochs (:mod:`creditaudit.report.folder`
writes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.formatting import counted, markdown_text, one_line
from creditaudit.protocol import NOT_EVALUATED, UNVERIFIED_MARK, DepthUtility
from creditaudit.protocol.records import is_frozen_baseline
from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS, REGISTRIES
from creditaudit.report.protocol import VERDICT_COLUMN
from creditaudit.report.runs import DIVERGED_MARK, code_versions_text, deep_cos_footnotes
from creditaudit.report.tables import RECOMPUTED_MARK
from creditaudit.results import RunIndex


def epochs_note(run: RunRecord) -> str:
    """For a diverged run whose protocol was last evaluated after its last finite epoch:
    one line saying that its template's numbers (the protocol's evaluation) are of another
    epoch than its rows in the tables above (marked ‡); else ""."""
    numbers, protocol = run.numbers_epoch, run.protocol.epoch
    if run.status != "diverged" or protocol is None or numbers == protocol:
        return ""
    rows = ("of no epoch (none was evaluated finite)" if numbers is None
            else f"of epoch {numbers}, its last whose evaluation was finite "
                 f"({DIVERGED_MARK})")
    return (f"This run diverged: the template below is its protocol's last evaluation, at "
            f"epoch {protocol}; its numbers in the tables above are {rows}.\n\n")


def thresholds_text(ids: Sequence[str]) -> str:
    """``(a) max stream growth > 50×, …``: when each diagnostic fires at its default
    threshold (a diagnostic not installed here: as its records say), each as Markdown that
    reads as the diagnostic's own words (a plugin's label is a guest's text)."""
    parts = []
    for id_ in ids:
        diagnostic = DIAGNOSTICS.find(id_)
        if diagnostic is None:
            parts.append(f"({markdown_text(id_)}) as its records say")
            continue
        limit = diagnostic().limit()
        parts.append(markdown_text(f"{diagnostic.id_label()} "
                                   f"{diagnostic.short or diagnostic.label} "
                                   f"{diagnostic.threshold_text(limit)}"))
    return ", ".join(parts)


def reference_notes(index: RunIndex, runs: Sequence[Any]) -> list[str]:
    """What ``(unverified)`` means, and why, for each run whose reference gradient is not
    verified."""
    why = {run.run_id: judged.reference_note for run in runs
           if (judged := index.records.verdict(run).judgement).reference_verified is False}
    if not why:
        return []
    return [f"{UNVERIFIED_MARK}: the number was measured against a reference gradient that "
            "is not verified, so a cosine, Γ, (b) or (c) there need not measure anything "
            f"(the verdict says why): {counted(len(why), 'run')}.", ""]


def deep_cos_notes(runs: Sequence[Any]) -> list[str]:
    """What the deep-cosine marks of the tables (§ * †) mean, for the marks shown."""
    return [line for note in deep_cos_footnotes(runs).values() for line in (note + ".", "")]


def code_notes(runs: Sequence[Any]) -> list[str]:
    """One line per run resumed on another version of creditaudit or torch than its first
    part."""
    notes = [f"- {markdown_text(run.run_id)} {markdown_text(text)}" for run in runs
             if (text := code_versions_text(run)) is not None]
    if not notes:
        return []
    return ["Runs resumed on another version of creditaudit or torch (the commit or the "
            "torch install changed between an interruption and the resume):", "", *notes, ""]


# A declared failure's reason is a guest's text: one line, this long at most.
REASON_CHARS = 200


def declared_failure_notes(runs: Sequence[Any]) -> list[str]:
    """One line per conformance check a run's plugin fails by design and declares
    (``environment.components.<axis>.declared_failures``: check → reason): its numbers do
    not claim what that check checks, which no table shows."""
    notes = []
    for run in runs:
        components = (run.environment or {}).get("components")
        # a record's environment is free-form: components that are no mapping declare none
        for axis, entries in (components.items() if isinstance(components, dict) else ()):
            for entry in entries if isinstance(entries, list) else [entries]:
                declared = entry.get("declared_failures") if isinstance(entry, dict) else None
                if not isinstance(declared, dict):
                    continue
                noun = next((r.noun for r in REGISTRIES if r.key.split(".")[0] == axis), axis)
                who = f"{noun} plugin '{entry.get('name', '?')}' ({entry.get('origin', '?')})"
                for check, reason in declared.items():
                    reason = one_line(reason)
                    if len(reason) > REASON_CHARS:
                        reason = reason[:REASON_CHARS - 1] + "…"
                    notes.append(f"- {markdown_text(run.run_id)}: {markdown_text(who)} fails "
                                 f"{markdown_text(check)} by design: {markdown_text(reason)}")
    if not notes:
        return []
    return ["Conformance checks a run's plugin fails and declares it fails by design (its "
            "numbers do not claim what the check checks):", "", *notes, ""]


def frozen_notes(index: RunIndex, rows: Sequence[dict[str, str]]) -> list[str]:
    notes = []
    d = DepthUtility.id_label()
    recomputed = [r for r in rows if r[VERDICT_COLUMN].endswith(RECOMPUTED_MARK)]
    if recomputed:
        notes.append(f"{RECOMPUTED_MARK} {d} re-evaluated against the mean final accuracy of "
                     "the frozen-blocks runs of the same recipe (same data, network and its "
                     "code, optimiser and precision; the default, `--no-frozen-from-runs` "
                     f"turns it off), not the record's own {d}; the verdict follows. "
                     f"{counted(len(recomputed), 'run')}.")
    elif not index.frozen_from_runs:
        could = [run for run in index.runs if not is_frozen_baseline(run)
                 and index.frozen_baseline(run) is not None
                 and (report := index.protocol_report(run)) is not None
                 and any(r.id == DepthUtility.name and r.status == NOT_EVALUATED
                         for r in report.diagnostics)]
        if could:
            notes.append(f"{d} is not evaluated in {counted(len(could), 'run')} although "
                         "frozen-blocks runs of their recipe exist: run `creditaudit "
                         f"report` without `--no-frozen-from-runs` (by default it evaluates "
                         f"{d} against them).")
    return [*notes, ""] if notes else []


__all__ = ["epochs_note", "thresholds_text", "reference_notes", "deep_cos_notes",
           "code_notes", "frozen_notes", "declared_failure_notes"]
