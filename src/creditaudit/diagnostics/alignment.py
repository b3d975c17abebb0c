"""Cosine alignment between credits and BP gradients, without an eps clamp."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def cosine_per_sample(a: Tensor, g: Tensor) -> Tensor:
    """cos(a_i, g_i) per sample in float64: ``(N, d)``, ``(N, d)`` → ``(N,)``.

    No eps clamp (``F.cosine_similarity`` clamps the norms at 1e-8, which makes the cosine
    of 1e-10-scale gradients ~100× too small). Samples where either vector is exactly zero
    have no direction: they are NaN.
    """
    a64, g64 = a.double().flatten(1), g.double().flatten(1)
    # Scale each vector by its max-abs entry first so squares cannot underflow.
    a64 = a64 / a64.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    g64 = g64 / g64.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    denom = a64.norm(dim=1) * g64.norm(dim=1)
    cos = (a64 * g64).sum(dim=1) / denom
    return torch.where(denom > 0, cos, torch.full_like(cos, float("nan")))


def mean_cosine(a: Tensor, g: Tensor) -> float:
    """Mean over samples with a defined cosine; NaN when no sample has one."""
    cos = cosine_per_sample(a, g)
    valid = cos[~torch.isnan(cos)]
    return float(valid.mean()) if valid.numel() else float("nan")


def layer_cosines(credits: list[Tensor], grads: list[Tensor]) -> list[float]:
    """Per-layer mean cosine cos(a_l, g_l), l = 0 … L."""
    return [mean_cosine(a, g) for a, g in zip(credits, grads)]


def deep_mean(values: list[float]) -> float:
    """Mean over layers l ≥ 1 (the deep layers), ignoring undefined (NaN) layers."""
    deep = [v for v in values[1:] if not math.isnan(v)]
    return sum(deep) / len(deep) if deep else float("nan")
