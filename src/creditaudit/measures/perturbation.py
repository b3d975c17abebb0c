"""Perturbation correlation ρ_l: does the credit predict how the loss moves? (science.md §6)

For each sample i and M random unit directions v at state h_l the *predicted* change of the
per-sample loss is ε⟨a_il, v⟩ and the *true* change is CE_i(h_l + εv) − CE_i(h_l), from a
forward pass that starts at state l (``model.forward_from``). ρ_l is the Pearson correlation
of the two, pooled over samples × directions. It needs no backprop through the model, so it
judges any credit — including BP's own — against the network's actual response.

Precision: on an exploded model (‖h‖ ~ 1e5 and more) an ε = 1e-3 step moves the loss by
~1e-9, below fp32 resolution, and even the exact gradient scores ρ ≈ 0 in fp32. Everything
is therefore computed on a float64 *copy* of the model by default; the caller's model is
never changed. The BP positive control (credit = g_l, ρ ≈ 1) is reported beside every ρ;
below :data:`MEASURABLE_BP_RHO` the ρ column is *unmeasurable*, not "no credit"; so is the
ρ of a credit that is zero at every sample (no direction, so no correlation: NaN).

Token states (ViT, ``(B, T, d)``): v is a unit vector in the space of the *whole* token
tensor (all T·d entries) and ⟨a, v⟩ runs over all of them, so ρ is the directional
derivative of the loss with respect to the full state. Credits must therefore have the full
shape of h_l (what ``CreditRule.credits`` returns), not the CLS summary.

Cost, bounded by design: the float64 pass over the samples (states h_l and BP gradients
g_l) runs in chunks, and the perturbed forwards in slices of rows, each sized so that what
autograd saves for it stays under ``memory_bytes``
(:class:`~creditaudit.measures.working.WorkingCopy`). With a compute budget
``budget_flops`` ρ uses only as many samples as the budget pays for, decided before the
first forward (:mod:`creditaudit.measures.budget`). The result is then exactly ρ with
``n_samples=n``, and ``se`` says how precise it is (a jackknife over samples,
:func:`jackknife_se`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.measures.budget import rho_budget
from creditaudit.measures.directions import unit_directions
from creditaudit.measures.progress import Clock, Say, StageProgress
from creditaudit.measures.working import DEFAULT_MEMORY_GB, WorkingCopy
from creditaudit.models.contract import ResidualNet

MEASURABLE_BP_RHO = 0.9
DEFAULT_EPS = 1e-3
# Samples per draw of directions; each carries all M directions (chunk·M rows per pass). The
# chunk shrinks so one perturbed tensor stays under MAX_ELEMENTS (4 MB in float64; a ViT
# token state with 32 directions is 35k numbers per sample). Larger tensors cost more than
# they save: the allocator hands each one back to the OS when it is freed, so every
# forward faulted its memory in afresh — at 64 MB per tensor, 237k page faults and 17% of
# ρ's time at d=256 L=4 (docs/benchmarks.md). The memory cap only slices these forwards
# further; it never changes which directions are drawn.
SAMPLE_CHUNK = 256
MAX_ELEMENTS = 1 << 19


# Beyond 2^±200 sums of squares, and their products, could under- or overflow float64.
_SAFE_PEAK = 2.0 ** 200


def _in_range(x: Tensor) -> Tensor:
    """``x`` (float64) divided by its largest |entry| when that lies beyond 2^±200, where
    the sums of squares of a correlation would under- or overflow (a correlation is
    scale-free); else ``x`` as it is, so ordinary values give the same bits as before."""
    peak = float(x.abs().max()) if x.numel() else 0.0
    if peak > 0 and math.isfinite(peak) and not 1 / _SAFE_PEAK < peak < _SAFE_PEAK:
        return x / peak
    return x


def pearson(a: Tensor, b: Tensor) -> float:
    """Pearson correlation of two equally long 1-D tensors, in float64 (NaN if either is
    flat), at any scale of either (credits of 1e-200 or 1e200 included)."""
    a64, b64 = _in_range(a.double().flatten()), _in_range(b.double().flatten())
    a64, b64 = a64 - a64.mean(), b64 - b64.mean()
    denom = torch.sqrt((a64 * a64).sum() * (b64 * b64).sum())
    return float((a64 * b64).sum() / denom) if denom > 0 else float("nan")


def jackknife_se(predicted: Tensor, true: Tensor) -> float:
    """Standard error of the pooled Pearson correlation of ``predicted`` and ``true``, both
    ``(n, M)`` (M directions of each of n samples), by the delete-one-sample jackknife.

    A sample's M directions share its state and credit, so they are not independent
    pairs: the samples are the units left out. NaN for n < 2 or a flat leave-one-out set.
    """
    n, m = predicted.shape
    if n < 2:
        return float("nan")
    p, t = _in_range(predicted.double()), _in_range(true.double())
    p, t = p - p.mean(), t - t.mean()
    rows = torch.stack([p.sum(1), t.sum(1), (p * p).sum(1), (t * t).sum(1), (p * t).sum(1)])
    rest = rows.sum(dim=1, keepdim=True) - rows  # each statistic without sample i
    count = (n - 1) * m
    sxx = rest[2] - rest[0] * rest[0] / count
    syy = rest[3] - rest[1] * rest[1] / count
    sxy = rest[4] - rest[0] * rest[1] / count
    left_out = sxy / torch.sqrt(sxx * syy)
    spread = ((left_out - left_out.mean()) ** 2).sum()
    return float(torch.sqrt(spread * (n - 1) / n))


def _directions(shapes: Sequence[tuple[int, ...]], b: int, m: int, *,
                generator: torch.Generator, dtype: torch.dtype, device: torch.device
                ) -> dict[tuple[int, ...], Tensor]:
    """One draw per distinct state shape, in layer order: every layer of a shape shares it."""
    out: dict[tuple[int, ...], Tensor] = {}
    for shape in shapes:
        if shape not in out:
            out[shape] = unit_directions(b, m, shape, generator=generator, dtype=dtype,
                                         device=device)
    return out


def _predicted(credit: Tensor, v: Tensor, eps: float, like: Tensor) -> Tensor:
    """ε⟨a_i, v_ij⟩: ``(b, …)`` credits, ``(b, m, D)`` directions → ``(b, m)``."""
    a = credit.to(device=like.device, dtype=like.dtype)
    return eps * torch.einsum("bd,bmd->bm", a.flatten(1), v)


def _losses(model: ResidualNet, layer: int, h: Tensor, y: Tensor, rows: int) -> Tensor:
    """Per-sample CE of the network run on from ``h`` at ``layer``, ``rows`` at a time."""
    return torch.cat([F.cross_entropy(model.forward_from(layer, h[r:r + rows]), y[r:r + rows],
                                      reduction="none") for r in range(0, h.shape[0], rows)])


BP_CREDIT = None  # in a list of credits: the working copy's exact BP gradient


@dataclass
class _Pooled:
    """One layer's predicted (one list per credit) and true loss changes, ``(b, M)`` per
    block of samples."""

    predicted: list[list[Tensor]]
    true: list[Tensor] = field(default_factory=list)


@dataclass
class _Perturbed:
    pooled: dict[int, _Pooled]
    samples: int
    block: int
    shapes: dict[int, tuple[int, ...]]


@torch.no_grad()
def _perturb(working: WorkingCopy, n: int, layers: Sequence[int],
             credits: Sequence[Sequence[Tensor] | None], *, n_directions: int, eps: float,
             generator: torch.Generator, say: Say | None, clock: Clock) -> _Perturbed:
    """True and predicted loss changes of ``credits`` (each [a_0 … a_L] over ≥ n samples,
    or :data:`BP_CREDIT`) at ``layers`` on the first n samples of ``working``.

    The true change does not depend on the credit, so one set of perturbed forwards serves
    every credit at a layer (controls too), and one set of directions per block of samples
    serves every layer whose state has the same shape.
    """
    m = n_directions
    progress = StageProgress(say, "ρ", n, clock=clock)
    first = working.part(0, min(1, n))
    shapes = {layer: tuple(first.states[layer].shape[1:]) for layer in layers}
    largest = max(math.prod(shape) for shape in shapes.values())
    block = max(1, min(SAMPLE_CHUNK, MAX_ELEMENTS // (m * largest)))
    rows = working.max_rows or block * m
    bp_over = n if any(c is BP_CREDIT for c in credits) else None
    pooled = {layer: _Pooled([[] for _ in credits]) for layer in layers}
    model = working.model
    for start in range(0, n, block):
        part = working.part(start, min(start + block, n), bp_over=bp_over)
        yb, b = part.y, part.stop - part.start
        some = part.states[layers[0]]
        v_of = _directions([shapes[layer] for layer in layers], b, m, generator=generator,
                           dtype=some.dtype, device=some.device)
        for layer in layers:
            hb, v = part.states[layer], v_of[shapes[layer]]  # v: (b, m, D), rows (i, j)
            base = _losses(model, layer, hb, yb, rows)
            # All M directions of every sample in one forward (sliced by the memory cap).
            moved = (hb.flatten(1).unsqueeze(1) + eps * v).view(b * m, *shapes[layer])
            ce = _losses(model, layer, moved, yb.repeat_interleave(m), rows)
            pooled[layer].true.append((ce - base.repeat_interleave(m)).view(b, m))
            for k, credit in enumerate(credits):
                a = part.bp[layer] if credit is BP_CREDIT else credit[layer][start:part.stop]  # type: ignore[index]
                pooled[layer].predicted[k].append(_predicted(a, v, eps, hb))
        progress.update(part.stop, clock())
    return _Perturbed(pooled, n, block, shapes)


@torch.no_grad()
def _replay_predicted(perturbed: _Perturbed, layers: Sequence[int],
                      credits: dict[int, Tensor], *, n_directions: int, eps: float,
                      generator: torch.Generator, like: Tensor) -> dict[int, list[Tensor]]:
    """The predicted changes of ``credits[layer]`` ``(n, …)`` under the directions a
    :func:`_perturb` pass drew from ``generator`` in its starting state (drawn again)."""
    out: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    for start in range(0, perturbed.samples, perturbed.block):
        stop = min(start + perturbed.block, perturbed.samples)
        v_of = _directions([perturbed.shapes[layer] for layer in layers], stop - start,
                           n_directions, generator=generator, dtype=like.dtype,
                           device=like.device)
        for layer in layers:
            out[layer].append(_predicted(credits[layer][start:stop],
                                         v_of[perturbed.shapes[layer]], eps, like))
    return out


def perturbation_rho(model: nn.Module, x: Tensor, y: Tensor, credits: Sequence[Tensor],
                     layer: int, *, n_directions: int = 32, eps: float = DEFAULT_EPS,
                     n_samples: int = 1024, dtype: torch.dtype = torch.float64,
                     generator: torch.Generator | None = None) -> float:
    """ρ_l of one credit at one layer.

    ``model`` meets the contract (``forward_states``, ``forward_from``); ``x`` ``(N, …)``,
    ``y`` ``(N,)``; ``credits[l]`` has the full shape of h_l for the same N samples (any
    scale: ρ is scale-free). Uses the first ``n_samples`` samples and ``n_directions``
    directions each, drawn from ``generator`` (default: seeded 0; the global RNG is never
    used).
    """
    return rho_table(model, x, y, credits, layers=[layer], n_directions=n_directions,
                     eps=eps, n_samples=n_samples, dtype=dtype, generator=generator,
                     controls=False)["rho"][0]


def rho_per_layer(model: nn.Module, x: Tensor, y: Tensor, credits: Sequence[Tensor], *,
                  layers: Sequence[int] | None = None, n_directions: int = 32,
                  eps: float = DEFAULT_EPS, n_samples: int = 1024,
                  dtype: torch.dtype = torch.float64,
                  generator: torch.Generator | None = None) -> list[float]:
    """ρ_l for every layer in ``layers`` (default all states 0 … L); arguments as
    :func:`perturbation_rho`."""
    return rho_table(model, x, y, credits, layers=layers, n_directions=n_directions, eps=eps,
                     n_samples=n_samples, dtype=dtype, generator=generator,
                     controls=False)["rho"]


def rho_controls(model: nn.Module, x: Tensor, y: Tensor, *, layers: Sequence[int] | None = None,
                 n_directions: int = 32, eps: float = DEFAULT_EPS, n_samples: int = 1024,
                 dtype: torch.dtype = torch.float64, seed: int = 0) -> dict[str, list[float]]:
    """The positive (credit = g_l, exact BP gradient) and negative (i.i.d. Gaussian credit)
    controls of ρ on ``model``: ``{"bp": [...], "random": [...]}``, one value per layer."""
    table = rho_table(model, x, y, None, layers=layers, n_directions=n_directions, eps=eps,
                      n_samples=n_samples, dtype=dtype, seed=seed)
    return {"bp": table["bp"], "random": table["random"]}


def rho_table(model: nn.Module, x: Tensor, y: Tensor, credits: Sequence[Tensor] | None, *,
              layers: Sequence[int] | None = None, n_directions: int = 32,
              eps: float = DEFAULT_EPS, n_samples: int = 1024,
              dtype: torch.dtype | None = torch.float64, seed: int = 0,
              generator: torch.Generator | None = None, controls: bool = True,
              working: WorkingCopy | None = None, budget_flops: float | None = None,
              memory_bytes: float = DEFAULT_MEMORY_GB * 1e9, progress: Say | None = None,
              clock: Clock = time.perf_counter) -> dict[str, Any]:
    """ρ of ``credits`` with its controls, per layer, from one set of perturbed forwards.

    Returns ``{"layers", "rho", "se", "bp", "random", "measurable", "samples",
    "budget"}`` (``rho`` and ``se`` empty when ``credits`` is None; controls empty
    when ``controls=False``). ``se[l]`` is the jackknife standard error of ``rho[l]``
    (:func:`jackknife_se`); ``samples`` how many samples were used, ``budget`` the
    :class:`~creditaudit.measures.budget.RhoBudget` that decided it (None without
    ``budget_flops``). ``bp`` is the positive control (credit = exact g_l, computed on the
    working-dtype copy), ``random`` the negative control (Gaussian credit from a generator
    seeded ``seed + 1``), and ``measurable[l]`` is True when ``bp[l] >= 0.9`` — below that no
    ρ on this model means anything — and, with ``credits``, ``rho[l]`` is a number: a credit
    that predicts the same loss change for every sample and direction (zero at every sample,
    as at a block a rule leaves untrained) has no correlation to measure, and its NaN is
    not measurable there, whatever the control says. Directions are the same for all three
    credits (a paired comparison). ``dtype=None`` runs the caller's model as it is (in eval
    mode) instead of a copy.
    ``working``: a :class:`WorkingCopy` of ``model`` on ``x`` to reuse (``dtype`` and
    ``memory_bytes`` are then ignored); else one is planned for ``memory_bytes``.

    ``budget_flops``: ρ's compute budget in floating-point operations (None: none). ρ then
    uses the first ``samples`` = ⌊budget_flops /
    :func:`~creditaudit.measures.budget.rho_sample_flops`⌋ samples (at least
    :data:`~creditaudit.measures.budget.MIN_RHO_SAMPLES`, at most ``n_samples``), decided
    before any forward, and every value is exactly what ``n_samples=samples`` gives.
    ``progress`` (e.g. ``print``) gets a line with the samples done and the ETA at most
    every :data:`~creditaudit.measures.progress.PROGRESS_SECONDS`; ``clock`` paces those
    lines only.
    """
    generator = generator if generator is not None else torch.Generator().manual_seed(seed)
    n = min(n_samples, x.shape[0])
    w = working or WorkingCopy.planned(model, x[:n], y[:n], dtype, memory_bytes=memory_bytes)
    budget = None  # without a budget nothing is counted: ρ runs exactly as it did before
    n = min(n, w.n)
    if budget_flops is not None:
        budget = rho_budget(w, n, n_directions=n_directions, budget_flops=budget_flops,
                            layers=layers)
        n = budget.samples
        if budget.reached:  # else the pass stays what it is (over every sample, for nudging)
            w = w.first(n)
    n_layers = len(w.part(0, min(1, n)).states)
    layers = list(range(n_layers)) if layers is None else list(layers)
    sources: list[Sequence[Tensor] | None] = [] if credits is None else [credits]
    if controls:
        sources.append(BP_CREDIT)
    start_state = generator.get_state()
    perturbed = _perturb(w, n, layers, sources, n_directions=n_directions, eps=eps,
                         generator=generator, say=progress, clock=clock)
    used = perturbed.samples
    if controls:
        # The random control's noise is drawn for the samples used, layer by layer, as a
        # pass with n_samples = used draws it; its directions are drawn again. It is drawn
        # in float64 on the CPU, whatever the working dtype and the caller's default device.
        like = w.part(0, min(1, used)).states[layers[0]]
        noise_gen = torch.Generator().manual_seed(seed + 1)
        noise = {layer: torch.randn((used, *perturbed.shapes[layer]), generator=noise_gen,
                                    dtype=torch.float64, device="cpu"
                                    ).to(device=like.device, dtype=like.dtype)
                 for layer in layers}
        replay = torch.Generator().set_state(start_state)
        predicted = _replay_predicted(perturbed, layers, noise, n_directions=n_directions,
                                      eps=eps, generator=replay, like=like)
        for layer in layers:
            perturbed.pooled[layer].predicted.append(predicted[layer])
    out: dict[str, Any] = {"layers": layers, "rho": [], "se": [], "bp": [],
                           "random": [], "measurable": [], "samples": used,
                           "budget": budget}
    for layer in layers:
        pool = perturbed.pooled[layer]
        true_all = torch.cat(pool.true)
        pairs = [(torch.cat(p), true_all) for p in pool.predicted]
        if credits is not None:
            predicted_all, _ = pairs.pop(0)
            out["rho"].append(pearson(predicted_all, true_all))
            out["se"].append(jackknife_se(predicted_all, true_all))
        if controls:
            bp, random = (pearson(p, t) for p, t in pairs)
            out["bp"].append(bp)
            out["random"].append(random)
            defined = credits is None or math.isfinite(out["rho"][-1])
            out["measurable"].append(bool(bp >= MEASURABLE_BP_RHO) and defined)
    return out
