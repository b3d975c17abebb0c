"""The rule conformance suite's checks of what a rule's credit depends on, one function each
like :mod:`creditaudit.testing.rule_properties`: feedback a rule calls learned is trained, and
a sample's credit, and what training learns from it, do not depend on where the sample sits
in its batch.

A rule that declares ``feedback_kind = "learned"`` is read as one whose credit improves with
training (KP's B mirroring W, the bridges' auxiliary nets, local classifiers); one whose
learning step is a no-op, or trains a copy its credits never read, is a fixed-feedback rule
under another name — :func:`learned_feedback_is_trained` compares its credits, after three
epochs of one step, with those of an identical rule that took no step, at the trained
weights.

A credit weighted by the sample's index in the batch (sample i's credit × (1 + i/B)) gives
one sample another credit, and another update, depending on where the batch order puts it;
:func:`credits_ignore_batch_position` reverses the batch. A rule that draws noise per sample
in batch order (docs/extending.md's NoisyBP) legally gives the reversed batch other credits
too, from the same generator state; the two differ in that drawn noise moves with the draw:
after a zero-learning-rate step (weights and BatchNorm statistics kept, the rule's generator
advanced) its position dependence changes, while a weighting stays. Sound, not complete: a
weighting on a rule whose own training moves its credits at that step (an auxiliary net with
an optimiser of its own: local classifiers, the bridges) changes then too and passes; a rule
whose per-sample noise comes from a generator no step advances fails, and rightly — its noise
is then a fixed pattern by position.

A weighting inside a rule's own learning step (local classifiers, a bridge's nets, trained
by an optimiser of the rule's own) leaves its credits per sample and order-free, and passes
that check; :func:`training_ignores_batch_order` trains two alike rules two steps, the first
on the batch in order and reversed, and compares weights and credits. Sound, not complete
either: a rule whose step draws from its generator (the Credit Bridge, brSF) is passed,
since noise drawn per sample in batch order follows the order.

A rule that declares ``feedback_kind = "symmetric"`` computes its credit with the forward
weights themselves (backprop, EP): it estimates ∂CE/∂h_l, so
:func:`symmetric_credits_follow_the_gradient` holds each state's credit within 90° of
backprop's gradient. A weaker claim than the estimate's quality (EP on the tiny ViT-Mini's
unconverged relaxation: cosine 0.24 at h_0; NoisyBP, σ = 1: ≈ 0.7), but one a flipped sign —
an EP that nudges against the loss and divides by +β, so it reports −g and ascends — fails
at every state, and which no other check sees: such a rule reports the credit it trains with.

The untrained twin of :func:`learned_feedback_is_trained` ends the same epochs without a step
(an ``end_epoch`` that may switch credits, as the Credit Bridge's warm-up does, is then
alike in both).
"""

from __future__ import annotations

import torch
from torch import Tensor

from creditaudit.methods.base import CreditRule
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.testing.common import TOLERANCE, relative_error, tiny_batch
from creditaudit.testing.rule_binding import make_rule
from creditaudit.testing.rule_properties import REAL_STEP_LR, trained_for_credits
from creditaudit.testing.rule_state import copied_buffers

# Epochs of one training step each that learned feedback gets before its credits are compared
# with an untrained twin's (as fixed_feedback_stays_fixed trains fixed feedback).
LEARNING_EPOCHS = 3


def learned_feedback_is_trained(cls: type[CreditRule], arch: str = "resmlp") -> None:
    trained, untrained = make_rule(cls, arch=arch), make_rule(cls, arch=arch)
    optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-2)
    for epoch in range(LEARNING_EPOCHS):  # epochs as the trainer ends them: a rule may
        # switch credits at an epoch's end (the Credit Bridge's warm-up)
        assert trained.train_step(*tiny_batch(seed=epoch, arch=arch), optimizer).finite, \
            "a training step on a tiny float64 net was not finite"
        trained.end_epoch(epoch + 1, LEARNING_EPOCHS)
        untrained.end_epoch(epoch + 1, LEARNING_EPOCHS)
    # The twin at the trained weights (and BatchNorm statistics): only the rule's own
    # training — its learned feedback — is left to tell the two apart.
    untrained.model.load_state_dict(trained.model.state_dict())
    trained.model.eval()
    untrained.model.eval()
    x, y = tiny_batch(seed=LEARNING_EPOCHS, arch=arch)
    moved = max(relative_error(a, b) for a, b in zip(trained.credits(x, y),
                                                       untrained.credits(x, y)))
    assert moved >= TOLERANCE, (
        f"the rule declares feedback_kind 'learned', but after {LEARNING_EPOCHS} epochs of "
        "training its credits equal those of the same rule untrained at the same weights "
        f"(they differ by {moved:.1e} rel.): its feedback never learns (a no-op learning "
        "step, or one that trains a copy its credits do not read) — train the feedback its "
        "credits use, or declare 'fixed_random' so the fresh-feedback null redraws it")


def _position_dependence(rule: CreditRule, x: Tensor, y: Tensor
                         ) -> tuple[list[Tensor], float]:
    """Per state, the credits of the reversed batch minus the reversed credits of the batch
    ((B, …) each), and the largest relative size of that difference."""
    order = torch.arange(x.shape[0] - 1, -1, -1)
    credits = rule.credits(x, y)
    reversed_credits = rule.credits(x[order], y[order])
    error = max(relative_error(b, a[order]) for a, b in zip(credits, reversed_credits))
    return [b - a[order] for a, b in zip(credits, reversed_credits)], error


def credits_ignore_batch_position(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = trained_for_credits(cls, arch)
    x, y = tiny_batch(seed=3, arch=arch)
    first, moved = _position_dependence(rule, x, y)
    if moved < TOLERANCE:
        return
    # Fresh draws for a rule that draws per step; the weights and buffers as they were.
    buffers = copied_buffers(rule)
    zero_lr = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    assert rule.train_step(x, y, zero_lr).finite, \
        "a training step on a tiny float64 net was not finite"
    with torch.no_grad():
        for name, b in rule.model.named_buffers():
            b.copy_(buffers[name])
    rule.model.eval()
    again, moved_again = _position_dependence(rule, x, y)
    if moved_again < TOLERANCE:
        return
    error = max(relative_error(b, a) for a, b in zip(first, again))
    assert not error < TOLERANCE, (
        f"reversing the batch's order changes the samples' credits (by {moved:.2e} rel.), "
        "and identically again after a step that draws anew: a sample's credit depends on its "
        "position in the batch (a weight by index), so one sample gets another credit and "
        "update wherever the data order puts it — compute each sample's credit from that "
        "sample alone (noise drawn per sample is fine: it changes with the draw)")


# Relative tolerance of training_ignores_batch_order: summing a batch in another order
# changes the update by rounding (~1e-16), which an optimiser of the rule's own can amplify
# (Adam's first step divides a near-zero gradient by its own size: 2e-10 on the ConvMixer
# with local-ce); weighting samples by position changes weights and credits by 1e-1 or more.
ORDER_TOLERANCE = 1e-6


def _stepped(cls: type[CreditRule], arch: str, reverse_first: bool
             ) -> tuple[CreditRule, bool]:
    """A fresh rule after two SGD steps (the first batch reversed or not, then another
    batch), and whether its generator moved during the steps (it draws per step)."""
    generator = torch.Generator().manual_seed(7)
    rule = make_rule(cls, arch=arch, generator=generator)
    drawn = generator.get_state()
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=REAL_STEP_LR)
    x, y = tiny_batch(seed=1, arch=arch)
    if reverse_first:
        order = torch.arange(x.shape[0] - 1, -1, -1)
        x, y = x[order], y[order]
    for batch in ((x, y), tiny_batch(seed=2, arch=arch)):
        assert rule.train_step(*batch, optimizer).finite, \
            "a training step on a tiny float64 net was not finite"
    return rule, not torch.equal(generator.get_state(), drawn)


def training_ignores_batch_order(cls: type[CreditRule], arch: str = "resmlp") -> None:
    forward, drawn = _stepped(cls, arch, reverse_first=False)
    if drawn:  # noise drawn per sample in batch order may legally follow the order
        return
    backward, _ = _stepped(cls, arch, reverse_first=True)
    weights = max(relative_error(b.detach(), a.detach()) for a, b in zip(
        forward.model.parameters(), backward.model.parameters()))
    forward.model.eval()
    backward.model.eval()
    x, y = tiny_batch(seed=3, arch=arch)
    credits = max(relative_error(b, a) for a, b in zip(forward.credits(x, y),
                                                        backward.credits(x, y)))
    assert weights < ORDER_TOLERANCE and credits < ORDER_TOLERANCE, (
        "training on a batch in reverse order leaves other weights (by "
        f"{weights:.2e} rel.) and credits (by {credits:.2e} rel.) than training on it in "
        "order, though the rule drew nothing in its steps: its training weights a sample "
        "by its position in the batch (its own learning step — feedback, auxiliary nets — "
        "included), so a run's numbers depend on the data order — weigh every sample of a "
        "batch alike")


def symmetric_credits_follow_the_gradient(cls: type[CreditRule], arch: str = "resmlp"
                                          ) -> None:
    rule = trained_for_credits(cls, arch)
    x, y = tiny_batch(seed=3, arch=arch)
    credits = rule.credits(x, y)
    gradients = bp_state_gradients(rule.model, x, y)
    for layer, (a, g) in enumerate(zip(credits, gradients)):
        a, g = a.detach().to(g.dtype).flatten(), g.flatten()
        norms = float(a.norm() * g.norm())
        if norms == 0:  # no direction to compare (a state the loss does not reach)
            continue
        cosine = float(a @ g) / norms
        assert cosine > 0, (
            f"the rule declares feedback_kind 'symmetric', but its credit of state {layer} "
            f"points away from backprop's gradient (cosine {cosine:+.3f}): a rule that "
            "computes its credit with the forward weights estimates ∂CE/∂h_l, and one that "
            "points against it ascends the loss (a flipped sign: EP's nudge or its −r/β) — "
            "fix the sign, or declare the feedback_kind the credit is made of")


__all__ = ["learned_feedback_is_trained", "credits_ignore_batch_position",
           "training_ignores_batch_order", "symmetric_credits_follow_the_gradient",
           "LEARNING_EPOCHS"]
