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
below :data:`MEASURABLE_BP_RHO` the ρ column is *unmeasurable*, not "no credit".

Token states (ViT, ``(B, T, d)``): v is a unit vector in the space of the *whole* token
tensor (all T·d entries) and ⟨a, v⟩ runs over all of them, so ρ is the directional
derivative of the loss with respect to the full state. Credits must therefore have the full
shape of h_l (what ``CreditRule.credits`` returns), not the CLS summary.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.bp import bp_state_gradients
from creditaudit.models.contract import ResidualNet

MEASURABLE_BP_RHO = 0.9
DEFAULT_EPS = 1e-3
# Samples per batched forward; each carries all M directions (chunk·M rows per pass). The
# chunk shrinks so one perturbed tensor stays under MAX_ELEMENTS (64 MB in float64): a ViT
# token state with 32 directions is 266k numbers per sample.
SAMPLE_CHUNK = 256
MAX_ELEMENTS = 1 << 23


def pearson(a: Tensor, b: Tensor) -> float:
    """Pearson correlation of two equally long 1-D tensors, in float64 (NaN if either is flat)."""
    a64, b64 = a.double().flatten(), b.double().flatten()
    a64, b64 = a64 - a64.mean(), b64 - b64.mean()
    denom = torch.sqrt((a64 * a64).sum() * (b64 * b64).sum())
    return float((a64 * b64).sum() / denom) if denom > 0 else float("nan")


def model_copy(model: nn.Module, dtype: torch.dtype) -> ResidualNet:
    """An eval-mode copy of ``model`` in ``dtype`` (the caller's model stays as it is)."""
    clone = copy.deepcopy(model)
    clone.to(dtype=dtype)
    clone.eval()
    return clone  # type: ignore[return-value]


def _cast_input(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.to(dtype) if x.is_floating_point() else x


@torch.no_grad()
def _rho_at_layer(model: ResidualNet, h: Tensor, y: Tensor, layer: int,
                  credits: Sequence[Tensor], *, n_directions: int, eps: float,
                  generator: torch.Generator) -> list[float]:
    """ρ for several credits at one layer, sharing the directions and the true changes.

    ``h`` ``(n, …)`` is the state h_layer of ``model`` (already in the working dtype);
    ``credits[k]`` has the shape of ``h``. The true change does not depend on the credit, so
    one set of perturbed forwards serves every credit (positive and negative controls too).
    """
    m = n_directions
    chunk = max(1, min(SAMPLE_CHUNK, MAX_ELEMENTS // (m * h[0].numel())))
    predicted: list[list[Tensor]] = [[] for _ in credits]
    true: list[Tensor] = []
    for start in range(0, h.shape[0], chunk):
        hb, yb = h[start:start + chunk], y[start:start + chunk]
        b = hb.shape[0]
        # Directions come from a CPU generator (reproducible on any device), then move.
        v = torch.randn((b * m, *hb.shape[1:]), generator=generator, dtype=h.dtype)
        v = v.to(h.device)
        v = v / torch.linalg.vector_norm(v.flatten(1), dim=1).view(-1, *[1] * (v.dim() - 1))
        base = F.cross_entropy(model.forward_from(layer, hb), yb, reduction="none")
        # All M directions of every sample in ONE forward: sample-major rows (i, j).
        moved = hb.repeat_interleave(m, dim=0) + eps * v
        ce = F.cross_entropy(model.forward_from(layer, moved), yb.repeat_interleave(m),
                             reduction="none")
        true.append(ce - base.repeat_interleave(m))
        for k, credit in enumerate(credits):
            a = credit[start:start + chunk].to(device=h.device, dtype=h.dtype)
            predicted[k].append(eps * (a.repeat_interleave(m, dim=0) * v).flatten(1).sum(dim=1))
    true_all = torch.cat(true)
    return [pearson(torch.cat(p), true_all) for p in predicted]


def _prepare(model: nn.Module, x: Tensor, y: Tensor, n_samples: int,
             dtype: torch.dtype | None) -> tuple[ResidualNet, list[Tensor], Tensor, int]:
    """(model copy in dtype — the model itself for ``dtype=None`` —, its states on the
    first n samples, labels, n)."""
    n = min(n_samples, x.shape[0])
    work = model if dtype is None else model_copy(model, dtype)
    x_n = x[:n] if dtype is None else _cast_input(x[:n], dtype)
    with torch.no_grad():
        states, _ = work.forward_states(x_n)  # type: ignore[operator]
    return work, states, y[:n], n  # type: ignore[return-value]


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
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    work, states, y_n, n = _prepare(model, x, y, n_samples, dtype)
    return _rho_at_layer(work, states[layer], y_n, layer, [credits[layer][:n]],
                         n_directions=n_directions, eps=eps, generator=generator)[0]


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
              generator: torch.Generator | None = None, controls: bool = True
              ) -> dict[str, list]:
    """ρ of ``credits`` with its controls, per layer, from one set of perturbed forwards.

    Returns ``{"layers", "rho", "bp", "random", "measurable"}`` (``rho`` empty when
    ``credits`` is None; controls empty when ``controls=False``). ``bp`` is the positive
    control (credit = exact g_l, computed on the working-dtype copy), ``random`` the
    negative control (Gaussian credit from a generator seeded ``seed + 1``), and
    ``measurable[l]`` is True when ``bp[l] >= 0.9`` — below that no ρ on this model means
    anything. Directions are the same for all three credits (a paired comparison).
    ``dtype=None`` runs the caller's model as it is (in eval mode) instead of a copy.
    """
    generator = generator if generator is not None else torch.Generator().manual_seed(seed)
    work, states, y_n, n = _prepare(model, x, y, n_samples, dtype)
    layers = list(range(len(states))) if layers is None else list(layers)
    out: dict[str, list] = {"layers": layers, "rho": [], "bp": [], "random": [],
                            "measurable": []}
    if controls:
        x_n = x[:n] if dtype is None else _cast_input(x[:n], dtype)
        bp = bp_state_gradients(work, x_n, y_n)
        noise_gen = torch.Generator().manual_seed(seed + 1)
    for layer in layers:
        candidates: list[Tensor] = [] if credits is None else [credits[layer][:n]]
        if controls:
            noise = torch.randn(states[layer].shape, generator=noise_gen,
                                dtype=states[layer].dtype)
            candidates += [bp[layer], noise.to(states[layer].device)]
        values = _rho_at_layer(work, states[layer], y_n, layer, candidates,
                               n_directions=n_directions, eps=eps, generator=generator)
        if credits is not None:
            out["rho"].append(values.pop(0))
        if controls:
            out["bp"].append(values[0])
            out["random"].append(values[1])
            out["measurable"].append(bool(values[0] >= MEASURABLE_BP_RHO))
    return out
