"""The shipped experiments leave a run that stopped early out of their means, and say so.

A run that stopped early (``record.stopped_early``: ``--stop-on-walkback``, a Recorder
finished before its ``optim.epochs``; status completed) has end-of-run numbers of an earlier
epoch than the other seeds of its group. No shipped experiment sets
``diagnostics.stop_on_walkback`` (part of the run id, so such a run of the same settings is
another run), but a summary reads whatever finished records it is given — the Python API's
``Experiment.summarise(records)``, a Recorder's record in a planned folder — so every
experiment that averages over seeds is tested: the run keeps its seed row and its verdict,
stays out of every mean, and a line under the tables names it in the report's words.
"""

from __future__ import annotations

from typing import Any

import pytest

from creditaudit.protocol.records import RecordSet
from creditaudit.study.experiments import experiment_names, get_experiment
from creditaudit.study.experiments.literature import cell_summary
from creditaudit.study.experiments.literature_tables import TABLES
from test_experiments import fake_record

REASON = "protocol verdict needs walk-back: (a)"
NOTE = ("Left out of the end-of-run means (they would mix runs of different lengths): "
        f"DFA seed 7 stopped early at epoch 1: {REASON}.")
FULL, EARLY = 0.3, 0.777  # accuracies (and training deep cosines) of the two DFA seeds
# The experiments that average over seeds (the literature experiment's cells hold runs of
# its own networks only: tested on a cell) and those that count each run's decision.
AVERAGING = ["audit_table", "random_init", "temporal", "penalty_sweep", "capacity_cost",
             "fresh_null", "depth_ladder", "rule_zoo"]
COUNTING = ["decision_utility", "threshold_sensitivity"]


def with_null(record, value: float):
    """``record`` with a fresh-B null block whose training-B deep cosine is ``value``."""
    record.diagnostics.fresh_b_null = {"training_value": value, "mean": 0.0, "std": 0.01,
                                       "z": value / 0.01, "values": [value]}
    return record


def records() -> list:
    """bp, frozen and dfa (also at λ = 1e-2) with seed 42; dfa seed 7 stopped early."""
    early = fake_record("dfa", 7, acc=EARLY, gamma=0.9)
    early.stopped_early = {"epoch": 1, "reason": REASON}
    runs = [fake_record("bp", 42, acc=0.5), fake_record("frozen", 42, acc=0.2),
            fake_record("dfa", 42, acc=FULL), fake_record("dfa", 42, acc=FULL, penalty=1e-2),
            fake_record("dfa", 42, acc=FULL, penalty=1e-4), fake_record("fa", 42, acc=FULL),
            early]
    return [with_null(r, r.final_acc) for r in runs]


def aggregates(value: Any) -> list[dict]:
    """Every aggregate (``{"mean", "std", "n", …}``) anywhere in a summary."""
    if isinstance(value, dict):
        found = [value] if {"mean", "n"} <= set(value) else []
        return found + [a for v in value.values() for a in aggregates(v)]
    if isinstance(value, list):
        return [a for v in value for a in aggregates(v)]
    return []


@pytest.mark.parametrize("name", AVERAGING)
def test_a_run_that_stopped_early_stays_out_of_every_mean_and_is_named(name):
    experiment = get_experiment(name)
    summary = experiment.summarise(records())
    found = aggregates(summary)
    assert found, name
    # each group holds one full-length run (the stopped one is no second value of any mean)
    assert all(a["n"] <= 1 for a in found), [a for a in found if a["n"] > 1]
    assert not any(a["n"] and abs(a["mean"] - EARLY) < 1e-9 for a in found)
    markdown = experiment.to_markdown(summary)
    assert summary["stopped_early"] == NOTE and NOTE in markdown
    assert f"{(FULL + EARLY) / 2:.3f}" not in markdown


def test_its_seed_row_and_verdict_stay():
    summary = get_experiment("audit_table").summarise(records())
    [dfa] = [row for row in summary["rows"] if row["label"] == "dfa"]
    assert [(s["seed"], s["stopped_early"]) for s in dfa["seeds"]] == [
        (7, f"stopped early at epoch 1: {REASON}"), (42, None)]
    assert dfa["verdict"]["n"] == 2
    assert dfa["test_acc"]["mean"] == pytest.approx(FULL)


def test_counting_experiments_take_no_note():
    """Decision utility and threshold sensitivity count each run's decision: no mean."""
    assert sorted(AVERAGING + COUNTING + ["literature"]) == sorted(experiment_names())
    for name in COUNTING:
        summary = get_experiment(name).summarise(records())
        assert "stopped_early" not in summary


def test_literature_cells_leave_it_out_of_best_and_last_error():
    table = TABLES[0]
    column, row = table.columns[0], table.rows[0]
    early = fake_record(row.rule, 7, acc=EARLY)
    early.stopped_early = {"epoch": 1, "reason": REASON}
    members = [fake_record(row.rule, 42, acc=FULL), early]
    cell = cell_summary(table, column, row, members, RecordSet(members))
    for key in ("best_error", "last_error"):
        assert cell[key]["n"] == 1
        assert cell[key]["mean"] == pytest.approx(100 * (1 - FULL))
    assert [s["stopped_early"] is not None for s in cell["seeds"]] == [False, True]
    assert cell["curve"] == [[1, pytest.approx(100 * (1 - (FULL + EARLY) / 2))]]
    note = get_experiment("literature").summarise(members)["stopped_early"]
    assert note.endswith(f"seed 7 stopped early at epoch 1: {REASON}.")
