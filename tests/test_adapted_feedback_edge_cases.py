"""The per-layer feedback rules on adapted networks of shapes and habits a researcher's own
modules have: a token Linear followed by an in-place op, and a model
converted to float64 after the rule was bound. Gradients are checked against a
hand-written reference in float64: each layer's forward written as F.linear(x, B) −
F.linear(x, B).detach() + F.linear(x.detach(), W, b), whose input gradient goes through B
and whose weight and bias gradients are exact.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, rule
from creditaudit.errors import ModelContractError

F64 = torch.float64
PER_LAYER = ["fa-linear", "usf", "brsf", "frsf", "kp"]


class TokenMLP(nn.Module):
    """x (B, T, 5) → Linear → ReLU(inplace=True) → Linear → GELU → mean over T → head;
    ``residual_add``: the second Linear's output then takes ``+= h`` in place instead."""

    def __init__(self, *, residual_add: bool = False) -> None:
        super().__init__()
        self.residual_add = residual_add
        self.inp = nn.Linear(5, 6)
        self.act = nn.ReLU(inplace=True)
        self.mid = nn.Linear(6, 6)
        self.out = nn.GELU()
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.inp(x))
        z = self.mid(h)
        if self.residual_add:
            z += h
        return self.head(self.out(z).mean(dim=1))


def through_feedback(layer: nn.Linear, b: Tensor) -> Callable[[Tensor], Tensor]:
    """``layer``'s forward with its input gradient through ``b`` (module docstring)."""
    b = b.detach()

    def forward(x: Tensor) -> Tensor:
        through_b = F.linear(x, b.to(x.dtype))
        return through_b - through_b.detach() + F.linear(x.detach(), layer.weight, layer.bias)

    return forward


def reference_gradients(net: nn.Module, feedback: dict[str, Tensor], x: Tensor,
                        y: Tensor) -> dict[str, Tensor]:
    """∂CE/∂θ of a copy of ``net`` with each named Linear's input gradient through its B."""
    net = copy.deepcopy(net)
    modules = dict(net.named_modules())
    for name, b in feedback.items():
        modules[name].forward = through_feedback(modules[name], b)
    F.cross_entropy(net(x), y).backward()
    return {name: p.grad for name, p in net.named_parameters()}


@pytest.mark.parametrize("residual_add", [False, True])
@pytest.mark.parametrize("method", PER_LAYER)
def test_an_in_place_op_after_a_token_linear_trains_the_rule(method, residual_add):
    # F.linear of a (B, T, in) input with a bias returns a view, which autograd refused to
    # let ReLU(inplace=True) (or z += h) change: "Output 0 of _FeedbackLinear is a view
    # and is being modified inplace".
    torch.manual_seed(0)
    net = TokenMLP(residual_add=residual_add).to(F64)
    x, y = torch.randn(6, 4, 5, dtype=F64), torch.randint(0, 3, (6,))
    before = copy.deepcopy(net)
    bound = rule(method, adapt(net, states=["act", "out"], example=x[:4]), penalty=0.0)
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.0)
    assert bound.train_step(x, y, optimizer).finite
    feedback = dict(zip([name for name, _ in bound.layers], bound.feedback_matrices(),
                        strict=True))
    expected = reference_gradients(before, feedback, x, y)
    for name, p in net.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-12, atol=1e-14), name
    credits = bound.credits(x, y)
    assert all(bool(torch.isfinite(c).all()) for c in credits)


class MLP(nn.Module):
    """x (B, 5) → Linear → tanh → Linear → tanh → head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.act = nn.Linear(5, 6), nn.Tanh()
        self.mid, self.out = nn.Linear(6, 6), nn.Tanh()
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.out(self.mid(self.act(self.inp(x)))))


@pytest.mark.parametrize("method", PER_LAYER)
def test_a_model_converted_to_float64_after_binding_trains_the_rule(method):
    # brSF drew each step's magnitudes into float32 buffers made when it was bound and
    # raised "dtype Double does not match dtype of out parameter (Float)" on its first step
    # once the model was float64; the other rules trained on.
    torch.manual_seed(0)
    net = MLP()
    x, y = torch.randn(6, 5, dtype=F64), torch.randint(0, 3, (6,))
    bound = rule(method, adapt(net, states=["act", "out"], example=x[:4].float()), penalty=0.0)
    net.to(F64)
    before = copy.deepcopy(net)
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.0)
    used = [b.clone() for b in bound.feedback_matrices()]  # kp's B mirrors the step after it
    assert bound.train_step(x, y, optimizer).finite
    if method == "brsf":  # its magnitudes are drawn for the step
        used = bound.feedback_matrices()
    feedback = dict(zip([name for name, _ in bound.layers], used, strict=True))
    expected = reference_gradients(before, feedback, x, y)
    for name, p in net.named_parameters():
        assert p.grad.dtype == F64
        assert torch.allclose(p.grad, expected[name], rtol=1e-12, atol=1e-14), name


class OwnAttention(nn.MultiheadAttention):
    """Attention of its own on the packed projection (scaled_dot_product_attention), or
    nn.MultiheadAttention's through ``super().forward`` when ``inherited``."""

    inherited = False

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                **kwargs: object) -> tuple[Tensor, None]:
        if self.inherited:
            return super().forward(query, key, value, need_weights=False)
        q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        return self.out_proj(F.scaled_dot_product_attention(q, k, v)), None


class AttentionNet(nn.Module):
    """x (B, T, 5) → Linear → tanh → OwnAttention → mean over T → head."""

    def __init__(self, inherited: bool) -> None:
        super().__init__()
        self.inp, self.act = nn.Linear(5, 8), nn.Tanh()
        self.attention = OwnAttention(8, 1, batch_first=True)
        self.attention.inherited = inherited
        self.out, self.head = nn.Identity(), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.inp(x))
        return self.head(self.out(self.attention(h, h, h)[0]).mean(dim=1))


@pytest.mark.parametrize("method", ["fa-linear", "usf"])
def test_an_attention_subclass_with_a_forward_of_its_own_is_named_as_such(method):
    # It ran, but without F.multi_head_attention_forward, so its projections kept their
    # exact backward: the step was refused with "… was not run in the forward pass …
    # remove unused attention layers", which was untrue.
    torch.manual_seed(0)
    x, y = torch.randn(6, 4, 5), torch.randint(0, 3, (6,))
    bound = rule(method, adapt(AttentionNet(inherited=False), states=["act", "out"],
                               example=x[:4]))
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    with pytest.raises(ModelContractError) as error:
        bound.train_step(x, y, optimizer)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("an nn.MultiheadAttention (OwnAttention with embed_dim=8) ran "
                              "without nn.MultiheadAttention's own attention"), message
    assert "super().forward(…)" in message
    inherited = rule(method, adapt(AttentionNet(inherited=True), states=["act", "out"],
                                   example=x[:4]))
    optimizer = torch.optim.SGD(inherited.trainable_parameters(), lr=0.1)
    assert inherited.train_step(x, y, optimizer).finite


class NestingAttention(nn.MultiheadAttention):
    """An attention whose forward first runs an inner nn.MultiheadAttention on its input,
    then its own (``super().forward``); ``nest=False``: its own only."""

    nest = True

    def __init__(self, embed_dim: int) -> None:
        super().__init__(embed_dim, 2, batch_first=True, dtype=F64)
        self.inner = nn.MultiheadAttention(embed_dim, 1, batch_first=True, dtype=F64)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                **kwargs: object) -> tuple[Tensor, Tensor | None]:
        if self.nest:
            query = key = value = self.inner(query, key, value, need_weights=False)[0]
        return super().forward(query, key, value, need_weights=False)


def test_an_attention_run_inside_another_attention_gets_its_own_feedback():
    """PyTorch's attention between an inner attention's replaced projections was taken
    for a call of the outer attention's own, whose feedback it then used (a ValueError
    traceback, zip() argument 4 is shorter…). The gradients are those of the same two
    attentions run one after the other."""
    from creditaudit.methods.adapted_feedback import (
        AttentionFeedback,
        replaced_attention_backward,
    )
    from creditaudit.methods.replaced_backward import _FeedbackLinear

    torch.manual_seed(0)
    outer = NestingAttention(4)
    entries = [AttentionFeedback(a, [torch.randn_like(a.in_proj_weight)],
                                 torch.randn_like(a.out_proj.weight))
               for a in (outer, outer.inner)]
    x = torch.randn(2, 3, 4, dtype=F64)

    def gradients(nest: bool) -> list[Tensor]:
        outer.nest = nest
        h = x.clone().requires_grad_(True)
        with replaced_attention_backward(entries, _FeedbackLinear.apply):
            z = h if nest else outer.inner(h, h, h, need_weights=False)[0]
            y = outer(z, z, z)[0]
        return torch.autograd.grad(y.square().sum(), [h, *outer.parameters()])

    for nested, sequential in zip(gradients(True), gradients(False), strict=True):
        assert torch.allclose(nested, sequential, rtol=1e-12, atol=1e-14)


class ShortcutAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention's attention on its first call in a forward pass, an attention
    of its own on the second (a shortcut such as a cache)."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                **kwargs: object) -> tuple[Tensor, None]:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls % 2:
            return super().forward(query, key, value, need_weights=False)
        q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        return self.out_proj(F.scaled_dot_product_attention(q, k, v)), None


class TwiceAttentionNet(AttentionNet):
    """AttentionNet with its ShortcutAttention applied twice."""

    def __init__(self) -> None:
        super().__init__(inherited=True)
        self.attention = ShortcutAttention(8, 1, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.inp(x))
        h = self.attention(h, h, h)[0]
        return self.head(self.out(self.attention(h, h, h)[0]).mean(dim=1))


@pytest.mark.parametrize("method", ["fa-linear", "usf"])
def test_an_attention_that_runs_its_own_attention_on_some_calls_is_named_as_such(method):
    # Its second call's projections kept their exact backward: the step trained, half the
    # attention's signal going down through W while the record named the rule.
    torch.manual_seed(0)
    x, y = torch.randn(6, 4, 5), torch.randint(0, 3, (6,))
    bound = rule(method, adapt(TwiceAttentionNet(), states=["act", "out"], example=x[:4]))
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    with pytest.raises(ModelContractError, match=(
            r"^an nn.MultiheadAttention \(ShortcutAttention with embed_dim=8\) ran without "
            r"nn.MultiheadAttention's own attention")):
        bound.train_step(x, y, optimizer)


def test_kp_feedback_follows_a_model_converted_to_float64_after_binding():
    # kp kept the float32 B it was bound with after net.to(float64): every mirror step
    # B ← W + (1 − lr·wd)(B − W_old) was computed and stored in float32 while the run was
    # float64, so B drifted from W's float64 updates by float32 round-off.
    torch.manual_seed(0)
    net = MLP()
    x, y = torch.randn(6, 5, dtype=F64), torch.randint(0, 3, (6,))
    bound = rule("kp", adapt(net, states=["act", "out"], example=x[:4].float()), penalty=0.0)
    net.to(F64)
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1, weight_decay=0.01)
    before_b = [b.to(F64) for b in bound.feedback_matrices()]
    before_w = [w.detach().clone() for w in bound.weights()]
    assert bound.train_step(x, y, optimizer).finite
    for b_old, w_old, b, w in zip(before_b, before_w, bound.feedback_matrices(),
                                  bound.weights(), strict=True):
        assert b.dtype == F64
        expected = w.detach() + (1 - 0.1 * 0.01) * (b_old - w_old)
        assert torch.allclose(b, expected, rtol=0, atol=1e-15)
