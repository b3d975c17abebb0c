"""The per-epoch diagnostics a logger writes beyond the norms and cosines: whether the deep
cosine is a valid measurement, and a feedback rule's alignment of B with W per layer."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from creditaudit.config import RunConfig
from creditaudit.loggers import epoch_scalars
from creditaudit.run.trainer import train
from sweep_files import TINY_SWEEP_BASE

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {**TINY_SWEEP_BASE, "method.name": "fa-linear", "data.teacher_width": 32,
        "optim.epochs": 1, "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (pip install -e '.[test]')")
def test_tensorboard_holds_the_feedback_alignment_and_the_cosines_validity(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    record = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path / "runs"),
                                          "run.tensorboard": str(tmp_path / "tb")})).record
    events = EventAccumulator(str(tmp_path / "tb" / record.run_id),
                              size_guidance={"scalars": 0})
    events.Reload()
    for entry in record.log:
        measures = entry.measures
        assert measures.feedback_layers  # fa-linear: one B per layer
        expected = {"credit/deep_cos_valid": 1.0}
        for layer, angle, ratio in zip(measures.feedback_layers, measures.feedback_angle,
                                       measures.feedback_norm_ratio, strict=True):
            expected[f"credit/feedback_angle/{layer}"] = angle
            expected[f"credit/feedback_norm_ratio/{layer}"] = ratio
        for tag, value in expected.items():
            assert epoch_scalars(entry)[tag] == value, tag
            (point,) = [p for p in events.Scalars(tag) if p.step == entry.epoch]
            assert point.value == pytest.approx(value, rel=1e-6), tag


def test_an_invalid_deep_cosine_is_logged_as_not_valid(tmp_path):
    entry = train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                         "run.out_dir": str(tmp_path)})).record.log[-1]
    below_floor = dataclasses.replace(
        entry.measures, cos_valid=[True, False, True],
        cos_invalid=[None, "reference_below_floor", None])
    scalars = epoch_scalars(dataclasses.replace(entry, measures=below_floor))
    assert scalars["credit/deep_cos_valid"] == 0.0
    assert "credit/deep_cos" in scalars  # still logged, beside its mark
    old = dataclasses.replace(entry.measures, cos_valid=None, cos_invalid=None)
    assert "credit/deep_cos_valid" not in epoch_scalars(dataclasses.replace(entry,
                                                                            measures=old))
    assert not any(tag.startswith("credit/feedback") for tag in scalars)  # dfa: no B per layer


def test_an_extra_named_like_the_tools_own_number_does_not_replace_it(tmp_path):
    entry = train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                         "run.out_dir": str(tmp_path)})).record.log[-1]
    mine = {"loss": 9.0, "acc": 0.9, "lr": 7.0, "seconds": 5.0, "my_metric": 1.5}
    scalars = epoch_scalars(dataclasses.replace(entry, extras=mine))
    assert scalars["train/loss"] == entry.train_loss  # the epoch's training loss
    assert scalars["train/acc"] == entry.train_acc
    assert scalars["train/lr"] == entry.lr
    assert scalars["train/seconds"] == entry.seconds
    assert {tag: scalars[tag] for tag in scalars if tag.startswith("train/extras/")} == {
        "train/extras/loss": 9.0, "train/extras/acc": 0.9, "train/extras/lr": 7.0,
        "train/extras/seconds": 5.0}
    assert scalars["train/my_metric"] == 1.5


def test_a_diagnostic_named_like_the_verdicts_tags_does_not_replace_them(tmp_path):
    entry = train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                         "run.out_dir": str(tmp_path)})).record.log[-1]
    judged = dataclasses.replace(entry, protocol={"a": "passed", "walk_back": "fired",
                                                  "verdict": "passed"},
                                 verdict="needs walk-back")
    scalars = epoch_scalars(judged)
    assert scalars["protocol/walk_back"] == 1.0  # the verdict
    assert scalars["protocol/diagnostics/walk_back"] == 1.0
    assert scalars["protocol/diagnostics/verdict"] == 0.0
    assert "protocol/verdict" not in scalars  # W&B's verdict text
    assert scalars["protocol/a"] == 0.0


def test_an_extra_named_extras_slash_a_tool_name_keeps_a_tag_of_its_own(tmp_path):
    """``loss`` is logged as ``train/extras/loss``; an extra named ``extras/loss`` took
    that tag too, and one number overwrote the other."""
    entry = train(RunConfig().replace(**{**TINY, "method.name": "dfa",
                                         "run.out_dir": str(tmp_path)})).record.log[-1]
    mine = {"loss": 9.0, "extras/loss": 8.0, "extras/extras/loss": 7.0, "extras": 6.0}
    scalars = epoch_scalars(dataclasses.replace(entry, extras=mine))
    assert {tag: scalars[tag] for tag in scalars if tag.startswith("train/extras")} == {
        "train/extras/loss": 9.0, "train/extras/extras/loss": 8.0,
        "train/extras/extras/extras/loss": 7.0, "train/extras": 6.0}
    assert scalars["train/loss"] == entry.train_loss
