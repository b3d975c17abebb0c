"""The temporal experiment's per-epoch (d) against a frozen-blocks run that DIVERGED: its
overflowed epoch's accuracy is NaN and later epochs are not logged. The NaN margin read as
"not fired" — (d) passed, at that epoch and at the run's end; a frozen run that diverged in
its first epoch gave a (d) evaluated and passed on nothing. (d) is now not evaluated where
there is no finite baseline, and the summary says why."""

from __future__ import annotations

import math

import pytest

from creditaudit.records import load_records
from creditaudit.run.trainer import Trainer, train
from creditaudit.study.experiments import get_experiment
from integrity_support import nan_weights_after
from test_copies_and_marks import tiny

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    """bp runs (3 epochs) of seeds 42 and 7; the frozen run of seed 42 diverges in epoch 2,
    that of seed 7 in epoch 1."""
    out = tmp_path_factory.mktemp("temporal_diverged")
    for seed, diverge in ((42, 2), (7, 1)):
        train(tiny(out, **{"method.name": "bp", "run.seed": seed, "optim.epochs": 3}))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Trainer, "train_epoch", nan_weights_after(diverge))
            train(tiny(out, **{"method.name": "frozen", "run.seed": seed,
                               "optim.epochs": 3}))
    found, unreadable = load_records(out)
    assert not unreadable
    records = [r for _, r in found]
    assert {r.status for r in records if r.method == "frozen"} == {"diverged"}
    experiment = get_experiment("temporal")
    result = experiment.summarise(records)
    return result, experiment.to_markdown(result)


def seeds(summary):
    (row,) = summary[0]["rows"]
    return {s["seed"]: s for s in row["seeds"]}


def test_a_baseline_that_diverged_later_is_no_baseline_either(summary):
    """A frozen run that diverged is no baseline of (d) (protocol.records.baseline_runs),
    even at the epochs before it diverged."""
    seed = seeds(summary)[42]
    assert not seed["d_evaluated"] and "d" not in seed["evaluated"]
    assert seed["fires_at_end"]["d"] is None  # not a pass
    assert "diverged in epoch 2: no baseline" in seed["d_not_evaluated"]


def test_a_baseline_diverged_in_its_first_epoch_evaluates_nothing(summary):
    seed = seeds(summary)[7]
    assert not seed["d_evaluated"] and "d" not in seed["evaluated"]
    assert seed["fires_at_end"]["d"] is None and seed["first_fired"]["d"] is None
    assert "frozen-blocks run" in seed["d_not_evaluated"]
    assert "diverged in epoch 1" in seed["d_not_evaluated"]


def test_the_table_says_not_evaluated_and_why(summary):
    _, markdown = summary
    assert "seed 42:" in markdown
    assert "(d) not evaluated" in markdown and "seed 7:" in markdown


def test_a_margin_is_never_read_from_a_nan_accuracy():
    from types import SimpleNamespace

    from creditaudit.study.experiments.temporal import depth_utility_trace

    record = SimpleNamespace(series=lambda key: ([0, 1, 2], [0.1, 0.5, 0.6]))
    trace = depth_utility_trace(record, {0: 0.1, 1: 0.4, 2: math.nan})
    assert trace["margins"] == {1: pytest.approx(10.0)} and trace["at_end"] is None
