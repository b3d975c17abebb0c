"""Every registered architecture passes the public model suite (check_model), check by
check; and the suite catches models whose behaviour contradicts what they declare."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from creditaudit.errors import ConfigError
from creditaudit.models import ARCHITECTURES, ResidualMLP
from creditaudit.models.convmixer import ConvMixer
from creditaudit.models.registry import ConvMixerArchitecture, ResMLPArchitecture
from creditaudit.models.resmlp import MLPBlock
from creditaudit.testing import check_model, model_checks

pytestmark = pytest.mark.usefixtures("single_thread")

# Each architecture with its tiny defaults, and without terminal LayerNorm / skips where it
# declares those options. Architectures of adapted models (module, own-loop) build no
# ResidualNet: adapt() checks their states (tests/test_own_loop.py).
VARIANTS = [(cls, options) for cls in ARCHITECTURES.classes() if not cls.adapted
            for options in ({}, {"out_ln": False}, {"residual": False})
            if set(options) <= set(cls.option_names())]
CASES = [(cls, options, check) for cls, options in VARIANTS
         for check in model_checks(cls, options)]


@pytest.mark.parametrize("cls,options,check", CASES,
                         ids=[f"{c.name}{''.join(f'-{k}' for k in o)}-{k.id}"
                              for c, o, k in CASES])
def test_architecture_conforms(cls, options, check):
    check()


def test_every_builtin_architecture_is_checked():
    assert {cls.name for cls, _ in VARIANTS} >= {"resmlp", "student", "vit", "convmixer"}


def test_options_it_does_not_declare_are_refused():
    with pytest.raises(ConfigError, match="has no option 'width'"):
        check_model(ResMLPArchitecture, {"width": 16})


def _mlp(cls: type[ResidualMLP], options, input_shape, n_classes, **overrides) -> ResidualMLP:
    kwargs = {"out_ln": options.out_ln, "residual": options.residual, "w2_std": options.w2_std,
              **overrides}
    return cls(ResMLPArchitecture.flat_dim(input_shape), options.d, n_classes,
               options.n_blocks, **kwargs)


class NoLNClaimingOne(ResidualMLP):
    terminal_ln = True  # type: ignore[assignment]


class LNDeclaredAbsent(ResidualMLP):
    terminal_ln = False  # type: ignore[assignment]


class ClaimsLN(ResMLPArchitecture):
    name, label = "claims-ln", "Claims LN"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(NoLNClaimingOne, options, input_shape, n_classes, out_ln=False)


class HidesLN(ResMLPArchitecture):
    name, label = "hides-ln", "Hides LN"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(LNDeclaredAbsent, options, input_shape, n_classes, out_ln=True)


class AcceptsAnyInput(ConvMixerArchitecture):
    """check() accepts everything, though build() needs images the patch divides."""

    name, label = "accepts-any", "Accepts any"

    @classmethod
    def check(cls, options, input_shape):
        return None


class MixingBlock(nn.Module):
    """A branch that adds the batch mean: in eval mode too, sample 0 sees the others."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, h):
        return self.linear(h) + h.mean(dim=0, keepdim=True)


class MixesSamples(ResMLPArchitecture):
    name, label = "mixes", "Mixes samples"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.blocks[1] = MixingBlock(options.d)
        return model


class TokensClaimed(ResidualMLP):
    state_layout = "tokens"


class WrongLayout(ResMLPArchitecture):
    name, label = "wrong-layout", "Wrong layout"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(TokensClaimed, options, input_shape, n_classes)


class SeedsItself(ResMLPArchitecture):
    name, label = "seeds-itself", "Seeds itself"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        torch.manual_seed(0)
        return _mlp(ResidualMLP, options, input_shape, n_classes)


class SplitNamesTheWrongLayer(MLPBlock):
    @property
    def output_layer(self):
        return self.w1  # the block's output is w2(hidden(h))


class BadSplit(ResMLPArchitecture):
    name, label = "bad-split", "Bad split"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.blocks[0] = SplitNamesTheWrongLayer(options.d, options.w2_std)
        return model


class SkipsALayer(ResidualMLP):
    def forward_from(self, layer, h):
        return super().forward_from(min(layer + 1, self.n_blocks), h)


class ForwardFromSkips(ResMLPArchitecture):
    name, label = "skips", "Skips"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(SkipsALayer, options, input_shape, n_classes)


class TiesTheReadout(ResMLPArchitecture):
    """The terminal LayerNorm is block 0's: the readout trains a block's parameters."""

    name, label = "tied", "Tied"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.out_ln = model.blocks[0].ln
        return model


class MiscountsBlocks(ResidualMLP):
    def describe(self):
        return dataclasses.replace(super().describe(), n_blocks=self.n_blocks + 1)


class LiesInDescribe(ResMLPArchitecture):
    name, label = "lies", "Lies"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(MiscountsBlocks, options, input_shape, n_classes)


class ClampsInPlace(nn.Module):
    """An embedding that clamps its input in place (idempotent: every pass sees the same
    values, so only the edited batch shows it)."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.inner = embed

    def forward(self, x):
        return self.inner(x.clamp_(-0.5, 0.5))


class EditsItsInput(ResMLPArchitecture):
    name, label = "edits", "Edits its input"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.embed = ClampsInPlace(model.embed)
        return model


class WarmUpCounter(nn.Module):
    """An embedding whose training-mode warm-up counts forwards in a buffer, eval-mode ones
    too: the diagnostics' forwards would shorten the warm-up training goes through."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.inner = embed
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        scale = min(1.0, float(self.calls) / 100.0) if self.training else 1.0
        return scale * self.inner(x)


class CountsEvalForwards(ResMLPArchitecture):
    name, label = "counts-eval", "Counts eval forwards"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.embed = WarmUpCounter(model.embed)
        return model


class FourClassHead(ResMLPArchitecture):
    """A readout written for a 4-class dataset: 4 logits whatever n_classes it is asked
    for (the suite's own class count), while the model says n_classes as asked."""

    name, label = "four-class-head", "Four-class head"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        model = _mlp(ResidualMLP, options, input_shape, n_classes)
        model.out_head = nn.Linear(options.d, 4)
        return model


@pytest.mark.parametrize("cls,check", [
    (FourClassHead, "builds_a_contract_model"),
    (CountsEvalForwards, "forward_leaves_the_model_alone"),
    (EditsItsInput, "forward_leaves_its_input_alone"),
    (ClaimsLN, "terminal_ln_is_what_the_readout_does"),
    (HidesLN, "terminal_ln_is_what_the_readout_does"),
    (AcceptsAnyInput, "check_refuses_what_build_cannot_build"),
    (MixesSamples, "samples_are_independent_in_eval_mode"),
    (WrongLayout, "states_follow_the_declared_layout"),
    (SeedsItself, "building_is_deterministic_under_a_seed"),
    (BadSplit, "branch_split_adds_up_to_the_block"),
    (ForwardFromSkips, "states_are_the_residual_chain"),
    (TiesTheReadout, "parameters_belong_to_one_part"),
    (LiesInDescribe, "description_matches_the_model"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_suite_catches_models_that_break_the_contract(cls, check):
    with pytest.raises(AssertionError) as err:
        check_model(cls)
    assert "fails 1 conformance check:" in str(err.value)  # that one, and only that one
    assert f"- {check}:" in str(err.value)


def test_the_terminal_ln_messages_say_which_way_the_declaration_is_wrong():
    with pytest.raises(AssertionError, match="the readout has no terminal LayerNorm"):
        check_model(ClaimsLN)
    with pytest.raises(AssertionError, match="hides a terminal LayerNorm"):
        check_model(HidesLN)


@pytest.mark.parametrize("name", ["resmlp", "vit", "convmixer"])
def test_a_built_in_whose_h_L_starts_at_zero_passes_the_terminal_ln_check(name):
    """residual=False, w2_std=0 and no terminal LayerNorm: every state after h_0 is exactly 0
    at init, which scaling leaves as it is; the suite read the readout as hiding a LayerNorm."""
    options = {"residual": False, "out_ln": False, "w2_std": 0.0}
    check_model(ARCHITECTURES.get(name), options)


def test_image_architectures_refuse_flat_features_with_a_config_error():
    for name in ("vit", "convmixer"):
        cls = ARCHITECTURES.get(name)
        options = cls.Options(d=8, n_blocks=1, patch=2)
        with pytest.raises(ConfigError, match="needs images"):
            cls(options).check((40,))


class GroupNormMLP(ResidualMLP):
    terminal_ln = True  # type: ignore[assignment]

    def readout(self, h):
        return self.out_head(nn.functional.group_norm(h, 2))


class GroupNormHeadMLP(ResMLPArchitecture):
    name, label = "group-norm-mlp", "GroupNorm MLP"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return _mlp(GroupNormMLP, options, input_shape, n_classes, out_ln=False)


class GroupNormMixer(ConvMixer):
    terminal_ln = True  # type: ignore[assignment]

    def readout(self, h):
        return self.out_head(nn.functional.group_norm(h, 2).mean(dim=(2, 3)))


class GroupNormHeadMixer(ConvMixerArchitecture):
    name, label = "group-norm-mixer", "GroupNorm mixer"

    def build(self, *, input_shape, n_classes):
        model = super().build(input_shape=input_shape, n_classes=n_classes)
        model.__class__, model.out_ln = GroupNormMixer, None
        return model


@pytest.mark.parametrize("cls", [GroupNormHeadMLP, GroupNormHeadMixer], ids=lambda c: c.name)
def test_a_group_norm_before_a_linear_head_is_a_linear_head(cls):
    """A terminal GroupNorm of two groups of channels (declared as the terminal
    normalisation) before pooling and a linear head hides no layer: the readout check's
    circle kept one mean and variance over the whole state only, not over each group, and
    refused it (rel. 0.25)."""
    check_model(cls)
