"""Reports of a results folder: audit table rows, verdicts, (d) against frozen runs, and a
self-contained HTML page."""

from __future__ import annotations

import base64
import json
import re
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.figures import render_all
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DiagnosticReport,
    Thresholds,
    depth_utility_diagnostic,
)
from creditaudit.records import RunRecord, load_record
from creditaudit.report.folder import (
    audit_table,
    classifier,
    render_report_markdown,
    summary_table,
    write_report,
)
from creditaudit.report.html import compact_png, markdown_to_html
from creditaudit.report.settings import differing_settings
from creditaudit.results import RunIndex
from creditaudit.run.trainer import train
from integrity_support import as_written

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
    # A failed run without protocol block: a row in the section of unfinished runs.
    source = next(out.glob("dfa-*"))
    record = json.loads((source / "record.json").read_text())
    # Its own run id: a copy of the dfa run's id would be that run, counted once.
    record.update(status="failed", protocol={}, final=None, error="RuntimeError: boom",
                  run_id=record["run_id"].rsplit("-", 1)[0] + "-0000000000")
    failed = out / "failed-copy"
    failed.mkdir()
    (failed / "record.json").write_text(as_written(record))
    return out


def records(results: Path) -> list[dict]:
    """The records below ``results`` as dicts, every value in place (record.json stores
    each number once: the headline numbers are read from their epoch's entry)."""
    return [load_record(p).to_dict() for p in sorted(results.rglob("record.json"))]


def section_lines(markdown: str, heading: str) -> list[str]:
    """The table rows (header aside) of the section under ``## heading``."""
    if f"## {heading}" not in markdown:
        return []
    section = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def audit_lines(markdown: str) -> list[str]:
    return section_lines(markdown, "Audit table")


def unfinished_lines(markdown: str) -> list[str]:
    return section_lines(markdown, "Runs that did not finish")


def test_report_cli_writes_a_row_per_run_with_verdicts(results, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(results), "--out", str(out), "--no-frozen-from-runs"]) == 0
    stdout = capsys.readouterr().out
    assert "report.md" in stdout and "report.html" in stdout
    markdown = (out / "report.md").read_text()
    rows = audit_lines(markdown)
    recs = records(results)
    assert len(recs) == 4 and len(rows) == 3  # the failed run is in its own section
    for record in recs:
        row = [r for r in rows if record["run_id"] in r and record["status"] in r]
        if record["status"] == "failed":
            assert row == [] and record["run_id"] in unfinished_lines(markdown)[0]
            continue
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
    # The reporting template of every audited run, rendered by DiagnosticReport.
    assert markdown.count("| id | diagnostic | value | fires when | status | reason |") == 3
    # Only the audit panels can be drawn from bp/dfa/frozen; the rest say what they need.
    assert "![fig6_audit_panels](figures/fig6_audit_panels.png)" in markdown
    assert "Figure 1 — audit hero** — needs: FA runs" in markdown
    # --no-frozen-from-runs left (d) unevaluated: the note says that the default evaluates it.
    assert "run `creditaudit report` without `--no-frozen-from-runs` (by default it " \
        "evaluates (d) against them)" in markdown


def test_report_html_is_self_contained(results, tmp_path):
    index = RunIndex.from_dir(results)
    rendered, missing = render_all(index, tmp_path / "r" / "figures")
    files = write_report(index, tmp_path / "r", rendered=rendered, missing=missing)
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    assert 'src="http' not in page and "<link" not in page and " src=" not in page.replace(
        ' src="data:', "")
    assert page.count("<script") == 1 and "<script>" in page  # one inline script, no file
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    png = files.rendered[0].pngs[0].read_bytes()
    assert base64.b64decode(embedded) == compact_png(png)
    assert page.count('<table class="interactive">') == 3 and "<h2>Audit table</h2>" in page
    for record in records(results):
        assert record["run_id"] in page
    # Each finished run's template is folded under a line with its run id and verdict.
    audited = [r["run_id"] for r in records(results) if r["protocol"]]
    summaries = re.findall(r"<summary><code>([^<]+)</code> <strong[^>]*>[^<]+</strong>"
                           r"</summary>", page)
    assert sorted(summaries) == sorted(audited) and page.count("<details>") == len(audited)


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
    page = markdown_to_html(text, images={"a.png": image, "b.png": tmp_path / "b.png"})
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


def test_a_report_html_that_cannot_be_written_leaves_the_old_report_md(results, tmp_path):
    from creditaudit.errors import OutputError

    out = tmp_path / "r"
    (out / "report.html").mkdir(parents=True)  # a folder where the page goes
    (out / "report.md").write_text("old report\n")
    with pytest.raises(OutputError, match="report.html"):
        write_report(RunIndex.from_dir(results), out, rendered=[], missing=[])
    assert (out / "report.md").read_text() == "old report\n"  # not a new one beside no page


def test_report_skips_unreadable_records(results, tmp_path, plant):
    copy = tmp_path / "runs"
    shutil.copytree(results, copy)
    plant(copy / "broken" / "record.json", "{not json")
    files = write_report(RunIndex.from_dir(copy), tmp_path / "r", rendered=[], missing=[])
    markdown = files.markdown.read_text()
    assert "could not be read" in markdown and "broken" in markdown
    assert len(audit_lines(markdown)) == 3 and len(unfinished_lines(markdown)) == 1


# --- LaTeX -----------------------------------------------------------------------------------
def latex_reports(results: Path) -> list[DiagnosticReport]:
    """The audited runs' reports; one given a method and architecture full of specials."""
    reports = [DiagnosticReport.from_dict(r["protocol"]["report"]) for r in records(results)
               if r["protocol"]]
    reports[0].metadata.update(method="my_rule&co #1 50%", arch="x{d}~^\\ λ — Γ h_0…h_3")
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
    # an adapted model's own label (``4 states h_0…h_3``): its ellipsis, not a ?
    assert r"$\Gamma$ h\_0\ldots{}h\_3 &" in rows[1]
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



# --- runs told apart --------------------------------------------------------------------------
def variant(record: dict, run_id: str, **settings) -> dict:
    """A copy of ``record`` under ``run_id`` with dotted config ``settings`` changed."""
    copy = json.loads(json.dumps(record))
    copy["run_id"] = run_id
    for key, value in settings.items():
        section, name = key.split(".")
        copy["config"][section][name] = value
    return copy


def index_of(raws: list[dict], **kwargs) -> RunIndex:
    return RunIndex.from_records([RunRecord.from_dict(raw) for raw in raws], **kwargs)


def first(results: Path, method: str) -> dict:
    return next(r for r in records(results) if r["config"]["method"]["name"] == method
                and r["status"] == "completed")


def test_runs_that_differ_in_a_setting_get_a_column_for_it(results):
    bp = first(results, "bp")
    longer = variant(bp, "bp-longer", **{"optim.epochs": 4})
    bigger = variant(bp, "bp-bigger", **{"data.n_train": 1024})
    other_seed = variant(bp, "bp-seed-7", **{"run.seed": 7})
    index = index_of([bp, longer, bigger, other_seed])
    audit = audit_table(index, index.runs)
    assert {"optim.epochs", "data.n_train"} <= set(audit.columns)
    assert "optim.lr" not in audit.columns and "run.seed" not in audit.columns  # equal; shown
    markdown = render_report_markdown(index)
    rows = [tuple(line.split(" | ")[1:]) for line in audit_lines(markdown)]  # run id aside
    assert len(rows) == len(set(rows)) == 4
    # Across seeds: the seed-7 run joins bp's row; the others are rows of their own.
    summary = section_lines(markdown, "Summary across seeds")
    assert len(summary) == len(set(summary)) == 3
    assert sum("| 7, 42 |" in line for line in summary) == 1
    assert summary_table(index, index.runs).columns[4:6] == ["data.n_train", "optim.epochs"]
    # Data from other files (same config): the data source tells the runs apart.
    moved = variant(bp, "bp-other-files")
    moved["data"]["source"] = "f" * 64
    assert "data source" in audit_table(index_of([bp, moved]), index_of([bp, moved]).runs
                                        ).columns


def test_an_option_of_one_rule_brings_no_column_beside_rules_without_it(results):
    """A Fashion-MNIST sweep of BP, FA, DFA, the Credit Bridge and frozen blocks gave both
    tables a `settings` column of nine rule options, `method.bridge_hidden=—, …` on every
    BP row, though the method column tells the rules apart; an option differs only between
    runs of rules that have it."""
    bp, dfa = first(results, "bp"), first(results, "dfa")
    assert "normalise_credit" in dfa["config"]["method"]
    assert "normalise_credit" not in bp["config"]["method"]
    index = index_of([bp, dfa])
    for table in (audit_table(index, index.runs), summary_table(index, index.runs)):
        assert not [c for c in table.columns if c.startswith("method.") or c == "settings"]
    raw = variant(dfa, "dfa-raw", **{"method.normalise_credit": False})
    index = index_of([bp, dfa, raw])
    audit = audit_table(index, index.runs)
    assert sorted(row["method.normalise_credit"] for row in audit.rows) == ["no", "yes", "—"]


def test_audit_panels_say_which_recipe_a_column_of_mixed_recipes_draws(results):
    """Figure 6 drew BP at optim.lr 50 (growth 1.3e3×) in one column with BP at 1e-3 on a
    real MNIST-1D folder: one `BP` column, nothing telling the two recipes apart. Each
    column now names its recipe, and a note says how the recipes differ."""
    from creditaudit.figures import audit_panels

    bp = first(results, "bp")
    index = index_of([bp, variant(bp, "bp-fast", **{"optim.lr": 50.0})])
    cats, _ = audit_panels.panel_points(audit_panels.select(index))
    assert sorted(cats) == ["BP\nrecipe 1", "BP\nrecipe 2"]
    fig = audit_panels.build(index)[audit_panels.NAME]
    [note] = [t.get_text() for t in fig.texts if t.get_gid() == "recipes"]
    assert note in {"Recipes: 2 differs from 1 in optim.lr: 50.0 vs 0.001.",
                    "Recipes: 2 differs from 1 in optim.lr: 0.001 vs 50.0."}
    cats, _ = audit_panels.panel_points(audit_panels.select(index_of([bp])))
    assert cats == ["BP"]  # one recipe: no number


def test_unfinished_runs_have_their_own_section_and_no_summary_row(results):
    dfa = first(results, "dfa")
    failed_fa = variant(dfa, "fa-failed", **{"method.name": "fa"})
    failed_fa.update(status="failed", protocol={}, final=None, error="RuntimeError: x | y")
    running = variant(dfa, "dfa-running", **{"optim.epochs": 9})
    running.update(status="running", final=None, protocol={})
    index = index_of([*records(results), failed_fa, running])
    markdown = render_report_markdown(index)
    assert not any("fa-failed" in line or "dfa-running" in line or "failed" in line
                   for line in audit_lines(markdown))
    unfinished = unfinished_lines(markdown)
    assert len(unfinished) == 3  # the fixture's failed copy, fa-failed, dfa-running
    assert any("fa-failed" in line and r"RuntimeError: x \| y" in line for line in unfinished)
    assert any("dfa-running" in line and "| running |" in line for line in unfinished)
    summary = section_lines(markdown, "Summary across seeds")
    assert not any(line.startswith("| FA |") for line in summary)  # failed runs only: no row
    dfa_rows = [line for line in summary if line.startswith("| DFA |")]
    assert len(dfa_rows) == 1 and "| 42 |" in dfa_rows[0]  # not "42, 42": the failed copy


def test_a_run_that_stopped_early_stays_out_of_its_summary_rows_means(results):
    """Its numbers are of an earlier epoch than its row's other runs': a mean over both was
    a mean over runs of different lengths. Its seed is marked, its verdict counted, and a
    line under the table names it."""
    dfa = first(results, "dfa")
    early = variant(dfa, "dfa-early", **{"run.seed": 7})
    early["stopped_early"] = {"epoch": 1, "reason": "protocol verdict needs walk-back: (a)"}
    early["final"]["test_acc"] = 0.5
    index = index_of([dfa, early])
    assert index.runs[0].final_acc != index.runs[1].final_acc
    [row] = summary_table(index, index.runs).rows
    assert row["seeds"] == "7 (stopped early), 42"
    assert row["test acc"] == f"{dfa['final']['test_acc']:.3f} (1 run)"  # no spread of one
    assert row["walked back"].endswith("/2")
    markdown = render_report_markdown(index)
    assert ("Left out of the end-of-run means (they would mix runs of different lengths): "
            "DFA seed 7 stopped early at epoch 1: protocol verdict needs walk-back: (a).") \
        in markdown.split("## Summary across seeds", 1)[1]


def test_a_running_record_says_whether_a_process_holds_it(results, tmp_path):
    """A record left running by a sweep's worker that was killed (or whose failure could
    not be written) read as running; its claim file says whether a process still holds it.
    Runs without a claim (creditaudit train, own loops) stay plain 'running'."""
    import os
    import socket
    import subprocess
    import sys

    from creditaudit.records import CLAIM_FILE

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    claims = {"dfa-live": (os.getpid(), host, 0), "dfa-killed": (gone.pid, host, 0),
              "dfa-silent": (1, "another-host", 3600), "dfa-unclaimed": None}
    dfa = first(results, "dfa")
    for run_id, claim in claims.items():
        raw = variant(dfa, run_id)
        raw.update(status="running", final=None, protocol={})
        folder = tmp_path / "runs" / run_id
        folder.mkdir(parents=True)
        (folder / "record.json").write_text(as_written(raw))
        if claim is not None:
            pid, where, age = claim
            path = folder / CLAIM_FILE
            path.write_text(json.dumps({"pid": pid, "host": where, "token": "t"}))
            os.utime(path, (path.stat().st_mtime - age,) * 2)
    markdown = render_report_markdown(RunIndex.from_dir(tmp_path / "runs"))
    rows = {run_id: line for line in unfinished_lines(markdown) for run_id in claims
            if run_id in line}
    # The first line counts the killed and the silent run apart from those that may run.
    assert "4 run records in " in markdown
    assert " (2 running, 2 running (no process holds it))." in markdown.splitlines()[2]
    assert f"| running (held by pid {os.getpid()} on {host}) |" in rows["dfa-live"]
    assert (f"| running (no process holds it: interrupted? pid {gone.pid} on {host} is "
            "gone) |") in rows["dfa-killed"]
    assert ("| running (no process holds it: interrupted? the claim of pid 1 on "
            "another-host has had no heartbeat for 60 min) |") in rows["dfa-silent"]
    assert "| running |" in rows["dfa-unclaimed"]


def test_an_interrupted_run_a_live_process_holds_is_said_to_be_trained_again(results,
                                                                             tmp_path):
    """A resume (or --force) that has not yet written its first record leaves the record
    interrupted (or failed) while the claim says a live process trains it again."""
    import os
    import socket

    from creditaudit.records import CLAIM_FILE

    dfa = first(results, "dfa")
    for run_id, status in (("dfa-resuming", "interrupted"), ("dfa-forced", "failed"),
                           ("dfa-left", "interrupted")):
        raw = variant(dfa, run_id)
        raw.update(status=status, final=None, protocol={})
        folder = tmp_path / "runs" / run_id
        folder.mkdir(parents=True)
        (folder / "record.json").write_text(as_written(raw))
        if run_id != "dfa-left":
            (folder / CLAIM_FILE).write_text(json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "token": "t"}))
    markdown = render_report_markdown(RunIndex.from_dir(tmp_path / "runs"))
    rows = {line.split("|")[1].strip(): line for line in unfinished_lines(markdown)
            if "dfa-" in line}
    who = f"pid {os.getpid()} on {socket.gethostname()}"
    assert [line for line in rows.values() if "dfa-resuming" in line][0].count(
        f"| interrupted (being trained again by {who}) |") == 1
    assert any(f"| failed (being trained again by {who}) |" in line and "dfa-forced" in line
               for line in rows.values())
    assert any("| interrupted |" in line and "dfa-left" in line for line in rows.values())


def test_a_claim_not_readable_yet_names_no_pid(results, tmp_path):
    """A claim just created that is a folder, or empty, is being written for its 30 s of
    grace: the run read "being trained again by pid ? on ?". It says what is known now, and
    a claim that names no pid or host does not make one up."""
    import os

    from creditaudit.records import CLAIM_FILE
    from creditaudit.report.runs import status_text

    dfa = first(results, "dfa")
    claims = {"dfa-folder": None, "dfa-empty": "", "dfa-hostless": '{"pid": 7}',
              "dfa-old": ""}
    texts = {}
    for run_id, claim in claims.items():
        raw = variant(dfa, run_id)
        raw.update(status="running" if run_id == "dfa-old" else "interrupted", final=None,
                   protocol={})
        folder = tmp_path / "runs" / run_id
        folder.mkdir(parents=True)
        (folder / "record.json").write_text(as_written(raw))
        path = folder / CLAIM_FILE
        path.mkdir() if claim is None else path.write_text(claim)
        if run_id == "dfa-old":
            os.utime(path, (path.stat().st_mtime - 90,) * 2)
        texts[run_id] = status_text(RunRecord.from_dict(raw), folder)
    assert texts["dfa-folder"] == ("interrupted (being trained again by a process whose "
                                   "claim is being written)")
    assert texts["dfa-empty"] == texts["dfa-folder"]
    assert texts["dfa-hostless"] == "interrupted (being trained again by pid 7 (its host " \
        "not named))"
    assert texts["dfa-old"] == ("running (no process holds it: interrupted? its claim has "
                                "been unreadable for 90 s)")
    assert not any("?" in text.split("interrupted?")[-1] for text in texts.values())


def test_verdicts_are_coloured_by_meaning_and_spelled_out():
    """Each verdict's colour class is its judgement's kind (never read back from its words);
    four colours apart in every colour vision, text on each readable."""
    from colour_support import closest_pair, contrast
    from creditaudit.formatting import VERDICT_COLORS
    from creditaudit.protocol import judge
    from creditaudit.report.html import CSS, markdown_fragment

    statuses = {"a": PASSED, "b": PASSED, "c": PASSED, "d": PASSED}
    failed = {"verified": False, "how": "failed", "where": "blocks.1.w2", "detail": "x"}
    judged = {"pass": judge(statuses),
              "walk-back": judge({**statuses, "a": FIRED, "d": NOT_EVALUATED}),
              "incomplete": judge({**statuses, "d": NOT_EVALUATED}),
              "unverified": judge(statuses, failed)}
    assert {kind: j.kind for kind, j in judged.items()} == {k: k for k in judged}
    classify = classifier({j.text: j.kind for j in judged.values()})
    for css, j in judged.items():
        assert classify("td", j.text, "verdict") == css
        assert classify("strong", f"Verdict: {j.text}", "") == css
        # Only a verdict column's cell, or the bold verdict line, is a verdict.
        assert classify("td", j.text, "method") is None
        assert classify("strong", j.text, "") is None
    assert classify("td", "baseline of (d)", "verdict") is None
    assert classify("td", "0.9", "verdict") is None
    assert classify("strong", "fired", "") == "fired"
    table = "| run | verdict |\n|---|---|\n" + "".join(f"| r{i} | {j.text} |\n"
                                                      for i, j in enumerate(judged.values()))
    fragment = markdown_fragment(table + "\n**Verdict: trustworthy**\n", classify=classify)
    for css, j in judged.items():  # (a module name in backticks is a code span)
        assert f'<td class="{css}">{j.text.split("`")[0]}' in fragment
    assert '<strong class="pass">Verdict: trustworthy</strong>' in fragment
    # Four colours apart in every colour vision; text on them readable (WCAG AA).
    assert set(VERDICT_COLORS) == set(judged)
    assert closest_pair(list(VERDICT_COLORS.values()))[0] >= 10
    for css, color in VERDICT_COLORS.items():
        rule = re.search(rf"td\.{css}, [^{{]*\{{ background: (#\w+); color: (#\w+);", CSS)
        assert rule and rule.group(1) == color, css
        assert contrast(rule.group(2), color) >= 4.5
    assert "strong {" not in CSS  # bold text is no longer red whatever it says


@pytest.fixture(scope="module")
def bare_results(tmp_path_factory) -> Path:
    """Runs as `creditaudit demo` trains them: no end-of-run metrics."""
    out = tmp_path_factory.mktemp("bare_runs")
    previous = torch.get_num_threads()
    try:
        for method in ("bp", "frozen"):
            train(RunConfig().replace(**{**SMOKE, "optim.epochs": 1, "method.name": method,
                                         "run.out_dir": str(out),
                                         "diagnostics.end_of_run": False}))
    finally:
        torch.set_num_threads(previous)
    return out


def template_columns(markdown: str) -> dict[str, list[str]]:
    """Column → every cell under it, over the templates' tables."""
    section = markdown.split("## Reporting template, per run", 1)[1]
    columns: dict[str, list[str]] = {}
    header = None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if header is None:
            header = cells
        elif not line.startswith("|---"):
            for name, value in zip(header, cells):
                columns.setdefault(name, []).append(value)
    return columns


def test_templates_leave_out_what_no_run_fills_and_say_why(results, bare_results, tmp_path):
    bare = write_report(RunIndex.from_dir(bare_results), tmp_path / "bare", rendered=[],
                        missing=[]).markdown.read_text()
    note = next(line for line in bare.splitlines() if line.startswith("Left out of every"))
    for name in ("Γ (aggregation)", "per-layer Γ", "cos(a_l, g_l)", "diagnostics.end_of_run"):
        assert name in note
    columns = template_columns(bare)
    assert columns and all(set(cells) != {"—"} for cells in columns.values()), columns
    assert "Γ (aggregation)" not in columns and "test acc" in columns
    # Runs with end-of-run metrics keep those columns.
    full = write_report(RunIndex.from_dir(results), tmp_path / "full", rendered=[],
                        missing=[]).markdown.read_text()
    assert "diagnostics.end_of_run" not in full and "Γ (aggregation)" in template_columns(full)


def test_compact_png_keeps_the_picture_and_its_colours(tmp_path):
    import io

    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, color in enumerate(("#1965B0", "#DC050C", "#4EB265", "#F1932D")):
        ax.plot(np.arange(50), np.sin(np.arange(50) / 5 + i), color=color, lw=2)
        ax.fill_between(np.arange(50), i, i + 0.5, color=color, alpha=0.2)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=200)
    plt.close(fig)
    png = buffer.getvalue()
    small = compact_png(png)
    assert len(small) < len(png) / 2
    before = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    after = np.asarray(Image.open(io.BytesIO(small)).convert("RGB")).astype(int)
    assert before.shape == after.shape
    values, counts = np.unique(before.reshape(-1, 3), axis=0, return_counts=True)
    for color in values[np.argsort(-counts)[:10]]:  # the dominant colours stay exact
        where = (before == color).all(axis=2)
        assert (after[where] == color).all()
    assert np.abs(before - after).mean() < 1.0
    # Transparent images and non-PNG bytes are left alone.
    transparent = io.BytesIO()
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(transparent, format="PNG")
    assert compact_png(transparent.getvalue()) == transparent.getvalue()
    assert compact_png(b"not a png") == b"not a png"


@pytest.mark.parametrize("command", ["report", "figures"])
def test_dataset_without_runs_is_refused_naming_those_held(results, tmp_path, capsys,
                                                           command):
    """``--dataset nosuch`` once wrote a report of "0 run records" saying the folder held
    no finished runs, although it did; now one line names the datasets it holds."""
    out = tmp_path / "out"
    assert main([command, str(results), "--dataset", "nosuch", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"no run records of dataset 'nosuch' in {results} (it holds: synthetic)" in err
    assert not out.exists()


@pytest.mark.parametrize("held", [(), ("config.toml",), ("init.pt",)])
def test_a_folder_holding_no_run_records_is_refused_writing_nothing(tmp_path, capsys, held):
    """`creditaudit report DIR` of a folder holding no runs (none, a researcher's own
    config.toml, a starting run's init.pt) once wrote DIR/report/report.html of "0 run
    records"; now one line says there is nothing to report, and why, and writes nothing."""
    for name in held:
        (tmp_path / name).write_text("x\n")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{tmp_path} holds no run records (record.json below it)" in err
    assert ("of a run that has not written its record yet" in err) == ("init.pt" in held)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(held)


@pytest.mark.parametrize("command", ["report", "figures"])
def test_empty_or_file_results_path_is_refused(tmp_path, capsys, monkeypatch, command):
    """An empty RESULTS_DIR once read the current folder silently."""
    monkeypatch.chdir(tmp_path)
    assert main([command, ""]) == 2
    assert "empty path" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x\n")
    assert main([command, "afile"]) == 2
    assert "afile is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_plugins_declared_failures_are_named_in_the_report(results):
    """A plugin that fails a conformance check by design (``expected_failures``) runs, and
    its record keeps the check and its reason "so a reader sees what its numbers do not
    claim": the report, which no table of shows it, says so in one line each (the reason
    is the guest's text: it reads as itself, on one line)."""
    dfa = first(results, "dfa")
    declared = variant(dfa, "dfa-declared")
    model = declared["environment"]["components"]["model"]
    model.update(origin="my-plugins==0.1.0", declared_failures={
        "terminal_ln_is_what_the_readout_does": "hides a <b>LN</b> | by\ndesign"})
    markdown = render_report_markdown(index_of([dfa, declared]))
    line = ("- dfa-declared: architecture plugin 'resmlp' (my-plugins==0.1.0) fails "
            "terminal_ln_is_what_the_readout_does by design: hides a \\<b>LN\\</b> \\| by "
            "design")
    assert line in markdown.splitlines()
    assert markdown.count("by design:") == 1  # the plain run declares nothing
    page = markdown_to_html(markdown)
    assert "hides a &lt;b&gt;LN&lt;/b&gt; | by design" in page


def test_a_factory_given_an_argument_and_not_reads_apart(results):
    """Since an option only some runs have brought no column beside runs without it, two
    runs alike in every fixed column read alike too: two runs of one factory, one given
    model.args.d = 8 and one no model.args (or another argument, model.args.n = 2), gave
    identical rows (no model.args column: each key was held by one run only). The absence
    is told apart where no fixed column does it."""
    dfa = RunRecord.from_dict(first(results, "dfa"))
    factory = {"model.arch": "module",
               "model.factory": "creditaudit.testing.zoo:TransformerClassifier"}

    def of(run_id: str, args: dict | None) -> RunRecord:
        with warnings.catch_warnings():  # model.d, model.n_blocks: not the factory's
            warnings.simplefilter("ignore")
            return replace(dfa, run_id=run_id,
                           config=dfa.config.replace(**factory, **{"model.args": args}))

    for other in (None, {"n": 2}):
        runs = [of("given-d", {"d": 8}), of("other", other)]
        assert differing_settings(runs), other
        index = RunIndex.from_records(runs)
        audit = audit_table(index, index.runs)
        cells = [" ".join(str(row.get(c)) for c in audit.columns if c.startswith("model.args")
                          or c == "settings") for row in audit.rows]
        assert len(set(cells)) == 2, (audit.columns, cells)
