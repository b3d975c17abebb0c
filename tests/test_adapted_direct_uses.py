"""A parameter an adapted network multiplies its signal by outside any layer the per-layer
feedback rules replace (``x @ self.W``, ``F.linear(x, self.W)``, einsum, bmm, a readout tied
to the embedding) would keep its exact backward under fa-linear/usf/brsf/frsf/kp while the
record names the rule: binding the rule refuses it in one line naming the module and the
parameter and saying how to fix it. Elementwise uses of parameters (a scale vector, a
positional embedding, a class token, a norm's affine, an Embedding lookup at the input)
and every built-in and zoo architecture stay accepted."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, rule
from creditaudit.errors import ModelContractError
from creditaudit.models.direct_uses import DirectUses
from creditaudit.testing.common import TINY_ARCHS, tiny_batch, tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

PER_LAYER = ("fa-linear", "usf", "brsf", "frsf", "kp")
WIDTH, CLASSES = 8, 3


class Mixer(nn.Module):
    """A block whose forward multiplies by its own parameter in one of several ways."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.W = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5)
        self.scale = nn.Parameter(torch.ones(WIDTH))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, h: Tensor) -> Tensor:
        if self.use == "matmul":
            h = h @ self.W
        elif self.use == "transposed":
            h = h @ self.W.t()
        elif self.use == "einsum":
            h = torch.einsum("btd,de->bte", h, self.W)
        elif self.use == "linear":
            h = F.linear(h, self.W)
        elif self.use == "bmm":
            h = torch.bmm(h, self.W.expand(h.shape[0], -1, -1))
        # spellings the refusal missed, training W's exact backward under the rule's name:
        elif self.use == "linalg.matmul":  # not the object torch.matmul is
            h = torch.linalg.matmul(h, self.W)
        elif self.use == "inner":
            h = h.inner(self.W)
        elif self.use == "vecdot":
            h = torch.linalg.vecdot(h.unsqueeze(-2), self.W)
        elif self.use == "Tensor.baddbmm":
            h = torch.zeros_like(h).baddbmm(h, self.W.expand(h.shape[0], -1, -1))
        elif self.use == "Tensor.addmm_":
            flat = h.flatten(0, 1)
            h = torch.zeros_like(flat).addmm_(flat, self.W).view_as(h)
        # a weight built in the forward by writing W into a buffer (block-diagonal, …):
        elif self.use == "buf[:k] = W":
            half = WIDTH // 2
            weight = torch.zeros(WIDTH, WIDTH, device=h.device)
            weight[:half, :half] = self.W[:half, :half]
            weight[half:, half:] = self.W[half:, half:]
            h = h @ weight
        elif self.use == "new_zeros().copy_(W)":  # a buffer shaped by the signal
            h = h @ h.new_zeros(WIDTH, WIDTH).copy_(self.W)
        return torch.tanh(self.norm(h) * self.scale)  # elementwise uses: accepted


class TokenNet(nn.Module):
    """Token ids → Embedding (+ positional embedding, class token) → Linear → Mixer →
    Linear → readout (an nn.Linear head, or tied to the embedding when ``tied``)."""

    def __init__(self, use: str = "none", tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(CLASSES, WIDTH)
        self.position = nn.Parameter(torch.zeros(1, 4, WIDTH))
        self.token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.a, self.mix, self.b = nn.Linear(WIDTH, WIDTH), Mixer(use), nn.Linear(WIDTH, WIDTH)
        self.head = None if tied else nn.Linear(WIDTH, CLASSES)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.embed(ids) + self.position
        h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], dim=1)
        h = self.b(self.mix(self.a(h)))[:, 0]
        return self.head(h) if self.head is not None else F.linear(h, self.embed.weight)


def token_ids() -> Tensor:
    return torch.randint(0, CLASSES, (4, 4), generator=torch.Generator().manual_seed(0))


def adapted(net: nn.Module):
    torch.manual_seed(0)
    return adapt(net, ["a", "mix", "b"], example=token_ids())


@pytest.mark.parametrize("use", ["matmul", "transposed", "einsum", "linear", "bmm",
                                 "linalg.matmul", "inner", "vecdot", "Tensor.baddbmm",
                                 "Tensor.addmm_", "buf[:k] = W", "new_zeros().copy_(W)"])
def test_a_parameter_multiplied_directly_is_refused_naming_module_and_parameter(use):
    model = adapted(TokenNet(use))
    with pytest.raises(ModelContractError) as error:
        rule("fa-linear", model)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("--method fa-linear cannot replace the backward of parameter "
                              "'mix.W': module 'mix' (Mixer) multiplies its signal by it "
                              "directly"), message
    assert "wrap it in nn.Linear (or nn.Conv2d), or train with bp" in message
    rule("bp", model)  # the rules that keep the backward exact take it
    rule("dfa", model)


@pytest.mark.parametrize("method", PER_LAYER)
def test_every_per_layer_rule_refuses_a_readout_tied_to_the_embedding(method):
    """A tied readout F.linear(h, embed.weight) in the network's own forward."""
    model = adapted(TokenNet(tied=True))
    with pytest.raises(ModelContractError, match=(
            rf"^--method {method} cannot replace the backward of parameter 'embed.weight': "
            r"the forward of TokenNet multiplies its signal by it directly")):
        rule(method, model)


@pytest.mark.parametrize("method", PER_LAYER)
def test_elementwise_uses_of_parameters_stay_accepted(method):
    """A positional embedding, a class token, a LayerNorm's affine, a scale vector and an
    Embedding lookup at the input are no products."""
    model = adapted(TokenNet())
    assert model.probe_direct_uses == ()
    rule(method, model)


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
def test_builtin_and_zoo_architectures_multiply_no_parameter_directly(arch):
    model, (x, _) = tiny_model(arch=arch), tiny_batch(arch=arch)
    net = getattr(model, "net", model)
    if hasattr(model, "probe_direct_uses"):
        assert model.probe_direct_uses == ()
    with torch.enable_grad(), DirectUses(net, x) as probe:
        net(x)
    assert probe.found == [] and "" in probe.called


class ScoredMixer(nn.Module):
    """Attention of the tokens over each other whose scores start from a learned bias
    (``use``: how the product is added to it), or of a learned query the tokens' mean is
    added to in place (``query+=``): products of two activations, no parameter's."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.bias = nn.Parameter(torch.zeros(1, 5, 5))
        self.query = nn.Parameter(torch.zeros(1, 1, WIDTH))

    def forward(self, h: Tensor) -> Tensor:
        bias, keys = self.bias.expand(h.shape[0], -1, -1), h.transpose(1, 2)
        if self.use == "torch.baddbmm":
            scores = torch.baddbmm(bias, h, keys)
        elif self.use == "input=":
            scores = torch.baddbmm(input=bias, batch1=h, batch2=keys)
        elif self.use == "Tensor.baddbmm":
            scores = bias.baddbmm(h, keys)
        elif self.use == "Tensor.baddbmm_":
            scores = bias.clone().baddbmm_(h, keys)
        elif self.use == "F.linear bias":  # the bias of a product of two activations
            scores = torch.stack([F.linear(one, one, self.bias[0, 0]) for one in h])
        elif self.use == "F.conv1d bias=":  # a dynamic convolution: its kernel from h
            out = []
            for one in h:  # (T, WIDTH): a kernel (WIDTH, WIDTH, 1) of the sample's own
                kernel = torch.outer(one.mean(0), one.mean(0)).unsqueeze(-1)
                out.append(F.conv1d(one.t().unsqueeze(0), kernel, bias=self.query[0, 0]))
            return h + torch.cat(out).transpose(1, 2)
        else:  # "query+=", "query[:, 0] ="
            query = self.query.expand(h.shape[0], -1, -1).clone()
            if self.use == "query+=":
                query += h.mean(1, keepdim=True)
            else:  # the signal written over the learned query
                query[:, 0] = h.mean(1)
            return h + (query @ keys).softmax(-1) @ h
        return scores.softmax(-1) @ h


@pytest.mark.parametrize("use", ["torch.baddbmm", "input=", "Tensor.baddbmm",
                                 "Tensor.baddbmm_", "query+=", "query[:, 0] =", "F.linear bias",
                                 "F.conv1d bias="])
def test_a_parameter_added_to_a_product_of_activations_is_accepted(use):
    """torch.baddbmm(self.bias, q, kᵀ) adds the bias; it multiplies nothing by it (it was
    refused as 'multiplies its signal by it directly', the rule's backward untouched by it
    either way), and so does a learned query once the signal is added to it in place, and
    the bias of F.linear or a convolution whose weight is computed from the signal (both
    were refused the same way)."""
    net = TokenNet()
    net.mix = ScoredMixer(use)
    model = adapted(net)
    assert model.probe_direct_uses == ()
    rule("fa-linear", model)
