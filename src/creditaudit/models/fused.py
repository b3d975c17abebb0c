"""LayerNorm → Linear on a detached input, with parameter gradients from one product.

Local credit rules feed every block a detached state h, so nobody needs ∂/∂h. Autograd
still computes the first Linear's input-gradient product G·W (B×d_out by d_out×d_in),
because the LayerNorm's trainable γ and β sit behind it. With n̂ the normalised input
(LN(h) = n̂·γ + β) and G = ∂loss/∂z at the Linear's output z = LN(h)·Wᵀ + b, a single
product M = Gᵀn̂ (d_out × d_in) gives all four parameter gradients:

    ∂W = Gᵀ(n̂·γ + β) = M·diag(γ) + (Gᵀ1)βᵀ        ∂b = Gᵀ1
    ∂γ_j = Σ_b (G·W)_bj n̂_bj = Σ_k W_kj M_kj        ∂β = Wᵀ(Gᵀ1)

so the step skips G·W entirely (one of the block's four backward matmuls). The forward
values are those of ``linear(ln(h))``; :func:`layer_norm_linear` falls back to exactly that
whenever the input gradient could be needed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn import functional as F


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` (no dispatch at all when it already is: this runs per block)."""
    return t if t.dtype == dtype else t.to(dtype)


class _DetachedLayerNormLinear(torch.autograd.Function):
    """z = LN(h; γ, β, eps)·Wᵀ + b for an h that needs no gradient (no ∂h is returned)."""

    @staticmethod
    def forward(ctx: FunctionCtx, h: Tensor, gamma: Tensor, beta: Tensor, weight: Tensor,
                bias: Tensor | None, eps: float) -> Tensor:
        width = h.shape[-1]
        # LayerNorm in at least the parameters' precision, as autocast runs it; the Linear
        # then autocasts (bf16 under autocast) exactly as ``linear(ln(h))`` would.
        rows = _as(h.reshape(-1, width), torch.promote_types(h.dtype, gamma.dtype))
        normed, mean, rstd = torch.native_layer_norm(rows, (width,), gamma, beta, eps)
        z = F.linear(normed, weight, bias)
        ctx.save_for_backward(rows, mean, rstd, gamma, beta, weight)
        ctx.has_bias = bias is not None
        return z.view(*h.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_z: Tensor
                 ) -> tuple[None, Tensor | None, Tensor | None, Tensor | None, Tensor | None,
                            None]:
        rows, mean, rstd, gamma, beta, weight = ctx.saved_tensors
        g = grad_z.reshape(-1, weight.shape[0])
        n_hat = (rows - mean) * rstd  # (N, d_in): the normalised input, recomputed
        # M in the forward matmul's dtype (bf16 under autocast), then the parameters' dtype.
        m = _as(g.t().mm(_as(n_hat, g.dtype)), weight.dtype)  # (d_out, d_in)
        s = _as(g, weight.dtype).sum(dim=0)  # Gᵀ1, (d_out,)
        need = ctx.needs_input_grad
        d_gamma = torch.linalg.vecdot(weight, m, dim=0) if need[1] else None
        d_beta = s @ weight if need[2] else None
        # in place: d×d elementwise passes cost a third of the product they replace
        d_weight = m.mul_(gamma).addr_(s, beta) if need[3] else None
        d_bias = s if need[4] and ctx.has_bias else None
        return None, d_gamma, d_beta, d_weight, d_bias, None


_fusion_enabled = True


@contextlib.contextmanager
def plain_autograd() -> Iterator[None]:
    """Within the block, :func:`layer_norm_linear` is always plain ``linear(ln(h))``.

    The choice is made at forward time, so a graph built inside keeps plain autograd for
    its backward. For references in tests and the "before" timings of benchmarks.
    """
    global _fusion_enabled
    previous, _fusion_enabled = _fusion_enabled, False
    try:
        yield
    finally:
        _fusion_enabled = previous


def fusable(ln: nn.Module, linear: nn.Module) -> bool:
    """Whether ``ln`` is a last-axis LayerNorm with γ and β and ``linear`` an ``nn.Linear``."""
    return (isinstance(ln, nn.LayerNorm) and isinstance(linear, nn.Linear)
            and len(ln.normalized_shape) == 1 and ln.weight is not None
            and ln.bias is not None)


def _needs_grad(ln: nn.LayerNorm, linear: nn.Linear) -> bool:
    """Whether any of γ, β, W, b is trained (attribute reads: this runs per block and step,
    where iterating ``parameters()`` cost more than the LayerNorm itself on small models)."""
    return (ln.weight.requires_grad or ln.bias.requires_grad or linear.weight.requires_grad
            or (linear.bias is not None and linear.bias.requires_grad))


def layer_norm_linear(h: Tensor, ln: nn.LayerNorm, linear: nn.Linear) -> Tensor:
    """``linear(ln(h))`` for (…, d) inputs; when h needs no gradient (a local rule's detached
    block input) the backward skips the input-gradient product G·W (module docstring).

    Forward values are the same either way; the parameter gradients agree with autograd's
    to rounding (the products are summed in a different order).
    """
    if (not _fusion_enabled or h.requires_grad or not torch.is_grad_enabled()
            or not fusable(ln, linear) or not _needs_grad(ln, linear)):
        return linear(ln(h))
    return _DetachedLayerNormLinear.apply(h, ln.weight, ln.bias, linear.weight, linear.bias,
                                          ln.eps)
