"""Figures name every diverged run they keep in an end-of-run mean, and the epoch its
numbers are of (its last finite one), as the report marks them (‡ and a line naming it).

Real tiny runs that diverge in their first epoch (lr 1e6 on the synthetic task): their
end-of-run numbers are of epoch 0, though the recipe trains 2 epochs.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from creditaudit.config import RunConfig
from creditaudit.figures import RunIndex
from creditaudit.records import load_record
from creditaudit.report.runs import diverged_text
from creditaudit.run.trainer import train
from creditaudit.study.figures import hero, lambda_sweep, penalty, summary
from figure_support import SMOKE

pytestmark = pytest.mark.usefixtures("single_thread")

# What Figures 1, 3, 4 and 5 need of one recipe, one seed each.
RUNS = [(m, 0.0) for m in ("bp", "fa", "dfa", "frozen", "state-bridge", "credit-bridge")]
RUNS += [("dfa", 0.01), ("bp", 0.01)]
DFA = "DFA seed 42 diverged in epoch 1: numbers of epoch 0, the last whose evaluation was finite"


@pytest.fixture(scope="module")
def diverged_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("diverged_runs")
    previous = torch.get_num_threads()
    try:
        for method, lam in RUNS:
            train(RunConfig().replace(**SMOKE).replace(**{
                "method.name": method, "method.penalty": lam, "optim.lr": 1e6,
                "run.seed": 42, "run.out_dir": str(out)}))
    finally:
        torch.set_num_threads(previous)
    return out


def notes(fig, gid: str = "diverged") -> list[str]:
    return [t.get_text().replace("\n", " ") for t in fig.texts if t.get_gid() == gid]


def test_figures_name_each_diverged_run_and_the_epoch_its_points_are_of(diverged_results):
    """Every run diverged in epoch 1 of 2: Figure 1 drew epoch-0 values with no word; now
    each figure drawing end-of-run values says, under it, which runs diverged and which
    epoch their points are of (per-epoch curves — Figure 5a — need no such line)."""
    index = RunIndex.from_dir(diverged_results)
    assert {run.status for run in index.runs} == {"diverged"}
    dfa = next(r for r in index.runs if r.method == "dfa" and r.penalty == 0)
    assert diverged_text(dfa).replace("‡ ", "").startswith(
        f"diverged{DFA.split('diverged')[1]}; no trained epoch was finite")
    [note] = notes(hero.build(index)[hero.NAME])
    assert note.startswith("Diverged (their end-of-run points are of their last finite "
                           "epoch): ") and DFA in note and "BP seed 42 diverged in epoch 1" in note
    [note] = notes(penalty.build(index)[penalty.NAME])
    assert DFA in note and "DFA λ=0.01 seed 42 diverged in epoch 1" in note
    figs = summary.build(index)
    assert not notes(figs["fig5a_accuracy"])
    for name in summary.NAMES[1:]:
        [note] = notes(figs[name])
        assert DFA in note and "State Bridge seed 42 diverged" in note
    [note] = notes(lambda_sweep.build(index)[lambda_sweep.NAME])  # its frozen line only
    assert "Frozen blocks seed 42 diverged in epoch 1: numbers of epoch 0" in note
    assert "DFA" not in note


def test_a_run_with_no_finite_epoch_is_said_to_have_no_end_of_run_point(diverged_results):
    """A diverged run none of whose evaluations was finite (edited here: a real one would
    need epoch 0 itself to overflow) has no end-of-run point, and the line says so."""
    runs = [load_record(p) for p in sorted(diverged_results.rglob("record.json"))]
    dfa = next(r for r in runs if r.method == "dfa" and r.penalty == 0)
    dfa.final.test_acc = None
    assert dfa.numbers_epoch is None
    [note] = notes(hero.build(RunIndex.from_records(runs))[hero.NAME])
    assert ("DFA seed 42 diverged in epoch 1: no epoch's evaluation was finite, so no "
            "end-of-run point") in note
    assert "no epoch's evaluation was finite, so no test acc nor any other number" in \
        diverged_text(dfa)  # the report's words stay its own


def test_no_line_where_no_run_diverged(diverged_results):
    from creditaudit.results import diverged_note

    runs = [load_record(p) for p in sorted(diverged_results.rglob("record.json"))]
    for run in runs:
        run.status = "completed"
    assert diverged_note(runs) is None
    assert not notes(hero.build(RunIndex.from_records(runs))[hero.NAME])


def test_fig3a_counts_the_nan_norms_of_both_its_axes_in_one_note(diverged_results):
    """Figure 3 (a) draws ‖h_L‖ and ‖g_L‖ on two y axes of one panel: the NaN/inf epochs
    of the diverged DFA runs vanished from it without a word, where the other log panels
    count them. Now one note, a line per norm, says it (two notes would cover each other).
    The DFA runs get the epoch-1 entry a run that overflowed after logging it holds (edited
    here: these runs stopped before logging it)."""
    runs = [load_record(p) for p in sorted(diverged_results.rglob("record.json"))]
    for run in [r for r in runs if r.method == "dfa"]:
        entry = copy.deepcopy(run.log[0])
        entry.epoch = 1
        entry.measures.hidden_norms[-1] = math.nan
        entry.measures.bp_grad_norms_per_sample_med[-1] = math.inf
        run.log.append(entry)
    fig = penalty.build(RunIndex.from_records(runs))[penalty.NAME]
    panel = fig.axes[0].get_position().bounds  # (a) and its twin y axis
    notes_a = [t.get_text() for ax in fig.axes if ax.get_position().bounds == panel
               for t in ax.texts if t.get_gid() == "not_drawable"]
    assert notes_a == ["2 of 2 runs logged ‖h_L‖ NaN/inf at some epoch (diverged), not drawn\n"
                       "2 of 2 runs logged ‖g_L‖ NaN/inf at some epoch (diverged), not drawn"]


def test_per_run_curves_name_each_diverged_run_in_their_legend(diverged_results):
    """Figure 8 drew a run that diverged in its first epoch as one dot at epoch 0, named
    `DFA seed 42` like a finished run: nothing on the figure said why its curve stops."""
    from creditaudit.figures import run_curves

    fig = run_curves.build(RunIndex.from_dir(diverged_results))[run_curves.NAME]
    labels = {text.get_text() for legend in (ax.get_legend() for ax in fig.axes) if legend
              for text in legend.get_texts()}
    assert "DFA seed 42, diverged in epoch 1" in labels
    assert "DFA λ=0.01 seed 42, diverged in epoch 1" in labels
