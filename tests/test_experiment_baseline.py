"""The experiments' frozen-blocks baseline line is the report's baseline of (d).

``creditaudit report`` (:class:`~creditaudit.protocol.records.RecordSet`) evaluates (d)
against the frozen runs of the same recipe that finished and trained all their epochs; the
experiments that print a "Frozen baseline" (and capacity_cost's effects over it) take the
same runs of the records they are given — not every frozen run among them.
"""

from __future__ import annotations

import pytest

from creditaudit.protocol.records import RecordSet
from creditaudit.study.experiments import get_experiment
from creditaudit.study.experiments.registry import NO_CHOICES
from test_experiments import fake_record

# The experiments that print one frozen-blocks baseline for their rows.
WITH_BASELINE = ["audit_table", "depth_ladder", "penalty_sweep", "capacity_cost"]
BASELINE = 0.2  # the final accuracy of the one frozen run the report takes


def other(record, run_id: str, **overrides):
    """``record`` as another run: ``run_id``, its config with dotted ``overrides``."""
    record.config = record.config.replace(**overrides)
    record.run_id = run_id
    return record


def records() -> list:
    """bp, dfa and dfa+λ with one frozen run of their recipe, and frozen runs the report
    does not take: of other recipes (more epochs, another width), one that failed, one
    that stopped early, one that diverged (its accuracy is of its last finite epoch)."""
    failed = fake_record("frozen", 7, acc=0.8)
    failed.status = "failed"
    diverged = fake_record("frozen", 9, acc=0.05)
    diverged.status, diverged.divergence = "diverged", {"epoch": 2, "reason": "non-finite"}
    early = fake_record("frozen", 8, acc=0.7)
    early.stopped_early = {"epoch": 1, "reason": "protocol verdict needs walk-back: (a)"}
    return [fake_record("bp", 42, acc=0.5), fake_record("dfa", 42, acc=0.3),
            fake_record("dfa", 42, acc=0.3, penalty=1e-2),
            fake_record("frozen", 42, acc=BASELINE),
            other(fake_record("frozen", 42, acc=0.9), "frozen-longer", **{"optim.epochs": 9}),
            other(fake_record("frozen", 42, acc=0.6), "frozen-wider", **{"model.d": 7}),
            failed, early, diverged]


@pytest.mark.parametrize("name", WITH_BASELINE)
def test_the_frozen_baseline_is_the_reports(name):
    runs = records()
    assert RecordSet(runs).frozen_baseline(runs[1]) == (BASELINE, 1)
    summary = get_experiment(name).summarise_fn(runs, NO_CHOICES)
    assert summary["frozen_acc"]["n"] == 1
    assert summary["frozen_acc"]["mean"] == pytest.approx(BASELINE)
    assert "0.200 (n=1)" in get_experiment(name).to_markdown(summary)


def test_capacity_cost_effects_are_over_the_reports_baseline():
    summary = get_experiment("capacity_cost").summarise_fn(records(), NO_CHOICES)
    assert summary["effects_pp"]["dfa_penalty_over_frozen"] == pytest.approx(
        100 * (0.3 - BASELINE))


def test_runs_of_recipes_with_different_baselines_print_none():
    """Each row's (d) is against its own recipe's frozen runs: no one baseline line."""
    runs = [fake_record("dfa", 42, acc=0.3), fake_record("frozen", 42, acc=BASELINE),
            other(fake_record("dfa", 42, acc=0.3), "dfa-longer", **{"optim.epochs": 9}),
            other(fake_record("frozen", 42, acc=0.9), "frozen-longer", **{"optim.epochs": 9})]
    summary = get_experiment("audit_table").summarise_fn(runs, NO_CHOICES)
    assert summary["frozen_acc"] is None
    margins = {s["run_id"]: s["margin_pp"] for row in summary["rows"] for s in row["seeds"]}
    assert margins["dfa-0.0-s42"] == pytest.approx(100 * (0.3 - BASELINE))
    assert margins["dfa-longer"] == pytest.approx(100 * (0.3 - 0.9))


def test_capacity_cost_effects_compare_cells_over_the_seeds_both_have():
    """The effects were the difference of two cells' means over whatever seeds each had:
    with BP+λ's seed 123 missing (failed, or not trained yet) and the penalty changing no
    run, "penalty cost for BP" read −10 pp — seed 123's own accuracy, not the penalty's
    cost. They are over the seeds both cells have, and the line names them."""
    runs = [fake_record("bp", 42, acc=0.5), fake_record("bp", 123, acc=0.7),
            fake_record("bp", 42, acc=0.5, penalty=1e-2),
            fake_record("dfa", 42, acc=0.3), fake_record("dfa", 123, acc=0.4),
            fake_record("dfa", 42, acc=0.3, penalty=1e-2),
            fake_record("dfa", 123, acc=0.4, penalty=1e-2),
            fake_record("frozen", 42, acc=BASELINE), fake_record("frozen", 123, acc=BASELINE)]
    experiment = get_experiment("capacity_cost")
    summary = experiment.summarise_fn(runs, NO_CHOICES)
    effects = summary["effects_pp"]
    assert effects["bp_penalty_cost"] == pytest.approx(0.0)
    assert effects["dfa_penalty_gain"] == pytest.approx(0.0)
    assert effects["credit_quality_gap"] == pytest.approx(100 * (0.5 - 0.3))
    assert summary["effects_seeds"] == {"bp_penalty_cost": [42], "dfa_penalty_gain": [42, 123],
                                        "credit_quality_gap": [42]}
    markdown = experiment.to_markdown(summary)
    assert "penalty cost for BP: +0.0 pp (over seed 42: the seeds both cells have)" in markdown
    assert "penalty gain for DFA: +0.0 pp\n" in markdown


def test_temporal_final_accuracy_says_over_how_many_seeds():
    """Temporal's "final acc" cell was the bare mean, the one accuracy of the experiments'
    tables without its spread and n: with a seed missing, "0.400" read as a mean over
    seeds. It is written as every other table writes an accuracy over seeds."""
    runs = [fake_record("dfa", 42, acc=0.3), fake_record("dfa", 123, acc=0.5),
            fake_record("bp", 42, acc=0.4),
            fake_record("frozen", 42, acc=BASELINE), fake_record("frozen", 123, acc=BASELINE)]
    experiment = get_experiment("temporal")
    markdown = experiment.to_markdown(experiment.summarise_fn(runs, NO_CHOICES))
    assert "| bp | 0.400 (n=1) |" in markdown
    assert "| dfa | 0.400 ± 0.141 (n=2) |" in markdown


def test_capacity_cost_effect_marks_are_of_the_seeds_the_effect_is_over():
    """An effect over the seeds both cells have carried the marks of every run of both
    cells: with BP's seed 123 diverged and BP+λ's seed 123 missing, 'penalty cost for BP:
    +0.0‡ pp (over seed 42 …)' marked as of a diverged run a number no diverged run is in.
    And the line named its seeds wherever any cell had another seed, though both of its
    own cells had just those."""
    diverged = fake_record("bp", 123, acc=0.7)
    diverged.status, diverged.divergence = "diverged", {"epoch": 1, "reason": "non-finite"}
    runs = [fake_record("bp", 42, acc=0.5), diverged,
            fake_record("bp", 42, acc=0.5, penalty=1e-2),
            fake_record("dfa", 42, acc=0.3), fake_record("dfa", 123, acc=0.4),
            fake_record("dfa", 7, acc=0.4),
            fake_record("dfa", 42, acc=0.3, penalty=1e-2),
            fake_record("dfa", 123, acc=0.4, penalty=1e-2),
            fake_record("frozen", 42, acc=BASELINE), fake_record("frozen", 123, acc=BASELINE)]
    experiment = get_experiment("capacity_cost")
    summary = experiment.summarise_fn(runs, NO_CHOICES)
    assert summary["effects_marks"]["bp_penalty_cost"] == {}
    markdown = experiment.to_markdown(summary)
    assert "penalty cost for BP: +0.0 pp (over seed 42: the seeds both cells have)" in markdown
    # DFA's cells: seeds 7, 42, 123 without the penalty, 42 and 123 with it
    assert "penalty gain for DFA: +0.0 pp (over seeds 42, 123: the seeds both" in markdown
    # the diverged run is in BP's no-penalty mean and in nothing else the effects are over
    assert summary["effects_marks"]["credit_quality_gap"] == {}
    # BP's cells with every seed of theirs: no seeds named, though DFA's has another
    runs[1] = fake_record("bp", 123, acc=0.7)
    runs.append(fake_record("bp", 123, acc=0.7, penalty=1e-2))
    markdown = experiment.to_markdown(experiment.summarise_fn(runs, NO_CHOICES))
    assert "penalty cost for BP: +0.0 pp\n" in markdown
