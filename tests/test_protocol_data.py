"""The protocol as data: a fifth diagnostic, registered the way a plugin is, reaches every
reader of records — protocol reports in every format, report.md/html, the audit panels,
threshold sensitivity, verdicts and the experiments' summaries — with its own label, unit and
threshold, and no consumer names a diagnostic id of its own."""

from __future__ import annotations

import ast
import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.config import RunConfig, opt
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DiagnosticReport,
    ProtocolDiagnostic,
    protocol,
)
from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS, Origin
from creditaudit.results import RunIndex
from creditaudit.run.trainer import train

SRC = Path(__file__).resolve().parents[1] / "src" / "creditaudit"


@dataclass
class MarginOptions:
    min_margin: float = opt(1.0, "(e) fires when the median top-1 − top-2 logit is below this",
                            min=0.0)


class LogitMargin(ProtocolDiagnostic[MarginOptions]):
    """A fifth diagnostic: the median gap between the two largest logits."""

    name = "e"
    label = "logit margin"
    statistic = "median top-1 − top-2 logit"
    operator, unit, value_format, threshold = "<", " nats", ".3g", "min_margin"
    hint = "the classifier barely separates its first two choices"
    short = "top-1 − top-2 logit"
    sensitivity = (0.01, 0.1, 1.0, 10.0)
    needs = "runs whose evaluation logits are finite"
    rank = 50

    def evaluate(self, evidence):
        if evidence.logits is None:
            return self.result(None, NOT_EVALUATED, "needs the evaluation logits")
        top = evidence.logits.topk(2, dim=1).values
        value = float((top[:, 0] - top[:, 1]).median())
        if not math.isfinite(value):
            return self.result(None, NOT_EVALUATED, "the logits are NaN/Inf")
        return self.judge(value, f"median top-1 − top-2 logit {value:.3g}")


@pytest.fixture(scope="module")
def margin():
    """LogitMargin in the registry of diagnostics for this module's tests, then gone."""
    DIAGNOSTICS.names()  # the built-ins and installed plugins first
    DIAGNOSTICS._plugins[LogitMargin.name] = DIAGNOSTICS.validate(LogitMargin, "test")
    DIAGNOSTICS._origins[LogitMargin.name] = Origin(builtin=False, distribution="tests")
    yield LogitMargin
    del DIAGNOSTICS._plugins[LogitMargin.name], DIAGNOSTICS._origins[LogitMargin.name]


TINY = {"data.n_train": 256, "data.n_test": 256, "data.in_dim": 8, "model.d": 16,
        "model.n_blocks": 2, "optim.batch_size": 64, "optim.epochs": 1,
        "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False,
        "run.progress": False, "run.threads": 1}


@pytest.fixture(scope="module")
def runs(margin, tmp_path_factory) -> Path:
    """BP, DFA and frozen blocks trained with the fifth diagnostic in their protocol."""
    out = tmp_path_factory.mktemp("five")
    previous = torch.get_num_threads()
    try:
        for method in ("bp", "dfa", "frozen"):
            train(RunConfig().replace(**TINY, **{
                "method.name": method, "run.out_dir": str(out),
                "diagnostics.protocol": [*(d.name for d in protocol()), margin.name]}))
    finally:
        torch.set_num_threads(previous)
    return out


def margin_of(report: DiagnosticReport):
    return report.diagnostic(LogitMargin.name)


def test_the_fifth_diagnostic_passes_the_conformance_suite(margin):
    from creditaudit.testing import check_diagnostic

    report = check_diagnostic(margin)  # raises on any failed check
    assert report.passed and not report.expected_failures


def test_training_records_the_fifth_diagnostic(runs):
    assert RunIndex.from_dir(runs).diagnostic_ids() == ["a", "b", "c", "d", "e"]
    for run in RunIndex.from_dir(runs).runs:
        assert list(run.recorded_statuses()) == ["a", "b", "c", "d", "e"]
        assert run.recorded_value("e") > 0


def test_it_has_a_row_or_column_in_every_report_format(runs):
    from creditaudit.report import render

    index = RunIndex.from_dir(runs)
    reports = [index.protocol_report(run) for run in index.runs]
    for report in reports:
        result = margin_of(report)
        value = f"{result.value:.3g} nats"
        text = render(report, "text")
        assert re.search(rf"\(e\)\s+logit margin\s+{re.escape(value)}\s+< 1 nats\s+"
                         f"{result.status.upper()}", text), text
        markdown = render(report, "md")
        assert f"| (e) | logit margin | {value} | < 1 nats | {result.status} |" in markdown
        header, _, row = markdown.splitlines()[:3]
        cells = dict(zip(header.split(" | "), row.split(" | ")))
        assert cells["(e)"] == value  # the reporting-template row has its column
        assert "(a)" not in cells and "(b)" not in cells  # shown per layer instead
    latex = render(reports, "latex").splitlines()
    assert "& (d) & (e) & verdict" in latex[2]
    for report, line in zip(reports, latex[4:]):
        cell = f"{margin_of(report).value:.3g} nats"
        assert (f"\\textbf{{{cell}}}" if margin_of(report).fired else cell) in line


def test_it_has_a_column_in_the_folder_report(runs, tmp_path):
    from creditaudit.report.folder import write_report

    index = RunIndex.from_dir(runs)
    files = write_report(index, tmp_path)
    markdown = files.markdown.read_text()
    assert "(d) accuracy − frozen < 2 pp, (e) top-1 − top-2 logit < 1 nats" in markdown
    audit = markdown.split("## Audit table")[1].split("\n## ")[0]
    header = next(line for line in audit.splitlines() if line.startswith("| run |"))
    assert header.endswith("| (d) | (e) | verdict |")
    fired = 0
    for run in index.runs:
        result = margin_of(index.protocol_report(run))
        word = "**fired**" if result.fired else "passed"
        row = next(line for line in audit.splitlines() if run.run_id in line)
        assert f"| {word} {result.value:.3g} nats |" in row
        fired += result.fired
    summary = markdown.split("## Summary across seeds")[1].split("\n## ")[0]
    assert summary.count("(e)×1") == fired
    assert "<th>(e)</th>" in files.html.read_text()


def test_it_gets_an_audit_panel_with_its_threshold_line(runs):
    from creditaudit.figures import audit_panels

    index = RunIndex.from_dir(runs)
    fig = audit_panels.build(index)[audit_panels.NAME]
    panel = next(ax for ax in fig.axes if ax.get_title() == "(e) logit margin")
    assert len(fig.axes) == 5 and panel.get_ylabel() == "top-1 − top-2 logit (nats)"
    assert panel.get_yscale() == "linear"
    line = next(l for l in panel.get_lines() if l.get_gid() == "e:threshold")
    np.testing.assert_allclose(line.get_ydata(), [1.0, 1.0])
    drawn = sorted(y for c in panel.collections if str(c.get_gid()).startswith("e:")
                   for y in np.asarray(c.get_offsets()).reshape(-1, 2)[:, 1])
    recorded = sorted(r.recorded_value("e") for r in index.runs)
    np.testing.assert_allclose(drawn, recorded, rtol=1e-12)


def with_margin(record: RunRecord, value: float | None, run_id: str) -> RunRecord:
    """``record`` with (e) stored as ``value`` (None: not evaluated), judged at 1 nat."""
    raw = copy.deepcopy(record.to_dict())
    raw["run_id"] = run_id
    status = NOT_EVALUATED if value is None else FIRED if value < 1.0 else PASSED
    raw["protocol"]["report"]["diagnostics"]["e"].update(value=value, status=status)
    return RunRecord.from_dict(raw)


def test_threshold_sensitivity_sweeps_its_declared_range(runs):
    from creditaudit.study.experiments import get_experiment

    index = RunIndex.from_dir(runs)
    template = next(r for r in index.runs if r.method == "bp")
    values = [0.05, 0.5, 5.0, None]
    records = [with_margin(template, v, f"bp-{i}") for i, v in enumerate(values)]
    frozen = next(r for r in index.runs if r.method == "frozen")
    summary = get_experiment("threshold_sensitivity").summarise([*records, frozen])
    block = summary["diagnostics"]["e"]
    assert block["statistic"] == "top-1 − top-2 logit (nats)"
    assert {r["threshold"]: r["n_fired"] for r in block["rows"]} == {
        0.01: 0, 0.1: 1, 1.0: 2, 10.0: 3}  # fires below the threshold
    assert all(r["n_evaluated"] == 3 for r in block["rows"])
    assert [r["default"] for r in block["rows"]] == [False, False, True, False]
    band = block["stable_band"]
    assert (band["closest_fired"], band["closest_passed"]) == (0.5, 5.0)
    assert band["gap"] == pytest.approx(4.5) and band["gap_unit"] == "nats"
    markdown = get_experiment("threshold_sensitivity").to_markdown(summary)
    assert "## (e) top-1 − top-2 logit (nats), fires when < threshold" in markdown
    assert "gap 4.5 nats" in markdown
    assert summary["judged_at_default"] == ["c"]  # (c) declares no range


def test_verdicts_and_summaries_count_it(runs):
    from creditaudit.protocol.records import RecordSet
    from creditaudit.study.experiments import get_experiment
    from creditaudit.study.experiments.groups import verdict_overview

    index = RunIndex.from_dir(runs)
    template = next(r for r in index.runs if r.method == "bp")
    fires = with_margin(template, 0.1, "bp-fires")
    passes = with_margin(template, 3.0, "bp-passes")
    verdicts = RecordSet([fires, passes], use_frozen_runs=False)
    assert "e" in verdicts.verdict(fires).fired
    assert verdicts.verdict(fires).text.startswith("needs walk-back (e)")
    assert "e" not in verdicts.verdict(passes).fired
    overview = verdict_overview([verdicts.verdict(fires), verdicts.verdict(passes)])
    assert overview["fired_counts"]["e"] == 1 and "(e)" in overview["text"]
    records = index.runs
    decisions = get_experiment("decision_utility").summarise(records)
    plans = {s["description"]: s["diagnostics"] for s in decisions["strategies"]}
    assert plans["S1 + (e)"] == ["e"] and plans["S1 + (a)(b)(c)(d)(e)"] == list("abcde")
    untrained = get_experiment("random_init").summarise(records)
    assert untrained["diagnostics"] == list("abce")  # (d) does not apply before training
    assert untrained["verdict_over"] == "(a)(b)(c)(e); (d) does not apply before training"
    temporal = get_experiment("temporal").summarise(records)
    assert all(list(row["first_fired"]) == list("abcde") for row in temporal["rows"])
    assert "(e) first epoch" in get_experiment("temporal").to_markdown(temporal)


# --- no consumer names a diagnostic ------------------------------------------------------
CONSUMERS = ["study", "figures", "report", "results", "loggers", "cli"]


def test_no_reader_of_records_names_a_diagnostic_id():
    """Diagnostic ids are written in their classes only: every reader of records iterates
    the protocol the records hold (or the registry's default)."""
    ids = {cls.name for cls in protocol()}  # the built-ins
    named = ids | {f"({i})" for i in ids}
    found = []
    for folder in CONSUMERS:
        path = SRC / folder
        assert path.is_dir(), path  # a consumer that moved is still read
        for file in sorted(path.rglob("*.py")):
            tree = ast.parse(file.read_text())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                          and node.body and isinstance(node.body[0], ast.Expr)}
            found += [f"{file.relative_to(SRC)}:{node.lineno} {node.value!r}"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in named
                      and id(node) not in docstrings]
    assert not found, found
