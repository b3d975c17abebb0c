"""Adapted networks that recompute part of their forward in the backward pass
(``torch.utils.checkpoint``, non-reentrant): every rule trains them exactly as it trains
the same network without checkpointing."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from creditaudit import adapt, rule
from creditaudit.errors import ModelContractError

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
STATES = ["inp", "b1", "b2"]
RULES = ("bp", "fa-linear", "usf", "brsf", "frsf", "kp", "dfa", "drtp", "local-ce")


class Net(nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.inp = nn.Linear(6, 8)
        self.b1 = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.b2 = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        h = checkpoint(self.b1, h, use_reentrant=False) if self.checkpointed else self.b1(h)
        return self.head(self.b2(h))


def trained(method: str, checkpointed: bool) -> list[Tensor]:
    torch.manual_seed(0)
    net = Net(checkpointed).to(F64)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, generator=generator, dtype=F64)
    y = torch.randint(0, 3, (16,), generator=generator)
    bound = rule(method, adapt(net, STATES, example=x[:4]))
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    for _ in range(3):
        assert bound.train_step(x, y, optimizer).finite
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("method", RULES)
def test_a_checkpointed_block_trains_as_without_checkpointing(method: str) -> None:
    # The per-layer feedback rules replace each layer's forward while the graph is built;
    # a checkpointed block recomputes its forward in the backward pass, which must use B
    # there too (it used W — backprop's signal — when the backward ran outside).
    for plain, recomputed in zip(trained(method, False), trained(method, True), strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=1e-12)


class Encoder(nn.Module):
    """Tokens through a checkpointed encoder layer (attention's projections get feedback)."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.inp = nn.Linear(3, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x.view(-1, 2, 3))
        h = (checkpoint(self.layer, h, use_reentrant=False) if self.checkpointed
             else self.layer(h))
        return self.head(h[:, 0])


def test_a_checkpointed_encoder_layer_trains_with_fa_linear_as_without():
    # Outside the replaced layers the recomputation saved other tensors than the forward
    # and the step raised CheckpointError.
    params = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        net = Encoder(checkpointed).to(F64)
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1), dtype=F64)
        bound = rule("fa-linear", adapt(net, ["inp", "layer"], example=x[:4]))
        optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
        assert bound.train_step(x, torch.arange(8) % 3, optimizer).finite
        params.append([p.detach().clone() for p in net.parameters()])
    for plain, recomputed in zip(*params, strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=1e-12)


class Spanning(Net):
    """One checkpointed region computes both blocks: state 'b1' lies inside it."""

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        h = checkpoint(lambda t: self.b2(self.b1(t)), h, use_reentrant=False)
        return self.head(h)


class Reentrant(Net):
    def forward(self, x: Tensor) -> Tensor:
        h = checkpoint(self.b1, self.inp(x), use_reentrant=True)
        return self.head(self.b2(h))


@pytest.mark.parametrize(("net", "fragment"), [
    (Spanning, "Spanning computes a state inside a torch.utils.checkpoint region rather than "
     "at its end"),
    (Reentrant, "Reentrant runs torch.utils.checkpoint with use_reentrant=True, which refuses "
     "torch.autograd.grad")])
def test_checkpointing_adapt_cannot_work_with_is_one_line_saying_how(net, fragment):
    # Both read as torch's own error raised by the network ("Spanning raised
    # CheckpointError while adapt() probed it: … different metadata …").
    with warnings.catch_warnings(), pytest.raises(ModelContractError) as err:
        warnings.simplefilter("ignore")  # torch: "None of the inputs have requires_grad=True"
        adapt(net(False), STATES, input_shape=(6,))
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
