"""Wrong EP plugins that passed every check of the rule suite: EP declares
``blocks_train_on_the_reported_credit`` an expected failure (it trains at its nudged states,
O(β) from the free ones the check reads), so nothing held its step to the credit it reports.
``block_biases_train_on_the_reported_credit`` does: a bias gradient is Σ_b a, whatever the
states, so it is exact for EP too."""

from __future__ import annotations

import pytest

from creditaudit.methods import EP
from creditaudit.methods.ep import contrastive_objective
from creditaudit.testing import check_rule
from creditaudit.testing.rule_properties import block_biases_train_on_the_reported_credit

pytestmark = pytest.mark.usefixtures("single_thread")

NEW_CHECK = "block_biases_train_on_the_reported_credit"


class TrainFlippedEP(EP):
    """A broken EP: its training step nudges with −β (and divides by +β), so the blocks
    train on −a while the credits it reports are EP's."""

    name = "train-flipped-ep"

    def _nudged_step(self, x, y, states, optimizer):
        relax = self.relax
        self.relax = lambda s, labels, **kw: relax(s, labels, beta=-self.beta)
        try:
            return super()._nudged_step(x, y, states, optimizer)
        finally:
            del self.relax


class LayerShiftedEP(EP):
    """A broken EP: block l trains on the credit of its input state a_l, not of the state
    it writes (a_{l+1})."""

    name = "layer-shifted-ep"

    def contrastive_objective(self, x, relaxation, credits):
        return contrastive_objective(self.model, x, relaxation, [credits[0], *credits[:-1]])


class ShortTrainingEP(EP):
    """A broken EP: its training relaxation stops one step short of the reported one's."""

    name = "short-training-ep"

    def _nudged_step(self, x, y, states, optimizer):
        relax = self.relax
        self.relax = lambda s, labels, **kw: relax(s, labels, steps=self.steps - 1)
        try:
            return super()._nudged_step(x, y, states, optimizer)
        finally:
            del self.relax


@pytest.mark.parametrize("cls", [TrainFlippedEP, LayerShiftedEP], ids=lambda c: c.name)
def test_an_ep_step_on_another_credit_is_caught(cls):
    with pytest.raises(AssertionError) as err:
        check_rule(cls, archs=("resmlp",))
    assert f"{NEW_CHECK}[resmlp]" in str(err.value)
    assert "differs from Σ_b a by" in str(err.value)
    block_biases_train_on_the_reported_credit(EP)


def test_a_training_relaxation_one_step_short_is_caught_where_it_has_not_converged():
    # the tiny ResidualMLP converges within the steps (the short step is then harmless);
    # the tiny ViT does not
    with pytest.raises(AssertionError, match="differs from Σ_b a by"):
        block_biases_train_on_the_reported_credit(ShortTrainingEP, "vit")
    block_biases_train_on_the_reported_credit(EP, "vit")
