"""Credit rules that declare a stacked step (tests/test_stacked_plugins.py): the door runs
``stacked_step_is_the_rule_step`` on them, and ``sweep --stack`` stacks a plugin rule that
passed it like a built-in.

- ``h5-stacked-dfa``: the control — DFA under another name, declaring DFA's projected step,
  which is its step: admitted and stacked;
- ``h5-sign-dfa``: projects the output error with sign(B_l) in its credit and its step, yet
  declares the projected step (which projects with B_l itself): refused at the door;
- ``h5-waived-sign-dfa``: the same, declaring the stacked check a failure by design:
  admitted, and trained alone with its own step.
"""

from creditaudit.methods.dfa import DFA


class StackedDFA(DFA):
    name = "h5-stacked-dfa"
    label = "plugin DFA"
    stacked_step = "projected"


class SignDFA(DFA):
    name = "h5-sign-dfa"
    label = "sign-feedback DFA"
    credit_formula = "a_l = sign(B_l)^T e"
    stacked_step = "projected"

    def credits_from_error(self, error, states):
        with self.using_feedback([b.sign() for b in self.feedback]):
            return super().credits_from_error(error, states)

    def train_step(self, x, y, optimizer):
        with self.using_feedback([b.sign() for b in self.feedback]):
            return super().train_step(x, y, optimizer)


class WaivedSignDFA(SignDFA):
    name = "h5-waived-sign-dfa"
    label = "waived sign-feedback DFA"
    stacked_step = "projected"
    expected_failures = {"stacked_step_is_the_rule_step": "its step projects with sign(B_l)"}
