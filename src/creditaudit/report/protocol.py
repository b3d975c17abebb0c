"""Rendering of protocol reports: plain text, Markdown (the reporting template) and LaTeX.

JSON is :meth:`DiagnosticReport.to_json` (serialisation of the data); everything here only
formats numbers a report already holds::

    from creditaudit.report import render
    print(render(report, "text"))      # or "md", "latex", "json"
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from creditaudit.descriptions import CREDIT_NOT_FINITE, GRADIENT_NOT_FINITE
from creditaudit.formatting import fmt, markdown_text, one_line, plain_line, telling_number
from creditaudit.methods import credit_formula
from creditaudit.protocol import (
    FIRED,
    HEADLINE_GAMMA,
    PASSED,
    DiagnosticReport,
    DiagnosticResult,
    Judgement,
    ReferenceValidity,
    ResidualStreamScale,
    block_growths,
    default_names,
    in_order,
)
from creditaudit.protocol.verdicts import reads_reference
from creditaudit.registry import DIAGNOSTICS
from creditaudit.report.run_metrics import (  # noqa: F401 — importable from here as before
    ep_convergence_lines,
    metrics_lines,
)

FORMATS = ("text", "md", "json", "latex")
# The header of the tables' verdict column (report.html colours its cells, and only them).
VERDICT_COLUMN = "verdict"


def threshold_text(result: DiagnosticResult) -> str:
    """When the diagnostic fires, as the diagnostic itself writes it (``> 50×``); a result
    of a diagnostic not installed here shows its threshold alone."""
    diagnostic = DIAGNOSTICS.find(result.id)
    if diagnostic is None:
        return f"{result.threshold:g}"
    return diagnostic.threshold_text(result.threshold)


def value_text(result: DiagnosticResult, judged: Judgement | None = None) -> str:
    """The statistic in the diagnostic's own format and unit (``—`` when there is none),
    with as many more digits as it takes to tell its status (:func:`decisive_text`); with
    ``judged``, one computed from the reference gradient ((b), (c)) is marked when that
    reference is not verified."""
    diagnostic = DIAGNOSTICS.find(result.id)
    if diagnostic is None:
        text = "—" if result.value is None else f"{result.value:.3g}"
    else:
        text = decisive_text(diagnostic, result)
    return judged.mark(text) if judged is not None and reads_reference(result.id) else text


def decisive_text(diagnostic: Any, result: DiagnosticResult) -> str:
    """``diagnostic.value_text`` of ``result``'s value, with more digits where the number as
    rounded there would read as the other status (fired or passed against its threshold):
    a (d) margin of 1.996 pp fired at ``< 2 pp`` reads ``+1.996 pp``, not ``+2.00 pp``, and a
    growth of 50.04 fired at ``> 50×`` reads ``50.04``, not ``50``."""
    judged = result.status in (FIRED, PASSED) and isinstance(result.threshold, int | float)
    return diagnostic.value_text(result.value, result.threshold if judged else None)


def reference_line(judged: Judgement) -> str | None:
    """``reference gradient failed its check at `x`: every cosine, Γ and (b) … marked
    (unverified)`` when the reference is not verified, else None."""
    if judged.reference_verified is not False:
        return None
    return (f"{judged.reference_note}: every cosine, Γ, (b) and (c) below is measured "
            "against it and marked (unverified)")


def verdict_text(report: DiagnosticReport) -> str:
    """What the report's verdict reads: for an audited frozen-blocks run, what the tables and
    figures say of it in place of a verdict (metadata ``baseline``, from
    :func:`~creditaudit.protocol.records.baseline_text`), else its judgement's."""
    return report.metadata.get("baseline") or report.judgement.text


def checkpoint_line(metadata: dict[str, Any]) -> str | None:
    """``run status diverged: audited at its last checkpoint, epoch 2`` for a report of
    ``creditaudit audit`` on a run that did not complete (its numbers are not of the run's
    last logged epoch), else None (a completed run's checkpoint is its last epoch; reports
    of ``diagnose`` or of a record carry no status). A running run's status says whether a
    process holds it (``status_text``: ``running (no process holds it: interrupted? …)``)."""
    status, epoch = metadata.get("status"), metadata.get("epoch")
    if status in (None, "completed") or epoch is None:
        return None
    # whether a process holds a running run (``running (no process holds it: …)``)
    status = metadata.get("status_text") or status
    return f"run status {status}: audited at its last checkpoint, epoch {epoch}"


# LaTeX's special characters, and the non-ASCII ones the reports print, as text a plain
# `pdflatex` document compiles without packages.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}", "—": "---", "–": "--", "−": "$-$", "×": r"$\times$",
          "±": r"$\pm$", "Γ": r"$\Gamma$", "λ": r"$\lambda$", "‖": r"$\|$", "≥": r"$\geq$",
          "≤": r"$\leq$", "→": r"$\to$", "†": r"\dag{}", "·": r"$\cdot$",
          "…": r"\ldots{}"}


def _latex_escape(text: str) -> str:
    """``text`` as LaTeX: on one line, control characters as spaces (:func:`plain_line`),
    specials escaped, the reports' non-ASCII characters as commands, any other non-ASCII
    character as ``?`` (a table that compiles beats an exact glyph)."""
    return "".join(_LATEX.get(c, c if c.isascii() else "?") for c in plain_line(text))


# A layer's flag where some sample's credit or gradient is NaN/Inf (``cos_invalid``).
NOT_FINITE_FLAGS = {
    CREDIT_NOT_FINITE: "credit NaN/Inf at some samples: no valid cos",
    GRADIENT_NOT_FINITE: "‖g‖ NaN/Inf at some samples: no valid cos"}


def measured(value: float | None, spec: str = ".3g") -> str:
    """A measured number as it is: ``NaN`` where it is NaN (``fmt``'s ``—`` says *not
    measured*), ``inf`` where infinite."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else fmt(value, spec)


def against(value: float | None, diagnostic: Any, threshold: float) -> str:
    """A measured number (:func:`measured`) in ``diagnostic``'s format, with the digits it
    takes to tell which side of ``threshold`` it lies (:func:`telling_number`): a growth of
    50.04 flagged above 50× reads ``50.04``, not ``50``."""
    if value is None or not math.isfinite(value):
        return measured(value)
    return telling_number(value, diagnostic.value_format, diagnostic.operator, threshold)


def layer_rows(report: DiagnosticReport) -> list[tuple[str, ...]]:
    """Per-layer cells: layer, ‖h_l‖, growth into l (for h_0: since initialisation, as (a)
    measured it), ‖g_l‖, cos (marked when the reference is not verified), flags."""
    judged = report.judgement
    growths = block_growths(report.hidden_norms)
    since_init = next((r.details.get("embed_growth") for r in report.diagnostics
                       if r.id == ResidualStreamScale.name), None)
    cosines = report.layer_cosines or []
    rows = []
    for layer, (h, g) in enumerate(zip(report.hidden_norms, report.grad_norms)):
        growth = growths[layer - 1] if layer > 0 else since_init
        flags = []
        if growth is not None and growth > report.thresholds.growth:
            flags.append("growth > threshold" if layer else
                         "growth since initialisation > threshold")
        if g < report.thresholds.grad_floor:
            flags.append("‖g‖ below floor: invalid reference")
        cos = cosines[layer]["cos"] if layer < len(cosines) else None
        defined = cosines[layer].get("defined") if layer < len(cosines) else None
        invalid = cosines[layer].get("cos_invalid") if layer < len(cosines) else None
        if invalid in NOT_FINITE_FLAGS:
            flags.append(NOT_FINITE_FLAGS[invalid])
        elif not math.isfinite(g):  # no credit given: the median says it alone
            flags.append("‖g‖ NaN/Inf at some samples")
        elif defined is not None and defined < 1:
            flags.append(f"cos over {defined:.0%} of samples (the rest: zero credit or gradient)")
        rows.append((str(layer), measured(h),
                     against(growth, ResidualStreamScale, report.thresholds.growth),
                     against(g, ReferenceValidity, report.thresholds.grad_floor),
                     judged.mark(fmt(cos, "+.3f")), ", ".join(flags)))
    return rows

def render(report: DiagnosticReport, form: str = "text") -> str:
    """``report`` as ``text``, ``md`` (the reporting template), ``json`` or ``latex``."""
    if form == "json":
        return report.to_json()
    renderers = {"text": render_text, "md": render_markdown, "latex": render_latex}
    if form not in renderers:
        raise ValueError(f"unknown report format {form!r}; choose one of {', '.join(FORMATS)}")
    return renderers[form](report)


def render_text(report: DiagnosticReport) -> str:
    """A readable plain-text table of the diagnostics, the verdict and the layers; every
    text the report holds (a guest's label or reason too) on its line (:func:`plain_line`),
    so none can print a line of its own."""
    meta = report.metadata
    judged = report.judgement
    text = plain_line
    lines = [text(f"creditaudit protocol — {meta.get('model', 'model')}"
                  f" ({meta.get('method') or 'no credit'}), {meta.get('n_samples', '?')} "
                  "evaluation samples")]
    for note in (checkpoint_line(meta), reference_line(judged)):
        if note is not None:
            lines.append(text(note))
    header = f"  {'id':<4} {'diagnostic':<32} {'value':>12} {'fires when':>12}  status"
    lines += [header, "  " + "-" * (len(header) - 2)]
    for r in report.diagnostics:
        lines.append(f"  {text(r.label):<4} {text(r.name):<32} {text(value_text(r, judged)):>12} "
                     f"{text(threshold_text(r)):>12}  {text(r.status.upper())}")
        lines.append(f"       {text(r.reason)}")
    lines.append(f"verdict: {text(verdict_text(report))}")
    lines.append("")
    lines.append(f"  {'layer':>5} {'‖h_l‖':>10} {'growth':>8} {'‖g_l‖':>10} "
                 f"{'cos':>7}  flags")
    for row in layer_rows(report):
        lines.append(f"  {row[0]:>5} {row[1]:>10} {row[2]:>8} {row[3]:>10} {row[4]:>7}  "
                     f"{row[5]}")
    if report.gamma is not None:
        lines.append("Γ: " + ", ".join(f"{k} {judged.mark(fmt(v, '+.3f'))}"
                                        for k, v in report.gamma.items()))
    lines.extend(metrics_lines(report.metrics, judged))
    return "\n".join(lines)

def template_results(report: DiagnosticReport) -> list[DiagnosticResult]:
    """The diagnostics with a column of their own in the reporting-template row: those whose
    statistic the per-layer table does not show (a diagnostic not installed here has one)."""
    out = []
    for result in report.diagnostics:
        diagnostic = DIAGNOSTICS.find(result.id)
        if diagnostic is None or not diagnostic.per_layer:
            out.append(result)
    return out


def render_markdown(report: DiagnosticReport) -> str:
    """The reporting-template row (a column per diagnostic the per-layer table does not
    show, beside the frozen-blocks accuracy), the diagnostics and a per-layer table."""
    meta = report.metadata
    judged = report.judgement
    per_layer_gamma = (", ".join(fmt(row["cos"], "+.3f") for row in report.layer_cosines)
                       if report.layer_cosines else "—")
    per_layer_gamma = judged.mark(per_layer_gamma)
    gamma = (judged.mark(fmt(report.headline_gamma, '+.3f'))
             + f" ({HEADLINE_GAMMA.replace('_', ' ')})" if report.gamma else "—")
    frozen = meta.get("frozen_acc")
    method = meta.get("method") or "—"
    own = template_results(report)
    # Every text the report holds (names, labels, reasons: a record's, a guest's) enters as
    # markdown_text, so it reads as itself and keeps to its cell.
    text = markdown_text
    row = [text(method), text(credit_formula(method) or meta.get("credit_formula", "—")),
           text(meta.get("arch", meta.get("model", "—"))), fmt(meta.get("terminal_ln")),
           text(meta.get("dataset", "—")), text(meta.get("seeds", "—")),
           text(fmt(meta.get("feedback_seed"), "")), fmt(meta.get("headline_acc"), ".3f"),
           gamma, per_layer_gamma, "not given" if frozen is None else f"{frozen:.3f}",
           *(text(value_text(r, judged)) for r in own), text(verdict_text(report))]
    header = ["method", "credit", "architecture", "terminal LN", "dataset", "seeds",
              "feedback seed", "test acc", "Γ (aggregation)", "per-layer Γ", "frozen acc",
              *(text(r.label) for r in own), VERDICT_COLUMN]
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(row),
        "| " + " | ".join(row) + " |",
        "",
        "| id | diagnostic | value | fires when | status | reason |",
        "|---|---|---|---|---|---|",
    ]
    for r in report.diagnostics:
        out.append(f"| {text(r.label)} | {text(r.name)} | {text(value_text(r, judged))} | "
                   f"{text(threshold_text(r))} | {text(r.status)} | {text(r.reason)} |")
    notes = [text(note) for note in (checkpoint_line(meta), reference_line(judged)) if note]
    out += ["", f"**Verdict: {text(verdict_text(report))}**", "",
            *(line for note in notes for line in (note, "")),
            f"Per layer (medians over {meta.get('n_samples', '?')} samples; ‖g_l‖ as "
            "(1/128)·∂CE_i/∂h_l):", "",
            "| layer | ‖h_l‖ | growth into l | ‖g_l‖ | cos(a_l, g_l) | flags |",
            "|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(row) + " |" for row in layer_rows(report)]
    if report.gamma is not None:
        out += ["", "| Γ aggregation | value |", "|---|---|"]
        out += [f"| {k} | {judged.mark(fmt(v, '+.3f'))} |" for k, v in report.gamma.items()]
    metric_lines = [one_line(line) for line in metrics_lines(report.metrics, judged)]
    if metric_lines:
        out += ["", *code_block(metric_lines)]
    return "\n".join(out)


def code_block(lines: Sequence[str]) -> list[str]:
    """``lines`` as a fenced Markdown code block: its fence longer than any run of
    backticks in them, so no line can close it."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]

def render_latex(reports: DiagnosticReport | Sequence[DiagnosticReport]) -> str:
    """A complete ``tabular`` (no packages needed): a header row, then one row per report —
    method, architecture, test accuracy, headline Γ, one column per diagnostic the reports
    hold (fired values in bold, ``---`` where a report lacks it) and the verdict. Text is
    escaped; ``\\input`` it inside a ``table`` environment."""
    reports = [reports] if isinstance(reports, DiagnosticReport) else list(reports)
    ids = _diagnostic_ids(reports)
    header = ["method", "architecture", "test acc",
              f"Γ ({HEADLINE_GAMMA.replace('_', ' ')})", *(f"({id_})" for id_ in ids),
              "verdict"]
    lines = [r"\begin{tabular}{ll" + "r" * 2 + "l" * (len(header) - 4) + "}", r"\hline",
             " & ".join(_latex_escape(h) for h in header) + r" \\", r"\hline"]
    for report in reports:
        meta = report.metadata
        judged = report.judgement
        cells = [str(meta.get("method") or "—"), str(meta.get("arch", meta.get("model", "—"))),
                 fmt(meta.get("headline_acc"), ".3f"),
                 judged.mark(fmt(report.headline_gamma, "+.3f"))]
        cells = [_latex_escape(c) for c in cells]
        held = {r.id: r for r in report.diagnostics}
        for id_ in ids:
            r = held.get(id_)
            text = ("---" if r is None else "n/e" if r.value is None
                    else _latex_escape(value_text(r, judged)))
            cells.append(f"\\textbf{{{text}}}" if r is not None and r.fired else text)
        cells.append(_latex_escape(verdict_text(report)))
        lines.append(" & ".join(cells) + r" \\")
    return "\n".join([*lines, r"\hline", r"\end{tabular}"])


def _diagnostic_ids(reports: Sequence[DiagnosticReport]) -> list[str]:
    """The diagnostics the reports hold, in listing order (the default protocol's when
    none)."""
    ids = in_order(r.id for report in reports for r in report.diagnostics)
    return ids or default_names()
