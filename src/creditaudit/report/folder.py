"""Reports of a results folder: ``report.md`` and a self-contained ``report.html``.

Everything is read from run records (never a live model): the audit table (one row per
finished run, from the run's protocol block), a summary across seeds, the runs that did
not finish, the figures the runs support (embedded in the HTML as base64 PNG) and the
reporting-template rows of every finished run. Wherever runs differ in a setting that no
fixed column shows (epochs, data size, learning rate, …), the tables get a column for it,
named by its config key, so no two rows read alike.

By default (``frozen_from_runs``; ``creditaudit report --no-frozen-from-runs`` turns it off)
diagnostic (d) of each run is evaluated against the mean final accuracy of the frozen-blocks
runs of the same recipe (same data, model and its code, optimiser and precision), when there
are any; the table marks those rows with †, and the frozen runs' own rows are labelled as the
baseline.

The HTML is the same Markdown rendered by markdown-it-py (:mod:`creditaudit.report.html`),
with figures embedded, verdicts coloured by meaning (and always spelled out), sortable and
filterable tables, and each run's template folded under its run id.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.files.safe_files import atomic_write_files
from creditaudit.formatting import counted, markdown_text
from creditaudit.protocol import (
    FIRED,
    INCOMPLETE,
    KINDS,
)
from creditaudit.report.html import html_page, markdown_fragment
from creditaudit.report.notes import (
    code_notes,
    declared_failure_notes,
    deep_cos_notes,
    epochs_note,
    frozen_notes,
    reference_notes,
    thresholds_text,
)
from creditaudit.report.protocol import VERDICT_COLUMN, render_markdown
from creditaudit.report.runs import (
    diverged_footnote,
    status_count_text,
)
from creditaudit.report.tables import (
    NO_PROTOCOL,
    audit_table,
    diagnostic_ids,
    partial_means_note,
    summary_table,
    unfinished_table,
    verdict_cell,
)
from creditaudit.report.templates import drop_columns, unfilled_columns, unfilled_note
from creditaudit.results import RunIndex, stopped_early_note

REPORT_MD, REPORT_HTML, FIGURES_DIR = "report.md", "report.html", "figures"


def verdict_classes(index: RunIndex) -> dict[str, str]:
    """Every verdict text the report prints (audit-table cells, with and without †; the
    templates' verdicts) → its kind, the CSS class report.html colours it with —
    ``pass``, ``walk-back``, ``incomplete``, ``unverified`` — as the run's judgement
    (:attr:`~creditaudit.protocol.Judgement.kind`) says: never read back from the words."""
    classes = {NO_PROTOCOL: KINDS[INCOMPLETE]}
    for run in index.all_runs:
        report = index.protocol_report(run)
        text, kind = verdict_cell(report, run)
        if kind is None:
            continue
        classes[text] = kind
        if report is not None:
            classes[report.judgement.text] = kind
    return classes


def classifier(classes: Mapping[str, str]) -> Callable[[str, str, str], str | None]:
    """``classify(tag, text, column)`` of
    :func:`~creditaudit.report.html.markdown_fragment`: the kind of a verdict — a cell of a
    verdict column (header :data:`VERDICT_COLUMN`) or the templates' bold ``Verdict: …``
    line (``classes``: :func:`verdict_classes`) — ``fired`` for a bold **fired**, None for
    any other text: a cell elsewhere (a rule's label, a setting, an error) that reads like a
    verdict is no verdict."""
    def classify(tag: str, text: str, column: str) -> str | None:
        if tag == "strong":
            if text == FIRED:
                return "fired"
            verdict = text.removeprefix("Verdict: ")
            return classes.get(verdict) if verdict != text else None
        return classes.get(text) if column == VERDICT_COLUMN else None
    return classify


# --- the report ---------------------------------------------------------------------------
@dataclass
class Folded:
    """A part of the report that the HTML folds under its title (a run's template)."""

    title: str
    verdict: str
    kind: str | None
    markdown: str


def report_parts(index: RunIndex, *, rendered: Sequence[Any] = (),
                 missing: Sequence[tuple[Any, Any]] = (),
                 figures_dir: str = FIGURES_DIR) -> list[str | Folded]:
    """The report as Markdown parts, in order; :class:`Folded` parts are the runs'
    templates. See :func:`render_report_markdown`."""
    runs = index.all_runs
    finished = [run for run in runs if run.is_finished]
    unfinished = [run for run in runs if not run.is_finished]
    lines = ["# creditaudit report", ""]
    where = f" in {markdown_text(index.root)}" if index.root is not None else ""
    statuses: dict[str, int] = {}
    for run in runs:  # a killed run's record still says running: its claim tells
        status = status_count_text(run, index.folder(run))
        statuses[status] = statuses.get(status, 0) + 1
    status_text = ", ".join(f"{n} {markdown_text(s)}" for s, n in sorted(statuses.items()))
    lines.append(f"{counted(len(runs), 'run record')}{where}"
                 + (f" ({status_text})." if runs else "."))
    lines.append("")
    lines += code_notes(runs)
    lines += declared_failure_notes(runs)
    if index.copies:  # one run id is one run, wherever its folders are
        lines += ["Runs found in more than one folder:", ""]
        lines += [f"- {markdown_text(copies.text())}" for copies in index.copies]
        lines.append("")
    left_out = {path for copies in index.copies if copies.kept is None
                for path in copies.paths}
    unreadable = [(path, reason) for path, reason in index.skipped if path not in left_out]
    if unreadable:
        lines += ["Records that could not be read (left out):", ""]
        lines += [f"- {markdown_text(path)}: {markdown_text(reason)}"
                  for path, reason in unreadable]
        lines.append("")
    ids = diagnostic_ids(index.protocol_report(run) for run in finished)
    lines += ["Every number below is read from the run records. Statuses: **fired**, passed, "
              "n/e = not evaluated (never counted as passed). Diagnostics fire when: "
              f"{thresholds_text(ids)}, unless the records say otherwise. Where runs differ "
              "in a setting no other column shows, a column named by its config key shows "
              "it.", ""]

    lines += ["## Audit table", ""]
    if finished:
        table = audit_table(index, finished)
        lines += table.lines()
        lines.append("")
        lines += frozen_notes(index, table.rows)
        lines += reference_notes(index, finished)
        lines += deep_cos_notes(finished)
        diverged = diverged_footnote(finished)
        lines += [f"{diverged} (the acc column says which).", ""] if diverged else []
    else:
        lines += ["No finished run records found." if runs else "No run records found.", ""]

    if finished:
        lines += ["## Summary across seeds", ""]
        summary = summary_table(index, finished)
        lines += summary.lines()
        lines += ["", "Mean ± std (the sample std, ddof=1) over the seeds of each row (runs "
                      "that differ only in the seed; a mean of one run has no ± part: one "
                      "seed measures no spread); walked back = runs whose verdict needs "
                      "walk-back / runs with a protocol block. A mark of one run marks its "
                      "row's mean.",
                  ""]
        partial = partial_means_note(summary)
        lines += [partial, ""] if partial else []
        diverged = diverged_footnote(finished)
        lines += [f"{diverged}.", ""] if diverged else []
        stopped = stopped_early_note(finished, curves=False)
        lines += [markdown_text(stopped), ""] if stopped else []

    if unfinished:
        lines += ["## Runs that did not finish", "",
                  f"{counted(len(unfinished), 'run')} did not finish (failed, interrupted or still "
                  "running): left out of the tables above and of the figures.", ""]
        lines += unfinished_table(unfinished, index).lines()
        lines.append("")

    lines += ["## Figures", ""]
    for figure in rendered:
        lines += [f"### {markdown_text(figure.title)}", ""]
        for png in figure.pngs:
            lines += [f"![{markdown_text(png.stem)}]({figure_destination(figures_dir, png)})",
                      ""]
    if not rendered:
        lines += ["No figure could be drawn from these runs.", ""]
    if missing:
        lines += ["Figures the runs do not support yet:", ""]
        for module, err in missing:
            lines.append(f"- **{markdown_text(module.TITLE)}** — needs: "
                         f"{markdown_text('; '.join(err.needs))}. "
                         f"Runs it reads: {markdown_text(module.requirements)}")
        lines.append("")

    lines += ["## Reporting template, per run", ""]
    audited = [(run, report) for run in finished
               if (report := index.protocol_report(run)) is not None]
    templates = [render_markdown(report) for _, report in audited]
    unfilled = unfilled_columns(templates)
    if unfilled:
        lines += [unfilled_note(unfilled, [run for run, _ in audited]), ""]
    if not audited:
        lines += ["No finished run has a protocol block.", ""]
    parts: list[str | Folded] = ["\n".join(lines)]
    for (run, report), template in zip(audited, templates):
        parts.append(Folded(run.run_id, *verdict_cell(report, run),
                            epochs_note(run) + drop_columns(template, unfilled)))
    return parts


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
                     f"### {markdown_text(part.title)}\n\n{part.markdown}\n" for part in parts)
    return text.rstrip() + "\n"


def render_report_html(parts: Sequence[str | Folded], *, images: Mapping[str, Path] | None = None,
                       classes: Mapping[str, str] | None = None) -> str:
    """The report's page: the parts' Markdown, its tables sortable and filterable, each
    run's template folded under a line with its run id and verdict, verdicts coloured by
    their kind (``classes``: :func:`verdict_classes`), the figures ``images`` names
    (:func:`figure_files`) embedded as compacted PNG
    (:func:`creditaudit.report.html.compact_png`) and no other file."""
    classify = classifier(classes or {})
    body = []
    for part in parts:
        if isinstance(part, str):
            body.append(markdown_fragment(part, images=images, classify=classify,
                                          interactive=True, compact_images=True))
            continue
        css = part.kind
        verdict = (f'<strong class="{css}">' if css else "<strong>") + \
            f"{html.escape(part.verdict)}</strong>"
        body.append(f"<details>\n<summary><code>{html.escape(part.title)}</code> {verdict}"
                    "</summary>\n" + markdown_fragment(part.markdown, images=images,
                                                       classify=classify)
                    + "</details>\n")
    return html_page("".join(body), script=True)


# --- writing ------------------------------------------------------------------------------
def figure_destination(figures_dir: str, png: Path) -> str:
    """Where report.md points for the figure file ``png``: ``figures_dir/NAME.png``."""
    return f"{figures_dir}/{png.name}"


def figure_files(rendered: Sequence[Any], out_dir: str | Path, figures_dir: str
                 ) -> dict[str, Path]:
    """The figures report.html may embed, by their destination in report.md: the PNGs of
    ``rendered`` (the figures drawn for the report) that are files inside ``out_dir``,
    links resolved — a figure module's list of files is a guest's word, and the page must
    not carry a file from elsewhere (the file is read only if regular:
    :func:`creditaudit.report.html.read_regular_file`)."""
    root = Path(out_dir).resolve()
    files = {}
    for figure in rendered:
        for png in figure.pngs:
            path = Path(png).resolve()
            if path.is_relative_to(root):
                files[figure_destination(figures_dir, png)] = path
    return files


@dataclass
class ReportFiles:
    """What :func:`write_report` wrote, and the figures it embedded or listed as missing."""

    markdown: Path
    html: Path
    rendered: list[Any]
    missing: list[tuple[Any, Any]]


def write_report(index: RunIndex, out_dir: str | Path, *, rendered: Sequence[Any] = (),
                 missing: Sequence[tuple[Any, Any]] = ()) -> ReportFiles:
    """Write ``out_dir/report.md`` and ``out_dir/report.html``.

    The report draws no figure itself: ``rendered`` are figures drawn before (each with a
    ``title`` and its ``pngs``), ``missing`` the (figure, reason) pairs of those that could
    not be (the figure with ``TITLE`` and ``requirements``, the reason with ``needs``) —
    what :func:`creditaudit.figures.render_all` returns. Their PNGs are referenced where
    they are (relative to ``out_dir``; by convention ``out_dir/figures``) and those inside
    ``out_dir`` embedded in the HTML (:func:`figure_files`): the page carries no other file.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rendered, missing = list(rendered), list(missing)
    folders = {p.parent for f in rendered for p in f.pngs}
    figures_dir = FIGURES_DIR
    if folders and folders != {out / FIGURES_DIR}:
        folder = next(iter(folders)).resolve()
        figures_dir = Path(os.path.relpath(folder, out.resolve())).as_posix()
    parts = report_parts(index, rendered=rendered, missing=missing, figures_dir=figures_dir)
    md_path, html_path = out / REPORT_MD, out / REPORT_HTML
    page = render_report_html(parts, images=figure_files(rendered, out, figures_dir),
                              classes=verdict_classes(index))
    # Both or neither: a report.html that cannot be written (a folder in its place) leaves
    # the old report.md, not a new one beside an old page.
    atomic_write_files({md_path: parts_markdown(parts).encode(), html_path: page.encode()})
    return ReportFiles(md_path, html_path, rendered, missing)


__all__ = ["write_report", "render_report_markdown", "render_report_html", "report_parts",
           "parts_markdown", "audit_table", "summary_table", "unfinished_table",
           "verdict_classes", "classifier", "ReportFiles", "Folded", "FIGURES_DIR",
           "REPORT_MD", "REPORT_HTML"]
