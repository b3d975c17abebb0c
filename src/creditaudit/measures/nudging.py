"""Nudging test: does a step against the credit lower the loss?

At each deep state the credit is used as a descent direction: h_l ← h_l − η·â_l with
â = a/RMS(a) the credit's per-sample unit-RMS direction (RMS over the sample's entries, no eps
floor; a sample whose credit is exactly 0 does not move), and the network is run on from
state l. A useful credit lowers the mean loss (negative Δ); a random one leaves it unchanged
to first order. Where even the BP control's step changes the loss by less than the working
precision resolves, Δ is NaN for every credit (not measurable, as ρ below its control). The
same direction is used for a rule's credit and for its BP and random controls, so Δ depends
on the credit's direction only: it is the same for any positive rescaling of the credit and
for any chunking of the evaluation set into batches (credits in the batch-mean convention
scale with 1/batch). Computed on a float64 copy of the model by default, because on a grown
residual stream an η = 0.01 step changes the loss by less than fp32 resolves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.measures.perturbation import BP_CREDIT
from creditaudit.measures.progress import Clock, Say, StageProgress
from creditaudit.measures.working import DEFAULT_MEMORY_GB, WorkingCopy

DEFAULT_ETAS = (0.01, 0.1)
# A step's Δ is resolved where the BP control's step moves the mean loss by more than this
# many of the loss's float steps (eps·|loss|): BP's Δ then holds about 1.5% of relative
# rounding at most, and the mean over N per-sample losses rounds by a few steps (a head
# scaled by 1e-150 in float64 moved it by exactly 0, which the record then held as a
# measured Δ of 0.0 for every credit). In float32 (``dtype=None`` on a float32 model) that
# is ~2e-5 nats at a loss of 2.3.
RESOLVED_STEPS = 64


def unit_rms(a: Tensor) -> Tensor:
    """a/RMS(a) per sample (RMS over every non-batch entry); exactly-zero samples stay 0.

    Each sample is divided by its largest |entry| first, so entries of 1e-200 neither
    underflow when squared nor lose the direction.
    """
    flat = a.flatten(1)
    peak = flat.abs().amax(dim=1, keepdim=True)
    scaled = flat / torch.where(peak > 0, peak, torch.ones_like(peak))
    rms = scaled.pow(2).mean(dim=1, keepdim=True).sqrt()
    return (scaled / torch.where(rms > 0, rms, torch.ones_like(rms))).view_as(a)


def eta_key(eta: float) -> str:
    """The record key of a step size: ``0.01`` → ``"0.01"`` (shortest round-trip repr)."""
    return repr(float(eta))


def nudging_deltas(model: nn.Module, x: Tensor, y: Tensor, credits: Sequence[Tensor],
                   etas: Sequence[float] = (0.01,), layers: Sequence[int] | None = None, *,
                   dtype: torch.dtype | None = torch.float64,
                   working: WorkingCopy | None = None) -> dict[str, list[float]]:
    """Δ mean CE = CE(h_l − η·â_l) − CE(h_l) per step size and layer.

    ``model`` meets the contract; ``x`` ``(N, …)``, ``y`` ``(N,)``; ``credits[l]`` has the
    full shape of h_l (any scale: only its direction per sample matters, see
    :func:`unit_rms`). ``layers`` defaults to the deep states 1 … L. The loss is the mean
    per-sample cross-entropy over the N samples (nats). Returns ``{"0.01": [Δ_l for l in
    layers], …}``; negative Δ means the credit is a descent direction. ``dtype=None`` runs
    the caller's model as it is (eval mode assumed); otherwise a copy in ``dtype``.
    ``working``: a :class:`~creditaudit.measures.working.WorkingCopy` of ``model``
    on ``x`` to reuse (``dtype`` is then ignored). :func:`nudging_table` measures several
    credits in one pass.
    """
    return nudging_table(model, x, y, [credits], etas, layers, dtype=dtype,
                         working=working)[0]


@torch.no_grad()
def nudging_table(model: nn.Module, x: Tensor, y: Tensor,
                  credits: Sequence[Sequence[Tensor] | None], etas: Sequence[float] = (0.01,),
                  layers: Sequence[int] | None = None, *,
                  dtype: torch.dtype | None = torch.float64,
                  working: WorkingCopy | None = None, n_samples: int | None = None,
                  memory_bytes: float = DEFAULT_MEMORY_GB * 1e9,
                  progress: Say | None = None,
                  clock: Clock = time.perf_counter) -> list[dict[str, list[float]]]:
    """:func:`nudging_deltas` of several credits, in one pass over the samples.

    ``credits``: per credit [a_0 … a_L] over the N samples, or
    :data:`~creditaudit.measures.perturbation.BP_CREDIT` (None) for the working copy's
    exact BP gradient. Uses the first ``n_samples`` samples (default all N), chunk by chunk
    of the working copy (one planned for ``memory_bytes`` when ``working`` is None): with
    one chunk the means are taken over it at once, with several they are summed per chunk,
    which changes only the rounding. ``progress`` (e.g. ``print``) gets the samples done
    and the ETA at most every ``PROGRESS_SECONDS``. Returns one dict per credit.

    With BP among ``credits``, a step (η, layer) at which even the BP step moves the mean
    loss by no more than :data:`RESOLVED_STEPS` of its float steps is not measurable: every
    credit's Δ there is NaN, not a 0.0 (or a few rounding steps) that would read as a
    measured change — as ρ below its BP control is not measurable.
    """
    w = working or WorkingCopy.planned(model, x, y, dtype, memory_bytes=memory_bytes)
    n = w.n if n_samples is None else min(n_samples, w.n)
    n_layers = len(w.part(0, min(1, n)).states)
    layers = list(range(1, n_layers)) if layers is None else list(layers)
    need_bp = any(c is BP_CREDIT for c in credits)
    one_pass = w.chunks_over(n) == 1
    progress_ = StageProgress(progress, "nudging", n, clock=clock)
    reduction = "mean" if one_pass else "sum"
    before: list[Tensor] = []
    after: dict[tuple[int, int, int], list[Tensor]] = {}
    # Several chunks change the rounding anyway, so BP gradients ρ left in a chunk (of
    # another mean: nudging reads directions only) serve as they are.
    forwards = len(credits) * len(etas) * len(layers)
    for part in w.parts(n, bp=need_bp, any_scale=not one_pass):
        before.append(F.cross_entropy(part.logits, part.y, reduction=reduction))
        done = 0
        for k, credit in enumerate(credits):
            for e, eta in enumerate(etas):
                for layer in layers:
                    # one chunk may be all samples: say how far its forwards are
                    progress_.update(part.start + (part.stop - part.start) * done // forwards,
                                     clock())
                    done += 1
                    h = part.states[layer]
                    a = (part.bp[layer] if credit is BP_CREDIT  # type: ignore[index]
                         else credit[layer][part.start:part.stop])
                    step = unit_rms(a.to(device=h.device, dtype=h.dtype))
                    logits = w.model.forward_from(layer, h - eta * step)
                    after.setdefault((k, e, layer), []).append(
                        F.cross_entropy(logits, part.y, reduction=reduction))
        progress_.update(part.stop, clock())

    def mean(values: list[Tensor]) -> Tensor:
        return values[0] if one_pass else sum(values) / n  # type: ignore[return-value]

    base = mean(before)
    deltas = {key: float(mean(values) - base) for key, values in after.items()}
    if need_bp:  # the positive control says where the precision resolves Δ
        bp = next(k for k, credit in enumerate(credits) if credit is BP_CREDIT)
        floor = RESOLVED_STEPS * torch.finfo(base.dtype).eps * abs(float(base))
        for e in range(len(etas)):
            for layer in layers:
                if not abs(deltas[(bp, e, layer)]) > floor:
                    for k in range(len(credits)):
                        deltas[(k, e, layer)] = math.nan
    return [{eta_key(eta): [deltas[(k, e, layer)] for layer in layers]
             for e, eta in enumerate(etas)} for k in range(len(credits))]
