"""BioTorch (0.0.16) as an outside oracle: on the same plain MLP with the same feedback
matrices, creditaudit's fa-linear, usf, brsf, frsf and dfa take the same parameter updates
as BioTorch's fa, usf, brsf, frsf and dfa, to float64 round-off.

BioTorch is installed with ``pip install --no-deps biotorch==0.0.16`` (README, .ci/run). In
CI (``CI`` set) a missing BioTorch fails the test instead of skipping it.
"""

from __future__ import annotations

import contextlib
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
from creditaudit.models import PlainMLP

if os.environ.get("CI"):
    import biotorch.module.biomodule as biomodule  # CI must run these tests, never skip them
else:
    biomodule = pytest.importorskip("biotorch.module.biomodule")

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
IN_DIM, WIDTH, BLOCKS, CLASSES, BATCH = 7, 9, 3, 5, 11
STEPS, LR = 3, 0.1
TOLERANCE = 1e-12


def batch(seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(100 + seed)
    return (torch.randn(BATCH, IN_DIM, generator=gen, dtype=F64),
            torch.randint(0, CLASSES, (BATCH,), generator=gen))


def pair(method: str, mode: str, **options) -> tuple[CreditRule, nn.Module, list[nn.Linear]]:
    """creditaudit's rule on a float64 PlainMLP and BioTorch's conversion of the same layers
    (same weights, float64); BioTorch's Linear layers in order."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = PlainMLP(IN_DIM, WIDTH, CLASSES, BLOCKS).to(F64)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
            bio = biomodule.BioModule(model.as_sequential(), mode=mode,
                                      output_dim=CLASSES if mode == "dfa" else None)
    bio.to(F64)
    rule = build_rule(model, MethodConfig(name=method, **options), n_classes=CLASSES, seed=3)
    linears = [m for m in bio.module if isinstance(m, nn.Linear)]
    assert len(linears) == len(our_linears(rule)) == BLOCKS + 2
    return rule, bio, linears


def our_linears(rule: CreditRule) -> list[nn.Linear]:
    return [m for m in rule.model.modules() if isinstance(m, nn.Linear)]


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


def assert_same_parameters(rule: CreditRule, linears: list[nn.Linear], step: int) -> None:
    for index, (ours, theirs) in enumerate(zip(our_linears(rule), linears, strict=True)):
        for name in ("weight", "bias"):
            a, b = getattr(ours, name).detach(), getattr(theirs, name).detach()
            scale = float(b.abs().max())
            error = float((a - b).abs().max()) / scale
            assert error < TOLERANCE, \
                f"step {step}: Linear {index} {name} differs from BioTorch by {error:.1e} (rel.)"


def run_both(rule: CreditRule, bio: nn.Module, linears: list[nn.Linear],
             before_ours: callable = lambda: None) -> list[float]:
    """STEPS SGD steps on each side; parameters compared after every step. Returns the
    largest update per step (so a test can check the updates were not trivially zero)."""
    ours_opt = torch.optim.SGD(rule.trainable_parameters(), lr=LR)
    bio_opt = torch.optim.SGD([p for p in bio.parameters() if p.requires_grad], lr=LR)
    sizes = []
    for step in range(STEPS):
        x, y = batch(step)
        start = [m.weight.detach().clone() for m in our_linears(rule)]
        bio_step(bio, bio_opt, x, y)
        before_ours()
        assert rule.train_step(x, y, ours_opt).finite
        assert_same_parameters(rule, linears, step)
        sizes.append(max(float((m.weight.detach() - w).abs().max())
                         for m, w in zip(our_linears(rule)[1:-1], start[1:-1])))
    return sizes


def test_fa_linear_matches_biotorch_fa():
    rule, bio, linears = pair("fa-linear", "fa")
    for b, layer in zip(rule.feedback, linears, strict=True):
        layer.weight_backward.data.copy_(b)
    assert min(run_both(rule, bio, linears)) > 1e-4  # hidden layers did learn


def test_usf_matches_biotorch_usf():
    rule, bio, linears = pair("usf", "usf")
    for s, layer in zip(rule.magnitudes(), linears, strict=True):
        layer.scaling_factor = s  # BioTorch's B = scaling_factor · sign(W)
    assert min(run_both(rule, bio, linears)) > 1e-4


def test_frsf_matches_biotorch_frsf():
    rule, bio, linears = pair("frsf", "frsf")
    for m, layer in zip(rule.feedback, linears, strict=True):
        layer.weight_backward.data.copy_(m)  # BioTorch's B = |weight_backward| ∘ sign(W)
    assert min(run_both(rule, bio, linears)) > 1e-4


def test_brsf_matches_biotorch_brsf_with_the_same_draws():
    rule, bio, linears = pair("brsf", "brsf")

    def take_biotorch_draw() -> None:
        # BioTorch drew |M_t| from the global RNG in its forward and kept |M_t| ∘ sign(W);
        # creditaudit's next step uses the same magnitudes instead of its own draw.
        drawn = [layer.weight_backward.detach().abs().clone() for layer in linears]
        rule.draw_magnitudes = lambda: drawn

    assert min(run_both(rule, bio, linears, take_biotorch_draw)) > 1e-4


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
