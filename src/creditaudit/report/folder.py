"""Reports of a results folder: ``report.md`` and a self-contained ``report.html``.

Everything is read from run records (never a live model): the audit table (one row per
finished run, from the run's protocol block), a summary across seeds, the runs that did
not finish, the figures the runs support (embedded in the HTML as base64 PNG) and the
reporting-template rows of every finished run. Wherever runs differ in a setting that no
fixed column shows (epochs, data size, learning rate, …), the tables get a column for it,
named by its config key, so no two rows read alike.

By default (``frozen_from_runs``; ``creditaudit report --no-frozen-from-runs`` turns it off)
diagnostic (d) of each run is evaluated against the mean final accuracy of the frozen-blocks
runs of the same recipe (same data, model, optimiser and precision), when there are any; the
table marks those rows with †, and the frozen runs' own rows are labelled as the baseline.

The HTML is the same Markdown rendered by markdown-it-py (:mod:`creditaudit.report.html`),
with figures embedded, verdicts coloured by meaning (and always spelled out), sortable and
filterable tables, and each run's template folded under its run id.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config import non_semantic
from creditaudit.figures.common import method_label
from creditaudit.figures.runs import Run, RunIndex, mean_std, sort_methods
from creditaudit.formatting import fmt, markdown_table, one_line
from creditaudit.protocol import (
    FIRED,
    HEADLINE_GAMMA,
    INCOMPLETE,
    NOT_EVALUATED,
    TRUSTWORTHY,
    WALK_BACK,
    DiagnosticReport,
    default_names,
)
from creditaudit.protocol.records import is_frozen_baseline, model_description
from creditaudit.report.html import html_page, markdown_fragment
from creditaudit.report.protocol import render_markdown
from creditaudit.safe_files import atomic_write_bytes

REPORT_MD, REPORT_HTML, FIGURES_DIR = "report.md", "report.html", "figures"
GAMMA_COLUMN = f"Γ ({HEADLINE_GAMMA.replace('_', ' ')})"
# Each table: fixed columns before and after a column per differing setting.
AUDIT_HEAD = ("run", "method", "λ", "arch", "out_ln", "dataset", "seed")
AUDIT_TAIL = ("status", "acc", "deep cos", GAMMA_COLUMN, "(a)", "(b)", "(c)", "(d)", "verdict")
SUMMARY_HEAD = ("method", "λ", "arch", "dataset")
SUMMARY_TAIL = ("seeds", "test acc", "deep cos", "Γ", "walked back", "fired")
UNFINISHED_HEAD = ("run", "method", "λ", "arch", "dataset", "seed")
UNFINISHED_TAIL = ("status", "epochs logged", "error")
# The settings the fixed columns show: the rule and λ, the architecture with its width and
# depth, the terminal LN, the dataset and the seed.
SHOWN_SETTINGS = frozenset({"method.name", "method.penalty", "model.arch", "model.d",
                            "model.n_blocks", "model.out_ln", "data.name", "run.seed"})
DATA_SOURCE = "data source"
RECOMPUTED_MARK = "†"
ERROR_CHARS = 300


# --- what tells runs apart ----------------------------------------------------------------
def setting_text(value: Any) -> str:
    """A config value as a table cell: ``yes``/``no``, ``—`` for None, floats in ``g``."""
    if isinstance(value, float):
        return f"{value:g}"
    return fmt(value, "") if value is None or isinstance(value, bool) else str(value)


def run_settings(run: Run) -> dict[str, str]:
    """Every setting that makes ``run`` the run it is, as cell text by dotted config key:
    the config values its run id covers (output folder, threads, device, … left out) and,
    as ``data source``, what identifies its data apart from the seed (a hash prefix)."""
    skip = non_semantic(run.config)
    settings: dict[str, str] = {}
    for section, values in run.config.to_dict().items():
        for name, value in values.items():
            if (section, name) in skip:
                continue
            if isinstance(value, dict):  # a diagnostic's options table
                settings.update({f"{section}.{name}.{k}": setting_text(v)
                                 for k, v in value.items()})
            else:
                settings[f"{section}.{name}"] = setting_text(value)
    data = run.record.data
    if data is not None and data.source:
        settings[DATA_SOURCE] = data.source[:12]
    return settings


def differing_settings(runs: Sequence[Run]) -> list[str]:
    """The settings whose text differs between ``runs`` and that no fixed column shows, in
    config order. The data source counts only where no ``data.*`` setting differs (else
    it differs because they do)."""
    table = [run_settings(run) for run in runs]
    keys = list(dict.fromkeys(key for settings in table for key in settings))
    differ = [key for key in keys if key not in SHOWN_SETTINGS
              and len({settings.get(key, "—") for settings in table}) > 1]
    if any(key.startswith("data.") for key in differ):
        differ = [key for key in differ if key != DATA_SOURCE]
    return differ


# --- table rows ---------------------------------------------------------------------------
def diagnostic_cell(report: DiagnosticReport | None, id_: str) -> str:
    """``fired 694``, ``passed 1.01``, ``n/e`` — status and the compared value."""
    if report is None:
        return "—"
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


NO_PROTOCOL = "— (no protocol block)"


def verdict_cell(report: DiagnosticReport | None, run: Run) -> str:
    if is_frozen_baseline(run.record) and run.record.is_finished:
        return "baseline of (d)"
    if report is None:
        if run.status in ("failed", "interrupted", "running"):
            return f"— (run {run.status})"
        return NO_PROTOCOL
    text = report.verdict_text
    if report.metadata.get("frozen_from_runs"):
        text += f" {RECOMPUTED_MARK}"
    return text


def verdict_class(tag: str, text: str) -> str | None:
    """The CSS class of a verdict by its meaning — ``pass`` (trustworthy), ``walk-back``,
    ``incomplete`` (some diagnostic not evaluated, or no protocol block) — for a table cell
    or the template's bold ``Verdict: …`` line; ``fired`` for a bold **fired**; None for
    any other text."""
    if tag == "strong" and text == FIRED:
        return "fired"
    text = text.removeprefix("Verdict: ") if tag == "strong" else text
    if text.startswith(WALK_BACK):
        return "walk-back"
    if text.startswith(TRUSTWORTHY):
        return "pass"
    if text.startswith(("no walk-back in", INCOMPLETE, NO_PROTOCOL)):
        return "incomplete"
    return None


def arch_text(run: Run) -> str:
    """The model as built: ``ResMLP d=256 L=4``, ``StudentNet d=128 L=4 no out_LN`` …"""
    model = model_description(run.record)
    return model.label if model is not None else run.arch


def audit_row(index: RunIndex, run: Run, settings: Sequence[str] = ()) -> dict[str, str]:
    """One audit-table row (cells as Markdown text) for ``run``; ``settings``: the keys of
    :func:`run_settings` that get a column."""
    report = index.protocol_report(run)
    values = run_settings(run)
    return {
        "run": run.run_id, "method": method_label(run.method), "λ": fmt(run.penalty, "g"),
        "arch": arch_text(run),
        "out_ln": fmt(run.out_ln),
        "dataset": run.dataset, "seed": str(run.seed),
        **{key: values.get(key, "—") for key in settings},
        "status": run.status,
        "acc": fmt(run.final_acc, ".3f"), "deep cos": fmt(run.deep_cos, "+.3f"),
        GAMMA_COLUMN: fmt(run.headline_gamma, "+.3f"),
        **{f"({i})": diagnostic_cell(report, i) for i in default_names()},
        "verdict": verdict_cell(report, run),
    }


def dict_table(columns: Sequence[str], rows: Sequence[dict[str, str]]) -> list[str]:
    """Markdown table lines of dict ``rows`` (one column per key in ``columns``)."""
    return markdown_table(columns, [[row.get(c, "") for c in columns] for row in rows]
                          ).splitlines()


@dataclass
class Table:
    """Columns and rows (cells as Markdown text, by column) of one report table."""

    columns: list[str]
    rows: list[dict[str, str]]

    def lines(self) -> list[str]:
        return dict_table(self.columns, self.rows)


def audit_table(index: RunIndex, runs: Sequence[Run]) -> Table:
    """One row per run in ``runs`` (the finished ones, in the report)."""
    settings = differing_settings(runs)
    return Table([*AUDIT_HEAD, *settings, *AUDIT_TAIL],
                 [audit_row(index, run, settings) for run in runs])


@dataclass
class SummaryGroup:
    """Runs of one method and λ with the same settings, seeds aside."""

    runs: list[Run] = field(default_factory=list)
    reports: list[DiagnosticReport | None] = field(default_factory=list)


def summary_groups(index: RunIndex, runs: Sequence[Run] | None = None) -> list[SummaryGroup]:
    """Finished ``runs`` (default: all of the index's) grouped by everything but the seed,
    in report order (dataset, recipe, method, λ)."""
    groups: dict[tuple, SummaryGroup] = {}
    for run in index.runs if runs is None else runs:
        if not run.record.is_finished:
            continue
        settings = tuple(sorted((k, v) for k, v in run_settings(run).items() if k != "run.seed"))
        group = groups.setdefault((run.dataset, run.recipe, run.method, run.penalty, settings),
                                  SummaryGroup())
        group.runs.append(run)
        group.reports.append(index.protocol_report(run))
    order = {m: i for i, m in enumerate(sort_methods(k[2] for k in groups))}
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], order[k[2]], k[3],
                                                             k[4]))]


def summary_rows(index: RunIndex, runs: Sequence[Run] | None = None,
                 settings: Sequence[str] = ()) -> list[dict[str, str]]:
    """Across seeds: one row per group of :func:`summary_groups` (finished runs only);
    ``settings``: the keys of :func:`run_settings` that get a column."""
    rows = []
    for group in summary_groups(index, runs):
        run = group.runs[0]
        values = run_settings(run)

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
            **{key: values.get(key, "—") for key in settings},
            "seeds": ", ".join(str(r.seed) for r in group.runs),
            "test acc": ms((r.final_acc for r in group.runs), ".3f"),
            "deep cos": ms((r.deep_cos for r in group.runs), "+.3f"),
            "Γ": ms((r.headline_gamma for r in group.runs), "+.3f"),
            "walked back": f"{walked}/{len(audited)}" if audited else "—",
            "fired": " ".join(f"({i})×{n}" for i, n in sorted(fired.items())) or "—",
        })
    return rows


def summary_table(index: RunIndex, runs: Sequence[Run]) -> Table:
    settings = differing_settings([g.runs[0] for g in summary_groups(index, runs)])
    return Table([*SUMMARY_HEAD, *settings, *SUMMARY_TAIL],
                 summary_rows(index, runs, settings))


def unfinished_table(runs: Sequence[Run]) -> Table:
    """Failed, interrupted and running runs: what they are, how far they got, the error."""
    settings = differing_settings(runs)
    rows = []
    for run in runs:
        values = run_settings(run)
        error = one_line(run.record.error or "—")
        if len(error) > ERROR_CHARS:
            error = error[:ERROR_CHARS - 1] + "…"
        rows.append({
            "run": run.run_id, "method": method_label(run.method), "λ": fmt(run.penalty, "g"),
            "arch": arch_text(run), "dataset": run.dataset, "seed": str(run.seed),
            **{key: values.get(key, "—") for key in settings}, "status": run.status,
            "epochs logged": str(run.record.log[-1].epoch if run.record.log else 0),
            "error": error,
        })
    return Table([*UNFINISHED_HEAD, *settings, *UNFINISHED_TAIL], rows)


# --- per-run templates: columns no run fills ------------------------------------------------
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


# --- the report ---------------------------------------------------------------------------
@dataclass
class Folded:
    """A part of the report that the HTML folds under its title (a run's template)."""

    title: str
    verdict: str
    markdown: str


def report_parts(index: RunIndex, *, rendered: Sequence[Any] = (),
                 missing: Sequence[tuple[Any, Any]] = (),
                 figures_dir: str = FIGURES_DIR) -> list[str | Folded]:
    """The report as Markdown parts, in order; :class:`Folded` parts are the runs'
    templates. See :func:`render_report_markdown`."""
    runs = index.all_runs
    finished = [run for run in runs if run.record.is_finished]
    unfinished = [run for run in runs if not run.record.is_finished]
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
              "say otherwise. Where runs differ in a setting no other column shows, a column "
              "named by its config key shows it.", ""]

    lines += ["## Audit table", ""]
    if finished:
        table = audit_table(index, finished)
        lines += table.lines()
        lines.append("")
        lines += _frozen_notes(index, table.rows)
    else:
        lines += ["No finished run records found." if runs else "No run records found.", ""]

    if finished:
        lines += ["## Summary across seeds", ""]
        lines += summary_table(index, finished).lines()
        lines += ["", "Mean ± std (population) over the seeds of each row (runs that differ "
                      "only in the seed); walked back = runs whose verdict needs walk-back / "
                      "runs with a protocol block.", ""]

    if unfinished:
        lines += ["## Runs that did not finish", "",
                  f"{len(unfinished)} run(s) failed, were interrupted or are still running; "
                  "they are left out of the tables above and of the figures.", ""]
        lines += unfinished_table(unfinished).lines()
        lines.append("")

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
    audited = [(run, report) for run in finished
               if (report := index.protocol_report(run)) is not None]
    templates = [render_markdown(report) for _, report in audited]
    unfilled = unfilled_columns(templates)
    if unfilled:
        lines += [_unfilled_note(unfilled, [run for run, _ in audited]), ""]
    if not audited:
        lines += ["No finished run has a protocol block.", ""]
    parts: list[str | Folded] = ["\n".join(lines)]
    for (run, report), template in zip(audited, templates):
        parts.append(Folded(run.run_id, verdict_cell(report, run),
                            drop_columns(template, unfilled)))
    return parts


def _unfilled_note(columns: Sequence[Column], runs: Sequence[Run]) -> str:
    """One line: which template columns are left out, and why."""
    names = list(dict.fromkeys(name for _, name in columns))
    diagnostics = [name for name in names if name in {f"({i})" for i in default_names()}]
    text = f"Left out of every template below, as no run fills them: {', '.join(names)}."
    if len(diagnostics) < len(names) and not any(r.config.diagnostics.end_of_run for r in runs):
        text += (" The runs were trained without end-of-run metrics (`diagnostics.end_of_run "
                 "= false`, as `creditaudit demo` trains them); `creditaudit audit RUN_DIR` "
                 "computes them for one run.")
    if diagnostics:
        text += (f" {''.join(diagnostics)} not evaluated in any run: each run's diagnostics "
                 "table says why.")
    return text


def render_report_markdown(index: RunIndex, *, rendered: Sequence[Any] = (),
                           missing: Sequence[tuple[Any, Any]] = (),
                           figures_dir: str = FIGURES_DIR) -> str:
    """The report as Markdown; figure images are referenced as ``figures_dir/NAME.png``
    (relative to the report's folder). ``rendered``/``missing``: what
    :func:`creditaudit.figures.render_all` returned."""
    return parts_markdown(report_parts(index, rendered=rendered, missing=missing,
                                       figures_dir=figures_dir))


def parts_markdown(parts: Sequence[str | Folded]) -> str:
    """report.md of :func:`report_parts`: each folded part under a ``###`` heading."""
    text = "\n".join(part if isinstance(part, str) else
                     f"### {part.title}\n\n{part.markdown}\n" for part in parts)
    return text.rstrip() + "\n"


def render_report_html(parts: Sequence[str | Folded], *, base_dir: str | Path = "."
                       ) -> str:
    """The report's page: the parts' Markdown, its tables sortable and filterable, each
    run's template folded under a line with its run id and verdict, figures embedded as
    compacted PNG (:func:`creditaudit.report.html.compact_png`)."""
    body = []
    for part in parts:
        if isinstance(part, str):
            body.append(markdown_fragment(part, base_dir=base_dir, classify=verdict_class,
                                          interactive=True, compact_images=True))
            continue
        css = verdict_class("td", part.verdict)
        verdict = (f'<strong class="{css}">' if css else "<strong>") + \
            f"{html.escape(part.verdict)}</strong>"
        body.append(f"<details>\n<summary><code>{html.escape(part.title)}</code> {verdict}"
                    "</summary>\n" + markdown_fragment(part.markdown, base_dir=base_dir,
                                                       classify=verdict_class)
                    + "</details>\n")
    return html_page("".join(body), script=True)


def _frozen_notes(index: RunIndex, rows: Sequence[dict[str, str]]) -> list[str]:
    notes = []
    recomputed = [r for r in rows if r["verdict"].endswith(RECOMPUTED_MARK)]
    if recomputed:
        notes.append(f"{RECOMPUTED_MARK} (d) re-evaluated against the mean final accuracy of "
                     "the frozen-blocks runs of the same recipe (same data, architecture and "
                     "optimiser; `--frozen-from-runs`), not the record's own (d); the verdict "
                     f"follows. {len(recomputed)} run(s).")
    elif not index.frozen_from_runs:
        could = [run for run in index.runs if run.method != "frozen"
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
    parts = report_parts(index, rendered=rendered, missing=missing, figures_dir=figures_dir)
    md_path, html_path = out / REPORT_MD, out / REPORT_HTML
    atomic_write_bytes(md_path, parts_markdown(parts).encode())
    atomic_write_bytes(html_path, render_report_html(parts, base_dir=out).encode())
    return ReportFiles(md_path, html_path, rendered, missing)


__all__ = ["write_report", "render_report_markdown", "render_report_html", "report_parts",
           "audit_row", "audit_table", "summary_rows", "summary_table", "unfinished_table",
           "run_settings", "differing_settings", "verdict_class", "ReportFiles"]
