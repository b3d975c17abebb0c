"""A rule's training step is checked for what it does beside its update: what it reports of
the batch (the run records it as training loss and accuracy), how it applies the optimizer
it is handed, whether it leaves its batch and the model's modes alone, and whether feedback
it calls fixed stays fixed. The conformance suite holds each at the door; the trainer holds
what a step reports on every batch, since a plugin may tell the truth on the door's tiny
ones only (tests/guest_pkg/creditaudit_guests/step_rules.py)."""

from __future__ import annotations

import json

import pytest

from creditaudit.errors import GuestError
from creditaudit.methods import DFA
from creditaudit.methods.base import StepResult
from creditaudit.methods.registry import rule_class
from creditaudit.run.steps.reported import checked_step
from creditaudit.run.trainer import train
from creditaudit.testing import make_rule, rule_checks
from door_support import ORIGIN, guests, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

# (plugin, the check it fails, what the failure says)
LIARS = [
    ("step-halves-its-loss", "step_reports_its_batch", "reports loss"),
    ("step-all-correct", "step_reports_its_batch", "reports 9 correct where"),
    ("step-double-step", "step_is_one_optimizer_step", "by 2.000× its −lr·gradient"),
    ("step-scales-its-input", "step_reports_its_batch", "changed its input batch in place"),
    ("step-leaves-eval", "step_reports_its_batch", "in another train/eval mode"),
    ("step-learns-its-feedback", "fixed_feedback_stays_fixed", "training changed feedback.0"),
    ("step-redraws-each-epoch", "fixed_feedback_stays_fixed", "(in train_step or end_epoch)"),
    ("step-decays-its-lr", "step_is_one_optimizer_step", "changed 'lr' (0.1 -> 0.05)"),
    ("step-nan-but-finite", "step_reports_its_batch", "reports loss nan (finite=True)"),
    ("step-clears-optimizer-state", "step_is_one_optimizer_step",
     "step count going from 1 to 1"),
]


@pytest.mark.parametrize("name,check,says", LIARS, ids=[case[0] for case in LIARS])
def test_the_suite_catches_a_step_that_lies(tmp_path, name, check, says):
    with guests(tmp_path / "site", name):
        checks = [c for c in rule_checks(rule_class(name), ("resmlp",)) if c.__name__ == check]
        assert len(checks) == 1
        with pytest.raises(AssertionError) as err:
            checks[0]()
    assert says in str(err.value)


def test_a_step_that_lies_is_refused_at_the_door(tmp_path):
    out = tmp_path / "runs"
    with guests(tmp_path / "site", "step-halves-its-loss", "door-mixture"), \
            pytest.raises(GuestError) as err:
        train(tiny_config(out, **{"method.name": "step-halves-its-loss"}))
    line = str(err.value)
    assert line.startswith(f"credit rule plugin 'step-halves-its-loss' ({ORIGIN}) fails the "
                           "conformance check step_reports_its_batch[resmlp]: "), line
    assert "\n" not in line
    assert not list(out.rglob("record.json"))


def test_a_step_that_miscounts_past_the_door_is_named_when_it_does(tmp_path):
    out = tmp_path / "runs"
    with guests(tmp_path / "site", "step-miscounts-past-the-door", "door-mixture"), \
            pytest.raises(GuestError) as err:
        train(tiny_config(out, **{"method.name": "step-miscounts-past-the-door"}))
    line = str(err.value)
    assert line.startswith("credit rule plugin 'step-miscounts-past-the-door' "
                           f"({ORIGIN}): train_step() reported n=128 for a batch of 64 "
                           "samples; an error in its code, not in creditaudit"), line
    for path in out.rglob("record.json"):  # never recorded as a completed run
        assert json.loads(path.read_text())["status"] != "completed"


def test_a_nan_loss_reported_finite_is_a_divergence(tmp_path):
    out = tmp_path / "runs"
    with guests(tmp_path / "site", "step-nan-past-the-door", "door-mixture"):
        result = train(tiny_config(out, **{"method.name": "step-nan-past-the-door"}))
    record = result.record
    assert record.divergence == {"epoch": 1, "step": 0, "reason": "non-finite loss or state"}
    text = (result.run_dir / "record.json").read_text()
    assert "NaN" not in text.replace('"NaN"', "")  # no NaN training loss, strict JSON


def test_what_a_step_reports_is_checked(tiny_rule):
    ok = StepResult(loss=0.5, correct=3, n=8, finite=True)
    assert checked_step(ok, 8, tiny_rule) == ok
    nan = checked_step(StepResult(float("nan"), 3, 8, True), 8, tiny_rule)
    assert nan.finite is False
    for bad, says in [(StepResult(0.5, 3, 16, True), "reported n=16 for a batch of 8"),
                      (StepResult(0.5, 9, 8, True), "reported 9 correct of a batch of 8"),
                      (StepResult(0.5, -1, 8, True), "reported -1 correct"),
                      (0.5, "returned a float, not a StepResult")]:
        with pytest.raises(RuntimeError, match=f"credit rule 'dfa': train_step\\(\\) {says}"):
            checked_step(bad, 8, tiny_rule)


@pytest.fixture
def tiny_rule():
    return make_rule(DFA)


