"""A guest's words — a plugin's label, a diagnostic's short name or reason, a name a record
holds — read as themselves in every output: a figure draws them without parsing mathtext
(an invalid ``$\\frac$`` stopped the figure, and with it ``creditaudit report``, as our
internal error), report.md's sentence of thresholds cannot turn them into a heading or a
link, and no plain-text output, LaTeX table or error line carries a line break or a
terminal escape sequence of theirs. The guests: tests/guest_pkg ``text_*``."""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path

import pytest
from matplotlib.text import Text

from creditaudit.config import RunConfig
from creditaudit.figures import audit_panels, run_curves
from creditaudit.protocol import (
    FIRED,
    PASSED,
    DiagnosticReport,
    DiagnosticResult,
    protocol,
    verdict_of,
)
from creditaudit.records import SCHEMA, RunRecord
from creditaudit.registry import DIAGNOSTICS, RULES
from creditaudit.report import render
from creditaudit.report.html import markdown_fragment
from creditaudit.report.notes import thresholds_text
from creditaudit.results import RunIndex
from door_support import guests

RULE_NAMES = ("text-math-label", "text-dollar-label", "text-control-label")
DIAGNOSTIC = "text_markup"
ESCAPE = "\x1b"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    with guests(tmp_path_factory.mktemp("site"), *RULE_NAMES, DIAGNOSTIC):
        yield


def _record(method: str, extra: DiagnosticResult | None = None, model: str | None = None
            ) -> RunRecord:
    """A finished record of ``method`` (one trained epoch), its protocol block holding the
    four diagnostics and ``extra``; ``model``: the label its model described itself by."""
    config = RunConfig().to_dict()
    config["method"]["name"] = method
    results = [DiagnosticResult(d.name, d.label, value, d.limit(), PASSED, "")
               for d, value in zip(protocol(), (1.2, 4e-4, 0.1, 5.0))]
    results += [extra] if extra is not None else []
    verdict, fired, skipped = verdict_of(results)
    report = DiagnosticReport([1.0, 1.2], [1e-3, 4e-4], results, verdict, fired, skipped)
    entry = {"epoch": 1, "acc_eval": 0.5, "test_acc": 0.5, "hidden_norms": [1.0, 1.2],
             "bp_grad_norms_per_sample_med": [1e-3, 4e-4], "g_L_zero_fraction": 0.0,
             "g_L_nonzero_median": 4e-4, "cos_per_layer": [0.5, 0.5],
             "protocol": {r.id: r.status for r in results}}
    return RunRecord.from_dict(copy.deepcopy({
        "schema": SCHEMA, "run_id": f"{method}-s42", "config": config, "status": "completed",
        "log": [{"epoch": 0, "acc_eval": 0.1}, entry],
        "final": {"epochs_completed": 1, "test_acc": 0.5},
        "diagnostics": {"gamma": {"samples_then_layers": 0.5}},
        "protocol": {"epoch": 1, "verdict": verdict, "fired": fired,
                     "report": report.to_dict()},
        "reference": {"verified": True, "how": "states", "where": None, "detail": "agrees"},
        **({"model": {"arch": "resmlp", "label": model}} if model else {})}))


def _drawn_as(text: Text) -> tuple[str, bool]:
    """What matplotlib draws of ``text``: (its characters, whether as mathtext)."""
    return text._preprocess_math(text.get_text())


def _drawn_texts(fig) -> list[tuple[str, bool]]:
    fig.savefig(io.BytesIO(), format="png", dpi=40)  # raised on an invalid expression
    return [_drawn_as(t) for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.usefixtures("installed")
def test_a_rule_label_is_drawn_as_itself_never_as_mathtext():
    index = RunIndex.from_records([_record(name) for name in RULE_NAMES])
    labels = [RULES.get(name).label for name in RULE_NAMES]
    flat = [" ".join(label.replace(ESCAPE, " ").splitlines()) for label in labels]
    for module in (run_curves, audit_panels):
        fig = module.build(index)[module.NAME]
        drawn = _drawn_texts(fig)
        for text in flat:  # as the legend, a tick label: the label's characters, not math
            assert (text, False) in drawn or any(text in t for t, _ in drawn), (module, text)
        # No guest text is typeset as math (our own axis labels are).
        assert not any(math and ("frac" in t or "$5" in t or "5 or" in t) for t, math in drawn)
        assert not any(ESCAPE in t for t, _ in drawn)


@pytest.mark.usefixtures("installed")
def test_a_diagnostic_label_is_drawn_as_itself():
    extra = DiagnosticResult(DIAGNOSTIC, "(text_markup)", 0.7, 0.5, FIRED, "reason")
    fig = audit_panels.build(RunIndex.from_records([_record("bp", extra)]))[audit_panels.NAME]
    drawn = _drawn_texts(fig)
    label = DIAGNOSTICS.get(DIAGNOSTIC).label
    assert (f"({DIAGNOSTIC}) {' '.join(label.splitlines())}", False) in drawn
    # A diagnostic not installed here is drawn by its record's name, as it is.
    panel = audit_panels.Panel.of("zz", r"stored $\sqrt$ name")
    title = Text(text=panel.title)
    assert _drawn_as(title) == (r"(zz) stored $\sqrt$ name", False)


@pytest.mark.usefixtures("installed")
def test_the_thresholds_sentence_reads_a_plugin_label_as_itself():
    page = markdown_fragment(f"Diagnostics fire when: {thresholds_text(['a', DIAGNOSTIC])}.\n")
    assert page.count("<p>") == 1 and "<h2>" not in page and "<a " not in page
    assert "<em>" not in page
    assert "[link](http://evil.example)" in page


@pytest.mark.usefixtures("installed")
def test_the_text_report_keeps_a_guest_reason_on_its_line():
    from creditaudit_guests.text_diagnostics import REASON

    extra = DiagnosticResult(DIAGNOSTIC, "markup\nname", 0.7, 0.5, FIRED, REASON)
    record = _record("bp", extra)
    report = RunIndex.from_records([record]).protocol_report(record)
    text = render(report, "text")
    assert ESCAPE not in text
    verdicts = [line for line in text.splitlines() if line.startswith("verdict:")]
    assert verdicts == [f"verdict: {report.judgement.text}"]  # no forged verdict line
    assert "share 0.7 verdict: trustworthy" in text
    assert ESCAPE not in render(report, "latex") and ESCAPE not in render(report, "md")


@pytest.mark.usefixtures("installed")
def test_report_of_runs_of_a_rule_labelled_with_mathtext_is_written(tmp_path, capsys):
    from creditaudit.cli import main
    from creditaudit.records import save_record

    for name in RULE_NAMES:
        (tmp_path / "runs" / name).mkdir(parents=True)
        save_record(tmp_path / "runs" / name, _record(name))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    assert "internal error" not in capsys.readouterr().err
    assert (tmp_path / "rep" / "figures" / "fig6_audit_panels.png").is_file()


def test_an_error_line_carries_no_terminal_escape_sequence(tmp_path, capsys):
    from creditaudit.cli import main

    assert main(["report", str(tmp_path / f"gone{ESCAPE}[2J")]) == 2
    err = capsys.readouterr().err
    assert ESCAPE not in err and err.startswith("creditaudit: error: ") and err.count("\n") == 1


def test_a_model_label_of_a_record_is_drawn_as_itself():
    label = r"Net $\frac$ d=8"
    index = RunIndex.from_records([_record("bp", model=label), _record("dfa", model=label)])
    drawn = _drawn_texts(run_curves.build(index)[run_curves.NAME])
    assert any(label in text and not math for text, math in drawn)


def test_a_sweep_progress_line_keeps_a_guest_error_on_it():
    from creditaudit.cli.sweep_output import SweepProgress

    outcome = {"run_id": "r1", "status": "failed", "action": "refused",
               "error": f"ConfigError: plugin raised RuntimeError: boom\n# x {ESCAPE}[2J"}
    line = SweepProgress.describe(outcome)
    assert line == "r1 failed (refused): ConfigError: plugin raised RuntimeError: boom # x  [2J"


def test_the_console_run_table_keeps_each_name_on_its_line():
    """A sweep names its runs by their grid values (the user's strings): a line break or an
    escape sequence in one neither splits the table nor reaches the terminal."""
    from creditaudit.report import format_run_summary
    from test_experiments import fake_record

    record = fake_record("dfa", 1, acc=0.5)
    record.stopped_early = {"epoch": 1, "reason": "finish() after epoch 1 of optim.epochs=2"}
    table = format_run_summary([record], names=[f"lr=0.1\nverdict: trustworthy {ESCAPE}[2J"])
    assert ESCAPE not in table
    assert not any(line.startswith("verdict:") for line in table.splitlines())
    assert any(line.startswith("lr=0.1 verdict: trustworthy") and "stopped early" in line
               for line in table.splitlines())


@pytest.fixture
def verdict_label_installed(tmp_path):
    with guests(tmp_path / "site", "text-verdict-label"):
        yield


@pytest.mark.usefixtures("verdict_label_installed")
def test_report_html_badges_only_the_verdict_cells():
    """A rule labelled like a verdict, a dataset named like one and an error reading like
    one are coloured as nothing: report.html colours the cells of the verdict columns (the
    audit table's, each template's) and the templates' bold verdict line, and only those."""
    from creditaudit.report.folder import render_report_html, report_parts, verdict_classes

    guest = _record("text-verdict-label")
    verdict = guest.protocol.verdict
    assert RULES.get("text-verdict-label").label == verdict == "trustworthy"
    named = _record("bp")
    named.config.data.name = verdict
    failed = _record("dfa")
    failed.status, failed.error, failed.protocol = "failed", verdict, type(failed.protocol)()
    index = RunIndex.from_records([guest, named, failed])
    page = render_report_html(report_parts(index), classes=verdict_classes(index))
    badges = re.findall(r'<td class="pass">([^<]*)</td>', page)
    # One per finished run in the audit table and in its template; nothing else.
    assert badges == [verdict] * 4, badges
    assert page.count(f"<td>{verdict}</td>") >= 4  # the method, dataset and error cells
    assert page.count(f'<strong class="pass">Verdict: {verdict}</strong>') == 2


def test_a_warning_naming_a_folder_carries_no_terminal_escape_sequence(tmp_path):
    """The command's log lines (``warning: skipping an unreadable record: PATH``) name what
    they read: a folder called ``bad\\x1b[2J…`` cleared the terminal and a carriage return
    overwrote the line. Run as a process: the command's own log handler is what prints."""
    import subprocess
    import sys

    bad = tmp_path / "runs" / f"bad{ESCAPE}[2J\rover"
    bad.mkdir(parents=True)
    (bad / "record.json").write_text('{"schema": "nonsense"}')
    done = subprocess.run([sys.executable, "-m", "creditaudit", "figures",
                           str(tmp_path / "runs"), "--out", str(tmp_path / "figs")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr  # no record it could read: nothing to draw
    warning = [line for line in done.stderr.splitlines() if "unreadable record" in line]
    assert len(warning) == 1 and ESCAPE not in done.stderr and "\r" not in done.stderr
    assert "bad [2J over" in warning[0]


def test_audit_of_several_runs_names_a_bad_one_without_its_escape_sequences(tmp_path,
                                                                           capsys):
    """``audit A B``: the line naming a run that failed (and the progress line naming each
    run) keep a folder's or a guest's escape sequences off the terminal, as the one-run
    error line does."""
    from creditaudit.cli import main

    bad = tmp_path / f"bad{ESCAPE}[31m"
    bad.mkdir()
    (bad / "record.json").write_text('{"schema": "nonsense"}')
    assert main(["audit", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert ESCAPE not in err
    assert err.count("creditaudit: error: ") == 2 and err.count("audit: run ") == 2


def test_the_export_summary_keeps_a_run_id_on_its_line():
    """``export`` prints the runs it left out by their ids: a Recorder's ``name=`` (any
    folder name) reaches the terminal plain."""
    from creditaudit.study.export_files import ExportResult

    result = ExportResult(out=Path("out"))
    result.not_exported.append({"run_id": f"mine{ESCAPE}[31m\r# x", "reason": "own loop"})
    text = result.format()
    assert ESCAPE not in text and "\r" not in text
    assert "  not exported mine [31m # x: own loop" in text.splitlines()


def test_a_bidirectional_override_in_a_name_does_not_reverse_the_line():
    # a run id holding U+202E (right-to-left override) showed the rest of its line
    # reversed in the terminal, report.md and report.html: "r\u202eevil" read as "rlive"
    from creditaudit.formatting import markdown_text, plain_line

    for name in ("r\u202eevil", "r\u2066evil\u2069", "r\u202bevil\u202c"):
        assert plain_line(name).replace(" ", "") == "revil"
        assert markdown_text(name).replace(" ", "") == "revil"
    assert plain_line("👩\u200d💻") == "👩\u200d💻"  # a zero-width joiner stays
