"""The shipped experiments summarise runs that diverged, however early, and say so.

A run can diverge in its first epoch, before the training-time protocol evaluated anything
(``creditaudit_guests.fx29_rules``: a rule whose weights blow up after its first real step):
its record has an empty ``protocol``, no trained epoch (``final.epochs_completed == 0``) and
only the measures of epoch 0. Then every experiment still writes its summary and table (no
internal error), the run's numbers carry ‡, and a diagnostic it never evaluated is shown as
not evaluated — never as "never fired", never as a pass.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from creditaudit.records import load_records
from creditaudit.report.runs import DIVERGED_MARK
from creditaudit.run.trainer import Trainer, train
from creditaudit.study.experiments import experiment_names, get_experiment
from door_support import guests
from integrity_support import nan_weights_after
from test_copies_and_marks import tiny
from test_experiment_marks import rows
from test_experiment_marks import summary_md as render

pytestmark = pytest.mark.usefixtures("single_thread")

RULE = "fx29-blowup"
ACCURACY = re.compile(r"^0\.\d{3}\b")  # a cell that shows an accuracy


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """bp, dfa and frozen runs (seed 42); the blow-up rule plain, with λ = 1e-2 and with one
    trainable block, each diverged in its first epoch; a dfa run (seed 7) that diverges in
    epoch 2, after its first epoch's protocol was recorded."""
    out = tmp_path_factory.mktemp("diverged_experiments")
    for method in ("bp", "dfa", "frozen"):
        train(tiny(out, **{"method.name": method}))
    with guests(tmp_path_factory.mktemp("site"), RULE):
        for extra in ({}, {"method.penalty": 1e-2}, {"method.trainable_blocks": 1}):
            train(tiny(out, **{"method.name": RULE, **extra}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        train(tiny(out, **{"method.name": "dfa", "run.seed": 7}))
    return out


@pytest.fixture(scope="module")
def records(folder) -> list:
    found, unreadable = load_records(folder)
    assert not unreadable
    return [r for _, r in found]


def test_the_blow_up_runs_diverged_before_any_protocol(records):
    blown = [r for r in records if r.method == RULE]
    assert len(blown) == 3
    for record in blown:
        assert record.status == "diverged"
        assert record.numbers_epoch == 0 and record.protocol.epoch is None
        assert all(not entry.protocol for entry in record.log)


@pytest.mark.parametrize("name", experiment_names())
def test_every_experiment_summarises_a_run_diverged_in_its_first_epoch(records, name):
    """Summary and table are made (the summary is what the runner writes first: a table
    that raises leaves the .md unwritten) and the diverged runs' numbers carry ‡."""
    _, markdown = render(name, records)
    assert markdown.startswith(f"# Experiment `{name}`")
    for first in {line.split("|")[1].strip() for line in markdown.splitlines()
                  if line.startswith("| ")}:
        for row in rows(markdown, first):
            if RULE in " ".join(row.values()) and any(ACCURACY.match(c) for c in row.values()):
                assert any(c.endswith(DIVERGED_MARK) for c in row.values()), (name, row)


def test_penalty_sweep_says_not_evaluated_for_a_run_that_evaluated_nothing(records):
    summary, markdown = render("penalty_sweep", records)
    table = rows(markdown, "rule")
    blown = [r for r in table if r["rule"] == RULE]
    assert len(blown) == 3  # λ = 0, λ = 1e-2, one trainable block
    for row in blown:
        assert row["(a) first"] == row["(b) first"] == "not evaluated"
        assert row["test acc"].endswith(DIVERGED_MARK)
    bp = next(r for r in table if r["rule"] == "bp")
    assert bp["(a) first"] == "never (0/1)"


def test_temporal_counts_only_the_seeds_that_evaluated_a_diagnostic(records):
    summary, markdown = render("temporal", records)
    table = rows(markdown, "architecture")
    blown = [r for r in table if r["method"] == RULE]
    assert blown and all(r[f"({i}) first epoch"] == "not evaluated"
                         for r in blown for i in summary["diagnostics"])
    # dfa seed 7 has no frozen run of its seed: (d) per epoch was evaluated for seed 42 only
    dfa = next(r for r in table if r["method"] == "dfa")
    assert dfa["(d) first epoch"].endswith("not evaluated in 1)")


def test_trajectories_stop_at_a_diverged_runs_last_finite_epoch(records):
    """The median trajectories (penalty_sweep's, temporal's) read a run that diverged in
    epoch 2 up to epoch 1: epoch 2 holds the NaN network's measures, its accuracy the share
    of one class, which used to enter the median."""
    dfa = {r.seed: r for r in records if r.method == "dfa"}
    assert dfa[7].status == "diverged" and dfa[7].numbers_epoch == 1
    assert dfa[7].entry(2).has_diagnostics and math.isfinite(dfa[7].entry(2).acc_eval)
    for name in ("penalty_sweep", "temporal"):
        summary, _ = render(name, records)
        row = next(r for r in summary["rows"] if r["method"] == "dfa")
        path = row["trajectory"]
        assert path["acc_eval"][path["epoch"].index(2)] == dfa[42].entry(2).acc_eval, name
        assert path["acc_eval"][path["epoch"].index(1)] == pytest.approx(
            (dfa[42].entry(1).acc_eval + dfa[7].entry(1).acc_eval) / 2), name


def test_random_init_passes_no_run_that_evaluated_nothing(records):
    summary, markdown = render("random_init", records)
    blown = [s for row in summary["rows"] if row["method"] == RULE for s in row["seeds"]]
    assert blown and not any(s["trustworthy"] for s in blown)
    # (c) needs more evaluation samples than these tiny runs take: not evaluated, no run
    # passes as trustworthy; only dfa s7 fired
    assert summary["n_trustworthy"] == 0 and summary["n_fired"] == 1
    assert summary["not_evaluated"]["c"] == summary["n_runs"]
    assert summary["not_evaluated"]["a"] == len(blown)
    cells = [r["verdict (a)–(c)"] for r in rows(markdown, "architecture")
             if r["method"] == RULE]
    assert cells == ["nothing evaluated in 1/1 seeds"] * 3


def test_an_older_summary_without_evaluated_seeds_still_renders(records):
    """Summaries are read back and rendered again: one written before seeds kept
    ``evaluated`` renders (a seed whose first_fired lacks a diagnostic: not evaluated)."""
    summary, _ = render("penalty_sweep", records)
    for row in summary["rows"]:
        for seed in row["seeds"]:
            del seed["evaluated"]
    table = rows(get_experiment("penalty_sweep").to_markdown(summary), "rule")
    assert all(r["(a) first"] == "not evaluated" for r in table if r["rule"] == RULE)


def test_threshold_sensitivity_counts_every_run_and_marks_the_diverged(records):
    """Runs that diverged at once are judged on (d) as decision_utility judges them, named
    with why where a diagnostic left them out; a diverged run carries ‡ where it is named."""
    summary, markdown = render("threshold_sensitivity", records)
    audited = [r for r in records if r.method != "frozen"]
    assert summary["n_runs"] == len(audited) == 6
    d = next(r for r in summary["diagnostics"]["d"]["rows"] if r["default"])
    assert d["n_evaluated"] == len(audited)
    assert sum(RULE in label for label in d["fired"]) == 3  # at chance: (d) fires
    # decision_utility judges the same runs on (d)
    decisions = get_experiment("decision_utility").summarise(records)
    judged = [s for m in decisions["methods"] for s in m["seeds"]]
    assert len(judged) == len(audited)
    assert sum(s["statuses"]["d"] == "fired" for s in judged) == d["n_fired"]
    # (a): the three runs it left out, named with the reason, marked ‡
    a = summary["diagnostics"]["a"]
    assert {r["label"] for r in a["not_evaluated"]} == {
        f"{RULE} s42", f"{RULE} k=1 s42", f"{RULE}+λ=1e-2 s42"}
    section = markdown.split("## (a)", 1)[1].split("\n## ", 1)[0]
    assert "Not evaluated in 3 of the 6 runs" in section
    assert f"{RULE} s42{DIVERGED_MARK}" in section
    assert "diverged in epoch 1, before the protocol's first evaluation" in section
    # dfa s7 diverged in epoch 2: counted, and marked where the table names it
    table = rows(section, "threshold")
    default = next(r for r in table if "(default)" in r["threshold"])
    assert default["which"] == f"dfa s7{DIVERGED_MARK}"
    assert default["runs walked back"] == "6/6"
    assert f"{DIVERGED_MARK} of a diverged run" in markdown
