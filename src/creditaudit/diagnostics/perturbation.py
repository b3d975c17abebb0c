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
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.bp import bp_state_gradients
from creditaudit.models.contract import ResidualNet

MEASURABLE_BP_RHO = 0.9
DEFAULT_EPS = 1e-3
# Samples per batched forward; each carries all M directions (chunk·M rows per pass). The
# chunk shrinks so one perturbed tensor stays under MAX_ELEMENTS (4 MB in float64; a ViT
# token state with 32 directions is 35k numbers per sample). Larger tensors cost more than
# they save: the allocator hands each one back to the OS when it is freed, so every
# forward faulted its memory in afresh — at 64 MB per tensor, 237k page faults and 17% of
# ρ's time at d=256 L=4 (docs/benchmarks.md). Chunking does not change the directions.
SAMPLE_CHUNK = 256
MAX_ELEMENTS = 1 << 19


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


@dataclass
class WorkingCopy:
    """What ρ and nudging perturb: the model in the working dtype and its pass on N samples.

    ``model`` is a copy in ``dtype`` (the caller's model itself when ``dtype`` is None),
    ``x`` ``(N, …)`` the inputs cast to it, ``states`` [h_0 … h_L] and ``logits`` ``(N, C)``
    its forward pass (no graph). Built once per end-of-run block, it serves ρ, nudging and
    their BP controls.
    """

    model: ResidualNet
    x: Tensor
    y: Tensor
    states: list[Tensor]
    logits: Tensor
    _bp: list[Tensor] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, model: nn.Module, x: Tensor, y: Tensor, dtype: torch.dtype | None
           ) -> WorkingCopy:
        work = model if dtype is None else model_copy(model, dtype)
        x_in = x if dtype is None else _cast_input(x, dtype)
        with torch.no_grad():
            states, logits = work.forward_states(x_in)  # type: ignore[operator]
        return cls(work, x_in, y, list(states), logits)  # type: ignore[arg-type]

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def bp_gradients(self) -> list[Tensor]:
        """Exact ∂(mean CE)/∂h_l on the working copy (computed once)."""
        if self._bp is None:
            self._bp = bp_state_gradients(self.model, self.x, self.y)
        return self._bp

    def first(self, n: int) -> WorkingCopy:
        """The same copy restricted to the first ``n`` samples (no new forward pass)."""
        if n >= self.n:
            return self
        bp = None if self._bp is None else [g[:n] for g in self._bp]
        return WorkingCopy(self.model, self.x[:n], self.y[:n], [h[:n] for h in self.states],
                           self.logits[:n], bp)


def _unit_directions(b: int, m: int, shape: tuple[int, ...], *, generator: torch.Generator,
                     dtype: torch.dtype, device: torch.device) -> Tensor:
    """(b, m, D) unit directions, D = prod(shape), from a CPU generator (reproducible on
    any device). Drawn in float32 — a third of float64's cost on the CPU — then cast: a
    direction only has to be uniformly random on the sphere, not float64-exact."""
    v = torch.randn((b, m, math.prod(shape)), generator=generator, dtype=torch.float32)
    v = v.to(device=device, dtype=dtype)
    return v / torch.linalg.vector_norm(v, dim=2, keepdim=True)


@dataclass
class _Pooled:
    """One layer's predicted (one list per credit) and true loss changes, chunk by chunk."""

    predicted: list[list[Tensor]]
    true: list[Tensor] = field(default_factory=list)


@torch.no_grad()
def _rho_layers(model: ResidualNet, states: Sequence[Tensor], y: Tensor, layers: Sequence[int],
                credits: dict[int, list[Tensor]], *, n_directions: int, eps: float,
                generator: torch.Generator) -> dict[int, list[float]]:
    """ρ of several credits at several layers: ``{layer: [ρ per credit]}``.

    ``states[l]`` ``(n, …)`` is h_l of ``model`` (already in the working dtype);
    ``credits[l][k]`` has h_l's shape. The true change does not depend on the credit, so one
    set of perturbed forwards serves every credit at a layer (controls too), and one set of
    directions per chunk of samples serves every layer whose state has the same shape.
    """
    m = n_directions
    largest = max(states[layer][0].numel() for layer in layers)
    chunk = max(1, min(SAMPLE_CHUNK, MAX_ELEMENTS // (m * largest)))
    pooled = {layer: _Pooled([[] for _ in credits[layer]]) for layer in layers}
    n = states[layers[0]].shape[0]
    for start in range(0, n, chunk):
        yb = y[start:start + chunk]
        b = yb.shape[0]
        directions: dict[tuple[int, ...], Tensor] = {}
        for layer in layers:
            hb = states[layer][start:start + chunk]
            shape = tuple(hb.shape[1:])
            if shape not in directions:
                directions[shape] = _unit_directions(b, m, shape, generator=generator,
                                                     dtype=hb.dtype, device=hb.device)
            v = directions[shape]  # (b, m, D): sample-major rows (i, j)
            base = F.cross_entropy(model.forward_from(layer, hb), yb, reduction="none")
            # All M directions of every sample in ONE forward.
            moved = (hb.flatten(1).unsqueeze(1) + eps * v).view(b * m, *shape)
            ce = F.cross_entropy(model.forward_from(layer, moved), yb.repeat_interleave(m),
                                 reduction="none")
            pooled[layer].true.append(ce - base.repeat_interleave(m))
            for k, credit in enumerate(credits[layer]):
                a = credit[start:start + chunk].to(device=hb.device, dtype=hb.dtype)
                predicted = eps * torch.einsum("bd,bmd->bm", a.flatten(1), v)
                pooled[layer].predicted[k].append(predicted.flatten())
    out = {}
    for layer, pool in pooled.items():
        true_all = torch.cat(pool.true)
        out[layer] = [pearson(torch.cat(p), true_all) for p in pool.predicted]
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
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    n = min(n_samples, x.shape[0])
    w = WorkingCopy.of(model, x[:n], y[:n], dtype)
    return _rho_layers(w.model, w.states, w.y, [layer], {layer: [credits[layer][:n]]},
                       n_directions=n_directions, eps=eps, generator=generator)[layer][0]


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
              working: WorkingCopy | None = None) -> dict[str, list]:
    """ρ of ``credits`` with its controls, per layer, from one set of perturbed forwards.

    Returns ``{"layers", "rho", "bp", "random", "measurable"}`` (``rho`` empty when
    ``credits`` is None; controls empty when ``controls=False``). ``bp`` is the positive
    control (credit = exact g_l, computed on the working-dtype copy), ``random`` the
    negative control (Gaussian credit from a generator seeded ``seed + 1``), and
    ``measurable[l]`` is True when ``bp[l] >= 0.9`` — below that no ρ on this model means
    anything. Directions are the same for all three credits (a paired comparison).
    ``dtype=None`` runs the caller's model as it is (in eval mode) instead of a copy.
    ``working``: a :class:`WorkingCopy` of ``model`` on ``x`` to reuse (``dtype`` is then
    ignored).
    """
    generator = generator if generator is not None else torch.Generator().manual_seed(seed)
    n = min(n_samples, x.shape[0])
    w = (working or WorkingCopy.of(model, x[:n], y[:n], dtype)).first(n)
    work, states, y_n = w.model, w.states, w.y
    layers = list(range(len(states))) if layers is None else list(layers)
    out: dict[str, list] = {"layers": layers, "rho": [], "bp": [], "random": [],
                            "measurable": []}
    candidates: dict[int, list[Tensor]] = {
        layer: [] if credits is None else [credits[layer][:n]] for layer in layers}
    if controls:
        bp = w.bp_gradients()
        noise_gen = torch.Generator().manual_seed(seed + 1)
        for layer in layers:
            noise = torch.randn(states[layer].shape, generator=noise_gen,
                                dtype=states[layer].dtype)
            candidates[layer] += [bp[layer], noise.to(states[layer].device)]
    values = _rho_layers(work, states, y_n, layers, candidates, n_directions=n_directions,
                         eps=eps, generator=generator)
    for layer in layers:
        rhos = list(values[layer])
        if credits is not None:
            out["rho"].append(rhos.pop(0))
        if controls:
            out["bp"].append(rhos[0])
            out["random"].append(rhos[1])
            out["measurable"].append(bool(rhos[0] >= MEASURABLE_BP_RHO))
    return out
