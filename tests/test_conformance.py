"""Every registered credit rule passes the public conformance suite, check by check; and the
suite catches rules that break its contract."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from creditaudit.errors import ConfigError, GuestError
from creditaudit.methods import BP, DFA, EP, rule_class, rule_names
from creditaudit.methods.base import step_result
from creditaudit.run.trainer import train
from creditaudit.testing import check_rule, make_rule, rule_checks, tiny_batch
from creditaudit.testing.common import EXPECTED_FAILURE, relative_error
from creditaudit.testing.rule_lifecycle import state_dict_round_trips_and_resumes
from creditaudit.testing.rule_properties import (
    credits_are_per_sample,
    credits_are_seeded,
    local_update_follows_its_options,
    output_layer_errors,
)
from door_support import ORIGIN, guests, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

CASES = [(name, check) for name in rule_names() for check in rule_checks(rule_class(name))]
NEW_CHECK = "blocks_train_on_the_reported_credit"
TRAINED = "credited_parts_are_trained"
BIASES = "block_biases_train_on_the_reported_credit"
EMBEDDING = "embedding_trains_on_the_reported_credit"


@pytest.mark.parametrize("name,check", CASES, ids=[f"{n}-{c.id}" for n, c in CASES])
def test_rule_conforms(name, check):
    """Every rule, every check, on the tiny ResidualMLP, ViT-Mini and ConvMixer (a check a
    rule declares it fails by design is an xfail, and an error once it passes)."""
    outcome = check()
    if outcome.status == EXPECTED_FAILURE:
        pytest.xfail(outcome.message)


def test_every_rule_runs_the_checks_that_apply_to_it():
    names = {name: {c.__name__ for c in rule_checks(rule_class(name))} for name in rule_names()}
    assert "local_update_is_the_surrogate_gradient" in names["dfa"]
    assert "local_update_is_the_surrogate_gradient" not in names["bp"]  # BP is end-to-end
    assert NEW_CHECK in names["bp"] and NEW_CHECK in names["fa-linear"]
    assert NEW_CHECK not in names["dfa"]  # local rules: the surrogate check covers them
    assert "fresh_feedback_is_swappable" in names["fa"]
    assert "fresh_feedback_is_swappable" not in names["state-bridge"]
    # ConvMixer's blocks end in a 1×1 convolution, not an nn.Linear: nothing to compare
    archs = {c.arch for c in rule_checks(BP) if c.__name__ == NEW_CHECK}
    assert archs == {"resmlp", "vit"}


def test_only_ep_declares_an_expected_failure():
    declared = {name: rule_class(name).expected_failures for name in rule_names()}
    assert {name for name, failures in declared.items() if failures} == {"ep"}
    ep = {c.id: c.expected_failure for c in rule_checks(EP) if c.expected_failure}
    assert set(ep) == {f"{NEW_CHECK}[resmlp]", f"{NEW_CHECK}[vit]"}


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


class ReadoutOnlyBP(BP):
    """A broken non-local rule: it reports backprop's gradients as its credit, but its step
    trains only the readout (the audit would show cos +1.000 at every layer)."""

    name = "readout-only-bp"
    adapted_models = False  # its step reads the contract's readout

    def train_step(self, x, y, optimizer):
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            states, _ = self.model.forward_states(x)
        logits = self.model.readout(states[-1])
        ce = F.cross_entropy(logits, y)
        result = step_result(ce, logits, y)
        ce.backward()
        optimizer.step()
        return result


class ZeroingDFA(DFA):
    """A broken rule: its end_epoch zeroes the model's first weight (the same on every call,
    so a rule resumed from a checkpoint taken after it repeats it to the same effect)."""

    name = "zeroing-dfa"

    def end_epoch(self, epoch, n_epochs):
        with torch.no_grad():
            next(self.model.parameters()).zero_()
        return super().end_epoch(epoch, n_epochs)


def test_an_end_epoch_that_writes_the_weights_is_caught_and_named():
    # the check took the model's live state_dict next to end_epoch: a write it repeats to
    # the same effect (zeroing, clamping) passed; one it does not, failed as a divergence
    weight = next(iter(make_rule(DFA).model.named_parameters()))[0]
    with pytest.raises(AssertionError, match=f"end_epoch changed the model's weight "
                                             f"'{weight}'"):
        state_dict_round_trips_and_resumes(ZeroingDFA)
    state_dict_round_trips_and_resumes(DFA)


def test_the_suite_catches_rules_that_break_the_contract():
    with pytest.raises(AssertionError) as err:
        check_rule(LeakyDFA)
    message = str(err.value)
    assert "credits_are_detached_and_shaped_like_the_states" in message
    assert "credits_have_no_side_effects" in message and "RNG" in message
    with pytest.raises(AssertionError, match="local_update_is_the_surrogate_gradient"):
        check_rule(DoubledDFA)


def test_a_rule_that_trains_only_the_readout_fails_only_the_credit_checks():
    with pytest.raises(AssertionError) as err:
        check_rule(ReadoutOnlyBP)
    message = str(err.value)
    # Σ a ⊗ u, Σ a (the last layer's bias) and the embedding's ∂⟨h_0, a_0⟩/∂θ on resmlp and
    # vit (ConvMixer's stem holds a BatchNorm); a credited part without gradient on all
    # three; nothing else
    assert "fails 9 conformance checks" in message
    assert f"{NEW_CHECK}[resmlp]" in message and f"{NEW_CHECK}[vit]" in message
    assert f"{EMBEDDING}[resmlp]" in message and f"{EMBEDDING}[vit]" in message
    assert f"{BIASES}[resmlp]" in message and f"{BIASES}[vit]" in message
    assert "blocks.0.w2.weight" in message
    # ConvMixer's blocks end in a convolution: only the credited-part check holds it there
    assert f"{TRAINED}[convmixer]" in message
    assert "gives the embedding, which writes that state, no gradient" in message


class FrozenEmbeddingBP(BP):
    """An honest non-local rule: backprop on the blocks, the embedding left untrained, and
    a_0 = 0 reported for h_0 (no credit, none trained on)."""

    name = "frozen-embedding-bp"
    feedback_kind = "none"  # its a_0 is not backprop's
    stacked_step = None

    def credits(self, x, y):
        credits = super().credits(x, y)
        return [torch.zeros_like(credits[0]), *credits[1:]]

    def train_step(self, x, y, optimizer):
        embedding = list(self.model.embed.parameters())
        for p in embedding:
            p.requires_grad_(False)
        try:
            return super().train_step(x, y, optimizer)
        finally:
            for p in embedding:
                p.requires_grad_(True)


def test_an_untrained_embedding_with_a_zero_credit_passes_the_embedding_check():
    """The embedding check read no gradient as a wrong one, though a_0 = 0 implies none: the
    rule was refused ("gives the embedding's embed.weight no gradient")."""
    check_rule(FrozenEmbeddingBP, archs=("resmlp", "vit"))


def test_a_readout_only_liar_on_blocks_without_a_linear_end_is_caught():
    """On ConvMixer (blocks end in a 1×1 convolution) the Σ a ⊗ u check has nothing to
    compare: the suite without credited_parts_are_trained passed the liar there."""
    with pytest.raises(AssertionError) as err:
        check_rule(ReadoutOnlyBP, archs=("convmixer",))
    assert f"{TRAINED}[convmixer]" in str(err.value)
    assert NEW_CHECK not in str(err.value)
    check_rule(BP, archs=("convmixer",))  # the honest rule passes it


# Backprop whose gradients are backprop's but whose real step leaves credited parts at init
# (tests/guest_pkg, creditaudit_guests.fx1_rules): (entry point, the part left still on the
# tiny ResidualMLP, what the message says is wrong)
LEFT_OUT = "trainable_parameters() leaves them out"
NOT_APPLIED = "the step gives them a gradient but does not apply its update"
STILL = [("fx1-readout-params", "the embedding", LEFT_OUT),
         ("fx1-omits-a-block", "blocks[1]", LEFT_OUT),
         ("fx1-restores-blocks", "blocks[0]", NOT_APPLIED),
         ("fx1-restores-a-block", "blocks[1]", NOT_APPLIED),
         ("fx1-skips-the-step", "the embedding", NOT_APPLIED)]


@pytest.mark.parametrize("name,part,why", STILL, ids=[c[0] for c in STILL])
def test_a_rule_whose_real_step_leaves_credited_parts_still_fails_the_suite(
        tmp_path, name, part, why):
    """Their .grad after a zero-learning-rate step is backprop's, so only a real step shows
    that embedding or blocks never train (the suite passed all five before)."""
    with guests(tmp_path / "site", name), pytest.raises(AssertionError) as err:
        check_rule(rule_class(name))
    message = str(err.value)
    # that check and the optimizer step's, on every architecture
    assert "fails 6 conformance checks" in message
    assert all(f"{check}[{arch}]" in message for arch in ("resmlp", "vit", "convmixer")
               for check in (TRAINED, "step_is_one_optimizer_step"))
    first = message.splitlines()[1]
    assert f" of {part} unchanged although the rule reports a non-zero credit" in first
    assert why in first


@pytest.mark.parametrize("name,part,why", STILL, ids=[c[0] for c in STILL])
def test_a_rule_whose_real_step_leaves_credited_parts_still_is_refused_at_the_door(
        tmp_path, name, part, why):
    """The probe's case: such a plugin was trained and recorded with cos +1.000."""
    out = tmp_path / "runs"
    with guests(tmp_path / "site", name, "door-mixture"), pytest.raises(GuestError) as err:
        train(tiny_config(out, **{"method.name": name}))
    line = str(err.value)
    assert line.startswith(f"credit rule plugin {name!r} ({ORIGIN}) fails the conformance "
                           f"check {TRAINED}[resmlp]: a real training step "), line
    assert part in line and why in line and "\n" not in line
    assert not list(out.rglob("record.json"))


def test_ep_trains_its_output_layers_on_its_credit_at_the_nudged_states():
    """Why EP declares the credit check an expected failure: its gradient is exactly
    Σ a ⊗ u at the nudged input h + δ, not at h."""
    for arch in ("resmlp", "vit"):
        rule = make_rule(EP, arch=arch)
        x, y = tiny_batch(arch=arch)
        assert rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0)).finite
        with torch.no_grad():
            states, _ = rule.model.forward_states(x)
            relaxation = rule.relax(states, y)
            credits = rule.credits_from(relaxation, y.shape[0])
            for layer, block in enumerate(rule.model.blocks):
                u = block.hidden(relaxation.states[layer] + relaxation.deltas[layer])
                u = u[0] if isinstance(u, tuple) else u
                want = torch.einsum("...o,...i->oi", credits[layer + 1], u)
                assert relative_error(block.w2.weight.grad, want) < 1e-12


@pytest.mark.parametrize("arch", ["resmlp", "vit"])
def test_eps_gap_to_the_credit_check_vanishes_linearly_in_beta(arch):
    """The gap is the nudge's O(β), not a step that ignores the credit (which stays at 1)."""
    x, y = tiny_batch(arch=arch)
    gap = {beta: max(output_layer_errors(make_rule(EP, arch=arch, ep_beta=beta), x, y).values())
           for beta in (1e-6, 1e-8)}
    assert gap[1e-8] < 1e-5
    assert 50 < gap[1e-6] / gap[1e-8] < 200  # ×100 for β ×100: linear


def test_declared_failures_are_reported_and_must_keep_failing():
    report = check_rule(ReadoutOnlyBP, archs=("resmlp",),
                        expected_failures={NEW_CHECK: "fixture: trains the readout only",
                                           BIASES: "fixture: trains the readout only",
                                           EMBEDDING: "fixture: trains the readout only",
                                           TRAINED: "fixture: trains the readout only"})
    assert list(report.expected_failures) == [f"{NEW_CHECK}[resmlp]", f"{BIASES}[resmlp]",
                                              f"{EMBEDDING}[resmlp]", f"{TRAINED}[resmlp]"]
    assert f"{NEW_CHECK}[resmlp]" not in report.passed
    # one architecture only: the other keeps the check
    with pytest.raises(AssertionError, match=rf"{NEW_CHECK}\[vit\]"):
        check_rule(ReadoutOnlyBP, archs=("resmlp", "vit"),
                   expected_failures={f"{NEW_CHECK}[resmlp]": "fixture", BIASES: "fixture",
                                      EMBEDDING: "fixture", TRAINED: "fixture"})
    with pytest.raises(AssertionError, match=f"expected failure {NEW_CHECK}.resmlp. passed: "
                                             "remove it"):
        check_rule(BP, archs=("resmlp",), expected_failures={NEW_CHECK: "it does not fail"})


def test_a_declared_failure_needs_a_reason_and_a_known_check():
    with pytest.raises(ConfigError, match="needs a reason"):
        rule_checks(ReadoutOnlyBP, expected_failures={NEW_CHECK: " "})
    with pytest.raises(ConfigError, match="names no check"):
        rule_checks(ReadoutOnlyBP, expected_failures={"no_such_check": "why"})


def test_a_check_declared_failing_that_passes_fails_when_called():
    check = next(c for c in rule_checks(BP, archs=("resmlp",),
                                        expected_failures={NEW_CHECK: "it does not fail"})
                 if c.__name__ == NEW_CHECK)
    with pytest.raises(AssertionError, match="passed: remove it"):
        check()


class ShuffledDFA(DFA):
    """A broken rule: each sample's credit projects the previous sample's error (an
    indexing slip), trained and reported alike."""

    name = "shuffled-dfa"

    def projected_signal(self, logits, y):
        return super().projected_signal(logits, y).roll(1, 0)


class UnseededDFA(DFA):
    """A broken rule: its feedback comes from a generator of its own, seeded from the
    operating system's randomness — not from the one it is given."""

    name = "unseeded-dfa"

    def __init__(self, model, config, *, n_classes, generator):
        own = torch.Generator()
        own.seed()
        super().__init__(model, config, n_classes=n_classes, generator=own)


class ConstantSeedDFA(DFA):
    """A broken rule: it draws its feedback from seed 0 whatever method.feedback_seed says."""

    name = "constant-seed-dfa"

    def __init__(self, model, config, *, n_classes, generator):
        super().__init__(model, config, n_classes=n_classes,
                         generator=torch.Generator().manual_seed(0))


def _with_options(rule, step, **values):
    """``step()`` with ``rule.options`` fields set to ``values`` for its duration (a rule that
    ignores those options)."""
    saved = {key: getattr(rule.options, key) for key in values}
    for key, value in values.items():
        object.__setattr__(rule.options, key, value)
    try:
        return step()
    finally:
        for key, value in saved.items():
            object.__setattr__(rule.options, key, value)


class PenaltyFreeDFA(DFA):
    """A broken rule: its step ignores method.penalty (the run records λ, nothing applies it)."""

    name = "penalty-free-dfa"

    def train_step(self, x, y, optimizer):
        return _with_options(self, lambda: super(PenaltyFreeDFA, self).train_step(
            x, y, optimizer), penalty=0.0)


class AlwaysNormalisedDFA(DFA):
    """A broken rule: its step normalises the credit whatever normalise_credit says."""

    name = "always-normalised-dfa"

    def train_step(self, x, y, optimizer):
        return _with_options(self, lambda: super(AlwaysNormalisedDFA, self).train_step(
            x, y, optimizer), normalise_credit=True)


class UnsavedDFA(DFA):
    """A broken rule: its feedback is not in its state, so checkpoints do not hold it."""

    name = "unsaved-dfa"

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_a_credit_that_mixes_in_another_sample_is_caught():
    # trained and reported alike, it passed every check: the audit compared each sample's
    # credit with its neighbour's gradient
    with pytest.raises(AssertionError, match="changes the other samples' credit"):
        credits_are_per_sample(ShuffledDFA)
    credits_are_per_sample(DFA)


def test_a_rule_that_ignores_its_generator_is_caught():
    with pytest.raises(AssertionError, match="made with one seed"):
        credits_are_seeded(UnseededDFA)
    with pytest.raises(AssertionError, match="another seed gives the same credits"):
        credits_are_seeded(ConstantSeedDFA)
    credits_are_seeded(DFA)


@pytest.mark.parametrize("cls,option", [(PenaltyFreeDFA, "method.penalty=0.01"),
                                        (AlwaysNormalisedDFA, "normalise_credit=False")])
def test_a_step_that_ignores_the_recorded_options_is_caught(cls, option):
    # the suite stepped every rule with λ = 0 and its default normalisation only
    with pytest.raises(AssertionError, match=option):
        local_update_follows_its_options(cls)
    local_update_follows_its_options(DFA)


def test_feedback_left_out_of_the_state_is_caught():
    # the restored rule was drawn from the same generator seed, so it got the same
    # feedback without the file
    with pytest.raises(AssertionError, match="diverges"):
        state_dict_round_trips_and_resumes(UnsavedDFA)


class TensorMetricsDFA(DFA):
    """DFA whose end-of-run metrics hold a tensor, which no record can hold."""

    name = "tensor-metrics-dfa"

    def run_metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"mean_credit": self.credits(x, y)[0].abs().mean()}


class ReadoutZeroingDFA(DFA):
    """DFA whose end-of-run metrics zero the readout's bias as they measure."""

    name = "readout-zeroing-dfa"

    def run_metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        with torch.no_grad():
            list(self.model.parameters())[-1].zero_()
        return {}


def test_run_metrics_that_no_record_holds_or_that_move_the_weights_are_caught():
    # run_metrics() was first called at the end of a run: a plugin returning a tensor
    # failed the finished run there, after every epoch had trained
    from creditaudit.testing.rule_lifecycle import run_metrics_are_recordable

    with pytest.raises(AssertionError, match=r"run_metrics\(\) returned a value a record "
                                             r"cannot hold .*Tensor"):
        run_metrics_are_recordable(TensorMetricsDFA)
    with pytest.raises(AssertionError, match=r"run_metrics\(\) changed "):
        run_metrics_are_recordable(ReadoutZeroingDFA)
    run_metrics_are_recordable(DFA)
    run_metrics_are_recordable(EP)


class ReseedingDFA(DFA):
    """DFA that reseeds torch's global RNG as it binds (a 'reproducible' plugin)."""

    name = "reseeding-dfa"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        torch.manual_seed(0)


def test_a_rule_that_reseeds_the_global_rng_as_it_binds_is_caught():
    # the door watched the global RNGs during a step, not while the rule was built: a
    # torch.manual_seed(0) in __init__ gave every run seed one dropout stream
    from creditaudit.testing.rule_lifecycle import binding_leaves_global_rngs_untouched

    with pytest.raises(AssertionError, match=r"binding the rule \(its __init__\) moved or "
                                             r"reseeded torch's global RNG"):
        binding_leaves_global_rngs_untouched(ReseedingDFA)
    binding_leaves_global_rngs_untouched(DFA)
