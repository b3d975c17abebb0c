"""The per-layer feedback rules' training step, bit for bit: on a plain MLP (adapted with
:func:`creditaudit.adapt`, and as a contract model) and on a small conv net, ``fa-linear``,
``usf``, ``frsf``, ``brsf`` and ``kp`` take exactly the parameter updates of a backward pass
written out by hand here — every Linear's input gradient δ·B, its weight gradient δᵀ·x and
bias gradient Σδ, every convolution's from ``aten.convolution_backward`` with B in W's place
— with B built from the rule's own feedback as each rule defines it, and the same fused AdamW.

The rules' fast paths (B built only where a layer's input gradient is needed, no dtype casts
that change nothing, one hook set per model) must not change one bit of training; this is
the test that holds them to it. ``bp`` through ``adapt`` is held to plain autograd the same way.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, rule
from creditaudit.methods.base import all_finite
from creditaudit.methods.kp import group_of
from creditaudit.methods.linear_feedback import SignFeedback, backward_fan_in
from creditaudit.models.contract import ResidualNet
from creditaudit.optim import make_adamw

pytestmark = pytest.mark.usefixtures("single_thread")

IN, D, L, CLASSES, BATCH, STEPS = 12, 16, 3, 5, 8, 4
RULES = ["fa-linear", "usf", "frsf", "brsf", "kp"]


def mlp() -> nn.Sequential:
    """Linear(IN, D) → [ReLU → Linear(D, D)] × L → ReLU → Linear(D, CLASSES)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        layers: list[nn.Module] = [nn.Linear(IN, D)]
        for _ in range(L):
            layers += [nn.ReLU(), nn.Linear(D, D)]
        return nn.Sequential(*layers, nn.ReLU(), nn.Linear(D, CLASSES))


class ContractMLP(ResidualNet):
    """The same layers as a non-residual contract model (states: pre-activations)."""

    def __init__(self, net: nn.Sequential) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = D, CLASSES, False
        self.embed = net[0]
        self.blocks = nn.ModuleList(nn.Sequential(net[2 * i + 1], net[2 * i + 2])
                                    for i in range(L))
        self.head = nn.Sequential(net[-2], net[-1])

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)


def convnet() -> nn.Sequential:
    """Conv(2→4, 3×3, pad 1) → ReLU → Conv(4→4, 3×3, stride 2) → ReLU → flatten → Linear."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 3 * 3, CLASSES))


def batches(shape: tuple[int, ...]) -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, *shape, generator=generator),
             torch.randint(0, CLASSES, (BATCH,), generator=generator)) for _ in range(STEPS)]


def feedback_now(method: str, ours, weights: list[Tensor], generator_state: Tensor
                 ) -> tuple[list[Tensor], Tensor]:
    """(B per layer for the coming step, the rule's generator state after drawing it), from
    the rule's definition: fa-linear and kp their matrices, usf s·sign(W), frsf |M|∘sign(W)
    with fixed |M|, brsf a fresh |M| from the rule's generator."""
    if method in ("fa-linear", "kp"):
        return [b.clone() for b in ours.feedback], generator_state
    if method == "usf":
        return [s * torch.sign(w) for s, w in zip(ours.magnitudes(), weights)], generator_state
    if method == "frsf":
        return [m.abs() * torch.sign(w) for m, w in zip(ours.feedback, weights)], generator_state
    generator = torch.Generator().set_state(generator_state)
    drawn = [torch.randn(*w.shape, generator=generator)
             * (ours.config.feedback_scale / backward_fan_in(layer) ** 0.5)
             for w, (_, layer) in zip(weights, ours.layers)]
    return [m.abs() * torch.sign(w) for m, w in zip(drawn, weights)], generator.get_state()


def hand_step(net: nn.Sequential, feedback: list[Tensor], x: Tensor, y: Tensor,
              optimizer: torch.optim.Optimizer) -> None:
    """One step of the backward written out: the forward keeps every layer's input, the
    CE's gradient at the logits comes from autograd, then layer by layer down."""
    inputs, h = [], x
    for module in net:
        inputs.append(h)
        h = module(h)
    logits = h.detach().requires_grad_(True)
    (delta,) = torch.autograd.grad(F.cross_entropy(logits, y), logits)
    weighted = [m for m in net if isinstance(m, nn.Linear | nn.Conv2d)]
    index = len(weighted)
    optimizer.zero_grad(set_to_none=True)
    for position in range(len(net) - 1, -1, -1):
        module, given = net[position], inputs[position]
        if isinstance(module, nn.ReLU):
            delta = torch.ops.aten.threshold_backward(delta, module(given), 0)
        elif isinstance(module, nn.Flatten):
            delta = delta.view(given.shape)
        elif isinstance(module, nn.Linear):
            index -= 1
            module.weight.grad = delta.t().mm(given)
            module.bias.grad = delta.sum(dim=0)
            delta = delta.mm(feedback[index]) if position > 0 else None
        else:
            index -= 1
            delta, module.weight.grad, module.bias.grad = torch.ops.aten.convolution_backward(
                delta, given, feedback[index], [module.out_channels], list(module.stride),
                list(module.padding), list(module.dilation), False, [0, 0], module.groups,
                [position > 0, True, True])
    optimizer.step()


def kp_mirror(feedback: list[Tensor], weights: list[Tensor], before: list[Tensor],
              optimizer: torch.optim.Optimizer) -> None:
    for b, w, w_old in zip(feedback, weights, before):
        group = group_of(optimizer, w)
        shrink = float(group["lr"]) * float(group["weight_decay"])
        b.copy_(w.detach() + (b - w_old) * (1.0 - shrink))


def assert_bitwise_steps(method: str, net: nn.Sequential, model: nn.Module,
                         shape: tuple[int, ...]) -> None:
    """``method`` on ``model`` (built over ``net``'s layers) and the hand-written step on a
    copy of ``net`` take bit-identical parameter values after every step."""
    twin = copy.deepcopy(net)
    ours = rule(method, model, seed=11)
    optimizer = make_adamw(ours.trainable_parameters(), lr=1e-2, weight_decay=0.1)
    theirs = make_adamw(twin.parameters(), lr=1e-2, weight_decay=0.1)
    twin_weights = [m.weight for m in twin if isinstance(m, nn.Linear | nn.Conv2d)]
    assert [tuple(w.shape) for w in twin_weights] == [tuple(layer.weight.shape)
                                                      for _, layer in ours.layers]
    generator_state = ours.generator.get_state() if method == "brsf" else None
    mirrored = [b.clone() for b in ours.feedback] if method == "kp" else None
    for step, (x, y) in enumerate(batches(shape)):
        with torch.no_grad():
            weights = [w.detach().clone() for w in twin_weights]
        feedback, generator_state = feedback_now(method, ours, weights, generator_state)
        if mirrored is not None:
            feedback = [b.clone() for b in mirrored]
        assert ours.train_step(x, y, optimizer).finite
        hand_step(twin, feedback, x, y, theirs)
        if mirrored is not None:
            kp_mirror(mirrored, twin_weights, weights, theirs)
            assert all(torch.equal(a, b) for a, b in zip(mirrored, ours.feedback))
        for (name, p), q in zip(net.named_parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q), f"{method}: {name} differs after step {step + 1}"


@pytest.mark.parametrize("method", RULES)
def test_per_layer_rules_on_an_adapted_mlp_take_the_hand_written_step_bit_for_bit(method):
    net = mlp()
    model = adapt(net, [str(i) for i in range(0, 2 * L + 1, 2)], input_shape=(IN,))
    assert_bitwise_steps(method, net, model, (IN,))


@pytest.mark.parametrize("method", RULES)
def test_per_layer_rules_on_a_contract_mlp_take_the_hand_written_step_bit_for_bit(method):
    net = mlp()
    assert_bitwise_steps(method, net, ContractMLP(net), (IN,))


@pytest.mark.parametrize("method", RULES)
def test_per_layer_rules_on_an_adapted_conv_net_take_the_hand_written_step_bit_for_bit(method):
    net = convnet()
    model = adapt(net, ["0", "2"], input_shape=(2, 7, 7))
    assert_bitwise_steps(method, net, model, (2, 7, 7))


def test_bp_through_adapt_takes_the_plain_autograd_step_bit_for_bit():
    net = mlp()
    twin = copy.deepcopy(net)
    ours = rule("bp", adapt(net, [str(i) for i in range(0, 2 * L + 1, 2)], input_shape=(IN,)))
    optimizer = make_adamw(ours.trainable_parameters(), lr=1e-2, weight_decay=0.1)
    theirs = make_adamw(twin.parameters(), lr=1e-2, weight_decay=0.1)
    for x, y in batches((IN,)):
        ours.train_step(x, y, optimizer)
        theirs.zero_grad(set_to_none=True)
        F.cross_entropy(twin(x), y).backward()
        theirs.step()
        assert all(torch.equal(p, q) for p, q in zip(net.parameters(), twin.parameters()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_step_finiteness_check_sees_every_nan_and_inf(bad, dtype):
    generator = torch.Generator().manual_seed(0)
    for position in [(0, 0), (5, 7), (63, 32)]:
        t = torch.randn(64, 33, generator=generator).to(dtype)
        assert all_finite(t) and all_finite(t.t()) and all_finite(t[:, ::2])
        t[position] = bad
        assert not all_finite(t) and not all_finite(t.t())
        assert all_finite(t[:, ::2]) == (position[1] % 2 == 1)
    assert all_finite(torch.empty(0, 3, dtype=dtype))
    assert all_finite(torch.full((2, 2), torch.finfo(dtype).max, dtype=dtype))


def test_run_last_state_is_run_states_last_state_and_logits():
    net = mlp()
    model = adapt(net, [str(i) for i in range(0, 2 * L + 1, 2)], input_shape=(IN,))
    x, _ = batches((IN,))[0]
    states, logits = model.run_states(x)
    h_last, last_logits = model.run_last_state(x)
    assert torch.equal(h_last, states[-1]) and torch.equal(last_logits, logits)
    assert h_last.grad_fn is not None  # a training forward: the graph is kept
    assert all(not m._forward_hooks for m in net.modules())  # no hook left behind


@pytest.mark.parametrize("method", ["usf", "frsf", "brsf"])
def test_sign_feedback_is_built_only_where_an_input_gradient_is_needed(method, monkeypatch):
    """The first layer reads the data: its B is never built in a training step; every other
    layer's is built once per step."""
    built: list[int] = []
    build = SignFeedback.__call__

    def counting(self):
        built.append(id(self.weight))
        return build(self)

    monkeypatch.setattr(SignFeedback, "__call__", counting)
    net = mlp()
    ours = rule(method, adapt(net, [str(i) for i in range(0, 2 * L + 1, 2)], input_shape=(IN,)))
    optimizer = make_adamw(ours.trainable_parameters(), lr=1e-2, weight_decay=0.1)
    built.clear()
    for x, y in batches((IN,))[:2]:
        ours.train_step(x, y, optimizer)
    weights = [id(layer.weight) for _, layer in ours.layers]
    assert weights[0] not in built
    assert sorted(built) == sorted(weights[1:] * 2)


def test_sign_feedback_refuses_a_weight_changed_in_place_since_it_was_handed_out():
    ours = rule("usf", ContractMLP(mlp()))
    feedback = ours.step_feedback()
    with torch.no_grad():
        ours.layers[1][1].weight.mul_(-1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        feedback[1]()
    assert torch.equal(feedback[2](), ours.feedback_matrices()[2])
