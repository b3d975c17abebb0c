"""Every rendering of the tool's results, one module per idea:

- :mod:`creditaudit.formatting` (outside the package, figures use it too) — numbers, λ
  labels and Markdown tables;
- :mod:`.protocol` — one protocol report as text, Markdown (the reporting template), LaTeX
  (JSON is the report's own serialisation): :func:`render`;
- :mod:`.run_metrics` — a run's end-of-run metrics in plain lines: :func:`metrics_lines`;
- :mod:`.runs` — the one-line-per-run summary the CLI prints after training;
- :mod:`.folder` — ``report.md`` / ``report.html`` of a results folder;
- :mod:`.html` — Markdown to a self-contained HTML page.
"""

from __future__ import annotations

from creditaudit.formatting import fmt, format_lambda, markdown_table
from creditaudit.report.protocol import (
    FORMATS,
    render,
    render_latex,
    render_markdown,
    render_text,
)
from creditaudit.report.run_metrics import metrics_lines
from creditaudit.report.runs import format_run_summary

__all__ = ["FORMATS", "render", "render_text", "render_markdown", "render_latex",
           "metrics_lines", "format_run_summary", "fmt", "format_lambda", "markdown_table"]
