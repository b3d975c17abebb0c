"""The conformance suite of credit rules — ``check_rule(RuleClass)``.

Like scikit-learn's ``check_estimator``: it runs every check that does not depend on what the
rule computes, on tiny float64 networks of every architecture family in
:data:`~creditaudit.testing.common.TINY_ARCHS` — a ResidualMLP (states (B, d)), a ViT-Mini
(token states (B, T, d)) and a ConvMixer (feature maps (B, d, H, W), with BatchNorm), plus,
for rules that declare ``adapted_models``, two networks of :mod:`creditaudit.testing.zoo` adapted
with :func:`creditaudit.adapt` (PyTorch's TransformerEncoder layers; a CIFAR ResNet with
BatchNorm and a strided 1×1 shortcut) — and
raises one AssertionError listing every check that failed. Use it in a rule's own tests::

    from creditaudit.testing import check_rule
    check_rule(MyRule)                         # raises AssertionError naming what failed

    @pytest.mark.parametrize("check", rule_checks(MyRule), ids=lambda c: c.id)
    def test_conformance(check):               # one test per check and architecture
        check()

    check_rule(MyRule, options={"sigma": 0.5})  # under other options than its defaults

(the door checks a plugin rule under its run's options).

A check the rule fails by design is declared, with the reason, in the class attribute
``expected_failures`` (``{check name: reason}``, or ``"name[arch]"`` for one architecture)
or the ``expected_failures`` argument: it is reported as an expected failure, and an error
once it passes.

The checks (functions of :mod:`creditaudit.testing.rule_properties`, and of
:mod:`creditaudit.testing.rule_lifecycle` for the state, device, bf16 and feedback checks):

- ``credits_are_detached_and_shaped_like_the_states``: L + 1 finite credits, no graph, each
  shaped like its state, for a batch of one sample too (an evaluation set's last chunk may
  hold one) — every diagnostic compares them with the states' gradients;
- ``credits_have_no_side_effects``: computing credits in eval mode, as every diagnostic does,
  changes no parameter, no buffer (BatchNorm statistics), no ``.grad``, no global RNG state
  and not the rule's own state, and gives the same credits twice — diagnostics must never
  change training;
- ``local_update_is_the_surrogate_gradient`` (rules with ``local = True``): after one step
  every trainable parameter's gradient equals the analytic gradient of the local surrogate —
  Σ_l ⟨f_l(h_l), â_{l+1}⟩ with h_l detached, ⟨embed(x), â_0⟩ and the readout's exact
  cross-entropy on the detached h_L, with â = a / (RMS(a) + 1e-6) of the credits the rule
  reports — so the credit the audit scores is the credit that trained the network (every
  rule takes two training steps on other batches first, so learned feedback is checked once
  it has trained, not only at an init that may give zero credits, and a step that trains on
  a credit kept from an earlier step or batch fails);
- ``blocks_train_on_the_reported_credit`` (rules with ``local = False``, on architectures
  with a block whose branch ends in one ``nn.Linear``:
  :func:`~creditaudit.models.contract.split_branch`): after two training steps on other
  batches (as above: a step that counts its steps and trains on another credit from the
  second on matches on its first only) and one zero-learning-rate step, that last layer's
  weight gradient equals Σ_b a_{l+1,b} ⊗ u_b and its bias gradient Σ_b a_{l+1,b} (u = the
  block's hidden activation ``hidden(h_l)``, a the reported credit, batch-mean scale, read
  after the step so a rule that draws its feedback per step reports the step's draw). This
  is the gradient the rule's own credit implies for that layer, exact for backprop and every
  per-layer feedback rule (their weight gradients are exact). A rule that reports one credit
  and trains its blocks with another — or not at all — fails it; without it the audit would
  score a credit that never trained anything. (EP declares it an expected failure: it trains
  at its nudged states, O(β) away);
- ``block_biases_train_on_the_reported_credit`` (where the check above runs): its bias part
  alone — the last layer's bias gradient equals Σ_b a_{l+1,b}, which reads no state, so it
  is exact for EP too. A rule that declares the check above may still not train a block on
  another credit than it reports (EP's step nudged with −β, or block l fed a_l);
- ``embedding_trains_on_the_reported_credit`` (rules with ``local = False``, on the
  networks that are not adapted): after the same two steps and a zero-learning-rate one,
  the embedding's parameter gradients equal ∂⟨h_0, a_0⟩/∂θ of the credit a_0 it reports
  for h_0 — exact for backprop, EP and every per-layer feedback rule on a one-layer
  embedding. The checks above see the blocks only: a rule whose step trains the embedding
  with backprop while it reports another a_0 (negated, zero, another draw) would be
  audited at h_0 on a credit nothing trains on. An embedding with a BatchNorm is passed
  (its batch statistics are differentiated through by backprop, held by EP);
- ``credited_parts_are_trained`` (every rule, every architecture): after one
  zero-learning-rate step, each trainable part — the embedding, each block; an adapted
  model's segments — whose state the rule reports a non-zero credit for got a non-zero
  gradient; and one real step (``SGD(rule.trainable_parameters(), lr=0.1)``, the rule's own
  ``train_step``) changes every parameter of those parts that it gives a non-zero gradient.
  A rule that trains only its readout while reporting backprop's gradients would otherwise
  be audited cos +1.000; this holds it where no block splits into a last ``nn.Linear`` (the
  check above) too, and holds the rule whose gradients are backprop's but whose weights stay
  at init — left out of ``trainable_parameters()``, an optimizer step skipped or undone;
- ``step_reports_its_batch``: a training step (train mode, zero learning rate) reports
  the batch size, the number its model's logits classify correctly and their cross-entropy
  (to 1e-9 in float64) — the run records them as training loss and accuracy — and leaves
  its input batch, its labels, every module's train/eval mode and torch's, numpy's and
  Python's global random streams as it found them (a network's dropout draws from torch's);
- ``step_is_one_optimizer_step``: one step with ``SGD(lr=0.1)`` moves every model
  parameter by exactly −lr·(the gradient it leaves), and no parameter without one, and
  leaves the optimizer's param groups and settings (lr, weight decay, …) as it found them,
  and a second step with ``AdamW`` continues the first's state (each parameter it moves one
  step further in its count): the optimizer the run hands the step is applied once, nothing
  else writes the weights or clears the optimizer's moments, and the step runs no schedule
  or regulariser of its own beside the run's recorded one;
- ``frozen_blocks_stay_untouched``: with ``trainable_blocks=1`` the other blocks keep their
  initial weights and get no gradient over several steps (the depth ladder and the (d)
  baseline rely on it);
- ``state_dict_round_trips_and_resumes``: the rule's state saved in epoch 2 loads with
  ``torch.load(weights_only=True)`` (tensors and plain containers only) and a rule restored
  from it — made with another model seed and another generator seed, so feedback left out
  of the state is not drawn again alike, and without epoch 1's ``end_epoch``, so a count
  or switch kept outside the state is not repeated alike — continues bit-identically,
  parameters and
  buffers — resumed runs must equal
  uninterrupted ones; ``end_epoch`` leaves the model's parameters and buffers as they were
  (the optimizer alone writes the weights), checked on a copy taken before it;
- ``moves_to_a_device``: ``rule.to(device)`` moves the model and everything the rule owns;
- ``bf16_step_is_finite``: a training step under bf16 autocast is finite and keeps fp32
  parameters;
- ``fresh_feedback_is_swappable`` (``feedback_kind == "fixed_random"``): a redraw has the
  training feedback's structure, changes the credits inside ``using_feedback`` and leaves
  them exactly as before afterwards; ``credits_under`` gives, draw by draw, the credits
  ``using_feedback`` gives (to 1e-12 in float64: an override may batch differently) — the
  fresh-feedback null swaps feedback this way;
- ``fixed_feedback_stays_fixed`` (``feedback_kind == "fixed_random"``): the feedback in
  the rule's state is bit-identical after three epochs of one training step each (their
  ``end_epoch`` included) — the fresh-feedback null compares it with fresh draws of its
  initial distribution;
- ``stacked_step_is_the_rule_step`` (rules that declare a ``stacked_step``, on the tiny
  networks a stacked step takes: no adapted network, no buffers): one stacked step of two
  copies that differ in weights, batch, feedback draw and λ equals each copy's own
  ``train_step`` — updates, loss, correct count, the rule's state — since ``sweep --stack``
  and CUDA-graph capture run the declared step in place of the rule's own
  (:mod:`creditaudit.testing.rule_stacking`);
- ``local_update_follows_its_options`` (rules with ``local = True``, on the networks that
  are not adapted): the surrogate check again, with ``method.penalty`` 0.01 (the surrogate
  then adds λ·mean_b ‖f_l‖² for every trained block), the other ``normalise_credit``
  than the rule's default and ``method.trainable_blocks`` 2 (the first block frozen, as
  the depth ladder freezes blocks; each trained block must still take its own state's
  credit) (an option the rule names in ``ignored_options`` is left as it is) — a step that
  ignores an option the run records would train with other settings;
- ``credits_are_per_sample``: after two training steps, replacing the first sample of a
  batch (input and label) leaves every other sample's credit as it was (to 1e-10) — a
  credit that mixes in another sample's error (an indexing slip) would be compared with a
  gradient it does not estimate;
- ``credits_are_seeded``: two rules made with one seed and given one step give identical
  credits (the rule draws only from the generator it is given), and, for a rule that
  declares ``method.feedback_seed``, another seed gives other credits;
- ``learned_feedback_is_trained`` (``feedback_kind == "learned"``; of
  :mod:`creditaudit.testing.rule_credits`, like the next): after three epochs of one training
  step each (``end_epoch`` included), the credits differ from those of the same rule made
  alike that took no step, given the trained weights — feedback called learned whose learning
  step is a no-op, or trains a copy the credits never read, is fixed feedback under another
  name;
- ``credits_ignore_batch_position``: after two training steps, the credits of the batch in
  reverse order are its credits reversed (to 1e-10) — or, for a rule that draws noise per
  sample in batch order (the docs' NoisyBP), their difference changes after a
  zero-learning-rate step that draws anew. A credit weighted by the sample's index, which
  stays, would give one sample another update wherever the data order puts it;
- ``training_ignores_batch_order``: two training steps (SGD on the model; the rule's own
  optimisers as it runs them), the first on a batch in order or reversed, give the same
  weights and credits (to 1e-6) — its own learning step included (local classifiers, the
  bridges' nets), which the check above cannot see. A rule whose step draws from its
  generator is passed (noise drawn per sample in batch order follows the order);
- ``symmetric_credits_follow_the_gradient`` (``feedback_kind == "symmetric"``): after two
  training steps, each state's credit has a positive cosine with backprop's gradient
  ∂CE/∂h_l — a rule that computes its credit with the forward weights (BP, EP) estimates
  it, and an EP whose nudge sign is flipped consistently reports −g and trains on it,
  ascending the loss, though every other check holds (it trains on the credit it reports);
- ``readout_trains_on_its_cross_entropy``: after one zero-learning-rate step, the output
  layer (the ``nn.Linear`` whose output is the logits) has the gradient of the batch-mean
  cross-entropy — exact for every rule, whatever feedback it sends below. An end-to-end
  rule whose head is detached, left untrained or trained on a scaled error passes every
  check of the blocks and would record its accuracy for a network trained otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from creditaudit.methods.base import CreditRule
from creditaudit.methods.registry import validate_rule_class
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import split_branch
from creditaudit.testing.common import (
    TINY_ARCHS,
    Check,
    Report,
    declared_failures,
    reason_for,
    resolve_options,
    run_checks,
    tiny_arch,
    tiny_model,
)
from creditaudit.testing.rule_binding import checked_with
from creditaudit.testing.rule_credits import (
    credits_ignore_batch_position,
    learned_feedback_is_trained,
    symmetric_credits_follow_the_gradient,
    training_ignores_batch_order,
)
from creditaudit.testing.rule_lifecycle import (
    bf16_step_is_finite,
    binding_leaves_global_rngs_untouched,
    fresh_feedback_is_swappable,
    moves_to_a_device,
    run_metrics_are_recordable,
    state_dict_round_trips_and_resumes,
)
from creditaudit.testing.rule_properties import (
    block_biases_train_on_the_reported_credit,
    blocks_train_on_the_reported_credit,
    credited_parts_are_trained,
    credits_are_detached_and_shaped_like_the_states,
    credits_are_per_sample,
    credits_are_seeded,
    credits_have_no_side_effects,
    frozen_blocks_stay_untouched,
    local_update_follows_its_options,
    local_update_is_the_surrogate_gradient,
)
from creditaudit.testing.rule_stacking import stacked_step_is_the_rule_step, stacks_on
from creditaudit.testing.rule_steps import (
    embedding_trains_on_the_reported_credit,
    fixed_feedback_stays_fixed,
    readout_trains_on_its_cross_entropy,
    step_is_one_optimizer_step,
    step_reports_its_batch,
)

CHECKS: tuple[Callable[..., None], ...] = (
    credits_are_detached_and_shaped_like_the_states, credits_have_no_side_effects,
    local_update_is_the_surrogate_gradient, blocks_train_on_the_reported_credit,
    block_biases_train_on_the_reported_credit, embedding_trains_on_the_reported_credit,
    credited_parts_are_trained,
    step_reports_its_batch, step_is_one_optimizer_step, frozen_blocks_stay_untouched,
    state_dict_round_trips_and_resumes, moves_to_a_device, bf16_step_is_finite,
    fresh_feedback_is_swappable, fixed_feedback_stays_fixed,
    stacked_step_is_the_rule_step, local_update_follows_its_options, credits_are_per_sample,
    credits_are_seeded, learned_feedback_is_trained, credits_ignore_batch_position,
    training_ignores_batch_order, symmetric_credits_follow_the_gradient,
    readout_trains_on_its_cross_entropy, run_metrics_are_recordable,
    binding_leaves_global_rngs_untouched)


def _has_split_block(arch: str) -> bool:
    model = tiny_model(arch=arch)
    if isinstance(model, AdaptedModel):  # no residual blocks to split
        return False
    return any(split_branch(block) is not None for block in model.blocks)


# When a check applies (absent: always), from what the rule declares and the architecture.
def _runs_on(cls: type[CreditRule], arch: str) -> bool:
    """Adapted networks only for rules that declare ``adapted_models``."""
    return cls.adapted_models or not tiny_arch(arch).adapted


CONDITIONS: dict[Callable[..., None], Callable[[type[CreditRule], str], bool]] = {
    local_update_is_the_surrogate_gradient: lambda cls, arch: cls.local,
    local_update_follows_its_options:
        lambda cls, arch: cls.local and not tiny_arch(arch).adapted,
    blocks_train_on_the_reported_credit:
        lambda cls, arch: not cls.local and _has_split_block(arch),
    block_biases_train_on_the_reported_credit:
        lambda cls, arch: not cls.local and _has_split_block(arch),
    embedding_trains_on_the_reported_credit:
        lambda cls, arch: not cls.local and not tiny_arch(arch).adapted,
    fresh_feedback_is_swappable: lambda cls, arch: cls.feedback_kind == "fixed_random",
    fixed_feedback_stays_fixed: lambda cls, arch: cls.feedback_kind == "fixed_random",
    learned_feedback_is_trained: lambda cls, arch: cls.feedback_kind == "learned",
    symmetric_credits_follow_the_gradient:
        lambda cls, arch: cls.feedback_kind == "symmetric",
    stacked_step_is_the_rule_step: lambda cls, arch: (cls.stacks_as() is not None
                                                      and stacks_on(arch)),
}


def own_options(cls: type[CreditRule], options: Mapping[str, Any] | Any = None
                ) -> dict[str, Any]:
    """``cls``'s own options (its ``Options`` fields) by name, from ``options`` — a mapping
    (ConfigError naming a key ``cls`` does not declare; the defaults for those it lacks),
    an ``Options`` instance or a ``[method]`` section; {} for None."""
    if options is None:
        return {}
    return dataclasses.asdict(cls.options_from(resolve_options(cls, options)))


def _under(check: Callable[..., None], options: Mapping[str, Any]) -> Callable[..., None]:
    """``check`` run with every rule it makes bound with ``options`` (:func:`checked_with`)."""
    if not options:
        return check

    @functools.wraps(check)
    def run(cls: type[CreditRule], arch: str = "resmlp") -> None:
        with checked_with(options):
            check(cls, arch)

    return run


def rule_checks(cls: type[CreditRule], archs: Sequence[str] = TINY_ARCHS,
                expected_failures: Mapping[str, str] | None = None,
                options: Mapping[str, Any] | Any = None) -> list[Check]:
    """The checks that apply to ``cls``, once per tiny architecture in ``archs``: each a
    no-argument callable named like its check (``.arch`` and ``.id`` say which run it is,
    ``.expected_failure`` the reason a declared one fails). ``expected_failures``
    (``{check name: reason}``) adds to the class's own. ``options``: the rule's own options
    to check it with (``{"sigma": 0.5}``, an ``Options`` instance or a run's ``[method]``
    section; the defaults for those not given) — a check that sets one itself (the other
    ``normalise_credit``) still does."""
    validate_rule_class(cls, cls.__qualname__)
    failures = declared_failures(cls, expected_failures, (c.__name__ for c in CHECKS))
    for arch in archs:
        tiny_arch(arch)  # ValueError naming the tiny architectures
    values = own_options(cls, options)
    return [Check(_under(check, values), cls, arch, variant=arch,
                  expected_failure=reason_for(failures, check, arch))
            for arch in archs for check in CHECKS
            if _runs_on(cls, arch) and CONDITIONS.get(check, lambda c, a: True)(cls, arch)]


def check_rule(cls: type[CreditRule], archs: Sequence[str] = TINY_ARCHS,
               expected_failures: Mapping[str, str] | None = None,
               options: Mapping[str, Any] | Any = None) -> Report:
    """Run every check that applies to ``cls`` on each tiny architecture in ``archs``;
    AssertionError listing every check that failed (and every declared failure that
    passed), else the :class:`~creditaudit.testing.common.Report`.

    ``expected_failures``: ``{check name: reason}`` (or ``"name[arch]"``) of checks the rule
    fails by design, merged with the class attribute ``expected_failures``; each needs a
    reason (ConfigError otherwise). ``options``: the rule's own options to check it with
    (:func:`rule_checks`; its defaults when None).
    """
    return run_checks(rule_checks(cls, archs, expected_failures, options),
                      f"{cls.__name__} ({cls.name})")


__all__ = ["check_rule", "rule_checks", "own_options", "CHECKS", "CONDITIONS"]
