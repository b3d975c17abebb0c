"""One verdict behind every output: the same run reads the same — verdict, words, colour — in
its record, every format of its protocol report (text, Markdown, LaTeX, JSON), the folder
report (audit table, template, HTML colour), the run summary the command line prints, the
loggers, ``audit`` and the data of figure 6, for a trustworthy run, a walked-back one, one
whose (d) was not evaluated (figure 6 once drew it as trustworthy) and one whose reference
gradient failed its check (allowed: unverified). All come from
:func:`creditaudit.protocol.judge`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from matplotlib.colors import to_hex

from creditaudit import RunConfig
from creditaudit.cli import main
from creditaudit.figures import audit_panels
from creditaudit.formatting import VERDICT_COLORS, markdown_text
from creditaudit.loggers.scalars import verdict_text
from creditaudit.protocol import INCOMPLETE, TRUSTWORTHY, UNVERIFIED, WALK_BACK
from creditaudit.report import format_run_summary, render
from creditaudit.report.protocol import _latex_escape
from creditaudit.results import RunIndex
from creditaudit.run.trainer import train
from plugin_support import GUESTS

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.name": "synthetic", "data.in_dim": 16, "data.n_train": 256, "data.n_test": 256,
        "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False, "optim.epochs": 1,
        "optim.batch_size": 64, "run.progress": False}
SMALL = {"model.d": 16, "model.n_blocks": 2}
# (c) judged on the two batches of 128 the tiny evaluation set holds, at a threshold their
# cosine does not reach (1 itself, at which (c) could never fire, is out of its range).
C_ON_TWO_BATCHES = {"diagnostics.c": {"stability": 0.999999, "stability_batches": 2,
                                      "stability_batch_size": 128}}
RUNS = {  # name → (overrides, the verdict it must get)
    TRUSTWORTHY: ({**SMALL, **C_ON_TWO_BATCHES, "diagnostics.frozen_acc": 0.0}, TRUSTWORTHY),
    WALK_BACK: ({**SMALL, "diagnostics.b": {"grad_floor": 1.0}, "run.seed": 1}, WALK_BACK),
    "d not evaluated": ({**SMALL, **C_ON_TWO_BATCHES, "run.seed": 2}, INCOMPLETE),
    UNVERIFIED: ({"model.arch": "module",
                  "model.factory": "creditaudit_guests.ref_factories:doubled_backward",
                  "model.states": ["embed", "res"], "method.name": "dfa",
                  "diagnostics.allow_unverified_reference": True, "run.seed": 3},
                 UNVERIFIED),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("agreement")
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(GUESTS.folder))
    try:
        for overrides, _ in RUNS.values():
            train(RunConfig().replace(**{**TINY, **overrides, "run.out_dir": str(out)}))
    finally:
        patch.undo()
        GUESTS.forget()
    return out


def test_every_output_shows_the_one_verdict(results, tmp_path, capsys):
    index = RunIndex.from_dir(results, frozen_from_runs=False)
    assert main(["report", str(results), "--out", str(tmp_path / "report"),
                 "--no-frozen-from-runs"]) == 0
    capsys.readouterr()
    markdown = (tmp_path / "report" / "report.md").read_text()
    page = (tmp_path / "report" / "report.html").read_text()
    summary = format_run_summary(index.all_runs, use_frozen_runs=False).splitlines()
    _, points = audit_panels.panel_points([(r, index.protocol_report(r)) for r in index.runs])
    figure = audit_panels.build(index)[audit_panels.NAME]
    seen = set()
    for record in index.runs:
        judged = index.records.verdict(record).judgement
        seen.add(judged.verdict)
        report = index.protocol_report(record)
        assert report.judgement == judged  # the record's verdict is its report's
        # the record as training wrote it, and the loggers
        assert record.protocol.verdict == judged.verdict == report.verdict
        assert verdict_text(record.log[-1], record.reference.to_dict()) == judged.text
        # every format of the report
        assert f"verdict: {judged.text}" in render(report, "text").splitlines()
        # Markdown: the text escaped (a module name's backticks read as themselves)
        assert f"**Verdict: {markdown_text(judged.text)}**" in render(report, "md")
        assert render(report, "latex").splitlines()[4].endswith(
            f"& {_latex_escape(judged.text)} \\\\")
        assert json.loads(render(report, "json"))["verdict"] == judged.verdict
        # the folder report: the audit-table row, its colour, the folded template
        row = next(line for line in markdown.splitlines()
                   if line.startswith(f"| {record.run_id} |"))
        assert row.rstrip(" |").endswith(markdown_text(judged.text))
        cell = re.escape(judged.text.split("`")[0])
        assert re.search(rf'<td class="{judged.kind}">{cell}', page), judged.text
        assert re.search(rf'<code>{record.run_id}</code> <strong class="{judged.kind}">',
                         page)
        # the summary the command line prints
        line = next(line for line in summary if line.startswith(record.method)
                    and line.rstrip().endswith(judged.text))
        assert line
        # figure 6: every point of the run has its verdict and is drawn in its colour
        mine = [p for ps in points.values() for p in ps if p["run_id"] == record.run_id]
        assert mine and {(p["verdict"], p["kind"]) for p in mine} == {
            (judged.verdict, judged.kind)}
        for id_, ps in points.items():
            for p in ps:
                if p["run_id"] != record.run_id or p["value"] is None:
                    continue
                name = f"{id_}:{p['kind']}" + (":hollow" if p["hollow"] else "")
                (artist,) = figure.findobj(lambda a, n=name: a.get_gid() == n)
                offsets = np.asarray(artist.get_offsets()).reshape(-1, 2)
                assert np.isclose(offsets[:, 1], p["value"], rtol=0, atol=0).any()
                colours = artist.get_edgecolor() if p["hollow"] else artist.get_facecolor()
                assert to_hex(colours[0]) == VERDICT_COLORS[p["kind"]].lower()
    assert seen == {expected for _, expected in RUNS.values()}


def test_audit_says_the_same_verdict_as_the_record(results, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(GUESTS.folder))
    try:
        index = RunIndex.from_dir(results, frozen_from_runs=False)
        for record in index.runs:
            assert main(["audit", str(results / record.run_id), "--format", "json", "-q",
                         "--no-metrics", "--no-frozen-from-runs"]) == 0
            audited = json.loads(capsys.readouterr().out)
            assert audited["verdict"] == index.records.verdict(record).verdict
    finally:
        GUESTS.forget()
