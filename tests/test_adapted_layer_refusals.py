"""Layers the per-layer feedback rules (fa-linear, usf, brsf, frsf, kp) cannot replace are
refused in one line naming the layer, its class and the true cause: a subclass with a
forward of its own, a layer not called on the batch of the eval-mode forward the
diagnostics use (a training-only auxiliary head, a routed expert skipped on that batch, a
left-over layer: the message names all three, as it cannot tell them apart), a layer whose
weight the forward uses directly. Where adapt()'s probe ran that forward the refusal
comes when the rule is bound; elsewhere at the first pass that misses the layer. What
the rules do replace — subclasses that keep nn.Linear's or nn.Conv2d's forward, every
nn.Conv2d option — is replaced exactly (with B = W the replaced layer is the layer, to
round-off).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import warnings

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, rule
from creditaudit.errors import ModelContractError
from creditaudit.methods import bp_state_gradients
from creditaudit.methods.replaced_backward import replaced_backward
from creditaudit.models import ResidualNet
from creditaudit.testing.zoo import TransformerClassifier
from door_support import cli_args, error_line, site_with
from plugin_support import cli

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
PER_LAYER = ("fa-linear", "usf", "brsf", "frsf", "kp")
CLASSES = 3
FACTORIES = "creditaudit_guests.fx9_factories"


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# --- layers with a forward of their own ---------------------------------------------------
class StdConv2d(nn.Conv2d):
    """timm's weight-standardised convolution (BiT, ResNetV2): a forward of its own."""

    def forward(self, x: Tensor) -> Tensor:
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ScaledConv2d(nn.Conv2d):
    """Keeps nn.Conv2d's forward but overrides the _conv_forward it calls."""

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return super()._conv_forward(x, 2.0 * weight, bias)


class MaskedLinear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.tril(), self.bias)


class TaggedLinear(nn.Linear):
    """A subclass that keeps nn.Linear's forward (as torch's NonDynamicallyQuantizableLinear)."""


class TaggedConv2d(nn.Conv2d):
    """A subclass that keeps nn.Conv2d's forward."""


class ConvNet(nn.Module):
    """(B, 1, 6, 6) → stem conv → two conv blocks (``conv``, the layer under test, first) →
    mean over H, W → head."""

    def __init__(self, conv: type[nn.Conv2d] = nn.Conv2d,
                 linear: type[nn.Linear] = nn.Linear) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.b1 = nn.Sequential(conv(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Tanh())
        self.b2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Tanh())
        self.head = linear(4, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.b2(self.b1(self.stem(x))).mean(dim=(2, 3)))


def conv_net(**layers: type[nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConvNet(**layers).to(F64)


def image_batch() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(5, 1, 6, 6, generator=gen, dtype=F64),
            torch.randint(0, CLASSES, (5,), generator=gen))


def adapted(net: nn.Module, states=("stem", "b1", "b2")):
    x, _ = image_batch() if isinstance(net, ConvNet) else flat_batch()
    return adapt(net, list(states), example=x)


def instance_forward() -> nn.Module:
    net = conv_net()
    conv = net.b1[0]
    conv.forward = lambda x: nn.Conv2d.forward(conv, x).relu()  # this instance only
    return net


OWN_FORWARD = {  # network, the layer's name, its class, the base whose forward it overrides
    "StdConv2d": (lambda: conv_net(conv=StdConv2d), "b1.0", "StdConv2d", "Conv2d"),
    "_conv_forward": (lambda: conv_net(conv=ScaledConv2d), "b1.0", "ScaledConv2d", "Conv2d"),
    "masked Linear": (lambda: conv_net(linear=MaskedLinear), "head", "MaskedLinear", "Linear"),
    "instance forward": (instance_forward, "b1.0", "Conv2d", "Conv2d"),
}


@pytest.mark.parametrize("method", PER_LAYER)
@pytest.mark.parametrize("case", OWN_FORWARD)
def test_a_layer_with_its_own_forward_is_refused_when_the_rule_is_bound(method, case):
    """The rules would run F.conv2d/F.linear on its weight instead of its forward: another
    network, trained and measured (B = W would not give g_l). A rule that does not replace
    layers binds to the same model."""
    make, name, cls, base = OWN_FORWARD[case]
    model = adapted(make())
    with pytest.raises(ModelContractError) as error:
        rule(method, model)
    message = one_line(error)
    assert message.startswith(f"--method {method} cannot train {name!r} ({cls}): its "), message
    assert f"the rule replaces only nn.{base}'s own forward" in message
    assert message.endswith("or use a rule that does not replace layers (dfa, bp)")
    rule("dfa", model)


def test_a_contract_models_layer_with_its_own_forward_is_refused():
    class Net(ResidualNet):
        def __init__(self) -> None:
            super().__init__()
            self.d, self.n_classes = 4, CLASSES
            self.embed = nn.Conv2d(1, 4, 3, padding=1)
            self.blocks = nn.ModuleList([StdConv2d(4, 4, 3, padding=1)])
            self.head = nn.Linear(4, CLASSES)

        def readout(self, h: Tensor) -> Tensor:
            return self.head(h.mean(dim=(2, 3)))

    with pytest.raises(ModelContractError) as error:
        rule("fa-linear", Net())
    assert one_line(error).startswith("--method fa-linear cannot train Net.blocks.0 (StdConv2d)")


def assert_b_equal_w_is_backprop(model, x: Tensor, y: Tensor) -> list[str]:
    """fa-linear with B = W on ``model`` gives backprop's g_l at every state; returns the
    names of the layers it replaced."""
    fa = rule("fa-linear", model)
    fa.feedback = [w.detach().clone() for w in fa.weights()]
    for a, g in zip(fa.credits(x, y), bp_state_gradients(model, x, y), strict=True):
        assert float((a - g).abs().max()) <= 1e-10 * float(g.abs().max()), "credit is not g_l"
    return [name for name, _ in fa.layers]


def test_subclasses_that_keep_the_forward_are_replaced_exactly():
    model = adapted(conv_net(conv=TaggedConv2d, linear=TaggedLinear))
    assert assert_b_equal_w_is_backprop(model, *image_batch()) == [
        "stem", "b1.0", "b2.0", "head"]


def test_attentions_out_proj_a_linear_subclass_without_a_forward_of_its_own_still_works():
    """nn.MultiheadAttention's out_proj is a NonDynamicallyQuantizableLinear (an nn.Linear
    subclass keeping its forward) that the attention never calls as a module: it is
    replaced inside the attention, not refused."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = TransformerClassifier((1, 4, 4), patch=2, d=8, depth=2, heads=2,
                                    n_classes=CLASSES).to(F64)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 4, 4, generator=gen, dtype=F64)
    y = torch.randint(0, CLASSES, (4,), generator=gen)
    model = adapt(net, ["encoder.layers.0", "encoder.layers.1"], example=x)
    out_proj = net.encoder.layers[0].self_attn.out_proj
    assert type(out_proj) is not nn.Linear and type(out_proj).forward is nn.Linear.forward
    names = assert_b_equal_w_is_backprop(model, x, y)
    assert "encoder.layers.0.self_attn.out_proj" in names


# --- layers that do not run in the forward pass the diagnostics use -----------------------
class FlatNet(nn.Module):
    """(B, 6) → a, b, c (states) → head; ``extra`` says what else it holds: an auxiliary
    head run only in training, a left-over Linear never run, a Linear whose weight the
    forward uses directly, or a routed expert (``side`` in place of ``b`` for batches whose
    first feature's mean is above 1, which the probe batch's is not)."""

    def __init__(self, extra: str) -> None:
        super().__init__()
        self.extra = extra
        self.a, self.b, self.c = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.head, self.side = nn.Linear(8, CLASSES), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        expert = self.side if self.extra == "routed" and x[:, 0].mean() > 1 else self.b
        h = expert(torch.tanh(self.a(x)))
        if self.extra == "aux" and self.training:
            self.aux_logits = self.side(h)  # Inception's auxiliary classifier
        if self.extra == "direct":
            h = h + F.linear(h, self.side.weight, self.side.bias)
        return self.head(self.c(torch.tanh(h)))


def flat_batch() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(2)
    return (torch.randn(6, 6, generator=gen, dtype=F64),
            torch.randint(0, CLASSES, (6,), generator=gen))


def flat_net(extra: str) -> FlatNet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return FlatNet(extra).to(F64)


# Not called on the probe batch: a layer of the batch's (routed), of the mode's (aux) or
# of none (unused); the message says what is known and names the three.
NOT_CALLED_ON_PROBE = ("it was not called on adapt()'s example batch in eval mode, the pass "
                       "where the diagnostics measure credits; a layer called only for some "
                       "batches (a routed expert), only in training (an auxiliary head) or "
                       "never cannot have its backward replaced reliably: call it on every "
                       "batch in both modes or remove it, or use a rule that does not "
                       "replace layers (dfa, bp)")
NOT_CALLED = {
    "aux": NOT_CALLED_ON_PROBE,
    "unused": NOT_CALLED_ON_PROBE,
    "routed": NOT_CALLED_ON_PROBE,
    "direct": "the model's forward uses its weight directly instead of calling it as a module",
}


@pytest.mark.parametrize("method", PER_LAYER)
@pytest.mark.parametrize("extra", NOT_CALLED)
def test_a_layer_the_probe_did_not_see_called_is_refused_with_its_cause_at_binding(method,
                                                                                  extra):
    """Refused by rule(), before any step — not at the first diagnostic of a trained run
    (the aux head runs in every training step), and not blamed on direct weight use when
    the layer simply did not run."""
    model = adapted(flat_net(extra), ("a", "b", "c"))
    with pytest.raises(ModelContractError) as error:
        rule(method, model)
    message = one_line(error)
    assert message.startswith(f"--method {method} cannot replace the backward of 'side' "
                              "(Linear): "), message
    assert NOT_CALLED[extra] in message
    rule("dfa", model)


# --- where no probe ran: the first pass that misses a layer -------------------------------
class ContractNet(ResidualNet):
    """A contract model whose block holds a Linear ``extra`` decides about (see FlatNet)."""

    def __init__(self, extra: str) -> None:
        super().__init__()
        self.d, self.n_classes, self.extra = 6, CLASSES, extra
        self.embed = nn.Linear(6, 6)
        self.blocks = nn.ModuleList([nn.Linear(6, 6)])
        self.side = nn.ModuleList([nn.Linear(6, 6)])  # "blocks"-free: named side.0
        self.head = nn.Linear(6, CLASSES)

    def readout(self, h: Tensor) -> Tensor:
        if self.extra == "aux" and self.training:
            self.aux_logits = self.side[0](h)
        if self.extra == "direct":
            h = h + F.linear(h, self.side[0].weight, self.side[0].bias)
        return self.head(h)


@pytest.mark.parametrize("extra,train_cause,eval_cause", [
    ("unused", "it was not called on the batch it was given in training mode; a layer called "
               "only for some batches (a routed expert) or never cannot",
     "it was not called on the batch it was given in eval mode, the pass where the "
     "diagnostics measure credits; a layer called only for some batches (a routed expert), "
     "only in training (an auxiliary head) or never cannot"),
    ("aux", None, "it was not called on the batch it was given in eval mode"),
    ("direct", NOT_CALLED["direct"], NOT_CALLED["direct"]),
])
def test_without_a_probe_the_first_pass_that_misses_a_layer_names_its_cause(
        extra, train_cause, eval_cause):
    """A contract model binds without a forward: its training step (training mode) and its
    credits (eval mode) refuse the layer with the cause found in that mode, and the refused
    step changes no weight."""
    torch.manual_seed(0)
    model = ContractNet(extra).to(F64)
    fa = rule("fa-linear", model)
    x, y = flat_batch()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(fa.trainable_parameters(), lr=0.1)
    model.train()
    if train_cause is None:
        assert fa.train_step(x, y, optimizer).finite  # the aux head ran: nothing is missed
    else:
        with pytest.raises(ModelContractError) as error:
            fa.train_step(x, y, optimizer)
        assert one_line(error).startswith("--method fa-linear cannot replace the backward of "
                                          "'side.0' (Linear): ")
        assert train_cause in str(error.value)
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    model.eval()
    with pytest.raises(ModelContractError) as error:
        fa.credits(x, y)
    assert eval_cause in one_line(error)


# --- every nn.Conv2d option is replaced exactly --------------------------------------------
CONV_OPTIONS = list(itertools.product(
    ("zeros", "reflect", "replicate", "circular"), (1, (1, 2), "same", "valid"), (False, True)))


@pytest.mark.parametrize("mode,padding,unbatched", CONV_OPTIONS)
def test_every_conv2d_option_with_b_equal_w_is_the_layers_own_forward_and_backward(
        mode, padding, unbatched):
    """Padding modes (nn.Conv2d pads with F.pad, then convolves), 'same' with an even kernel
    (the extra row at the end), and unbatched (C, H, W) inputs, which nn.Conv2d takes."""
    gen = torch.Generator().manual_seed(0)
    layer = nn.Conv2d(4, 6, (3, 2), padding=padding, dilation=(1, 2), groups=2,
                      padding_mode=mode).to(F64)
    x = torch.randn(*(() if unbatched else (2,)), 4, 7, 8, generator=gen, dtype=F64,
                    requires_grad=True)
    with replaced_backward([("conv", layer)], [layer.weight.detach().clone()]):
        y = layer(x)
    exact = layer(x)
    assert y.shape == exact.shape and torch.allclose(y, exact, rtol=0, atol=1e-13)
    dy = torch.randn(exact.shape, generator=gen, dtype=F64)
    inputs = [x, layer.weight, layer.bias]
    for got, want in zip(torch.autograd.grad(y, inputs, dy), torch.autograd.grad(exact, inputs, dy),
                         strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)


# --- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("factory,layer", [("MaskedNet", "'b1' (MaskedLinear): its forward "
                                            "is its own"),
                                           ("AuxHeadNet", "'aux' (Linear): it was not "
                                            "called on adapt()'s example batch in eval mode")])
def test_the_command_line_refuses_such_a_network_in_one_line(factory, layer, tmp_path):
    done = cli(site_with(tmp_path), "train", "--method", "fa-linear",
               "--arch", f"module:{FACTORIES}:{factory}",
               *cli_args(tmp_path / "runs", **{
                   "data.name": "synthetic", "data.in_dim": 40, "data.n_train": 256,
                   "data.n_test": 256, "model.d": None, "model.n_blocks": None,
                   "model.states": ["stem", "b1", "b2"]}), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith("creditaudit: error: --method fa-linear cannot "), line
    assert layer in line


def test_biotorchs_converted_layers_are_refused_naming_their_module():
    """BioTorch's fa conversion swaps in Linear subclasses whose forward runs its own
    feedback: a per-layer rule on top would train a third network. Its class is named
    with its module (it is also called Linear)."""
    biomodule = pytest.importorskip("biotorch.module.biomodule")
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                        nn.Linear(8, CLASSES))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
        bio = biomodule.BioModule(net, mode="fa")
    with pytest.raises(ModelContractError) as error:
        rule("fa-linear", adapt(bio.module, ["0", "2"], input_shape=(6,)))
    assert one_line(error).startswith("--method fa-linear cannot train '0' "
                                      "(biotorch.layers.fa_constructor.linear.Linear): its forward "
                                      "is its own")


# --- kp: a weight computed from other parameters ------------------------------------------
def weight_norm_of(net: nn.Module, layer: str) -> nn.Module:
    with warnings.catch_warnings():  # torch.nn.utils.weight_norm is deprecated
        warnings.simplefilter("ignore")
        torch.nn.utils.weight_norm(net.get_submodule(layer))
    return net


COMPUTED_WEIGHTS = {  # how b1.0's weight is computed from other parameters on each forward
    "parametrizations.weight_norm":
        lambda net: nn.utils.parametrizations.weight_norm(net.b1[0]) and net,
    "parametrizations.spectral_norm":
        lambda net: nn.utils.parametrizations.spectral_norm(net.b1[0]) and net,
    "weight_norm": lambda net: weight_norm_of(net, "b1.0"),
    "spectral_norm": lambda net: nn.utils.spectral_norm(net.b1[0]) and net,
}


@pytest.mark.parametrize("case", COMPUTED_WEIGHTS)
def test_kp_refuses_a_layer_whose_weight_is_computed_from_other_parameters(case):
    """The optimiser steps weight_norm's g and v (or a parametrization's original), never W:
    KP's B, which takes W's step from W's parameter group, stayed at its initial draw — the
    layer silently trained as fa-linear's."""
    net = COMPUTED_WEIGHTS[case](conv_net())
    with pytest.raises(ModelContractError) as error:
        rule("kp", adapted(net))
    assert "kp" in one_line(error) and "'b1.0'" in one_line(error)
    assert "weight_norm or spectral_norm" in one_line(error)
    rule("fa-linear", adapted(net))  # B drawn once, W read as it is: nothing to mirror


@pytest.mark.parametrize("method", ["fa-linear", "kp"])
def test_a_layer_replaced_after_binding_is_named_as_replaced(method):
    """The bound layer is no longer called (its replacement runs with its exact backward):
    the line blamed a routed expert or an auxiliary head for it."""
    net = conv_net()
    bound = rule(method, adapted(net))
    net.b1[0] = nn.Conv2d(4, 4, 3, padding=1).to(F64)
    x, y = image_batch()
    with pytest.raises(ModelContractError) as error:
        bound.train_step(x, y, torch.optim.SGD(net.parameters(), lr=0.1))
    assert f"--method {method} was bound to the layer 'b1.0' (Conv2d), which is no longer in " \
           "the network: it was replaced or removed after the rule was bound" in one_line(error)
