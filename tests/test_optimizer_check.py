"""``rule.train_step(x, y, optimizer)`` with an optimiser that does not hold the rule's
parameters (another model's, or only some of them) is refused in one line on its first step:
it used to train nothing there and report the batch's loss and accuracy as a trained step."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

from creditaudit import rule
from creditaudit.errors import ConfigError
from creditaudit.methods.base import StepResult
from creditaudit.methods.bp import BP
from creditaudit.models import ResidualMLP

pytestmark = pytest.mark.usefixtures("single_thread")

RULES = ["bp", "fa", "dfa", "fa-linear", "kp", "local-ce", "credit-bridge", "state-bridge",
         "ep", "frozen"]


def net() -> ResidualMLP:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ResidualMLP(8, 16, 4, 2)


def batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,),
                                                                  generator=generator)


@pytest.mark.parametrize("name", RULES)
def test_an_optimizer_over_another_models_parameters_is_refused(name):
    bound = rule(name, net())
    before = [p.detach().clone() for p in bound.model.parameters()]
    with pytest.raises(ConfigError, match=rf"^{name}: the optimizer handed to train_step does "
                                          r"not hold \d+ of the \d+ parameters the rule "
                                          r"trains \(e.g. 'embed.weight'\)"):
        bound.train_step(*batch(), torch.optim.AdamW(net().parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, bound.model.parameters()))


def test_a_subset_is_refused_and_a_superset_is_the_callers():
    bound = rule("dfa", net())
    some = bound.trainable_parameters()[1:]
    with pytest.raises(ConfigError, match="does not hold 1 of the"):
        bound.train_step(*batch(), torch.optim.SGD(some, lr=0.1))
    extra = torch.nn.Parameter(torch.zeros(3))
    bound.train_step(*batch(), torch.optim.SGD([*bound.trainable_parameters(), extra], lr=0.1))


def test_each_optimizer_is_checked_once_per_rule(monkeypatch):
    from creditaudit.methods import optimizer_check

    calls = []
    check = optimizer_check.check_optimizer
    monkeypatch.setattr(optimizer_check, "check_optimizer",
                        lambda r, o: calls.append(r.name) or check(r, o))
    bound = rule("kp", net())  # kp's step calls its parent's: one check still
    optimizer = torch.optim.AdamW(bound.trainable_parameters(), lr=1e-3)
    for _ in range(3):
        bound.train_step(*batch(), optimizer)
    assert calls == ["kp"]
    bound.train_step(*batch(), torch.optim.AdamW(bound.trainable_parameters(), lr=1e-3))
    assert calls == ["kp", "kp"]


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize("block", ["torch.no_grad()", "torch.inference_mode()"])
def test_a_step_inside_the_loops_evaluation_block_is_refused_in_one_line(name, block):
    """A step called where autograd is off (an evaluation block around it) failed deep in
    torch ("element 0 of tensors does not require grad", "Inference tensors do not track
    version counter"); it is refused naming the block, nothing trained."""
    bound = rule(name, net())
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    before = [p.detach().clone() for p in bound.model.parameters()]
    context = torch.no_grad() if block == "torch.no_grad()" else torch.inference_mode()
    with pytest.raises(ConfigError, match=rf"^{name}: train_step was called inside "
                                          rf"{re.escape(block)}, which turns off the "
                                          r"gradients the step trains with: take training "
                                          r"steps outside the evaluation block"), context:
        bound.train_step(*batch(), optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, bound.model.parameters()))
    assert bound.train_step(*batch(), optimizer).finite  # outside it, the step trains


@pytest.mark.parametrize("name", ["bp", "dfa", "fa-linear"])
def test_a_step_under_enable_grad_inside_inference_mode_is_refused_in_one_line(name):
    """torch.enable_grad() opened inside torch.inference_mode() turns grad mode on but not
    inference mode off: the step failed in torch's 'Inference tensors do not track version
    counter', past the grad-mode check. It is refused as inside inference_mode()."""
    bound = rule(name, net())
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    before = [p.detach().clone() for p in bound.model.parameters()]
    with pytest.raises(ConfigError, match=rf"^{name}: train_step was called inside "
                                          r"torch\.inference_mode\(\), which turns off the "
                                          r"gradients"), torch.inference_mode(), \
            torch.enable_grad():
        bound.train_step(*batch(), optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, bound.model.parameters()))


class HandReadout(BP):
    """A rule computing its update by hand, no autograd: the readout's delta rule on the
    detached last state (what a Hebbian or forward-only rule does)."""

    name = "hand-readout"

    def train_step(self, x, y, optimizer):
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            states, logits = self.model.forward_states(x)
            h = states[-1].flatten(1)
            error = logits.softmax(dim=1) - torch.nn.functional.one_hot(y, logits.shape[1])
            for p in self.trainable_parameters():
                if p.shape == (logits.shape[1], h.shape[1]):
                    p.grad = error.T @ h / len(y)
            optimizer.step()
        return StepResult(float(torch.nn.functional.cross_entropy(logits, y)),
                          int((logits.argmax(dim=1) == y).sum()), len(y), True)


def test_a_step_computed_by_hand_trains_inside_no_grad_as_outside():
    """A rule whose step takes no autograd gradients works inside torch.no_grad(): the
    grad-mode check refused it up front (b1cb1f1) in a sentence untrue of it ("which turns
    off the gradients the step trains with"). Only a step that fails there is refused."""
    trained = []
    for block in (contextlib.nullcontext, torch.no_grad):
        bound = rule("bp", net())
        bound.__class__ = HandReadout
        optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
        with block():
            assert bound.train_step(*batch(), optimizer).finite
        trained.append([p.detach().clone() for p in bound.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*trained))
    assert not all(torch.equal(a, b) for a, b in zip(trained[0], net().parameters()))
