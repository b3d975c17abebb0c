"""Cosine alignment between credits and BP gradients, without an eps clamp."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from creditaudit.deep_layers import deep_mean
from creditaudit.descriptions import BELOW_FLOOR, CREDIT_NOT_FINITE, GRADIENT_NOT_FINITE
from creditaudit.measures.gradients import median_norms


def unit_rows(t: Tensor) -> Tensor:
    """Each sample's vector scaled to unit length, in float64: ``(N, …)`` → ``(N, D)``.

    Float64 inputs are divided by their rows' max-abs entry first, so squares of 1e-200
    entries cannot underflow (a float32 or bf16 entry squared in float64 never does); an
    exactly zero row has no direction and becomes NaN.
    """
    scale = t.dtype == torch.float64
    t64 = t.double().flatten(1)
    if scale:
        tiny = torch.finfo(torch.float64).tiny
        t64 = t64 / t64.abs().amax(dim=1, keepdim=True).clamp_min(tiny)
    norm = torch.linalg.vector_norm(t64, dim=1, keepdim=True)
    return torch.where(norm > 0, t64 / norm, torch.full_like(t64, float("nan")))


def cosine_per_sample(a: Tensor, g: Tensor) -> Tensor:
    """cos(a_i, g_i) per sample in float64: ``(N, d)``, ``(N, d)`` → ``(N,)``.

    No eps clamp (``F.cosine_similarity`` clamps the norms at 1e-8, which makes the cosine
    of 1e-10-scale gradients ~100× too small). Samples where either vector is exactly zero
    have no direction: they are NaN.
    """
    return (unit_rows(a) * unit_rows(g)).sum(dim=1)


def _mean_defined(cos: Tensor) -> float:
    valid = cos[~torch.isnan(cos)]
    return float(valid.mean()) if valid.numel() else float("nan")


def mean_cosine(a: Tensor, g: Tensor) -> float:
    """Mean over samples with a defined cosine; NaN when no sample has one."""
    return _mean_defined(cosine_per_sample(a, g))


def layer_cosines(credits: list[Tensor], grads: list[Tensor]) -> list[float]:
    """Per-layer mean cosine cos(a_l, g_l), l = 0 … L."""
    return layer_cosine_coverage(credits, grads)[0]


def layer_cosine_coverage(credits: list[Tensor], grads: list[Tensor]
                          ) -> tuple[list[float], list[float]]:
    """Per layer l = 0 … L: the mean cosine cos(a_l, g_l) and the fraction of samples it
    averages over (a sample whose credit or gradient is exactly zero has no direction and
    is left out, so below 1 the cosine describes only the rest)."""
    means, defined = [], []
    for a, g in zip(credits, grads):
        per_sample = cosine_per_sample(a, g)
        means.append(_mean_defined(per_sample))
        defined.append(float((~torch.isnan(per_sample)).double().mean()))
    return means, defined


def cosine_invalid(credits: list[Tensor], grads: list[Tensor], grad_norms: list[float],
                   floor: float) -> list[str | None]:
    """Per layer l = 0 … L: why cos(a_l, g_l) is not a valid measurement, None where it is.

    ``credits[l]``/``grads[l]`` are ``(N, d_l)`` per-sample vectors, ``grad_norms[l]`` the
    median ‖g_l‖ (1/128 scale). A NaN/Inf entry in any sample's gradient
    (:data:`~creditaudit.descriptions.GRADIENT_NOT_FINITE`) or credit
    (:data:`~creditaudit.descriptions.CREDIT_NOT_FINITE`) leaves that sample without a
    direction: unlike an exactly-zero vector, that is a fault, not a property of the
    sample, so the layer's cosine is not valid; else a median ‖g_l‖ below ``floor``
    (:data:`~creditaudit.descriptions.BELOW_FLOOR`)."""
    out: list[str | None] = []
    for a, g, norm in zip(credits, grads, grad_norms):
        if not bool(torch.isfinite(g).all()):
            out.append(GRADIENT_NOT_FINITE)
        elif not bool(torch.isfinite(a).all()):
            out.append(CREDIT_NOT_FINITE)
        else:
            out.append(None if norm >= floor else BELOW_FLOOR)
    return out


class ReferenceDirections:
    """The reference gradients' unit rows, normalised once, for scoring many credits (the
    fresh-feedback null's draws) against them: ``cosines(credits)`` equals
    ``layer_cosines(credits, grads)``."""

    def __init__(self, grads: list[Tensor]) -> None:
        self.units = [unit_rows(g) for g in grads]

    def cosines(self, credits: list[Tensor]) -> list[float]:
        return [_mean_defined((unit_rows(a) * u).sum(dim=1))
                for a, u in zip(credits, self.units)]


def _nanmean(values: Tensor, dim: int) -> Tensor:
    """Mean over ``dim`` ignoring NaN entries (NaN where every entry is NaN)."""
    valid = ~torch.isnan(values)
    total = torch.where(valid, values, torch.zeros_like(values)).sum(dim=dim)
    count = valid.sum(dim=dim)
    return torch.where(count > 0, total / count.clamp_min(1),
                       torch.full_like(total, float("nan")))


def _finite_mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else float("nan")


def gamma_aggregations(credits: list[Tensor], grads: list[Tensor]) -> dict[str, float]:
    """The aggregate alignment Γ under four aggregations, side by side (science.md §6).

    ``credits[l]`` and ``grads[l]`` are ``(N, d_l)`` per-sample vectors (any scale: cosines
    are scale-free). With c_il = cos(a_il, g_il) (NaN where either vector is exactly 0):

    - ``layers_then_samples``: per sample, mean of c_il over its defined layers; then mean
      over samples.
    - ``samples_then_layers``: per layer, mean of c_il over samples (the per-layer cosine);
      then mean over layers.
    - ``pooled``: per sample, one cosine between the concatenations [a_i0; a_i1; …; a_iL] and
      [g_i0; …; g_iL] of the raw (un-normalised) vectors, then mean over samples. Layers with
      large vectors dominate it, exactly as in a cosine of flattened whole-network gradients.
    - ``deep_only``: ``samples_then_layers`` over layers l ≥ 1 (drops the embedding state).

    NaN entries (undefined cosines) are skipped at every mean.
    """
    per_sample = torch.stack([cosine_per_sample(a, g) for a, g in zip(credits, grads)], dim=1)
    by_layer = layer_cosines(credits, grads)
    pooled = cosine_per_sample(torch.cat([a.flatten(1) for a in credits], dim=1),
                               torch.cat([g.flatten(1) for g in grads], dim=1))
    return {
        "layers_then_samples": float(_nanmean(_nanmean(per_sample, dim=1), dim=0)),
        "samples_then_layers": _finite_mean(by_layer),
        "pooled": float(_nanmean(pooled, dim=0)),
        "deep_only": deep_mean(by_layer),
    }


def layer_cosine_table(credits: list[Tensor], grads: list[Tensor], floor: float
                       ) -> list[dict[str, float | int | bool]]:
    """Per-layer cosine with its reference gradient's validity (science.md §6).

    ``grads[l]`` are ``(N, d)`` per-sample gradients in the 1/128 scale convention.
    ``g_norm`` is the median per-sample ‖g_l‖; a layer whose ``g_norm`` is below ``floor``
    keeps its cosine but is marked ``valid_reference: False`` — the number is then measured
    against a gradient at the numerical floor and means nothing. ``defined`` is the fraction
    of the N samples the cosine averages over: a sample whose credit (or gradient) is exactly
    zero has no direction and is left out, so below 1 the cosine describes only the rest.
    ``cos_invalid``: why the cosine is not valid, None where it is (:func:`cosine_invalid`:
    a NaN/Inf credit or gradient, or the reference below the floor).
    """
    means, defined = layer_cosine_coverage(credits, grads)
    norms = median_norms(grads)
    invalid = cosine_invalid(credits, grads, norms, floor)
    return [{"layer": layer, "cos": cos, "g_norm": g_norm,
             "valid_reference": bool(g_norm >= floor), "defined": share, "cos_invalid": why}
            for layer, (cos, g_norm, share, why) in enumerate(zip(means, norms, defined,
                                                                  invalid))]
