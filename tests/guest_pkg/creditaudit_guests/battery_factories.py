"""``module`` factories for the outside battery (tests/test_outside_battery.py). The good
network is :class:`Net` (16 flat features → ``embed`` → residual blocks ``b1``, ``b2`` →
``head``; states ``["embed", "b1", "b2"]``); every other factory returns something wrong
with it or does something wrong while building it.
"""

import sys

import torch
from torch import nn

STATES = ["embed", "b1", "b2"]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def forward(self, h):
        return h + self.f(h)


class Net(nn.Module):
    def __init__(self, in_dim=16, d=16, n_classes=10):
        super().__init__()
        self.embed = nn.Linear(in_dim, d)
        self.b1, self.b2 = Block(d), Block(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x):
        return self.head(self.b2(self.b1(self.embed(x))))


def good(**kwargs):
    return Net(**kwargs)


def returns_none(**kwargs):
    return None


def returns_tensor(**kwargs):
    return torch.zeros(3)


def returns_function(**kwargs):
    return good


def returns_class(**kwargs):
    return Net


def raises(**kwargs):
    raise ValueError("no such width")


def exits_zero(**kwargs):
    sys.exit(0)


def exits_text(**kwargs):
    sys.exit("the factory gave up")


def prints(**kwargs):
    print("building a network")
    return Net(**kwargs)


def nan_weights(**kwargs):
    net = Net(**kwargs)
    with torch.no_grad():
        net.b1.f[0].weight[0, 0] = float("nan")
    return net


def inf_bias(**kwargs):
    net = Net(**kwargs)
    with torch.no_grad():
        net.head.bias[0] = float("inf")
    return net


def three_classes(**kwargs):
    return Net(**{**kwargs, "n_classes": 3})


def float64(**kwargs):
    return Net(**kwargs).double()


def no_grad(**kwargs):
    net = Net(**kwargs)
    net.requires_grad_(False)
    return net


def seeding(**kwargs):
    torch.manual_seed(0)
    return Net(**kwargs)


_SHARED = []


def shared(**kwargs):
    """The same module object on every call (weights carried from one build to the next)."""
    if not _SHARED:
        _SHARED.append(Net(**kwargs))
    return _SHARED[0]


class ExtraDim(Net):
    def forward(self, x):
        return super().forward(x)[:, :, None]


def extra_dim(**kwargs):
    return ExtraDim(**kwargs)


class TupleOut(Net):
    def forward(self, x):
        return super().forward(x), x


def tuple_out(**kwargs):
    return TupleOut(**kwargs)


class DictOut(Net):
    def forward(self, x):
        return {"logits": super().forward(x)}


def dict_out(**kwargs):
    return DictOut(**kwargs)


class InPlaceInput(Net):
    def forward(self, x):
        x.mul_(2)
        return super().forward(x)


def in_place_input(**kwargs):
    return InPlaceInput(**kwargs)


class NaNForLargeBatches(Net):
    def forward(self, x):
        out = super().forward(x)
        return out * float("nan") if x.shape[0] > 16 else out


def nan_for_large_batches(**kwargs):
    return NaNForLargeBatches(**kwargs)


class Reuses(Net):
    """Runs block b1 twice: the state 'b1' is not one point of the forward."""

    def forward(self, x):
        return self.head(self.b2(self.b1(self.b1(self.embed(x)))))


def reuses_a_state(**kwargs):
    return Reuses(**kwargs)


class Skips(Net):
    """A skip from embed straight to the head: 'b2' is not a cut of the network."""

    def forward(self, x):
        h0 = self.embed(x)
        return self.head(self.b2(self.b1(h0)) + h0)


def skips_past_states(**kwargs):
    return Skips(**kwargs)


class Unused(Net):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.spare = nn.Linear(16, 16)


def with_unused_module(**kwargs):
    return Unused(**kwargs)


class Dropout(Net):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.head(self.drop(self.b2(self.b1(self.embed(x)))))


def with_dropout(**kwargs):
    return Dropout(**kwargs)


class BatchNormed(Net):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = nn.BatchNorm1d(16)

    def forward(self, x):
        return self.head(self.norm(self.b2(self.b1(self.embed(x)))))


def with_batchnorm(**kwargs):
    return BatchNormed(**kwargs)


class HeadLN(Net):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.head(self.norm(self.b2(self.b1(self.embed(x)))))


def head_ln(**kwargs):
    return HeadLN(**kwargs)


class Clamped(torch.autograd.Function):
    """The identity forward; a backward that clips the gradient to ±1e-6."""

    @staticmethod
    def forward(ctx, h):
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad):
        return grad.clamp(-1e-6, 1e-6)


class ClampedBackward(Net):
    def forward(self, x):
        return self.head(Clamped.apply(self.b2(self.b1(self.embed(x)))))


def clamped_backward(**kwargs):
    return ClampedBackward(**kwargs)


class Detached(Net):
    """The readout reads a detached h_L: no gradient reaches any state."""

    def forward(self, x):
        return self.head(self.b2(self.b1(self.embed(x))).detach())


def detached_head(**kwargs):
    return Detached(**kwargs)


def biotorch(mode):
    import contextlib
    import io
    import warnings

    from biotorch.module.biomodule import BioModule

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return BioModule(Net(), mode=mode)


def biotorch_fa(**kwargs):
    return biotorch("fa")


def biotorch_usf(**kwargs):
    return biotorch("usf")


def biotorch_frsf(**kwargs):
    return biotorch("frsf")


def biotorch_backpropagation(**kwargs):
    return biotorch("backpropagation")


class NoParameters(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.embed, self.b1, self.b2 = nn.Identity(), nn.Tanh(), nn.Tanh()

    def forward(self, x):
        return self.b2(self.b1(self.embed(x)))[:, :10]


def no_parameters(**kwargs):
    return NoParameters()
