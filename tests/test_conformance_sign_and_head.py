"""Wrong plugin rules that passed every check of the rule suite: an EP whose nudge sign is
flipped consistently (it reports −g and trains on it, so it ascends the loss, and every check
of the step against the reported credit holds), and end-to-end rules whose head is left
untrained or trained on a scaled error (no check of the blocks looks at the readout). Every
built-in (tests/test_conformance.py) and the docs' NoisyBP pass the checks that catch them."""

from __future__ import annotations

import pytest

from creditaudit.methods import BP, EP
from creditaudit.methods.bp import end_to_end_step
from creditaudit.models.contract import readout_parameters
from creditaudit.testing import check_rule
from creditaudit.testing.rule_credits import symmetric_credits_follow_the_gradient
from creditaudit.testing.rule_steps import readout_trains_on_its_cross_entropy

pytestmark = pytest.mark.usefixtures("single_thread")


class FlippedEP(EP):
    """A broken EP: a_l = +r_{l−1}/β, reported and trained on alike — it ascends."""

    name = "flipped-ep"

    def credits_from(self, relaxation, batch, beta=None):
        return [-a for a in super().credits_from(relaxation, batch, beta)]


class _HeadStepBP(BP):
    """BP whose optimizer step first rewrites the readout's gradients (``head``)."""

    def head(self, params):
        raise NotImplementedError

    def train_step(self, x, y, optimizer):
        step = optimizer.step

        def rewritten(*args, **kwargs):
            self.head(readout_parameters(self.model))
            return step(*args, **kwargs)

        optimizer.step = rewritten
        try:
            return end_to_end_step(self, x, y, optimizer)
        finally:
            del optimizer.step


class UntrainedHeadBP(_HeadStepBP):
    """A broken BP: the readout's gradients are dropped, so the head stays at init."""

    name = "untrained-head-bp"

    def head(self, params):
        for p in params:
            p.grad = None


class LoudHeadBP(_HeadStepBP):
    """A broken BP: the readout trains on ten times its cross-entropy gradient."""

    name = "loud-head-bp"

    def head(self, params):
        for p in params:
            p.grad.mul_(10.0)


def test_a_consistently_sign_flipped_ep_is_caught():
    with pytest.raises(AssertionError) as err:
        check_rule(FlippedEP, archs=("resmlp",))
    assert "symmetric_credits_follow_the_gradient[resmlp]" in str(err.value)
    assert "points away from backprop's gradient" in str(err.value)
    for arch in ("resmlp", "vit", "convmixer"):
        symmetric_credits_follow_the_gradient(EP, arch)


@pytest.mark.parametrize("cls,message", [(UntrainedHeadBP, "no gradient"),
                                         (LoudHeadBP, "another gradient")],
                         ids=lambda v: getattr(v, "name", v))
def test_a_head_trained_otherwise_is_caught(cls, message):
    with pytest.raises(AssertionError) as err:
        check_rule(cls, archs=("resmlp",))
    assert "readout_trains_on_its_cross_entropy[resmlp]" in str(err.value)
    assert f"output layer's out_head.weight {message}" in str(err.value)
    readout_trains_on_its_cross_entropy(BP)
