"""The fused LayerNorm → Linear of detached block inputs against plain autograd (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit.models.fused import (
    _DetachedLayerNormLinear,
    fusable,
    layer_norm_linear,
    plain_autograd,
)

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def modules(d_in: int = 12, d_out: int = 20, *, seed: int = 0, dtype=F64, bias: bool = True
            ) -> tuple[nn.LayerNorm, nn.Linear]:
    """A LayerNorm with γ, β far from (1, 0) (so a wrong ∂γ or ∂β formula shows) and a
    rectangular Linear (so a transposed W shows)."""
    torch.manual_seed(seed)
    ln, linear = nn.LayerNorm(d_in).to(dtype), nn.Linear(d_in, d_out, bias=bias).to(dtype)
    with torch.no_grad():
        ln.weight.normal_(1.0, 0.7)
        ln.bias.normal_(0.0, 0.7)
    return ln, linear


def inputs(*shape: int, seed: int = 1, dtype=F64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype) * 3.0 + 0.5


def params(ln: nn.LayerNorm, linear: nn.Linear) -> list[nn.Parameter]:
    return [*ln.parameters(), *linear.parameters()]


@pytest.mark.parametrize("shape", [(9, 12), (3, 5, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_gradients_equal_autograd(shape, bias):
    """∂W, ∂b, ∂γ, ∂β from the single product M = Gᵀn̂ equal plain autograd's."""
    ln, linear = modules(bias=bias)
    h = inputs(*shape)
    plain, fused = linear(ln(h)), layer_norm_linear(h, ln, linear)
    assert type(fused.grad_fn).__name__ == "_DetachedLayerNormLinearBackward"
    assert torch.equal(fused, plain)  # same forward kernels
    upstream = inputs(*plain.shape, seed=2)
    want = torch.autograd.grad(plain, params(ln, linear), upstream)
    got = torch.autograd.grad(fused, params(ln, linear), upstream)
    for w, g in zip(want, got, strict=True):
        assert w.abs().max() > 1e-2
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12 * float(w.abs().max()))


def test_gradcheck_against_finite_differences():
    ln, linear = modules(5, 4)
    h = inputs(6, 5)
    args = [p.detach().clone().requires_grad_(True) for p in params(ln, linear)]
    assert torch.autograd.gradcheck(
        lambda *p: _DetachedLayerNormLinear.apply(h, *p, ln.eps), args)


def test_partly_frozen_parameters_get_no_gradient():
    ln, linear = modules()
    ln.requires_grad_(False)
    h = inputs(7, 12)
    out = layer_norm_linear(h, ln, linear)
    out.pow(2).sum().backward()
    assert ln.weight.grad is None and ln.bias.grad is None
    ref_ln, ref_linear = modules()
    ref_ln.requires_grad_(False)
    ref_linear(ref_ln(h)).pow(2).sum().backward()
    torch.testing.assert_close(linear.weight.grad, ref_linear.weight.grad, rtol=0, atol=1e-12)


def test_input_that_needs_a_gradient_takes_the_plain_path():
    """BP needs ∂h: then nothing is fused and ∂h is autograd's."""
    ln, linear = modules()
    h = inputs(7, 12).requires_grad_(True)
    out = layer_norm_linear(h, ln, linear)
    assert type(out.grad_fn).__name__ == "AddmmBackward0"
    (grad_h,) = torch.autograd.grad(out.sum(), h)
    assert grad_h.abs().max() > 0
    with torch.no_grad():
        assert layer_norm_linear(h, ln, linear).grad_fn is None
    frozen_ln, frozen_linear = modules()
    frozen_ln.requires_grad_(False)
    frozen_linear.requires_grad_(False)
    assert layer_norm_linear(inputs(7, 12), frozen_ln, frozen_linear).grad_fn is None


def test_plain_autograd_switches_fusion_off_for_a_block_of_code():
    ln, linear = modules()
    h = inputs(7, 12)
    with plain_autograd():
        assert type(layer_norm_linear(h, ln, linear).grad_fn).__name__ == "AddmmBackward0"
    name = type(layer_norm_linear(h, ln, linear).grad_fn).__name__
    assert name == "_DetachedLayerNormLinearBackward"


def test_only_affine_last_axis_layer_norms_are_fused():
    assert fusable(nn.LayerNorm(4), nn.Linear(4, 3))
    assert not fusable(nn.LayerNorm(4, elementwise_affine=False), nn.Linear(4, 3))
    assert not fusable(nn.LayerNorm(4, bias=False), nn.Linear(4, 3))
    assert not fusable(nn.LayerNorm((2, 4)), nn.Linear(4, 3))
    ln = nn.LayerNorm(4, elementwise_affine=False).double()
    linear = nn.Linear(4, 3).double()
    h = inputs(5, 4)
    assert torch.equal(layer_norm_linear(h, ln, linear), linear(ln(h)))


def test_second_derivative_is_refused():
    ln, linear = modules()
    out = layer_norm_linear(inputs(4, 12), ln, linear)
    (grad_w,) = torch.autograd.grad(out.pow(2).sum(), linear.weight, create_graph=True)
    with pytest.raises(RuntimeError):
        grad_w.sum().backward()


def test_bf16_autocast_matches_plain_autocast():
    """Under CPU bf16 autocast: same output dtype and values, fp32 gradients close to plain."""
    ln, linear = modules(64, 48, dtype=torch.float32)
    h = inputs(16, 64, dtype=torch.float32).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, fused = linear(ln(h)), layer_norm_linear(h, ln, linear)
    assert fused.dtype == plain.dtype == torch.bfloat16
    torch.testing.assert_close(fused, plain)
    upstream = inputs(*plain.shape, seed=2, dtype=torch.float32).bfloat16()
    want = torch.autograd.grad(plain, params(ln, linear), upstream)
    got = torch.autograd.grad(fused, params(ln, linear), upstream)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == torch.float32 and torch.isfinite(g).all()
        # bf16 keeps ~3 significant digits; the fused sums differ in order only
        assert float((g - w).norm() / w.norm()) < 2e-2
