"""Reports of a results folder: ``report.md`` and a self-contained ``report.html``.

Everything is read from run records (never a live model): the audit table (one row per
run, from the run's protocol block), a summary across seeds, the figures the runs support
(embedded in the HTML as base64 PNG) and the reporting-template rows of every run.

By default (``frozen_from_runs``; ``creditaudit report --no-frozen-from-runs`` turns it off)
diagnostic (d) of each run is evaluated against the mean final accuracy of the frozen-blocks
runs of the same recipe (same data, model, optimiser and precision), when there are any; the
table marks those rows with †, and the frozen runs' own rows are labelled as the baseline.

The HTML is the same Markdown rendered by markdown-it-py (:mod:`creditaudit.report.html`),
figures embedded.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.figures.common import ARCH_LABELS, method_label
from creditaudit.figures.runs import Run, RunIndex, mean_std, sort_methods
from creditaudit.formatting import fmt, markdown_table, one_line
from creditaudit.protocol import (
    FIRED,
    HEADLINE_GAMMA,
    NOT_EVALUATED,
    DiagnosticReport,
    default_names,
)
from creditaudit.protocol.records import is_frozen_baseline, model_description
from creditaudit.report.html import markdown_to_html
from creditaudit.report.protocol import render_markdown
from creditaudit.safe_files import atomic_write_bytes

REPORT_MD, REPORT_HTML, FIGURES_DIR = "report.md", "report.html", "figures"
AUDIT_COLUMNS = ("run", "method", "λ", "arch", "out_ln", "dataset", "seed", "status", "acc",
                 "deep cos", f"Γ ({HEADLINE_GAMMA.replace('_', ' ')})", "(a)", "(b)", "(c)",
                 "(d)", "verdict")
RECOMPUTED_MARK = "†"


# --- table rows ---------------------------------------------------------------------------
def diagnostic_cell(report: DiagnosticReport | None, id_: str) -> str:
    """``fired 694``, ``passed 1.01``, ``n/e`` — status and the compared value."""
    if report is None or id_ not in {r.id for r in report.diagnostics}:
        return "—"  # no protocol block, or a protocol without this diagnostic
    result = report.diagnostic(id_)
    if result.status == NOT_EVALUATED:
        return "n/e"
    if result.value is None:
        value = ""
    elif id_ == "d":
        value = f" {result.value:+.2f} pp"
    elif id_ == "c":
        value = f" {result.value:.3f}"
    else:
        value = f" {result.value:.3g}"
    word = "**fired**" if result.status == FIRED else result.status
    return word + value


def verdict_cell(report: DiagnosticReport | None, run: Run) -> str:
    if is_frozen_baseline(run.record) and run.record.is_finished:
        return "baseline of (d)"
    if report is None:
        if run.status in ("failed", "interrupted", "running"):
            return f"— (run {run.status})"
        return "— (no protocol block)"
    text = report.verdict_text
    if report.metadata.get("frozen_from_runs"):
        text += f" {RECOMPUTED_MARK}"
    return text


def arch_text(run: Run) -> str:
    model = model_description(run.record)  # width and depth as built, not config keys
    name = ARCH_LABELS.get(run.arch_label) or (model.short_label if model else run.arch_label)
    if run.arch == "student" or model is None:
        return name
    return f"{name} d={model.d} L={model.n_blocks}"


def audit_row(index: RunIndex, run: Run, diagnostics: Sequence[str] | None = None
              ) -> dict[str, str]:
    """One audit-table row (cells as Markdown text) for ``run``; a cell per diagnostic of
    ``diagnostics`` (default: the built-in four)."""
    report = index.protocol_report(run)
    return {
        "run": run.run_id, "method": method_label(run.method), "λ": fmt(run.penalty, "g"),
        "arch": arch_text(run),
        "out_ln": "—" if run.arch == "student" else fmt(run.out_ln),
        "dataset": run.dataset, "seed": str(run.seed), "status": run.status,
        "acc": fmt(run.final_acc, ".3f"), "deep cos": fmt(run.deep_cos, "+.3f"),
        AUDIT_COLUMNS[10]: fmt(run.headline_gamma, "+.3f"),
        **{f"({i})": diagnostic_cell(report, i) for i in diagnostics or default_names()},
        "verdict": verdict_cell(report, run),
    }


def dict_table(columns: Sequence[str], rows: Sequence[dict[str, str]]) -> list[str]:
    """Markdown table lines of dict ``rows`` (one column per key in ``columns``)."""
    return markdown_table(columns, [[row.get(c, "") for c in columns] for row in rows]
                          ).splitlines()


@dataclass
class SummaryGroup:
    """Runs of one method and λ on one recipe (its seeds)."""

    runs: list[Run] = field(default_factory=list)
    reports: list[DiagnosticReport | None] = field(default_factory=list)


def summary_rows(index: RunIndex) -> list[dict[str, str]]:
    """Across seeds: one row per dataset × architecture × recipe × method × λ."""
    groups: dict[tuple, SummaryGroup] = {}
    for run in index.all_runs:
        key = (run.dataset, run.recipe, run.method, run.penalty)
        group = groups.setdefault(key, SummaryGroup())
        group.runs.append(run)
        group.reports.append(index.protocol_report(run))
    rows = []
    order = {m: i for i, m in enumerate(sort_methods(r.method for r in index.all_runs))}
    for key in sorted(groups, key=lambda k: (k[0], k[1], order[k[2]], k[3])):
        group = groups[key]
        run = group.runs[0]

        def ms(values: Any, spec: str) -> str:
            mean, std = mean_std(values)
            return "—" if math.isnan(mean) else f"{mean:{spec}} ± {std:.3f}"

        audited = [r for r in group.reports if r is not None]
        walked = sum(bool(r.fired) for r in audited)
        fired: dict[str, int] = {}
        for report in audited:
            for id_ in report.fired:
                fired[id_] = fired.get(id_, 0) + 1
        rows.append({
            "method": method_label(run.method), "λ": fmt(run.penalty, "g"),
            "arch": arch_text(run), "dataset": run.dataset,
            "epochs": str(run.epochs),
            "seeds": ", ".join(str(r.seed) for r in group.runs),
            "test acc": ms((r.final_acc for r in group.runs), ".3f"),
            "deep cos": ms((r.deep_cos for r in group.runs), "+.3f"),
            "Γ": ms((r.headline_gamma for r in group.runs), "+.3f"),
            "walked back": f"{walked}/{len(audited)}" if audited else "—",
            "fired": " ".join(f"({i})×{n}" for i, n in sorted(fired.items())) or "—",
        })
    return rows


SUMMARY_COLUMNS = ("method", "λ", "arch", "dataset", "epochs", "seeds", "test acc",
                   "deep cos", "Γ", "walked back", "fired")


# --- the report ---------------------------------------------------------------------------
def render_report_markdown(index: RunIndex, *, rendered: Sequence[Any] = (),
                           missing: Sequence[tuple[Any, Any]] = (),
                           figures_dir: str = FIGURES_DIR) -> str:
    """The report as Markdown; figure images are referenced as ``figures_dir/NAME.png``
    (relative to the report's folder). ``rendered``/``missing``: what
    :func:`creditaudit.figures.render_all` returned."""
    runs = index.all_runs
    lines = ["# creditaudit report", ""]
    where = f" in `{index.root}`" if index.root is not None else ""
    statuses: dict[str, int] = {}
    for run in runs:
        statuses[run.status] = statuses.get(run.status, 0) + 1
    status_text = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    lines.append(f"{len(runs)} run records{where}" + (f" ({status_text})." if runs else "."))
    lines.append("")
    if index.skipped:
        lines += ["Records that could not be read (left out):", ""]
        lines += [f"- `{path}`: {one_line(reason)}" for path, reason in index.skipped]
        lines.append("")
    lines += ["Every number below is read from the run records. Statuses: **fired**, passed, "
              "n/e = not evaluated (never counted as passed). Thresholds: (a) growth > 50×, "
              "(b) ‖g_L‖ < 1e-7, (c) stability > 0.30, (d) margin < 2 pp unless the records "
              "say otherwise.", ""]

    lines += ["## Audit table", ""]
    if runs:
        ids = index.diagnostic_ids()  # the built-in four, then any a config added
        rows = [audit_row(index, run, ids) for run in runs]
        columns = [c for c in AUDIT_COLUMNS if c != "verdict"] + [f"({i})" for i in ids
                                                                   if i not in default_names()]
        lines += dict_table([*columns, "verdict"], rows)
        lines.append("")
        lines += _frozen_notes(index, rows)
    else:
        lines += ["No run records found.", ""]

    if runs:
        lines += ["## Summary across seeds", ""]
        lines += dict_table(SUMMARY_COLUMNS, summary_rows(index))
        lines += ["", "Mean ± std (population) over the seeds of each row; walked back = runs "
                      "whose verdict needs walk-back / runs with a protocol block.", ""]

    lines += ["## Figures", ""]
    for figure in rendered:
        lines += [f"### {figure.title}", ""]
        for png in figure.pngs:
            lines += [f"![{png.stem}]({figures_dir}/{png.name})", ""]
    if not rendered:
        lines += ["No figure could be drawn from these runs.", ""]
    if missing:
        lines += ["Figures the runs do not support yet:", ""]
        for module, err in missing:
            lines.append(f"- **{module.TITLE}** — needs: {one_line('; '.join(err.needs))}. "
                         f"Runs it reads: {one_line(module.requirements)}")
        lines.append("")

    lines += ["## Reporting template, per run", ""]
    any_template = False
    for run in runs:
        report = index.protocol_report(run)
        if report is None:
            continue
        any_template = True
        lines += [f"### {run.run_id}", "", render_markdown(report), ""]
    if not any_template:
        lines += ["No run has a protocol block.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _frozen_notes(index: RunIndex, rows: Sequence[dict[str, str]]) -> list[str]:
    notes = []
    recomputed = [r for r in rows if r["verdict"].endswith(RECOMPUTED_MARK)]
    if recomputed:
        notes.append(f"{RECOMPUTED_MARK} (d) re-evaluated against the mean final accuracy of "
                     "the frozen-blocks runs of the same recipe (same data, architecture and "
                     "optimiser; `--frozen-from-runs`), not the record's own (d); the verdict "
                     f"follows. {len(recomputed)} run(s).")
    elif not index.frozen_from_runs:
        could = [run for run in index.all_runs if run.method != "frozen"
                 and index.frozen_baseline(run) is not None
                 and (report := index.protocol_report(run)) is not None
                 and report.diagnostic("d").status == NOT_EVALUATED]
        if could:
            notes.append(f"{len(could)} run(s) have (d) not evaluated although frozen-blocks "
                         "runs of their recipe exist: run `creditaudit report "
                         "--frozen-from-runs` to evaluate (d) against them.")
    return [*notes, ""] if notes else []


# --- writing ------------------------------------------------------------------------------
@dataclass
class ReportFiles:
    """What :func:`write_report` wrote."""

    markdown: Path
    html: Path
    rendered: list[Any]
    missing: list[tuple[Any, Any]]


def write_report(index: RunIndex, out_dir: str | Path, *, rendered: Sequence[Any] | None = None,
                 missing: Sequence[tuple[Any, Any]] | None = None) -> ReportFiles:
    """Write ``out_dir/report.md``, ``out_dir/report.html`` and the figures.

    Figures are rendered into ``out_dir/figures`` unless ``rendered`` (and ``missing``) from
    an earlier :func:`creditaudit.figures.render_all` are passed; their PNGs are then
    referenced where they are (relative to ``out_dir`` when possible) and embedded in the
    HTML.
    """
    from creditaudit.figures import render_all

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rendered is None:
        rendered, missing = render_all(index, out / FIGURES_DIR)
    rendered, missing = list(rendered), list(missing or [])
    folders = {p.parent for f in rendered for p in f.pngs}
    figures_dir = FIGURES_DIR
    if folders and folders != {out / FIGURES_DIR}:
        folder = next(iter(folders)).resolve()
        figures_dir = Path(os.path.relpath(folder, out.resolve())).as_posix()
    text = render_report_markdown(index, rendered=rendered, missing=missing,
                                  figures_dir=figures_dir)
    md_path, html_path = out / REPORT_MD, out / REPORT_HTML
    atomic_write_bytes(md_path, text.encode())
    atomic_write_bytes(html_path, markdown_to_html(text, base_dir=out).encode())
    return ReportFiles(md_path, html_path, rendered, missing)


__all__ = ["write_report", "render_report_markdown", "audit_row", "summary_rows",
           "ReportFiles"]
