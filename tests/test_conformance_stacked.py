"""A rule's declared ``stacked_step`` is checked like its other capabilities: the conformance
suite holds one stacked step of two tiny runs to each run's own ``train_step``
(``stacked_step_is_the_rule_step``), so a rule that declares a step it does not take fails
``check_rule`` — and, as a plugin, the door — instead of being stacked with another rule's
arithmetic."""

from __future__ import annotations

import re

import pytest
import torch

from creditaudit.methods import BP, DFA, rule_class, rule_names
from creditaudit.methods.bp import end_to_end_step
from creditaudit.testing import check_rule, rule_checks

pytestmark = pytest.mark.usefixtures("single_thread")

CHECK = "stacked_step_is_the_rule_step"


def test_the_rules_that_declare_a_stacked_step_are_checked_where_a_stack_runs():
    """Built-ins that declare one run the check on the tiny ResidualMLP and ViT-Mini (the
    ConvMixer has BatchNorm buffers and adapted networks step alone: nothing to compare);
    the others never run it. test_conformance.py's test_rule_conforms runs it for each."""
    for name in rule_names():
        cls = rule_class(name)
        archs = {c.arch for c in rule_checks(cls) if c.__name__ == CHECK}
        assert archs == ({"resmlp", "vit"} if cls.stacks_as() is not None else set()), name
    assert {n for n in rule_names() if rule_class(n).stacks_as()} == {
        "bp", "frozen", "fa", "dfa", "drtp"}


# --- rules that declare a stacked step they do not take --------------------------------------
class SignFeedbackDFA(DFA):
    """A DFA variant whose credit projects the error with sign(B_l), not B_l, yet declares
    the projected step (which projects with the rule's feedback B_l itself)."""

    name, label = "h5-sign-dfa", "sign-feedback DFA"
    credit_formula = "a_l = sign(B_l)^T e"
    stacked_step = "projected"

    def credits_from_error(self, error, states):
        with self.using_feedback([b.sign() for b in self.feedback]):
            return super().credits_from_error(error, states)

    def train_step(self, x, y, optimizer):
        with self.using_feedback([b.sign() for b in self.feedback]):
            return super().train_step(x, y, optimizer)


class DFADeclaredEndToEnd(DFA):
    """DFA's local step declared as BP's end-to-end one."""

    name, label = "h5-dfa-as-bp", "DFA declared end to end"
    stacked_step = "end_to_end"


class BPWithoutPenalty(BP):
    """Backprop that drops the residual-branch penalty λ from its step, declared as the
    end-to-end step (which adds λΣ‖f_l‖²): caught only because the two copies differ in λ."""

    name, label = "h5-bp-no-penalty", "BP without λ"
    stacked_step = "end_to_end"

    def train_step(self, x, y, optimizer):
        penalty = self.options.penalty
        self.options.penalty = 0.0
        try:
            return end_to_end_step(self, x, y, optimizer)
        finally:
            self.options.penalty = penalty


@pytest.mark.parametrize(("bad", "declared"), [
    (SignFeedbackDFA, "projected"), (DFADeclaredEndToEnd, "end_to_end"),
    (BPWithoutPenalty, "end_to_end")], ids=lambda v: getattr(v, "name", v))
def test_a_rule_declaring_a_stacked_step_it_does_not_take_fails_the_check(bad, declared):
    """Each fails exactly the stacked check, on both architectures, in a message that names
    the rule, the check, the declared step and what differs; undeclared, it passes."""
    with pytest.raises(AssertionError) as err:
        check_rule(bad)
    message = str(err.value)
    assert message.startswith(f"{bad.__name__} ({bad.name}) fails 2 conformance checks")
    assert f"{CHECK}[resmlp]: " in message and f"{CHECK}[vit]: " in message
    assert f"{bad.label} declares stacked_step {declared!r}, but its train_step updates" \
        in message
    assert re.search(r"differs by \d\.\d\de[+-]\d+ \(rel\.\)", message)
    honest = type(bad.__name__, (bad,), {"name": bad.name, "label": bad.label,
                                         "stacked_step": None})
    check_rule(honest)


def test_the_check_names_the_copy_whose_penalty_was_dropped():
    with pytest.raises(AssertionError) as err:
        check_rule(BPWithoutPenalty, archs=("resmlp",))
    message = str(err.value)
    assert "updates copy 1 (λ = 0.01) otherwise" in message
    assert "copy 0" not in message  # without λ the two steps agree


class CountingBP(BP):
    """BP whose step also counts its steps in the rule's state, which a stacked step (that
    never calls train_step) would leave behind."""

    name, label = "h5-counting-bp", "counting BP"
    stacked_step = "end_to_end"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0

    def train_step(self, x, y, optimizer):
        self.steps += 1
        return super().train_step(x, y, optimizer)

    def state_dict(self):
        return {"steps": torch.tensor(self.steps)}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])


def test_a_rule_whose_step_changes_its_own_state_cannot_declare_a_stacked_step():
    with pytest.raises(AssertionError) as err:
        check_rule(CountingBP, archs=("resmlp",))
    assert "its train_step changes the rule's own state (steps)" in str(err.value)
