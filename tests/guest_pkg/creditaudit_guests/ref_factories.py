"""Module factories whose backward is not the gradient of their forward (``model.factory =
"creditaudit_guests.ref_factories:NAME"``): the reference check refuses each in one line
naming the module, unless the run allows an unverified reference. ``plain`` is the same
network with autograd's backward, which passes."""

from __future__ import annotations

import contextlib
import io
import warnings

import torch
from torch import Tensor, nn

STATES = ["embed", "res"]  # h_0 = embed(x), h_1 = h_0 + f(h_0); logits = head(h_1)
BIOTORCH_STATES = [f"module.{name}" for name in STATES]


class Residual(nn.Module):
    """h + f(h)."""

    def __init__(self, f: nn.Module) -> None:
        super().__init__()
        self.f = f

    def forward(self, h: Tensor) -> Tensor:
        return h + self.f(h)


class DoubledGradient(torch.autograd.Function):
    """The identity forward; a backward that doubles the gradient (not the gradient)."""

    @staticmethod
    def forward(ctx, h: Tensor) -> Tensor:
        return h.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return 2 * grad


class Doubled(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return DoubledGradient.apply(h)


class Net(nn.Module):
    """embed → residual tanh block → head; ``doubled``: the block's branch ends in
    :class:`Doubled`."""

    def __init__(self, in_dim: int = 16, d: int = 16, n_classes: int = 10,
                 doubled: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, d)
        layers: list[nn.Module] = [nn.Linear(d, d), nn.Tanh()]
        if doubled:
            layers.append(Doubled())
        self.res = Residual(nn.Sequential(*layers))
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.res(self.embed(x)))


def plain(**kwargs) -> nn.Module:
    """The network with autograd's backward."""
    return Net(**kwargs)


def doubled_backward(**kwargs) -> nn.Module:
    """A custom torch.autograd.Function in the block whose backward is twice the gradient."""
    return Net(doubled=True, **kwargs)


def biotorch_fa(**kwargs) -> nn.Module:
    """The network converted by BioTorch (0.0.16) to feedback alignment: every Linear keeps
    its forward and takes a fixed random matrix in its backward."""
    from biotorch.module.biomodule import BioModule

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
        return BioModule(Net(**kwargs), mode="fa")
