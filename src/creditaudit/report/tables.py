"""The tables of a folder report: the audit table (one row per finished run), the summary
across seeds and the runs that did not finish.

Cells are Markdown; every text read from a run record enters them through
:func:`~creditaudit.formatting.markdown_text`, so it reads as itself. Wherever runs differ
in a setting that no fixed column shows (epochs, data size, learning rate, …), a table gets
a column for it, named by its config key, so no two rows read alike
(:mod:`creditaudit.report.settings`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditaudit.formatting import fmt, markdown_table, markdown_text, one_line
from creditaudit.protocol import (
    FIRED,
    HEADLINE_GAMMA,
    INCOMPLETE,
    KINDS,
    NOT_EVALUATED,
    DiagnosticReport,
    default_names,
    in_order,
)
from creditaudit.protocol.records import baseline_text, is_frozen_baseline, model_description
from creditaudit.records import RunRecord
from creditaudit.report.protocol import VERDICT_COLUMN, value_text
from creditaudit.report.runs import (
    ACC,
    DEEP_COS,
    GAMMA,
    diverged_text,
    headline_cell,
    status_text,
    stopped_early_text,
)
from creditaudit.report.settings import (
    DATA_SOURCE,
    MAX_SETTING_COLUMNS,
    MODEL_CODE,
    SETTINGS_COLUMN,
    SHOWN_SETTINGS,
    differing_settings,
    run_settings,
    setting_cells,
    setting_columns,
    setting_text,
)
from creditaudit.results import (
    RunIndex,
    as_float,
    figure_recipe,
    full_length,
    mean_std,
    method_label,
    seed_text,
    sort_methods,
    terminal_ln,
)

GAMMA_COLUMN = f"Γ ({HEADLINE_GAMMA.replace('_', ' ')})"
# Each table: fixed columns before and after a column per differing setting.
AUDIT_HEAD = ("run", "method", "λ", "arch", "out_ln", "dataset", "seed")
# … then one column per protocol diagnostic the runs hold, then the verdict.
AUDIT_TAIL = ("status", "acc", "deep cos", GAMMA_COLUMN)
SUMMARY_HEAD = ("method", "λ", "arch", "dataset")
# A summary mean over fewer runs than its row's: those that have the number.
PARTIAL_MEAN = "{} of {} runs"
# A summary cell of one run's value: one seed measures no spread, so no "± std" part.
ONE_RUN = "1 run"
SUMMARY_MEANS = ("test acc", "deep cos", "Γ")
SUMMARY_TAIL = ("seeds", "test acc", "deep cos", "Γ", "walked back", "fired")
UNFINISHED_HEAD = ("run", "method", "λ", "arch", "dataset", "seed")
UNFINISHED_TAIL = ("status", "epochs logged", "error")
RECOMPUTED_MARK = "†"
ERROR_CHARS = 300


# --- table rows ---------------------------------------------------------------------------
def diagnostic_cell(report: DiagnosticReport | None, id_: str) -> str:
    """``fired 694``, ``passed +3.10 pp``, ``n/e`` — status and the compared value, in the
    diagnostic's own format and unit (marked when computed from a reference gradient that
    is not verified); ``—`` where the run has no such result."""
    held = {} if report is None else {r.id: r for r in report.diagnostics}
    if id_ not in held:
        return "—"
    result = held[id_]
    if result.status == NOT_EVALUATED:
        return "n/e"
    value = "" if result.value is None else f" {value_text(result, report.judgement)}"
    word = "**fired**" if result.status == FIRED else result.status
    return word + value


def diagnostic_ids(reports: Iterable[DiagnosticReport | None]) -> list[str]:
    """The diagnostics ``reports`` hold, in listing order (the default protocol's when none
    does): one column each."""
    return in_order(r.id for report in reports if report is not None
                    for r in report.diagnostics) or default_names()


NO_PROTOCOL = "— (no protocol block)"


def verdict_cell(report: DiagnosticReport | None, run: RunRecord) -> tuple[str, str | None]:
    """(the verdict column's text, its kind — ``pass``, ``walk-back``, ``incomplete``,
    ``unverified``: :attr:`Judgement.kind`, the colour report.html gives it — or None for
    a frozen baseline's label)."""
    if is_frozen_baseline(run) and run.is_finished:
        return baseline_text(run), None
    if report is None:
        if run.status in ("failed", "interrupted", "running"):
            return f"— (run {run.status})", KINDS[INCOMPLETE]
        return NO_PROTOCOL, KINDS[INCOMPLETE]
    judged = report.judgement
    text = judged.text
    if report.metadata.get("frozen_from_runs"):
        text += f" {RECOMPUTED_MARK}"
    return text, judged.kind


def arch_text(run: RunRecord) -> str:
    """The model as built: ``ResMLP d=256 L=4``, ``StudentNet d=128 L=4 no out_LN`` …"""
    model = model_description(run)
    return model.label if model is not None else run.config.model.arch


def run_cells(run: RunRecord) -> dict[str, str]:
    """The cells that say which run a row is — run id, method, λ, arch, dataset — as
    Markdown that reads as the record's text (:func:`markdown_text`); a summary row shows
    all but the run id."""
    return {"run": markdown_text(run.run_id), "method": markdown_text(method_label(run.method)),
            "λ": fmt(run.penalty, "g"), "arch": markdown_text(arch_text(run)),
            "dataset": markdown_text(run.dataset)}


def acc_note(run: RunRecord) -> str:
    """`` (diverged in epoch 3: test acc of epoch 2, …)`` for a diverged run, `` (stopped
    early at epoch 1: …)`` for one that stopped before its ``optim.epochs``, else ``""``."""
    notes = [text for text in (stopped_early_text(run), diverged_text(run)) if text]
    return "".join(f" ({text})" for text in notes)


def audit_row(index: RunIndex, run: RunRecord, settings: Sequence[str] = (),
              diagnostics: Sequence[str] | None = None) -> dict[str, str]:
    """One audit-table row (cells as Markdown text) for ``run``; ``settings``: the keys of
    :func:`run_settings` that get a column; ``diagnostics``: the ids that get one (default:
    those of the run's report)."""
    report = index.protocol_report(run)
    values = run_settings(run)
    judged = index.records.verdict(run).judgement
    return {
        **run_cells(run), "out_ln": fmt(terminal_ln(run)), "seed": markdown_text(seed_text(run)),
        **setting_cells(values, settings),
        "status": markdown_text(run.status),
        "acc": headline_cell(fmt(run.final_acc, ".3f"), ACC, [run], [judged]) + acc_note(run),
        "deep cos": headline_cell(fmt(run.deep_cos, "+.3f"), DEEP_COS, [run], [judged]),
        GAMMA_COLUMN: headline_cell(fmt(run.headline_gamma, "+.3f"), GAMMA, [run], [judged]),
        **{f"({i})": diagnostic_cell(report, i)
           for i in (diagnostic_ids([report]) if diagnostics is None else diagnostics)},
        VERDICT_COLUMN: markdown_text(verdict_cell(report, run)[0]),
    }


def dict_table(columns: Sequence[str], rows: Sequence[dict[str, str]]) -> list[str]:
    """Markdown table lines of dict ``rows`` (one column per key in ``columns``)."""
    return markdown_table([markdown_text(c) for c in columns],
                          [[row.get(c, "") for c in columns] for row in rows]).splitlines()


@dataclass
class Table:
    """Columns and rows (cells as Markdown text, by column) of one report table."""

    columns: list[str]
    rows: list[dict[str, str]]

    def lines(self) -> list[str]:
        return dict_table(self.columns, self.rows)


def audit_table(index: RunIndex, runs: Sequence[RunRecord]) -> Table:
    """One row per run in ``runs`` (the finished ones, in the report)."""
    settings = differing_settings(runs)
    ids = diagnostic_ids(index.protocol_report(run) for run in runs)
    return Table([*AUDIT_HEAD, *setting_columns(settings), *AUDIT_TAIL,
                  *(f"({i})" for i in ids), VERDICT_COLUMN],
                 [audit_row(index, run, settings, ids) for run in runs])


@dataclass
class SummaryGroup:
    """Runs of one method and λ with the same settings, seeds aside."""

    runs: list[RunRecord] = field(default_factory=list)
    reports: list[DiagnosticReport | None] = field(default_factory=list)


def summary_groups(index: RunIndex, runs: Sequence[RunRecord] | None = None
                   ) -> list[SummaryGroup]:
    """Finished ``runs`` (default: all of the index's) grouped by everything but the seed,
    in report order (dataset, recipe, method, λ)."""
    groups: dict[tuple, SummaryGroup] = {}
    for run in index.runs if runs is None else runs:
        if not run.is_finished:
            continue
        settings = tuple(sorted((k, v) for k, v in run_settings(run).items() if k != "run.seed"))
        key = (run.dataset, figure_recipe(run), run.method, run.penalty, settings)
        group = groups.setdefault(key, SummaryGroup())
        group.runs.append(run)
        group.reports.append(index.protocol_report(run))
    order = {m: i for i, m in enumerate(sort_methods(k[2] for k in groups))}
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], order[k[2]], k[3],
                                                             k[4]))]


def summary_rows(index: RunIndex, runs: Sequence[RunRecord] | None = None,
                 settings: Sequence[str] = ()) -> list[dict[str, str]]:
    """Across seeds: one row per group of :func:`summary_groups` (finished runs only);
    ``settings``: the keys of :func:`run_settings` that get a column. A run that stopped
    early is counted in its row's verdicts and seeds (marked), not in its means
    (:func:`~creditaudit.results.full_length`)."""
    rows = []
    for group in summary_groups(index, runs):
        run = group.runs[0]
        values = run_settings(run)

        def ms(values: Any, spec: str) -> str:
            values = list(values)
            mean, std = mean_std(values)
            if math.isnan(mean):
                return "—"
            # A run without the number (a diverged one with no finite measure, an epoch
            # that took no diagnostics) is not in the mean: say over how many it is.
            measured = sum(not math.isnan(as_float(v)) for v in values)
            part = ("" if measured == len(values)
                    else f" ({PARTIAL_MEAN.format(measured, len(values))})")
            if measured == 1:  # one run: no spread was measured (not ± 0.000)
                return f"{mean:{spec}}{part or f' ({ONE_RUN})'}"
            return f"{mean:{spec}} ± {std:.3f}{part}"

        audited = [r for r in group.reports if r is not None]
        walked = sum(r.judgement.walked_back for r in audited)
        # End-of-run numbers of a run that stopped early are of an earlier epoch: its
        # verdict counts, its numbers stay out of the means (a line under the table).
        ended = full_length(group.runs)
        # A mark of one run (unverified, diverged, …) marks the group's mean.
        judged = [index.records.verdict(r).judgement for r in ended]
        fired: dict[str, int] = {}
        for report in audited:
            for id_ in report.fired:
                fired[id_] = fired.get(id_, 0) + 1
        rows.append({
            **run_cells(run), **setting_cells(values, settings),
            "seeds": markdown_text(", ".join(
                seed_text(r) + (" (stopped early)" if r.stopped_early else "")
                for r in group.runs)),
            "test acc": headline_cell(ms((r.final_acc for r in ended), ".3f"), ACC,
                                      ended, judged),
            "deep cos": headline_cell(ms((r.deep_cos for r in ended), "+.3f"), DEEP_COS,
                                      ended, judged),
            "Γ": headline_cell(ms((r.headline_gamma for r in ended), "+.3f"), GAMMA,
                               ended, judged),
            "walked back": f"{walked}/{len(audited)}" if audited else "—",
            "fired": markdown_text(" ".join(f"({i})×{fired[i]}" for i in in_order(fired))
                                   or "—"),
        })
    return rows


def partial_means_note(table: Table) -> str | None:
    """What ``(k of n runs)`` after a mean of ``table`` (:func:`summary_table`) means, where
    one is; else None."""
    partial = re.compile(re.escape(PARTIAL_MEAN).replace(r"\{\}", r"\d+"))
    if not any(partial.search(row.get(column, "")) for row in table.rows
               for column in SUMMARY_MEANS):
        return None
    return (f"({PARTIAL_MEAN.format('k', 'n')}): only k of the n runs the row's means are "
            "over (runs that stopped early aside) have that number (a diverged run with no "
            "finite one, an epoch that took no diagnostics: — in the audit table); the mean "
            "and std are over those k.")


def summary_table(index: RunIndex, runs: Sequence[RunRecord]) -> Table:
    settings = differing_settings([g.runs[0] for g in summary_groups(index, runs)])
    return Table([*SUMMARY_HEAD, *setting_columns(settings), *SUMMARY_TAIL],
                 summary_rows(index, runs, settings))


def unfinished_table(runs: Sequence[RunRecord], index: RunIndex | None = None) -> Table:
    """Failed, interrupted and running runs: what they are, how far they got, the error; a
    running one's status says whether a process holds it (:func:`status_text`, from the
    folder ``index`` read it from)."""
    settings = differing_settings(runs)
    rows = []
    for run in runs:
        values = run_settings(run)
        error = one_line(run.error or "—")
        if len(error) > ERROR_CHARS:
            error = error[:ERROR_CHARS - 1] + "…"
        rows.append({
            **run_cells(run), "seed": markdown_text(seed_text(run)),
            **setting_cells(values, settings),
            "status": markdown_text(status_text(run, index and index.folder(run))),
            "epochs logged": str(run.log[-1].epoch if run.log else 0),
            "error": markdown_text(error),
        })
    return Table([*UNFINISHED_HEAD, *setting_columns(settings), *UNFINISHED_TAIL], rows)


# The settings' names live in report.settings; re-exported here, where callers import them from
__all__ = ["Table", "audit_row", "audit_table", "summary_rows", "summary_table",
           "summary_groups", "unfinished_table", "run_settings", "differing_settings",
           "diagnostic_cell", "diagnostic_ids", "verdict_cell", "arch_text", "setting_text",
           "NO_PROTOCOL", "RECOMPUTED_MARK", "PARTIAL_MEAN", "partial_means_note",
           "GAMMA_COLUMN", "setting_columns", "setting_cells", "MAX_SETTING_COLUMNS",
           "SETTINGS_COLUMN", "SHOWN_SETTINGS", "DATA_SOURCE", "MODEL_CODE"]
