"""Reports of a results folder: audit table rows, verdicts, (d) against frozen runs, and a
self-contained HTML page."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.figures import RunIndex
from creditaudit.protocol import DiagnosticReport, Thresholds, depth_utility_diagnostic
from creditaudit.report.folder import write_report
from creditaudit.report.html import markdown_to_html
from creditaudit.training import train

SMOKE = {
    "data.n_train": 512, "data.n_test": 256, "data.in_dim": 16, "model.d": 16,
    "model.n_blocks": 2, "optim.batch_size": 64, "optim.epochs": 2,
    "diagnostics.eval_samples": 256, "diagnostics.rho_samples": 64,
    "diagnostics.rho_directions": 4, "diagnostics.null_draws": 3, "run.progress": False,
    "run.threads": 1,
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report_runs")
    previous = torch.get_num_threads()
    try:
        for method in ("bp", "dfa", "frozen"):
            train(RunConfig().replace(**SMOKE, **{"method.name": method,
                                                  "run.out_dir": str(out)}))
    finally:
        torch.set_num_threads(previous)
    # A failed run without protocol block still gets its row.
    source = next(out.glob("dfa-*"))
    record = json.loads((source / "record.json").read_text())
    record.update(status="failed", protocol={}, final=None, error="RuntimeError: boom")
    failed = out / "failed-copy"
    failed.mkdir()
    (failed / "record.json").write_text(json.dumps(record))
    return out


def records(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.rglob("record.json"))]


def audit_lines(markdown: str) -> list[str]:
    section = markdown.split("## Audit table", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def test_report_cli_writes_a_row_per_run_with_verdicts(results, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(results), "--out", str(out), "--no-frozen-from-runs"]) == 0
    stdout = capsys.readouterr().out
    assert "report.md" in stdout and "report.html" in stdout
    markdown = (out / "report.md").read_text()
    rows = audit_lines(markdown)
    recs = records(results)
    assert len(rows) == len(recs) == 4
    for record in recs:
        row = [r for r in rows if record["run_id"] in r and record["status"] in r]
        assert len(row) == 1, record["run_id"]
        verdict = record["protocol"].get("verdict")
        if record["config"]["method"]["name"] == "frozen":
            assert "baseline of (d)" in row[0]  # the baseline gets no verdict of its own
        elif verdict is not None:
            report = DiagnosticReport.from_dict(record["protocol"]["report"])
            assert report.verdict_text in row[0]
            assert "trustworthy" not in row[0]  # (d) was not evaluated
            a = report.diagnostic("a")
            word = "**fired**" if a.fired else a.status
            assert f"| {word} {a.value:.3g} |" in row[0]
        else:
            assert "run failed" in row[0]
    # The reporting template of every audited run, rendered by DiagnosticReport.
    assert markdown.count("| id | diagnostic | value | fires when | status | reason |") == 3
    # Only the audit panels can be drawn from bp/dfa/frozen; the rest say what they need.
    assert "![fig6_audit_panels](figures/fig6_audit_panels.png)" in markdown
    assert "Figure 1 — audit hero** — needs: FA runs" in markdown
    assert "--frozen-from-runs` to evaluate (d)" in markdown


def test_report_html_is_self_contained(results, tmp_path):
    files = write_report(RunIndex.from_dir(results), tmp_path / "r")
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    png = files.rendered[0].pngs[0].read_bytes()
    assert base64.b64decode(embedded) == png
    assert page.count("<table>") >= 2 and "<h2>Audit table</h2>" in page
    for record in records(results):
        assert record["run_id"] in page


def test_frozen_from_runs_reevaluates_d(results, tmp_path):
    index = RunIndex.from_dir(results, frozen_from_runs=True)
    files = write_report(index, tmp_path / "r", rendered=[], missing=[])
    markdown = files.markdown.read_text()
    recs = records(results)
    frozen = [r for r in recs if r["config"]["method"]["name"] == "frozen"][0]
    frozen_acc = frozen["final"]["test_acc"]
    rows = audit_lines(markdown)
    for record in recs:
        if record["config"]["method"]["name"] == "frozen" or record["status"] == "failed":
            continue
        d = depth_utility_diagnostic(record["final"]["test_acc"], frozen_acc, Thresholds())
        row = [r for r in rows if record["run_id"] in r and "completed" in r][0]
        status = "**fired**" if d.fired else "passed"
        assert f"| {status} {d.value:+.2f} pp |" in row
        assert row.rstrip(" |").endswith("†")
        if d.fired:
            assert "needs walk-back" in row and "(d)" in row
    assert "† (d) re-evaluated against the mean final accuracy" in markdown
    # The record itself is untouched: its (d) was not evaluated.
    assert all(r["protocol"]["report"]["diagnostics"]["d"]["status"] == "not evaluated"
               for r in recs if r["protocol"])


def test_markdown_to_html(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(b"\x89PNG fake")
    text = ("# Title <x>\n\nSome **bold** and `co|de` & text\nsame paragraph\n\n"
            "| a | b \\| c |\n|---|---|\n| 1 | <script> |\n\n"
            "```\nx < y\n```\n\n- item one\n- item two\n\n![fig](a.png)\n\n![gone](b.png)\n")
    page = markdown_to_html(text, base_dir=tmp_path)
    flat = " ".join(page.split())  # layout whitespace aside
    assert "<h1>Title &lt;x&gt;</h1>" in flat
    assert "<p>Some <strong>bold</strong> and <code>co|de</code> &amp; text same paragraph</p>" \
        in flat
    assert "<th>b | c</th>" in flat and "<td>&lt;script&gt;</td>" in flat  # no raw HTML
    assert "<script>" not in page
    assert "<pre><code>x &lt; y </code></pre>" in flat
    assert "<ul> <li>item one</li> <li>item two</li> </ul>" in flat
    assert f'src="data:image/png;base64,{base64.b64encode(image.read_bytes()).decode()}"' in page
    assert "image b.png could not be read" in page


def test_report_on_missing_folder_is_one_line_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_report_skips_unreadable_records(results, tmp_path, plant):
    copy = tmp_path / "runs"
    shutil.copytree(results, copy)
    plant(copy / "broken" / "record.json", "{not json")
    files = write_report(RunIndex.from_dir(copy), tmp_path / "r", rendered=[], missing=[])
    markdown = files.markdown.read_text()
    assert "could not be read" in markdown and "broken" in markdown
    assert len(audit_lines(markdown)) == 4


# --- LaTeX -----------------------------------------------------------------------------------
def latex_reports(results: Path) -> list[DiagnosticReport]:
    """The audited runs' reports; one given a method and architecture full of specials."""
    reports = [DiagnosticReport.from_dict(r["protocol"]["report"]) for r in records(results)
               if r["protocol"]]
    reports[0].metadata.update(method="my_rule&co #1 50%", arch="x{d}~^\\ λ — Γ")
    return reports


def test_latex_is_a_whole_table_with_a_header_and_a_row_per_run(results):
    from creditaudit.report import render_latex

    reports = latex_reports(results)
    lines = render_latex(reports).splitlines()
    assert lines[0].startswith(r"\begin{tabular}{") and lines[-1] == r"\end{tabular}"
    n_columns = len(re.match(r"\\begin\{tabular\}\{(\w+)\}", lines[0]).group(1))
    rows = [line for line in lines if line.endswith(r"\\")]
    assert rows[0].startswith("method & architecture & test acc")
    assert len(rows) == 1 + len(reports) == 4
    for row in rows:  # every row has the header's columns: no unescaped & in a cell
        assert len(re.split(r"(?<!\\)&", row)) == n_columns, row
    assert r"my\_rule\&co \#1 50\%" in rows[1]
    assert r"x\{d\}\textasciitilde{}\textasciicircum{}\textbackslash{} $\lambda$ --- $\Gamma$" \
        in rows[1]
    for row, report in zip(rows[1:], reports):
        assert report.verdict_text.replace("–", "--") in row
    assert render_latex(reports).isascii()  # pdflatex without inputenc reads it
    assert render_latex(reports[1]).count(r" \\") == 2  # one report: header and its row


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed "
                    "(apt-get install texlive-latex-base): the table's compilation not checked")
def test_latex_table_compiles_with_pdflatex(results, tmp_path):
    import subprocess

    from creditaudit.report import render_latex

    (tmp_path / "table.tex").write_text(render_latex(latex_reports(results)))
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\begin{document}\n"
                                      "\\input{table}\n\\end{document}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                           "doc.tex"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 0
