"""The rule suite's checks of what a credit depends on (creditaudit.testing.rule_credits):
learned feedback that never learns, and a credit weighted by the sample's position in the
batch, both of which passed every other check; every legal rule (the built-ins in
tests/test_conformance.py, the docs' NoisyBP here) passes them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from creditaudit.methods import DFA, rule_class
from creditaudit.methods.kp import KolenPollack
from creditaudit.methods.local_ce import LocalCE
from creditaudit.testing import check_rule, rule_checks
from creditaudit.testing.rule_credits import (
    credits_ignore_batch_position,
    learned_feedback_is_trained,
)

pytestmark = pytest.mark.usefixtures("single_thread")


class MirrorlessKP(KolenPollack):
    """A broken rule: it declares learned feedback, but B never takes W's step."""

    name = "mirrorless-kp"

    def mirror_step(self, gaps, optimizer):
        pass


class CopyMirroringKP(KolenPollack):
    """A broken rule: its learning step mirrors W's update into a copy of B, which its
    credits and steps never read."""

    name = "copy-mirroring-kp"

    def mirror_step(self, gaps, optimizer):
        live = self.feedback
        self.feedback = [b.clone() for b in live]
        try:
            super().mirror_step(gaps, optimizer)
        finally:
            self.feedback = live


class UntrainedLocalCE(LocalCE):
    """A broken rule: its local classifiers' optimiser never steps (they stay at zero)."""

    name = "untrained-local-ce"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.classifier_optimizer.step = lambda *a, **k: None


class PositionWeightedDFA(DFA):
    """A broken rule: sample i's credit (and so its update) is weighted by 1 + i/B, its
    place in the batch — trained and reported alike, per sample otherwise."""

    name = "position-weighted-dfa"

    def projected_signal(self, logits, y):
        signal = super().projected_signal(logits, y)
        batch = signal.shape[0]
        weight = 1 + torch.arange(batch, dtype=signal.dtype, device=signal.device) / batch
        return signal * weight[:, None]


@pytest.fixture(scope="module")
def noisy_bp():
    """docs/examples/noisy_bp.py's NoisyBP: noise drawn per sample, in batch order."""
    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "noisy_bp.py"
    spec = importlib.util.spec_from_file_location("noisy_bp_credits", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module.NoisyBP
    finally:
        sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("cls", [MirrorlessKP, CopyMirroringKP, UntrainedLocalCE],
                         ids=lambda cls: cls.name)
def test_learned_feedback_that_never_learns_is_caught(cls):
    with pytest.raises(AssertionError, match="declares feedback_kind 'learned'.*never learns"):
        learned_feedback_is_trained(cls)
    with pytest.raises(AssertionError, match="learned_feedback_is_trained"):
        check_rule(cls, archs=("resmlp",))


def test_the_learned_check_runs_on_learned_rules_only():
    def runs(name):
        return any(c.__name__ == "learned_feedback_is_trained"
                   for c in rule_checks(rule_class(name), archs=("resmlp",)))

    assert all(runs(name) for name in ("kp", "local-ce", "state-bridge", "credit-bridge"))
    assert not any(runs(name) for name in ("bp", "fa", "dfa"))


def test_a_credit_weighted_by_batch_position_is_caught():
    with pytest.raises(AssertionError, match="depends on its position in the batch"):
        credits_ignore_batch_position(PositionWeightedDFA)
    with pytest.raises(AssertionError) as err:
        check_rule(PositionWeightedDFA, archs=("resmlp",))
    assert "credits_ignore_batch_position" in str(err.value)
    assert "credits_are_per_sample" not in str(err.value)  # per sample otherwise
    credits_ignore_batch_position(DFA)


@pytest.mark.parametrize("arch", ["resmlp", "vit", "convmixer"])
def test_noise_drawn_per_sample_in_batch_order_passes(noisy_bp, arch):
    # its reversed batch gets other credits (the noise stays at its positions), but the
    # difference moves with the draw: a legal stochastic rule, not a weighting
    credits_ignore_batch_position(noisy_bp, arch)


def test_the_docs_rule_passes_the_whole_suite(noisy_bp):
    check_rule(noisy_bp, archs=("resmlp",))
