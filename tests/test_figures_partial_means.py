"""A mean across seeds that some of its method's runs hold no number for (a diverged run's
end-of-run block has no metrics) says over how many runs it is, and a method drawn from
one run says its error bar of 0 measures no spread — as the report's ``(2 of 3 runs)`` and
``(1 run)`` do; titles give the seeds each method ran, not the most any ran. A per-epoch
norm a diverged run logged as NaN/inf, which no axis draws, is counted on its panel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from creditaudit.config import RunConfig
from creditaudit.figures import RunIndex, run_curves
from creditaudit.figures.runs import layer_mean_std
from creditaudit.results import mean_std
from creditaudit.run.trainer import Trainer, train
from creditaudit.study.figures import hero, lambda_sweep, summary, temporal
from integrity_support import nan_weights_after

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.rho_samples": 16,
        "diagnostics.null_draws": 2, "run.progress": False}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """BP at seeds 42 and 123 and diverged in epoch 2 at seed 8 (no end-of-run metrics);
    FA, DFA, DFA λ=0.01, the bridges and frozen blocks at seed 42 alone."""
    out = tmp_path_factory.mktemp("partial_means")

    def run(method: str, seed: int = 42, penalty: float = 0.0) -> None:
        train(RunConfig().replace(**{**TINY, "method.name": method, "run.seed": seed,
                                     "method.penalty": penalty, "run.out_dir": str(out)}))

    for method in ("bp", "fa", "dfa", "state-bridge", "credit-bridge", "frozen"):
        run(method)
    run("dfa", penalty=0.01)
    run("bp", 123)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        run("bp", 8)
    return out


def note(fig) -> str:  # noqa: ANN001 - a matplotlib Figure
    [text] = [t.get_text().replace("\n", " ") for t in fig.texts if t.get_gid() == "partial"]
    return text


def test_fig1_says_which_means_leave_runs_out_and_which_have_one_run(mixed):
    index = RunIndex.from_dir(mixed)
    assert sorted(r.status for r in index.runs).count("diverged") == 1
    text = note(hero.build(index)[hero.NAME])
    assert "per-layer cosine of BP over 2 of 3 runs" in text
    assert "One run, so no spread (error bar 0): FA, DFA, State Bridge, Credit Bridge." in text
    assert "final accuracy of BP" not in text  # the diverged run's last finite epoch's


def test_fig5_notes_partial_means_and_titles_give_each_methods_seeds(mixed):
    figs = summary.build(RunIndex.from_dir(mixed))
    per_layer = note(figs["fig5b_per_layer"])
    for what in ("per-layer cosine", "ρ", "nudging"):
        assert f"{what} of BP over 2 of 3 runs" in per_layer
    assert "drift of BP over 2 of 3 runs" in note(figs["fig5c_drift"])
    assert "One run, so no spread" in note(figs["fig5e_final_accuracy"])
    assert "1–3 seeds" in figs["fig5a_accuracy"]._suptitle.get_text()
    assert "(1–3 seeds)" in figs["fig5e_final_accuracy"].axes[0].get_title()


def test_a_norm_a_diverged_run_logged_nan_is_counted_on_its_panel(mixed):
    """The NaN ‖h_L‖ and ‖g_L‖ of BP seed 8's overflowed epoch left no trace: the curves
    (per run in Figure 8, a mean in Figures 2 and 4) just stopped or averaged fewer runs."""
    index = RunIndex.from_dir(mixed)
    for fig in (run_curves.build(index)[run_curves.NAME], temporal.build(index)[temporal.NAME]):
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        for name in ("‖h_L‖", "‖g_L‖"):
            [text] = [t for t in texts if name in t]
            assert text.startswith("1 of ") and text.endswith(
                f"runs logged {name} NaN/inf at some epoch (diverged), not drawn")
    figure = lambda_sweep.build(index)[lambda_sweep.NAME]  # no diverged DFA run: no note
    assert not [t for ax in figure.axes for t in ax.texts if "NaN/inf" in t.get_text()]


def test_error_bars_are_the_sample_std_and_one_run_draws_none():
    """Error bars and bands were the population std while the report and the experiments
    give the sample std (ddof=1): the same seeds drew a narrower spread. A layer or value
    that one run holds still draws no bar (0), as documented."""
    assert mean_std([0.2, 0.4, None]) == pytest.approx((0.3, 0.1414213562))
    assert mean_std([0.5]) == (0.5, 0.0)
    mean, std = layer_mean_std([[0.2, 1.0, None], [0.4, None, None]])
    assert mean[:2] == pytest.approx([0.3, 1.0]) and np.isnan(mean[2])
    assert std[:2] == pytest.approx([0.1414213562, 0.0]) and np.isnan(std[2])
