"""DFA-family steps through projected outputs (methods/projected.py).

A rank-C credit lets a module whose output is a Linear's take its update from
p = y·Bᵀ; the updates must equal the written-out surrogate's (float64, ~1e-12) on every
route: projected, dense (blocks that do not split), mixed, frozen, with and without the
branch penalty. The reference is tests/test_local_steps.py's scalar surrogate, whose ViT
test covers the transformer blocks' projected MLP output behind their attention skip.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor, nn

from creditaudit.methods.projected import credit_scales, dense_route, projected_forward
from creditaudit.methods.surrogate import rms_normalise
from creditaudit.models import PlainMLP, ViTMini
from creditaudit.models.contract import ResidualNet, split_branch
from test_local_steps import (
    F64,
    C,
    assert_grads_equal,
    batch,
    mlp,
    reference_grads,
    rule_for,
    step_grads,
    tiny_vit,
)

pytestmark = pytest.mark.usefixtures("single_thread")


class Opaque(nn.Module):
    """The same block without the output_layer/hidden split: trained densely."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, h: Tensor) -> Tensor:
        return self.inner(h)


def test_routes_follow_the_contract():
    model = mlp(n_blocks=3)
    assert all(split_branch(b)[1] is b.w2 for b in model.blocks)
    rule = rule_for(model, "dfa")
    x, _ = batch()
    assert projected_forward(model, x, rule.feedback, keep_branches=False).projected == [
        True] * 4
    model.blocks[1] = Opaque(model.blocks[1])
    assert projected_forward(model, x, rule.feedback, keep_branches=False).projected == [
        True, True, False, True]
    plain = PlainMLP(6, 10, 4, 2).double()
    plain_rule = rule_for(plain, "dfa")
    local = projected_forward(plain, x, plain_rule.feedback, keep_branches=False)
    assert local.projected == [False] * 3
    vit = tiny_vit()
    vit_rule = rule_for(vit, "dfa")
    xv, _ = batch(n=2, shape=(3, 32, 32))
    local = projected_forward(vit, xv, vit_rule.feedback, keep_branches=True)
    # the patch embedding is not a Linear; each transformer block's MLP output layer is,
    # behind the attention output as an inner skip (which takes the dense credit)
    assert local.projected == [False, True, True]
    assert [s is None for s in local.skips] == [True, False, False]
    assert all(p.shape == (2, 65, C) for p in local.outputs[1:])


@pytest.mark.parametrize("name", ["dfa", "drtp"])
@pytest.mark.parametrize("penalty", [0.0, 0.3])
def test_mixed_projected_and_dense_modules(name, penalty):
    model = mlp(n_blocks=4)
    model.blocks[2] = Opaque(model.blocks[2])
    rule = rule_for(model, name, penalty=penalty, trainable_blocks=3)  # block 0 frozen
    x, y = batch()
    want = reference_grads(model, rule.credits(x, y), x, y, penalty)
    got = step_grads(rule, x, y)
    assert_grads_equal(got, want)
    assert got["blocks.0.w2.weight"] is None
    assert float(got["blocks.2.inner.w2.weight"].abs().max()) > 1e-4


class PreActivationMLP(ResidualNet):
    """embed Linear; blocks ReLU → Linear (an nn.Sequential ending in a Linear); head."""

    residual = False

    def __init__(self) -> None:
        super().__init__()
        self.d, self.n_classes = 10, C
        self.embed = nn.Linear(6, 10)
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(10, 10))
                                    for _ in range(3))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(10, C))

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)


@pytest.mark.parametrize("penalty", [0.0, 0.3])
def test_sequential_blocks_ending_in_a_linear_are_projected(penalty):
    torch.manual_seed(0)
    model = PreActivationMLP().double()
    rule = rule_for(model, "dfa", penalty=penalty)
    x, y = batch()
    assert projected_forward(model, x, rule.feedback, keep_branches=False).projected == [
        True] * 4
    assert_grads_equal(step_grads(rule, x, y),
                       reference_grads(model, rule.credits(x, y), x, y, penalty))


def test_plain_mlp_trains_densely_as_before():
    model = PlainMLP(6, 10, 4, 3).double()
    rule = rule_for(model, "dfa")
    x, y = batch()
    assert_grads_equal(step_grads(rule, x, y),
                       reference_grads(model, rule.credits(x, y), x, y, 0.0))


def test_credit_scales_are_the_surrogates_normalisation():
    """c_l·(s·B_l) equals â_l/B = rms_normalise(s·B_l)/B, a zero signal stays zero."""
    gen = torch.Generator().manual_seed(3)
    feedback = [torch.randn(4, 10, generator=gen) for _ in range(3)]
    signal = torch.randn(5, 4, generator=gen, dtype=F64)
    signal[2] = 0.0
    scales = credit_scales(signal, feedback, 5, normalise=True)
    assert scales.shape == (3, 5)
    for scale, b in zip(scales, feedback):
        credit = signal @ b.to(F64)
        torch.testing.assert_close(scale.unsqueeze(1) * credit, rms_normalise(credit) / 5,
                                   rtol=1e-13, atol=0)
    raw = credit_scales(signal, feedback, 5, normalise=False)
    assert torch.equal(raw, torch.full((3, 5), 0.2, dtype=F64))


def test_vit_step_under_bf16_autocast():
    """The projected MLP outputs and the dense attention skips under bf16 autocast: finite
    fp32 updates pointing where fp32's do."""
    x, y = batch(n=8, shape=(3, 32, 32), dtype=torch.float32)
    grads = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = ViTMini(n_classes=C, d=16, n_blocks=2, heads=2, mlp_ratio=2, w2_std=0.1)
        rule = rule_for(model, "dfa", penalty=0.1)
        rule.set_precision(precision, "cpu")
        grads[precision] = step_grads(rule, x, y)
    for key, g in grads["bf16"].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), key
        cos = torch.nn.functional.cosine_similarity(g.flatten(), grads["fp32"][key].flatten(),
                                                    dim=0)
        assert float(cos) > 0.95, key


@pytest.mark.parametrize("arch", ["mlp", "vit"])
@pytest.mark.parametrize("penalty", [0.0, 0.2])
def test_dense_route_gives_the_same_updates(arch, penalty):
    """dense_route() (the benchmarks' "before") and the projected route agree to rounding."""
    x, y = batch() if arch == "mlp" else batch(n=3, shape=(3, 32, 32))
    grads = []
    for dense in (False, True):
        model = mlp() if arch == "mlp" else tiny_vit()
        rule = rule_for(model, "dfa", penalty=penalty)
        with dense_route() if dense else contextlib.nullcontext():
            local = projected_forward(model, x, rule.feedback, keep_branches=False)
            assert any(local.projected) != dense
            grads.append(step_grads(rule, x, y))
    assert_grads_equal(grads[0], grads[1], tol=1e-11)
