"""Exact per-sample states and state gradients in one backward pass.

Scale convention (science.md §2): per-sample gradients are reported as (1/128)·∂CE_i/∂h_l, the
gradient of a batch-mean CE over a batch of 128, whatever the evaluation batch size. With a
sum-reduced loss one backward pass gives every sample's gradient exactly, because no op in
a contract model mixes samples (LayerNorm and attention act within a sample).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.models.contract import summary_vectors

REFERENCE_BATCH = 128
# A reference gradient below this (10× the 1e-8 eps of F.cosine_similarity) is numerical
# noise: cosines against it mean nothing (protocol diagnostic (b) fires below it).
REFERENCE_FLOOR = 1e-7
StatesFn = Callable[[Tensor], tuple[list[Tensor], Tensor]]


@dataclass
class StateGradients:
    """Per-sample summaries of states and their BP gradients on an evaluation set.

    ``states[l]`` and ``grads[l]`` are ``(N, d)`` (CLS token / pooled for other layouts);
    ``grads`` follow the 1/128 scale convention; ``losses`` is the per-sample CE ``(N,)``;
    ``logits`` is ``(N, C)``; ``labels`` the class indices ``(N,)`` the losses were taken
    against, in the samples' order (None when the maker did not give them).
    """

    states: list[Tensor]
    grads: list[Tensor]
    logits: Tensor
    losses: Tensor
    layout: str = "vectors"
    labels: Tensor | None = None

    @property
    def n_layers(self) -> int:
        return len(self.states)


def state_gradients(states_fn: StatesFn, x: Tensor, y: Tensor, *, chunk: int = 512
                    ) -> StateGradients:
    """States and exact per-sample gradients ``(1/128)·∂CE_i/∂h_l`` for every layer.

    ``states_fn(x)`` returns ``([h_0 … h_L], logits)`` with states in the autograd graph.
    Gradients are taken w.r.t. the states only: parameters and their ``.grad`` are untouched.
    """
    parts: list[tuple[list[Tensor], list[Tensor], Tensor, Tensor]] = []
    with torch.enable_grad():
        for start in range(0, x.shape[0], chunk):
            xb, yb = x[start:start + chunk], y[start:start + chunk]
            states, logits = states_fn(xb)
            losses = F.cross_entropy(logits, yb, reduction="none")
            grads = torch.autograd.grad(losses.sum(), states, allow_unused=True)
            grads = [torch.zeros_like(h) if g is None else g for g, h in zip(grads, states)]
            parts.append((
                [summary_vectors(h.detach()) for h in states],
                [summary_vectors(g) / REFERENCE_BATCH for g in grads],
                logits.detach(), losses.detach(),
            ))
    n_layers = len(parts[0][0])
    layout = {2: "vectors", 3: "tokens", 4: "maps"}[states[0].dim()]
    return StateGradients(
        states=[torch.cat([p[0][l] for p in parts]) for l in range(n_layers)],
        grads=[torch.cat([p[1][l] for p in parts]) for l in range(n_layers)],
        logits=torch.cat([p[2] for p in parts]),
        losses=torch.cat([p[3] for p in parts]),
        layout=layout,
        labels=y.detach(),
    )


# A float64 norm in (2^-480, 2^480) was summed from squares that neither underflowed nor
# overflowed; a row's norm outside it (0, tiny, huge, inf, NaN) is computed again, rescaled.
_SAFE_NORM = 2.0 ** 480


def per_sample_norms(vectors: Tensor) -> Tensor:
    """L2 norm of each sample's feature vector: ``(N, d)`` → ``(N,)``.

    Always ``dim=-1``: ``x.norm(-1)`` would be the L₋₁ norm of the whole tensor. Computed
    in float64; a float64 row whose norm lies outside (2^-480, 2^480) is divided by its
    max-abs entry first (and the norm multiplied back), so entries of 1e-170 do not
    underflow to a norm of exactly 0 when squared, nor entries of 1e160 overflow to inf;
    every other row keeps torch's norm bit for bit (a float32 or bf16 entry squared in
    float64 never under- or overflows, and is left as it is).
    """
    norms = torch.linalg.vector_norm(vectors.double(), ord=2, dim=-1)
    if vectors.dtype != torch.float64:
        return norms
    risky = ~((norms > 1 / _SAFE_NORM) & (norms < _SAFE_NORM))  # NaN included
    if not bool(risky.any()):
        return norms
    rows = vectors[risky]
    peak = rows.abs().amax(dim=-1, keepdim=True)
    # a zero row stays 0, a row holding inf or NaN keeps its norm (inf, NaN) unscaled
    peak = torch.where((peak > 0) & torch.isfinite(peak), peak, torch.ones_like(peak))
    norms[risky] = torch.linalg.vector_norm(rows / peak, ord=2, dim=-1) * peak.squeeze(-1)
    return norms


def median(values: Tensor) -> float:
    """The median of a 1-D tensor: the middle value, or the mean of the two middle values
    when there is an even number of them (``Tensor.median`` returns the lower of the two,
    which, with half the samples' gradients exactly zero, reads as a zero median); NaN when
    any value is NaN, ±inf when any is ±inf (NaN when both are): a sample whose norm
    overflowed leaves no median either — a tenth of the samples at inf is not a finite
    layer. ``values``: ``(N,)``, N ≥ 1."""
    ordered = values.sort().values  # -inf first, NaNs last
    n = ordered.numel()
    if bool(torch.isnan(ordered[-1])):
        return float("nan")  # as Tensor.median: a NaN sample leaves no median
    low, high = float(ordered[0]), float(ordered[-1])
    if math.isinf(low) or math.isinf(high):
        return high if not math.isinf(low) else low if not math.isinf(high) else float("nan")
    return float((ordered[(n - 1) // 2] + ordered[n // 2]) / 2)


def median_norms(vectors: list[Tensor]) -> list[float]:
    """Median over samples of the per-sample L2 norm, one value per layer."""
    return [median(per_sample_norms(v)) for v in vectors]


def zero_gradient_stats(grad: Tensor) -> tuple[float, float]:
    """(fraction of samples whose gradient is exactly 0, median norm over the others).

    Without a terminal LN a saturated softmax makes confidently-correct samples' gradients
    exactly 0 in fp32; the median over the rest tells that cause from LN cancellation.
    The median is NaN when every sample is zero.
    """
    norms = per_sample_norms(grad)
    zero = norms == 0
    rest = norms[~zero]
    return float(zero.double().mean()), median(rest) if rest.numel() else float("nan")
