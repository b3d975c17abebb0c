"""creditaudit.adapt: any nn.Module trained with the field's rules and audited.

The adapter's identities (states are the named modules' outputs; forward_from reruns the
rest of the network exactly), every error it must raise, the rules on adapted models (the
contract's updates on the same residual network; the residual-only rules refused), and the
proof on two networks nobody here wrote (creditaudit.testing.zoo): PyTorch's TransformerEncoder
layers and a CIFAR ResNet, each trained by six rules and audited.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import AdaptedModel, adapt, diagnose, rule
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.methods import DFA, rule_class, rule_names
from creditaudit.methods.adapted import state_increments
from creditaudit.models import ResidualMLP
from creditaudit.protocol import DiagnosticReport
from creditaudit.testing import ADAPTED_ARCHS, check_rule, rule_checks
from creditaudit.testing.zoo import CifarResNet, TransformerClassifier, resnet20

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
IMAGE = (1, 28, 28)
RESNET_STATES = ["stem", "layer1.0", "layer2.0", "layer3.0"]
TRANSFORMER_STATES = ["encoder.layers.0", "encoder.layers.1"]
ADAPTED_RULES = {"bp", "frozen", "fa-linear", "usf", "brsf", "frsf", "kp", "dfa", "drtp",
                 "local-ce"}
METRICS = {"rho_samples": 4, "rho_directions": 4, "null_draws": 2, "etas": (0.01,)}


def seeded(make, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def resnet(seed: int = 0, **options) -> CifarResNet:
    """The paper's ResNet with one block per stage (16/32/64 channels) on 1×28×28."""
    return seeded(lambda: CifarResNet(1, in_channels=1, **options), seed)


def transformer(seed: int = 0) -> TransformerClassifier:
    return seeded(lambda: TransformerClassifier(IMAGE, patch=7, d=16, depth=2, heads=2,
                                                mlp_ratio=2), seed)


def images(n: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
           ) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *IMAGE, generator=generator, dtype=dtype),
            torch.randint(0, 10, (n,), generator=generator))


def snapshot(module: nn.Module) -> dict[str, Tensor]:
    return {name: t.detach().clone() for name, t in
            [*module.named_parameters(), *module.named_buffers()]}


# --- the adapter ------------------------------------------------------------------------------
def test_states_are_the_named_modules_outputs_and_the_forward_is_the_models():
    net = resnet().eval()
    adapted = adapt(net, RESNET_STATES, example=images()[0])
    x, _ = images(5, seed=1)
    states, logits = adapted.forward_states(x)
    with torch.no_grad():
        expected = [net.stem(x)]
        for stage in (net.layer1, net.layer2, net.layer3):
            expected.append(stage(expected[-1]))
        assert torch.equal(logits.detach(), net(x)) and torch.equal(adapted(x), net(x))
    for h, want in zip(states, expected, strict=True):
        assert torch.equal(h.detach(), want) and h.requires_grad
    assert adapted.n_blocks == 3 and adapted.n_classes == 10
    assert adapted.state_shapes == ((16, 28, 28), (16, 28, 28), (32, 14, 14), (64, 7, 7))
    assert adapted.state_widths == (16, 16, 32, 64)


@pytest.mark.parametrize("layer", [0, 1, 2, 3])
def test_forward_from_reruns_the_rest_of_the_resnet(layer):
    net = resnet().eval()
    adapted = adapt(net, RESNET_STATES, input_shape=IMAGE)
    h = torch.randn(3, *adapted.state_shapes[layer], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        rest = [net.layer1, net.layer2, net.layer3][layer:]
        want = h
        for stage in rest:
            want = stage(want)
        want = net.fc(want.mean(dim=(2, 3)))
        assert torch.allclose(adapted.forward_from(layer, h), want, rtol=1e-6, atol=1e-6)


def test_forward_from_reruns_the_rest_of_the_transformer():
    net = transformer().eval()
    adapted = adapt(net, TRANSFORMER_STATES, input_shape=IMAGE)
    h = torch.randn(3, 17, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = net.head(net.norm(net.encoder.layers[1](h)[:, 0]))
        assert torch.allclose(adapted.forward_from(0, h), want, rtol=1e-5, atol=1e-6)
        assert torch.allclose(adapted.forward_from(1, h), net.head(net.norm(h[:, 0])),
                              rtol=1e-6, atol=1e-6)


class Positions(nn.Module):
    """A learned (B, d) tensor that does not depend on the input's values."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:
        return self.table.expand(x.shape[0], -1)


class PositionsEverywhere(nn.Module):
    """Adds position vectors computed before the states again after them: every state is
    still a cut, but forward_from must compute those vectors rather than skip them."""

    def __init__(self) -> None:
        super().__init__()
        self.pos, self.embed = Positions(4), nn.Linear(4, 4)
        self.block, self.head = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        p = self.pos(x)
        return self.head(self.block(self.embed(x) + p) + p)


def test_forward_from_runs_what_the_rest_of_the_network_reads_besides_the_state():
    net = seeded(PositionsEverywhere)
    adapted = adapt(net, ["embed", "block"], input_shape=(4,))
    h = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        p = net.pos.table
        torch.testing.assert_close(adapted.forward_from(1, h), net.head(h + p))
        torch.testing.assert_close(adapted.forward_from(0, h), net.head(net.block(h + p) + p))


def test_segments_are_what_writes_each_state_and_local_states_keep_them_apart():
    adapted = adapt(transformer(), TRANSFORMER_STATES, input_shape=IMAGE)
    names = {id(p): n for n, p in adapted.net.named_parameters()}
    segment0 = {names[id(p)] for p in adapted.segment_parameters(0)}
    assert {"cls_token", "pos", "patch_embed.weight"} <= segment0  # used outside submodules
    assert all(n.startswith(("cls_token", "pos", "patch_embed", "encoder.layers.0."))
               for n in segment0)
    assert {names[id(p)] for p in adapted.readout_parameters()} == {
        "norm.weight", "norm.bias", "head.weight", "head.bias"}
    outputs, logits = adapted.local_states(images(4)[0])
    params = list(adapted.net.parameters())
    for segment, out in [*enumerate(outputs), (None, logits)]:
        grads = torch.autograd.grad(out.sum(), params, allow_unused=True)
        reached = {names[id(p)] for p, g in zip(params, grads) if g is not None}
        own = adapted.readout_parameters() if segment is None else \
            adapted.segment_parameters(segment)
        assert reached == {names[id(p)] for p in own}


def test_adapt_changes_nothing_of_the_model():
    net = resnet()
    net.layer2.eval()  # a submodule the user keeps in eval mode
    net.fc.weight.requires_grad_(False)  # and a parameter the user froze
    modes = [m.training for m in net.modules()]
    before, rng = snapshot(net), torch.get_rng_state()
    adapt(net, RESNET_STATES, example=images()[0])
    assert [m.training for m in net.modules()] == modes
    assert not net.fc.weight.requires_grad and net.fc.bias.requires_grad
    assert all(torch.equal(t, before[n]) for n, t in snapshot(net).items())
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


# --- what adapt refuses -------------------------------------------------------------------------
class TwiceNet(nn.Module):
    """Calls one block twice (a shared module) and computes an unused auxiliary output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(4, 4), nn.Linear(4, 4)
        self.aux, self.head = nn.Linear(4, 2), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        self.aux(h)  # computed, never used
        return self.head(self.block(self.block(h)))


class DetachedNet(nn.Module):
    """Its logits depend on the block's output, but only through .detach()."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        return self.head(h + self.block(h).detach())


class NoGradNet(DetachedNet):
    """A frozen feature extractor run under torch.no_grad() inside the forward."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            h = self.embed(x)
        return self.head(self.block(h))


class TupleOutNet(DetachedNet):
    """Returns (logits, an auxiliary output), as many published networks do."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.embed(x)
        return self.head(self.block(h)), h


class PredictionsNet(DetachedNet):
    """Returns the predicted classes (int64), not the logits."""

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x))).argmax(dim=1)


class MaskedNet(DetachedNet):
    """Takes a mask beside its input, as many published networks do."""

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x * mask)))


class InPlaceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.norm, self.head = nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(F.relu(self.norm(self.embed(x)), inplace=True))


class Conv1dBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, h: Tensor) -> Tensor:
        return self.conv(h.unsqueeze(1)).squeeze(1)


class Conv1dNet(nn.Module):
    """A block built on a Conv1d, whose backward the per-layer rules cannot replace."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(8, 8), Conv1dBlock(), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x)))


class AlwaysDropoutNet(nn.Module):
    """Dropout that ignores eval mode: random, which is not mixing samples."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.block(self.embed(x))
        return self.head(nn.functional.dropout(h, 0.5, training=True))


class EditsItsInputNet(nn.Module):
    """Scales its input batch in place: every pass over one batch sees other samples."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x.mul_(2.0))))


def shared_block_net() -> nn.Sequential:
    """One Linear + Tanh block registered (and run) twice in a Sequential."""
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(block, block), nn.Linear(4, 3))


def batch_stat_resnet() -> CifarResNet:
    net = resnet()
    net.layer2[0].bn1 = nn.BatchNorm2d(32, track_running_stats=False)
    return net


REFUSALS = [
    ("unknown name", resnet, ["stem", "layer1.O"], {}, "'layer1.O' is not a submodule of "
     "CifarResNet; did you mean 'layer1.0'"),
    # one block registered twice (ALBERT-style sharing): '1.1' is a submodule, but the
    # line said "'1.1' is not a submodule of Sequential; did you mean '1.0.1', '1.0'?"
    ("registered twice", shared_block_net, ["0", "1.1"], {"input_shape": (4,)},
     "states: '1.1' is the module '1.0' registered a second time (the same object under "
     "both names), and adapt() reads a module by the name model.named_modules() gives it: "
     "name it '1.0'"),
    ("not a tensor", transformer, ["encoder.layers.0.self_attn", "encoder.layers.1"], {},
     "'encoder.layers.0.self_attn' returns a tuple of 2, not one floating tensor"),
    ("not a cut", resnet, ["stem", "layer1.0.conv1", "layer2.0"], {},
     "state 'layer1.0.conv1' is not a cut of the network"),
    ("out of order", resnet, ["stem", "layer2.0", "layer1.0"], {},
     "order the forward pass computes them: 'layer2.0' runs after 'layer1.0'"),
    ("mixes samples", batch_stat_resnet, RESNET_STATES, {},
     "mixes samples in eval mode (BatchNorm 'layer2.0.bn1' has track_running_stats=False"),
    ("random", AlwaysDropoutNet, ["embed", "block"], {"input_shape": (4,)},
     "the model's eval-mode forward is random: two passes over the same batch differ at "
     "'the logits'"),
    ("edits its input", EditsItsInputNet, ["embed", "block"], {"input_shape": (4,)},
     "the model's forward changes its input batch in place"),
    ("called twice", TwiceNet, ["embed", "block"], {"input_shape": (4,)},
     "state 'block' is called more than once"),
    ("does not reach", TwiceNet, ["embed", "aux"], {"input_shape": (4,)},
     "state 'aux' does not reach the output"),
    # the logits do depend on it: the message said they did not
    ("detached", DetachedNet, ["embed", "block"], {"input_shape": (4,)},
     "state 'block' does not reach the output: no gradient of the logits flows back to it "
     "(they do not depend on it, or the forward uses it through .detach()"),
    # adapt's own gradient call failed, and the line blamed the network: "NoGradNet raised
    # RuntimeError while adapt() probed it on input_shape=(4,): One of the differentiated …"
    ("no_grad state", NoGradNet, ["embed", "block"], {"input_shape": (4,)},
     "state 'embed' is computed under torch.no_grad() inside the forward, so no gradient can "
     "be measured at it: to keep what it computes from training, remove the torch.no_grad() "
     "and freeze its parameters"),
    ("tuple out", TupleOutNet, ["embed", "block"], {"input_shape": (4,)},
     "TupleOutNet's output must be (batch, classes) logits, got a tuple of 2 for a batch of 4: "
     "adapt a module "
     "of your own whose forward returns them"),
    ("predictions out", PredictionsNet, ["embed", "block"], {"input_shape": (4,)},
     "PredictionsNet's output must be (batch, classes) logits, got an int64 tensor of shape "
     "(4,) for a batch of 4"),
    # the line said "… missing 1 required positional argument: 'mask'; pass inputs its
    # forward takes", which neither adapt()'s caller nor the command line can
    ("several inputs", MaskedNet, ["embed", "block"], {"input_shape": (4,)},
     "MaskedNet's forward takes 2 inputs (x, mask), but the rules and the diagnostics call a "
     "network on one batch tensor: wrap it in a module whose forward takes one"),
    ("in place", InPlaceNet, ["embed", "norm"], {"input_shape": (4,)},
     "state 'norm' is modified in place"),
    ("one state", resnet, ["stem"], {}, "name at least two"),
    ("readout before", resnet, RESNET_STATES, {"readout": "layer3"},
     "acts before the last state 'layer3.0'"),
    ("readout short", transformer, TRANSFORMER_STATES, {"readout": "head"},
     "readout: parameter 'norm.bias' also acts after the last state"),
    ("lazy", lambda: lazy_net(), ["1", "3"], {"input_shape": (8,)},
     "LazyLinear '2' has not taken its shapes yet: run one forward pass on a batch"),
    ("lazy norm", lambda: lazy_net(nn.LazyBatchNorm1d()), ["1", "3"], {"input_shape": (8,)},
     "LazyLinear '2' and LazyBatchNorm1d '3' have not taken their shapes yet"),
    # TorchScript runs no forward hooks: a traced network's states were "not called" and a
    # scripted block's refusal of the hooks read as the network raising RuntimeError
    ("traced", lambda: torch.jit.trace(nn.Sequential(
        nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)),
        torch.randn(2, 8)), ["1", "3"],
     {"input_shape": (8,)}, "the model is a TorchScript module (TopLevelTracedModule)"),
    ("scripted block", lambda: nn.Sequential(nn.Linear(8, 8), torch.jit.script(
        nn.Sequential(nn.Linear(8, 8), nn.Tanh())), nn.Linear(8, 4)), ["0", "1"],
     {"input_shape": (8,)}, "Sequential's submodule '1' is a TorchScript module "
     "(RecursiveScriptModule), whose forward runs no forward hooks"),
    # torch.compile's graph skips hooks added after it compiled: a compiled network read
    # "'1' is not a submodule of OptimizedModule", its '_orig_mod.1' state "was not called",
    # and a compiled block's Linear was refused by fa-linear as "used directly"
    ("compiled", lambda: torch.compile(nn.Sequential(
        nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)),
        backend="eager"), ["1", "3"],
     {"input_shape": (8,)}, "the model is compiled with torch.compile (OptimizedModule)"),
    ("compiled block", lambda: nn.Sequential(nn.Linear(8, 8), torch.compile(
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()), backend="eager"), nn.Linear(8, 4)),
     ["0", "1"], {"input_shape": (8,)}, "Sequential's submodule '1' is compiled with "
     "torch.compile (OptimizedModule), whose compiled graph may keep running the forward "
     "hooks it was compiled with"),
    ("compiled in place", lambda: compiled_in_place(nn.Sequential(
        nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))),
     ["1", "3"], {"input_shape": (8,)},
     "the model is compiled with torch.compile (Sequential), whose compiled graph"),
]


def compiled_in_place(net: nn.Module) -> nn.Module:
    net.compile(backend="eager")
    return net


def lazy_net(activation: nn.Module | None = None) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.LazyLinear(8),
                         activation or nn.Tanh(), nn.Linear(8, 4))


def test_a_lazy_layer_that_took_its_shapes_is_adapted():
    net = lazy_net()
    net(torch.randn(2, 8))  # the forward pass the refusal asks for
    model = adapt(net, ["1", "3"], input_shape=(8,))
    assert model.state_widths == (8, 8)


class IndexTable(nn.Module):
    """Keeps a permutation as an integer parameter (requires_grad=False, as it must)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 4)
        self.order = nn.Parameter(torch.randperm(8), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.stem(x)[:, self.order]))


def test_an_integer_parameter_is_adapted_and_left_as_it_was():
    # the probe turned requires_grad on for every parameter, which an integer one cannot
    # take: adapt() said the network raised RuntimeError
    torch.manual_seed(0)
    net, x, y = IndexTable(), torch.randn(16, 8), torch.randint(0, 4, (16,))
    model = adapt(net, ["stem", "block"], example=x[:4])
    assert not net.order.requires_grad and net.order.dtype == torch.int64
    assert {id(p) for p in model.segment_parameters(1)} == {id(p) for p in net.block.parameters()}
    dfa = rule("dfa", model)
    dfa.train_step(x, y, torch.optim.SGD(dfa.trainable_parameters(), lr=0.1))
    assert dfa.frozen_outside() == {"order": 8}


@pytest.mark.parametrize("make,states,options,fragment", [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_adapt_refuses_what_cannot_work_in_one_line(make, states, options, fragment):
    options = {"input_shape": IMAGE, **options}
    with pytest.raises(ModelContractError) as err:
        adapt(make(), states, **options)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_factorys_network_returning_a_tuple_in_training_names_the_factorys_fix():
    """A network that returns (logits, aux) in training mode only passes adapt()'s probe;
    built by the command line's factory (its origin), the refusal in training says to make
    the factory return a wrapper: 'adapt a module of your own' is no fix there."""

    class TupleInTraining(TupleOutNet):
        def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
            out = super().forward(x)
            return out if self.training else out[0]

    net = TupleInTraining().eval()
    model = adapt(net, ["embed", "block"], input_shape=(4,))
    model.origin = "model factory 'nets:aux'"
    net.train()
    with pytest.raises(ModelContractError, match=r"got a tuple of 2 for a batch of 3: make the "
                                                 r"model factory 'nets:aux' return a module "
                                                 r"that wraps"):
        model.forward_states(torch.randn(3, 4))


class ChainNet(nn.Module):
    """embed → block → head, written out in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(8, 8), nn.Linear(8, 4)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.block(self.embed(x)))


def small_adapted() -> tuple[ChainNet, AdaptedModel]:
    net = seeded(ChainNet)
    return net, adapt(net, ["embed", "block"], input_shape=(8,))


def test_a_network_compiled_after_adapt_is_named_where_its_states_go_missing():
    """A graph compiled from the network runs the hooks it was compiled with: one compiled
    before the states' hooks existed (here, a hook-free copy standing for it) left them
    "not called in the forward pass: name submodules that the model's forward runs"."""
    net, model = small_adapted()
    graph = copy.deepcopy(net)
    net._compiled_call_impl = lambda *args, **kwargs: graph(*args, **kwargs)
    dfa = rule("dfa", model)
    with pytest.raises(ModelContractError, match=r"^the model is compiled with torch\.compile "
                                                 r"\(ChainNet\)"):
        dfa.train_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 3]),
                       torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.slow
def test_a_network_compiled_in_place_with_inductor_after_adapt_is_named():
    """Compiled with torch.compile's default backend, the states' version counters moved:
    every step said "state 'embed' is modified in place after its module returns it (e.g. by
    nn.ReLU(inplace=True))", which the network does not do (about 20 s to compile)."""
    net, model = small_adapted()
    net.compile()
    dfa = rule("dfa", model)
    with pytest.raises(ModelContractError, match=r"^the model is compiled with torch\.compile"):
        dfa.train_step(torch.randn(64, 8), torch.arange(64) % 4,
                       torch.optim.SGD(model.parameters(), lr=0.1))


def test_adapt_needs_a_probe_and_accepts_a_correct_readout():
    with pytest.raises(ModelContractError, match="needs example="):
        adapt(resnet(), RESNET_STATES)
    with pytest.raises(ModelContractError, match="at least 2"):
        adapt(resnet(), RESNET_STATES, example=images(1)[0])
    adapted = adapt(transformer(), TRANSFORMER_STATES, ["norm", "head"], input_shape=IMAGE)
    assert len(adapted.readout_parameters()) == 4


def test_state_increments_are_differences_where_the_shape_allows():
    h0, h1, h2 = torch.ones(2, 3), torch.full((2, 3), 4.0), torch.ones(2, 5)
    d1, d2 = state_increments([h0, h1, h2])
    assert torch.equal(d1, h1 - h0) and torch.equal(d2, h2)


# --- rules on adapted models --------------------------------------------------------------------
def test_rules_declare_whether_they_train_adapted_models():
    assert {name for name in rule_names() if rule_class(name).adapted_models} == ADAPTED_RULES
    adapted = adapt(resnet(), RESNET_STATES, input_shape=IMAGE)
    for name, reason in [("fa", "stands for one block's whole Jacobian"),
                         ("ep", "it relaxes the residual energy"),
                         ("state-bridge", "states of one width d"),
                         ("credit-bridge", "states of one width d")]:
        with pytest.raises(ModelContractError) as err:
            rule(name, adapted)
        message = str(err.value)
        assert message.startswith(f"{name} needs a residual network (embed, blocks returning "
                                  "branches, readout): ") and reason in message
        listed = set(message.split("adapted models support ")[1].split(", "))
        assert listed == ADAPTED_RULES


def test_the_capability_is_the_class_attribute(monkeypatch):
    adapted = adapt(resnet(), RESNET_STATES, input_shape=IMAGE)
    monkeypatch.setattr(DFA, "adapted_models", False)
    with pytest.raises(ModelContractError, match="dfa needs a residual network"):
        rule("dfa", adapted)
    assert not any(check.arch in ADAPTED_ARCHS for check in rule_checks(DFA))


def test_rule_validates_its_arguments():
    adapted = adapt(resnet(), RESNET_STATES, input_shape=IMAGE)
    with pytest.raises(ConfigError, match="unknown key method.lamda"):
        rule("dfa", adapted, lamda=0.1)
    with pytest.raises(ConfigError, match="method.penalty=-1.0 is out of range"):
        rule("dfa", adapted, penalty=-1)
    with pytest.raises(ConfigError, match="n_classes=3 but AdaptedModel has 10 logits"):
        rule("dfa", adapted, n_classes=3)
    with pytest.raises(ModelContractError, match="wrap your CifarResNet with adapt"):
        rule("dfa", resnet())
    assert rule("dfa", adapted, n_classes=10).n_classes == 10


def test_frozen_and_trainable_blocks_freeze_by_segment():
    adapted = adapt(resnet(), RESNET_STATES, input_shape=IMAGE)
    rule("bp", adapted, trainable_blocks=1)
    trainable = {n for n, p in adapted.net.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in adapted.net.named_parameters()
                         if n.startswith(("stem.", "layer3.", "fc."))}
    frozen = rule("frozen", adapted)
    assert {n for n, p in adapted.net.named_parameters() if p.requires_grad} == {
        "fc.weight", "fc.bias"}
    assert [p for p in frozen.trainable_parameters()] == adapted.readout_parameters()


class Residual(nn.Module):
    """h + branch(h): a residual block written the usual way."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, h: Tensor) -> Tensor:
        return h + self.branch(h)


class UserResMLP(nn.Module):
    """A contract ResidualMLP's own modules, rewired as a plain module with skip blocks."""

    def __init__(self, contract: ResidualMLP) -> None:
        super().__init__()
        self.embed = contract.embed
        self.blocks = nn.Sequential(*(Residual(b) for b in contract.blocks))
        self.out_ln, self.out_head = contract.out_ln, contract.out_head

    def forward(self, x: Tensor) -> Tensor:
        return self.out_head(self.out_ln(self.blocks(self.embed(x))))


@pytest.mark.parametrize("name,options", [("bp", {"penalty": 0.05}),
                                          ("dfa", {"penalty": 0.05}),
                                          ("drtp", {}), ("fa-linear", {}), ("kp", {}),
                                          ("local-ce", {"penalty": 0.05})])
def test_an_adapted_residual_net_trains_like_the_contract_model(name, options):
    """The same network as a contract ResidualMLP and adapted with the residual stream as
    states: every rule takes the same steps (the penalty on state increments is the branch
    penalty), so the adapter changes nothing a rule computes."""
    contract = seeded(lambda: ResidualMLP(6, 8, 4, 3, w2_std=0.3)).to(F64)
    adapted = adapt(UserResMLP(copy.deepcopy(contract)),
                    ["embed", "blocks.0", "blocks.1", "blocks.2"], input_shape=(6,))
    ours, theirs = rule(name, contract, **options), rule(name, adapted, **options)
    if name in ("dfa", "drtp"):
        assert [tuple(b.shape) for b in theirs.feedback] == [(4, 8)] * 4
    if name in ("fa-linear", "kp"):  # the same weight layers, in the same order
        assert [n.replace(".branch", "") for n, _ in theirs.layers] == [
            n for n, _ in ours.layers]
    if name not in ("bp", "local-ce"):  # local-ce's classifiers start at zero in both
        theirs.feedback = [b.clone() for b in ours.feedback]
    initial = [p.detach().clone() for p in contract.parameters()]
    generator = torch.Generator().manual_seed(5)
    optimizers = [torch.optim.SGD(r.trainable_parameters(), lr=0.1) for r in (ours, theirs)]
    for _ in range(3):
        x = torch.randn(10, 6, generator=generator, dtype=F64)
        y = torch.randint(0, 4, (10,), generator=generator)
        for r, optimizer in zip((ours, theirs), optimizers):
            assert r.train_step(x, y, optimizer).finite
    for a, b, start in zip(contract.parameters(), adapted.net.parameters(), initial,
                           strict=True):
        assert not torch.equal(a, start)
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    x = torch.randn(7, 6, generator=generator, dtype=F64)
    y = torch.randint(0, 4, (7,), generator=generator)
    for a, b in zip(ours.credits(x, y), theirs.credits(x, y), strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-13)


# --- attention: PyTorch's own layers get feedback ----------------------------------------------
def test_attention_projections_are_feedback_layers_with_an_exact_rest():
    """fa-linear on PyTorch's encoder layers: with B = W for every weight layer the credit
    is backprop's (so the attention between the replaced projections is exact), and the
    packed q/k/v projection's and out_proj's feedback each change the credit below them —
    BioTorch's module swap would leave both exact."""
    adapted = adapt(transformer().to(F64), TRANSFORMER_STATES, input_shape=IMAGE)
    fa, bp = rule("fa-linear", adapted), rule("bp", adapted)
    names = [name for name, _ in fa.layers]
    assert "encoder.layers.1.self_attn.in_proj_weight" in names
    assert "encoder.layers.1.self_attn.out_proj" in names
    x, y = images(6, dtype=F64)
    fa.feedback = [w.detach().clone() for w in fa.weights()]
    for a, g in zip(fa.credits(x, y), bp.credits(x, y), strict=True):
        assert torch.allclose(a, g, rtol=1e-9, atol=1e-14)
    exact = fa.credits(x, y)
    for site in ("in_proj_weight", "out_proj"):
        index = names.index(f"encoder.layers.1.self_attn.{site}")
        fa.feedback[index] = torch.randn_like(fa.feedback[index])
        moved = fa.credits(x, y)
        assert not torch.allclose(moved[0], exact[0]) and torch.equal(moved[1], exact[1])
        fa.feedback[index] = fa.weights()[index].detach().clone()


def test_weight_layers_whose_backward_cannot_be_replaced_are_refused():
    adapted = adapt(Conv1dNet(), ["embed", "block"], input_shape=(8,))
    with pytest.raises(ModelContractError, match="'block.conv' is a Conv1d; use those"):
        rule("fa-linear", adapted)
    dfa = rule("dfa", adapted)  # a rule that needs no weight layer's backward trains it
    optimizer = torch.optim.SGD(dfa.trainable_parameters(), lr=0.1)
    assert dfa.train_step(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), optimizer).finite


class Recurrent(nn.Module):
    """Token ids through an embedding, a recurrent layer and a block read at its last step."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.embed, self.rnn = nn.Embedding(12, 8), layer
        self.block, self.head = nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.block(self.rnn(self.embed(ids))[0][:, -1]))


@pytest.mark.parametrize("layer", [nn.LSTM, nn.GRU, nn.RNN])
def test_a_recurrent_layer_is_refused_by_the_per_layer_rules(layer):
    # Its weights pass the signal down (and back through time) with W: fa-linear trained
    # them by exact backprop and recorded the run as fa-linear.
    ids = torch.randint(0, 12, (4, 5), generator=torch.Generator().manual_seed(0))
    adapted = adapt(Recurrent(layer(8, 8, batch_first=True)), ["embed", "block"], example=ids)
    with pytest.raises(ModelContractError, match=f"'rnn' is a {layer.__name__}; use those"):
        rule("fa-linear", adapted)
    assert rule("dfa", adapted).train_step(ids, torch.tensor([0, 1, 2, 0]), torch.optim.SGD(
        adapted.parameters(), lr=0.1)).finite


# --- the proof: networks nobody here wrote, trained by each rule and audited --------------------
ZOO = {"transformer": (transformer, TRANSFORMER_STATES, "head"),
       "resnet20": (resnet, RESNET_STATES, "fc")}  # n=1 block per stage, 16/32/64 channels
FIRST = {"transformer": "patch_embed.weight", "resnet20": "stem.0.weight"}
PROOF_RULES = ["bp", "fa-linear", "usf", "kp", "dfa", "frozen"]


def first_gradients(name: str, make, states: list[str], x: Tensor, y: Tensor
                    ) -> dict[str, Tensor | None]:
    """The parameter gradients of rule ``name``'s first step on a fresh copy."""
    twin = rule(name, adapt(make(), states, example=x))
    twin.train_step(x, y, torch.optim.SGD(twin.trainable_parameters(), lr=0.0))
    return {n: None if p.grad is None else p.grad.clone()
            for n, p in twin.model.net.named_parameters()}


@pytest.mark.parametrize("name", PROOF_RULES)
@pytest.mark.parametrize("net", ZOO)
def test_a_network_nobody_here_wrote_trains_with_the_rule_and_is_audited(net, name):
    make, states, head = ZOO[net]
    x, y = images(16)
    adapted = adapt(make(), states, example=x)
    trained = rule(name, adapted)
    readout = {n for n, p in adapted.net.named_parameters()
               if any(p is q for q in adapted.readout_parameters())}
    initial = {n: p.detach().clone() for n, p in adapted.net.named_parameters()}
    optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-3)
    if name == "kp":
        feedback = [b.clone() for b in trained.feedback]
        weights = [w.detach().clone() for w in trained.weights()]
    for step in range(3):
        assert trained.train_step(*images(16, seed=step), optimizer).finite
        if name == "kp" and step == 0:  # B − W shrinks by (1 − lr·wd), whatever the gradient
            for b0, w0, b, w in zip(feedback, weights, trained.feedback, trained.weights()):
                torch.testing.assert_close(b - w.detach(), (b0 - w0) * (1 - 1e-3 * 0.01))
    changed = {n for n, p in adapted.net.named_parameters() if not torch.equal(p, initial[n])}
    assert changed == (readout if name == "frozen" else set(initial))

    # As each rule says: the head's gradient is backprop's (its δ at the logits is exact),
    # the first layer's is backprop's only for backprop itself (frozen: no gradient).
    ours, exact = (first_gradients(n, make, states, x, y) for n in (name, "bp"))
    torch.testing.assert_close(ours[f"{head}.weight"], exact[f"{head}.weight"])
    if name == "frozen":
        assert ours[FIRST[net]] is None
    elif name == "bp":
        assert torch.equal(ours[FIRST[net]], exact[FIRST[net]])
    else:
        assert not torch.allclose(ours[FIRST[net]], exact[FIRST[net]], rtol=1e-3, atol=0)

    x_eval, y_eval = images(8, seed=9)
    report = diagnose(adapted, x_eval, y_eval, credit=trained, metrics=True,
                      metric_options=METRICS)
    assert isinstance(report, DiagnosticReport) and report.verdict
    assert len(report.hidden_norms) == len(states) and report.metadata["method"] == name
    assert all(report.metrics["rho_measurable"]) and report.metadata["metrics_precision"] == \
        "float64"
    if name in ("bp", "frozen"):
        assert all(abs(c - 1.0) < 1e-6 for c in report.metrics["bp_cosine"])
    assert ("fresh_b_null" in report.metrics) == (trained.feedback_kind == "fixed_random")


def test_diagnosing_an_adapted_model_changes_nothing_of_its_training():
    """Training with diagnose() between steps gives bit-identical weights and statistics."""
    runs = []
    for audit in (False, True):
        adapted = adapt(resnet(shortcut="B"), RESNET_STATES, input_shape=IMAGE)
        dfa = rule("dfa", adapted, penalty=1e-3)
        optimizer = torch.optim.AdamW(dfa.trainable_parameters(), lr=1e-2)
        for step in range(2):
            dfa.train_step(*images(16, seed=step), optimizer)
            if audit:
                diagnose(adapted, *images(8, seed=5), credit=dfa, metrics=True,
                         metric_options=METRICS)
        runs.append(snapshot(adapted))
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])


def test_resnet20_is_the_paper_network():
    net = resnet20()
    assert sum(p.numel() for p in net.parameters()) == 269_722  # 0.27M (He et al. 2016)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == 20  # 6n + 2 weight layers with option A's free shortcuts
    assert resnet20(shortcut="B").layer2[0].shortcut[0].stride == (2, 2)


class DoubledAdaptedDFA(DFA):
    """A broken rule: on adapted models every segment trains on twice its credit."""

    name = "doubled-adapted-dfa"

    def train_step(self, x, y, optimizer):
        result = super().train_step(x, y, optimizer)
        for segment in range(self.model.n_blocks + 1):
            for p in self.model.segment_parameters(segment):
                if p.grad is not None:
                    p.grad.mul_(2.0)
        return result


def test_the_conformance_suite_runs_on_adapted_models_and_catches_a_broken_rule():
    archs = {check.arch for check in rule_checks(rule_class("dfa"))}
    assert set(ADAPTED_ARCHS) <= archs
    assert not set(ADAPTED_ARCHS) & {check.arch for check in rule_checks(rule_class("ep"))}
    with pytest.raises(AssertionError) as err:
        check_rule(DoubledAdaptedDFA, archs=ADAPTED_ARCHS)
    assert "local_update_is_the_surrogate_gradient[adapted-resnet]" in str(err.value)
    assert "local_update_is_the_surrogate_gradient[adapted-transformer]" in str(err.value)


def test_an_adapted_model_is_an_nn_module_that_copies():
    adapted = adapt(transformer(), TRANSFORMER_STATES, input_shape=IMAGE)
    clone = copy.deepcopy(adapted).to(F64)
    x = images(3, dtype=F64)[0]
    assert isinstance(clone, AdaptedModel) and clone.forward_from(1, clone.forward_states(
        x)[0][1]).dtype == F64


def test_encoder_layers_in_bfloat16_are_cuts():
    # The cut check reran the network from each state under no_grad, where PyTorch's
    # encoder layers take their fused fast path: 0.016 from the slow path in bfloat16,
    # and every state was refused as "not a cut of the network".
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
              for _ in range(2)]
    net = nn.Sequential(nn.Linear(4, 8), *layers, nn.Flatten(), nn.Linear(24, 3))
    net.to(torch.bfloat16)
    model = adapt(net, ["0", "1", "2"], input_shape=(3, 4))
    assert model.state_widths == (8, 8, 8)
