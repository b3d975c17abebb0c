"""Wrong plugin rules that passed every check of the rule suite, and the checks that catch
them now: a step that trains on a credit kept from an earlier step or batch, credits that
shift to other blocks when a block is frozen, an epoch count kept outside the state, and
local classifiers whose learning step weighs samples by their place in the batch. Every
legal rule (the built-ins in tests/test_conformance.py, the docs' NoisyBP) passes them."""

from __future__ import annotations

import pytest
import torch

from creditaudit.methods import CreditRule, bp_state_gradients
from creditaudit.methods.base import LocalOptions
from creditaudit.methods.local_ce import LocalCE
from creditaudit.models.contract import block_is_trainable
from creditaudit.testing import check_rule
from creditaudit.testing.rule_credits import training_ignores_batch_order
from creditaudit.testing.rule_lifecycle import state_dict_round_trips_and_resumes
from creditaudit.testing.rule_properties import (
    local_update_follows_its_options,
    local_update_is_the_surrogate_gradient,
)

pytestmark = pytest.mark.usefixtures("single_thread")


class LocalBP(CreditRule[LocalOptions]):
    """A legal plugin rule: backprop's state gradients, trained on the local surrogate."""

    name = "local-bp-plugin"
    label = "Local BP"
    credit_formula = "a_l = g_l"
    feedback_kind = "symmetric"
    local = True

    def gradients(self, x, y):
        return bp_state_gradients(self.model, x, y)

    def credits(self, x, y):
        return self.gradients(x, y)

    def train_step(self, x, y, optimizer):
        return self.local_train_step(x, y, optimizer, lambda local: self.gradients(x, y))


class StaleLocalBP(LocalBP):
    """A broken rule: each step trains on the credits of the step before (its first on its
    own), the cache saved with the state so it resumes alike."""

    name = "stale-local-bp"

    def train_step(self, x, y, optimizer):
        fresh = self.gradients(x, y)
        stale = getattr(self, "cached", None) or fresh
        self.cached = fresh
        return self.local_train_step(x, y, optimizer, lambda local: stale)

    def state_dict(self):
        return {"cached": getattr(self, "cached", None) or []}

    def load_state_dict(self, state):
        self.cached = list(state["cached"]) or None


class FirstBatchLocalBP(LocalBP):
    """A broken rule: every step trains on the credits of the first batch it saw."""

    name = "first-batch-local-bp"

    def train_step(self, x, y, optimizer):
        if not hasattr(self, "batch"):
            self.batch = (x.clone(), y.clone())
        return self.local_train_step(x, y, optimizer,
                                     lambda local: self.gradients(*self.batch))

    def state_dict(self):
        return {"batch": list(getattr(self, "batch", ()))}

    def load_state_dict(self, state):
        if state["batch"]:
            self.batch = tuple(state["batch"])


class FrozenShiftLocalBP(LocalBP):
    """A broken rule: the step lists the trained states' credits first, so with a block
    frozen each later block trains on the next state's credit (right when all train)."""

    name = "frozen-shift-local-bp"

    def train_step(self, x, y, optimizer):
        def shifted(local):
            grads = self.gradients(x, y)
            frozen = [i + 1 for i, block in enumerate(self.model.blocks)
                      if not block_is_trainable(block)]
            kept = [a for i, a in enumerate(grads) if i not in frozen]
            return kept + [torch.zeros_like(grads[i]) for i in frozen]

        return self.local_train_step(x, y, optimizer, shifted)


class EpochCountingLocalBP(LocalBP):
    """A broken rule: from its second epoch on it halves credit 1, counting epochs itself in
    a number its state leaves out (a resumed run starts counting again)."""

    name = "epoch-counting-local-bp"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs_seen = 0

    def end_epoch(self, epoch, n_epochs):
        self.epochs_seen += 1
        return {}

    def gradients(self, x, y):
        grads = bp_state_gradients(self.model, x, y)
        scale = 0.5 if self.epochs_seen >= 2 else 1.0
        return [scale * a if layer == 1 else a for layer, a in enumerate(grads)]


class PositionWeightedLocalCE(LocalCE):
    """A broken rule: its local classifiers learn from sample i weighted by 1 + i/B, its
    place in the batch; its credits are per sample and ignore the order."""

    name = "position-weighted-local-ce"

    @torch.no_grad()
    def classifier_credits(self, states, y, *, keep_gradients=False):
        credits = super().classifier_credits(states, y)
        if keep_gradients:
            batch = y.shape[0]
            with torch.autocast(y.device.type, enabled=False):
                for (features, e), weight, bias in zip(self.local_errors(states, y),
                                                       self.weights, self.biases):
                    e = e * (1 + torch.arange(batch, dtype=e.dtype) / batch)[:, None]
                    weight.grad = e.T @ features / batch
                    bias.grad = e.sum(dim=0) / batch
        return credits


def test_the_legal_plugin_passes_the_whole_suite():
    check_rule(LocalBP, archs=("resmlp",))


@pytest.mark.parametrize("cls", [StaleLocalBP, FirstBatchLocalBP], ids=lambda c: c.name)
def test_a_step_that_trains_on_a_kept_credit_is_caught(cls):
    # the surrogate check stepped a fresh rule once, where a kept credit is the step's own
    with pytest.raises(AssertionError, match="differs from the surrogate's"):
        local_update_is_the_surrogate_gradient(cls)
    local_update_is_the_surrogate_gradient(LocalBP)


def test_credits_that_shift_when_a_block_is_frozen_are_caught():
    # every check but frozen_blocks_stay_untouched ran with all blocks trained; that one
    # checks only that the frozen blocks stay
    with pytest.raises(AssertionError, match="method.trainable_blocks=2"):
        local_update_follows_its_options(FrozenShiftLocalBP)
    local_update_follows_its_options(LocalBP)


def test_an_epoch_count_left_out_of_the_state_is_caught():
    # the restored rule used to end epoch 1 too, so it counted alike without the file
    with pytest.raises(AssertionError, match="diverges"):
        state_dict_round_trips_and_resumes(EpochCountingLocalBP)
    state_dict_round_trips_and_resumes(LocalBP)


def test_a_learning_step_weighted_by_batch_position_is_caught():
    # its credits are per sample and ignore the order, so credits_ignore_batch_position
    # passed it; only what the classifiers learn depends on the order
    with pytest.raises(AssertionError, match="weights a sample by its position"):
        training_ignores_batch_order(PositionWeightedLocalCE)
    with pytest.raises(AssertionError) as err:
        check_rule(PositionWeightedLocalCE, archs=("resmlp",))
    assert "training_ignores_batch_order" in str(err.value)
    assert "credits_ignore_batch_position" not in str(err.value)
    training_ignores_batch_order(LocalCE)
