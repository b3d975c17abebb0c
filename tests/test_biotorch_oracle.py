"""BioTorch (0.0.16) as an outside oracle: on the same plain MLP with the same feedback
matrices, creditaudit's fa-linear, usf, brsf, frsf and dfa take the same parameter updates
as BioTorch's fa, usf, brsf, frsf and dfa, to float64 round-off; on the same small CNN
(full, depthwise, pointwise and grouped convolutions with strides and dilation, then Linear
layers) fa-linear, usf, brsf and frsf do too.

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

from creditaudit.config import MethodConfig
from creditaudit.methods import build_rule
from creditaudit.methods.base import CreditRule
from creditaudit.models import PlainMLP, ResidualNet

if os.environ.get("CI"):
    import biotorch.module.biomodule as biomodule  # CI must run these tests, never skip them
else:
    biomodule = pytest.importorskip("biotorch.module.biomodule")

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
IN_DIM, WIDTH, BLOCKS, CLASSES, BATCH = 7, 9, 3, 5, 11
IMAGE, CHANNELS = (2, 8, 8), 4  # the CNN's inputs and feature maps
STEPS, LR = 3, 0.1
TOLERANCE = 1e-12
WEIGHT_LAYERS = (nn.Linear, nn.Conv2d)


class PlainCNN(ResidualNet):
    """x (B, 2, 8, 8) → ReLU(Conv 3×3) → four ReLU(conv) blocks → mean over H, W →
    ReLU(Linear) → Linear: the blocks are a full 3×3, a depthwise 3×3 with stride 2, a
    pointwise 1×1 and a two-group dilated 3×3 convolution (no skips, states (B, 4, H, W))."""

    residual = False

    def __init__(self) -> None:
        super().__init__()
        c, self.d, self.n_classes = CHANNELS, CHANNELS, CLASSES
        self.embed = nn.Sequential(nn.Conv2d(IMAGE[0], c, 3, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList(nn.Sequential(conv, nn.ReLU()) for conv in (
            nn.Conv2d(c, c, 3, padding=1),
            nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c),
            nn.Conv2d(c, c, 1),
            nn.Conv2d(c, c, 3, padding=2, dilation=2, groups=2)))
        self.head = nn.Sequential(nn.Linear(c, 6), nn.ReLU(), nn.Linear(6, CLASSES))

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h.mean(dim=(2, 3)))

    def as_sequential(self) -> nn.Sequential:
        """A copy of the same layers, in order, as one ``nn.Sequential``."""
        layers: list[nn.Module] = [*self.embed]
        for block in self.blocks:
            layers += list(block)
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), *self.head]
        return copy.deepcopy(nn.Sequential(*layers))


def batch(seed: int, net: str = "mlp") -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    shape = (IN_DIM,) if net == "mlp" else IMAGE
    return (torch.randn(BATCH, *shape, generator=gen, dtype=F64),
            torch.randint(0, CLASSES, (BATCH,), generator=gen))


def pair(method: str, mode: str, net: str = "mlp", **options
         ) -> tuple[CreditRule, nn.Module, list[nn.Module]]:
    """creditaudit's rule on a float64 PlainMLP (or PlainCNN) and BioTorch's conversion of
    the same layers (same weights, float64); BioTorch's Linear and Conv2d layers in order."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = (PlainMLP(IN_DIM, WIDTH, CLASSES, BLOCKS) if net == "mlp" else PlainCNN())
        model = model.to(F64)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
            bio = biomodule.BioModule(model.as_sequential(), mode=mode,
                                      output_dim=CLASSES if mode == "dfa" else None)
    bio.to(F64)
    rule = build_rule(model, MethodConfig(name=method, **options), n_classes=CLASSES, seed=3)
    layers = [m for m in bio.module if isinstance(m, WEIGHT_LAYERS)]
    assert [type(m) for m in our_layers(rule)] == [nn.Conv2d if isinstance(m, nn.Conv2d)
                                                   else nn.Linear for m in layers]
    assert len(layers) == (BLOCKS + 2 if net == "mlp" else 7)
    return rule, bio, layers


def our_layers(rule: CreditRule) -> list[nn.Module]:
    """The Linear and Conv2d layers of creditaudit's model, in order."""
    return [m for m in rule.model.modules() if isinstance(m, WEIGHT_LAYERS)]


def twins(rule: CreditRule, layers: list[nn.Module]) -> list[nn.Module]:
    """BioTorch's layer for each layer with a feedback matrix (``rule.layers``; the CNN's
    first convolution reads the data and has none)."""
    names = [name for name, m in rule.model.named_modules() if isinstance(m, WEIGHT_LAYERS)]
    by_name = dict(zip(names, layers, strict=True))
    return [by_name[name] for name, _ in rule.layers]


def bio_step(bio: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if bio.mode == "dfa":
            out = bio(x, targets=y, loss_function=F.cross_entropy)
        else:
            out = bio(x)
        F.cross_entropy(out, y).backward()
    optimizer.step()


def assert_same_parameters(rule: CreditRule, layers: list[nn.Module], step: int) -> None:
    for index, (ours, theirs) in enumerate(zip(our_layers(rule), layers, strict=True)):
        for name in ("weight", "bias"):
            a, b = getattr(ours, name).detach(), getattr(theirs, name).detach()
            scale = float(b.abs().max())
            error = float((a - b).abs().max()) / scale
            assert error < TOLERANCE, (f"step {step}: {type(ours).__name__} {index} {name} "
                                       f"differs from BioTorch by {error:.1e} (rel.)")


def run_both(rule: CreditRule, bio: nn.Module, layers: list[nn.Module],
             before_ours: callable = lambda: None, net: str = "mlp") -> list[float]:
    """STEPS SGD steps on each side; parameters compared after every step. Returns the
    smallest update of a hidden layer per step (so a test can check that every layer the
    feedback reaches did learn)."""
    ours_opt = torch.optim.SGD(rule.trainable_parameters(), lr=LR)
    bio_opt = torch.optim.SGD([p for p in bio.parameters() if p.requires_grad], lr=LR)
    sizes = []
    for step in range(STEPS):
        x, y = batch(step, net)
        start = [m.weight.detach().clone() for m in our_layers(rule)]
        bio_step(bio, bio_opt, x, y)
        before_ours()
        assert rule.train_step(x, y, ours_opt).finite
        assert_same_parameters(rule, layers, step)
        sizes.append(min(float((m.weight.detach() - w).abs().max())
                         for m, w in zip(our_layers(rule)[1:-1], start[1:-1])))
    return sizes


NETS = ["mlp", "cnn"]


@pytest.mark.parametrize("net", NETS)
def test_fa_linear_matches_biotorch_fa(net):
    rule, bio, layers = pair("fa-linear", "fa", net)
    for b, layer in zip(rule.feedback, twins(rule, layers), strict=True):
        layer.weight_backward.data.copy_(b)
    assert min(run_both(rule, bio, layers, net=net)) > 1e-5  # every hidden layer did learn


@pytest.mark.parametrize("net", NETS)
def test_usf_matches_biotorch_usf(net):
    rule, bio, layers = pair("usf", "usf", net)
    for s, layer in zip(rule.magnitudes(), twins(rule, layers), strict=True):
        layer.scaling_factor = s  # BioTorch's B = scaling_factor · sign(W)
    assert min(run_both(rule, bio, layers, net=net)) > 1e-5


@pytest.mark.parametrize("net", NETS)
def test_frsf_matches_biotorch_frsf(net):
    rule, bio, layers = pair("frsf", "frsf", net)
    for m, layer in zip(rule.feedback, twins(rule, layers), strict=True):
        layer.weight_backward.data.copy_(m)  # BioTorch's B = |weight_backward| ∘ sign(W)
    assert min(run_both(rule, bio, layers, net=net)) > 1e-5


@pytest.mark.parametrize("net", NETS)
def test_brsf_matches_biotorch_brsf_with_the_same_draws(net):
    rule, bio, layers = pair("brsf", "brsf", net)
    fed_back = twins(rule, layers)

    def take_biotorch_draw() -> None:
        # BioTorch drew |M_t| from the global RNG in its forward and kept |M_t| ∘ sign(W);
        # creditaudit's next step uses the same magnitudes instead of its own draw.
        drawn = [layer.weight_backward.detach().abs().clone() for layer in fed_back]
        rule.draw_magnitudes = lambda: drawn

    assert min(run_both(rule, bio, layers, take_biotorch_draw, net)) > 1e-5


def test_the_cnn_comparison_can_fail():
    """With other feedback kernels than BioTorch's (its own random draw), the updates of the
    layers below the first feedback layer differ: the test sees the convolutions' B."""
    rule, bio, layers = pair("fa-linear", "fa", "cnn")
    with pytest.raises(AssertionError, match="Conv2d .* differs from BioTorch"):
        run_both(rule, bio, layers, net="cnn")


def test_dfa_without_normalisation_matches_biotorch_dfa():
    rule, bio, linears = pair("dfa", "dfa", normalise_credit=False)
    # DFA's B_l for state l is the feedback of the Linear that reads h_l (BioTorch replaces
    # that layer's input gradient with e·B); the first Linear reads x and needs none.
    assert len(rule.feedback) == len(linears) - 1
    for b, layer in zip(rule.feedback, linears[1:], strict=True):
        layer.weight_backward.data.copy_(b)
    assert min(run_both(rule, bio, linears)) > 1e-4


def test_normalised_dfa_differs_from_biotorch():
    """The comparison can fail: the default (RMS-normalised) DFA is another update."""
    rule, bio, linears = pair("dfa", "dfa")
    for b, layer in zip(rule.feedback, linears[1:], strict=True):
        layer.weight_backward.data.copy_(b)
    with pytest.raises(AssertionError, match="differs from BioTorch"):
        run_both(rule, bio, linears)
