"""Every registered credit rule passes the public conformance suite, check by check; and the
suite catches rules that break its contract."""

from __future__ import annotations

import pytest
import torch

from creditaudit.methods import DFA, rule_class, rule_names
from creditaudit.testing import check_rule, rule_checks

pytestmark = pytest.mark.usefixtures("single_thread")

CASES = [(name, check) for name in rule_names() for check in rule_checks(rule_class(name))]


@pytest.mark.parametrize("name,check", CASES, ids=[f"{n}-{c.id}" for n, c in CASES])
def test_rule_conforms(name, check):
    """Every rule, every check, on the tiny ResidualMLP, ViT-Mini and ConvMixer."""
    check()


def test_every_rule_runs_the_checks_that_apply_to_it():
    names = {name: {c.__name__ for c in rule_checks(rule_class(name))} for name in rule_names()}
    assert "local_update_is_the_surrogate_gradient" in names["dfa"]
    assert "local_update_is_the_surrogate_gradient" not in names["bp"]  # BP is end-to-end
    assert "fresh_feedback_is_swappable" in names["fa"]
    assert "fresh_feedback_is_swappable" not in names["state-bridge"]


class LeakyDFA(DFA):
    """A broken rule: its credits keep the graph and its step draws from the global RNG."""

    name = "leaky-dfa"

    def credits(self, x, y):
        torch.rand(1)
        return [a.requires_grad_(True) for a in super().credits(x, y)]


class DoubledDFA(DFA):
    """A broken rule: its blocks are trained on twice the normalised credit."""

    name = "doubled-dfa"

    def credits(self, x, y):
        return [a * 0.5 for a in super().credits(x, y)]  # scale only: â is unchanged

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        for block in self.model.blocks:
            for p in block.parameters():
                if p.grad is not None:
                    p.grad.mul_(2.0)
        return result


def test_the_suite_catches_rules_that_break_the_contract():
    with pytest.raises(AssertionError) as err:
        check_rule(LeakyDFA)
    message = str(err.value)
    assert "credits_are_detached_and_shaped_like_the_states" in message
    assert "credits_have_no_side_effects" in message and "RNG" in message
    with pytest.raises(AssertionError, match="local_update_is_the_surrogate_gradient"):
        check_rule(DoubledDFA)
