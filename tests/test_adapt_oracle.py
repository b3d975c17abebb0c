"""BioTorch (0.0.16) as an outside oracle on an adapted network nobody here wrote: on the
CIFAR ResNet of creditaudit.testing.zoo (BasicBlocks, BatchNorm in training mode, strided 1×1
shortcuts), adapted with creditaudit.adapt, fa-linear, usf, brsf and frsf take the same
parameter updates as BioTorch's conversion of the same network in modes fa, usf, brsf and
frsf, with the same feedback copied across, to float64 round-off.

BioTorch is installed with ``pip install --no-deps biotorch==0.0.16`` (README, .ci/run). In
CI (``CI`` set) a missing BioTorch fails the test instead of skipping it.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import warnings

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import adapt, rule
from creditaudit.methods.base import CreditRule
from creditaudit.testing.zoo import CifarResNet

if os.environ.get("CI"):
    import biotorch.module.biomodule as biomodule  # CI must run these tests, never skip them
else:
    biomodule = pytest.importorskip("biotorch.module.biomodule")

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
IMAGE, CLASSES, BATCH = (2, 8, 8), 5, 6
STATES = ["stem", "layer1.0", "layer2.0", "layer3.0"]
STEPS, LR = 3, 0.1
TOLERANCE = 1e-11


def pair(method: str, mode: str) -> tuple[CreditRule, nn.Module, list[nn.Module]]:
    """creditaudit's rule on the adapted ResNet and BioTorch's conversion of a copy (same
    weights, float64); BioTorch's layer for each of the rule's feedback layers."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = CifarResNet(1, (4, 6, 8), IMAGE[0], CLASSES, shortcut="B").to(F64)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
            bio = biomodule.BioModule(copy.deepcopy(net), mode=mode)
    bio.to(F64)
    ours = rule(method, adapt(net, STATES, input_shape=IMAGE))
    theirs = dict(bio.module.named_modules())
    twins = [theirs[name] for name, _ in ours.layers]
    assert len(twins) == 10  # stem, 3×2 block convolutions, 2 shortcuts, fc
    return ours, bio, twins


def batch(seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(100 + seed)
    return (torch.randn(BATCH, *IMAGE, generator=generator, dtype=F64),
            torch.randint(0, CLASSES, (BATCH,), generator=generator))


def run_both(ours: CreditRule, bio: nn.Module, before_ours=lambda: None) -> float:
    """STEPS SGD steps on each side; every parameter and BatchNorm statistic compared after
    each. Returns the smallest update of a convolution below the head over the steps."""
    net = ours.model.net
    theirs = dict(bio.module.named_parameters()) | dict(bio.module.named_buffers())
    ours_opt = torch.optim.SGD(ours.trainable_parameters(), lr=LR)
    bio_opt = torch.optim.SGD([p for p in bio.parameters() if p.requires_grad], lr=LR)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    for step in range(STEPS):
        x, y = batch(step)
        bio_opt.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.cross_entropy(bio(x), y).backward()
        bio_opt.step()
        before_ours()
        assert ours.train_step(x, y, ours_opt).finite
        for name, a in [*net.named_parameters(), *net.named_buffers()]:
            b = theirs[name].detach()
            error = float((a.detach() - b).abs().max()) / max(float(b.abs().max()), 1e-300)
            assert error < TOLERANCE, f"step {step}: {name} differs from BioTorch by {error:.1e}"
    return min(float((p.detach() - start[n]).abs().max()) for n, p in net.named_parameters()
               if n.endswith("conv1.weight"))


def test_fa_linear_matches_biotorch_fa_on_the_resnet():
    ours, bio, twins = pair("fa-linear", "fa")
    for b, layer in zip(ours.feedback, twins, strict=True):
        layer.weight_backward.data.copy_(b)
    assert run_both(ours, bio) > 1e-5  # every block learnt


def test_usf_matches_biotorch_usf_on_the_resnet():
    ours, bio, twins = pair("usf", "usf")
    for s, layer in zip(ours.magnitudes(), twins, strict=True):
        layer.scaling_factor = s  # BioTorch's B = scaling_factor · sign(W)
    assert run_both(ours, bio) > 1e-5


def test_frsf_matches_biotorch_frsf_on_the_resnet():
    ours, bio, twins = pair("frsf", "frsf")
    for m, layer in zip(ours.feedback, twins, strict=True):
        layer.weight_backward.data.copy_(m)  # BioTorch's B = |weight_backward| ∘ sign(W)
    assert run_both(ours, bio) > 1e-5


def test_brsf_matches_biotorch_brsf_with_the_same_draws_on_the_resnet():
    ours, bio, twins = pair("brsf", "brsf")

    def take_biotorch_draw() -> None:
        # BioTorch drew |M_t| from the global RNG in its forward; creditaudit's next step
        # uses the same magnitudes instead of its own draw.
        drawn = [layer.weight_backward.detach().abs().clone() for layer in twins]
        ours.draw_magnitudes = lambda: drawn

    assert run_both(ours, bio, take_biotorch_draw) > 1e-5


def test_the_resnet_comparison_can_fail():
    """With BioTorch's own random feedback instead of ours, the updates below the head
    differ: the comparison sees the shortcut and block convolutions' feedback."""
    ours, bio, _ = pair("fa-linear", "fa")
    with pytest.raises(AssertionError, match="differs from BioTorch"):
        run_both(ours, bio)
