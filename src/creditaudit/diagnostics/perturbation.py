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

Cost, bounded by design: the float64 pass over the samples (states h_l and BP gradients
g_l) runs in chunks, and the perturbed forwards in slices of rows, each sized so that what
autograd saves for it stays under ``memory_bytes`` (:func:`measure_footprint` measures the
model's bytes per sample on a few samples). With a compute budget ``budget_flops`` ρ uses
only as many samples as the budget pays for (never fewer than :data:`MIN_RHO_SAMPLES`),
decided before the first forward from the floating-point operations of one sample's
perturbed forwards, counted on one sample (:func:`rho_sample_flops`): the count depends on
the model's shapes only, so the same run gives the same samples on any machine under any
load. The result is then exactly ρ with ``n_samples=n``, and ``se`` says how precise it is
(a jackknife over samples, :func:`jackknife_se`).
"""

from __future__ import annotations

import copy
import ctypes
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from creditaudit.formatting import duration
from creditaudit.methods.bp import bp_state_gradients
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
DEFAULT_MEMORY_GB = 2.0
# ρ's compute budget never cuts it below this many samples (the jackknife needs two).
MIN_RHO_SAMPLES = 8
# At most one progress line per stage in this many seconds, and one trim of the C heap
# (release_freed_memory) in TRIM_SECONDS.
PROGRESS_SECONDS = 10.0
TRIM_SECONDS = 5.0
PROBE_SAMPLES = (2, 4)

Say = Callable[[str], None]
Clock = Callable[[], float]
StatesFn = Callable[[Tensor], tuple[list[Tensor], Tensor]]


def pearson(a: Tensor, b: Tensor) -> float:
    """Pearson correlation of two equally long 1-D tensors, in float64 (NaN if either is flat)."""
    a64, b64 = a.double().flatten(), b.double().flatten()
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
    p, t = predicted.double(), true.double()
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


@dataclass(frozen=True)
class Footprint:
    """What one sample costs a model's forward pass in its autograd graph.

    ``graph_bytes``: bytes of the tensors autograd saves for the backward (what a forward
    with grad holds until its backward; a forward without grad holds less at any moment);
    ``state_bytes``: bytes of the sample's states h_0 … h_L. Measured by
    :func:`measure_footprint`.
    """

    graph_bytes: int
    state_bytes: int

    def samples_within(self, memory_bytes: float, *, copies: int = 0,
                       backward: bool = False) -> int:
        """How many samples fit ``memory_bytes`` (at least 1): the graph (twice with a
        ``backward``, which allocates gradients of about what the forward saved: on
        ViT-Mini a state-gradient pass peaked at 1.8× its saved bytes) plus ``copies``
        more copies of the states (gradients, perturbed states) per sample."""
        graph = self.graph_bytes * (2 if backward else 1)
        per_sample = max(1, graph + copies * self.state_bytes)
        return max(1, int(memory_bytes // per_sample))


def _saved_bytes(states_fn: StatesFn, x: Tensor, y: Tensor
                 ) -> tuple[int, list[Tensor], Tensor]:
    """(bytes autograd saves for ``states_fn(x)`` and its CE, the states, the summed CE)."""
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        # Saved tensors stay alive with the graph, so no two share an address here; views
        # of one storage count once.
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    xb = x.detach().clone().requires_grad_(x.is_floating_point())
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        states, logits = states_fn(xb)
        loss = F.cross_entropy(logits, y, reduction="sum")
    return sum(storages.values()), list(states), loss


def measure_footprint(states_fn: StatesFn, x: Tensor, y: Tensor) -> Footprint:
    """The :class:`Footprint` of ``states_fn`` (``x -> ([h_0 … h_L], logits)``) per sample.

    Runs it on the first 2 and 4 samples of ``x`` ``(N, …)`` (labels ``y``) with the
    autograd graph, counting the bytes of every distinct storage autograd saves; the
    difference per added sample is the footprint (parameters, saved by every pass alike,
    drop out). The model should be in eval mode (as every diagnostic runs it).
    """
    n = int(x.shape[0])
    sizes = sorted({min(k, n) for k in PROBE_SAMPLES})
    saved: dict[int, int] = {}
    state_bytes = 0
    for k in sizes:
        saved[k], states, loss = _saved_bytes(states_fn, x[:k], y[:k])
        state_bytes = sum(h[0].numel() * h.element_size() for h in states)
        del states, loss
    low, high = sizes[0], sizes[-1]
    per_sample = ((saved[high] - saved[low]) / (high - low) if high > low
                  else saved[high] / high)
    return Footprint(max(math.ceil(per_sample), state_bytes), state_bytes)


@torch.no_grad()
def rho_sample_flops(model: ResidualNet, x: Tensor, *, n_directions: int,
                     layers: Sequence[int] | None = None) -> int:
    """Floating-point operations of one sample's perturbed forwards for ρ: at each state in
    ``layers`` (default every state h_0 … h_L), ``1 + n_directions`` forwards from it (the
    unmoved state and one per direction) through ``model.forward_from``.

    Counted exactly on the first sample of ``x`` ``(N, …)`` by torch's ``FlopCounterMode``
    (matrix products and convolutions, 2 per multiply-add; elementwise operations are not
    counted), with attention run as its two batched matrix products — the fused kernels of
    some devices are missing from torch's table, and the count must not depend on the
    device. Depends on the model's shapes only: the same number on every machine, whatever
    its load.
    """
    states, _ = model.forward_states(x[:1])
    layers = range(len(states)) if layers is None else layers
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        for layer in layers:
            model.forward_from(layer, states[layer])
    return (1 + n_directions) * counter.get_total_flops()


@dataclass(frozen=True)
class RhoBudget:
    """How many samples ρ uses under a compute budget.

    ``asked``: the samples asked for (``n_samples``, at most N); ``sample_flops``: one
    sample's perturbed forwards (:func:`rho_sample_flops`); ``budget_flops``: the budget in
    floating-point operations (None: no budget). ``samples`` =
    min(asked, max(:data:`MIN_RHO_SAMPLES`, ⌊budget_flops / sample_flops⌋)).
    """

    asked: int
    sample_flops: int
    budget_flops: float | None

    @property
    def samples(self) -> int:
        if self.budget_flops is None:
            return self.asked
        affordable = math.floor(self.budget_flops / max(1, self.sample_flops))
        return min(self.asked, max(MIN_RHO_SAMPLES, affordable))

    @property
    def reached(self) -> bool:
        """Whether the budget holds fewer samples than asked for."""
        return self.samples < self.asked

    def describe(self) -> str:
        """What the budget did, for a progress line (empty when it held every sample)."""
        if not self.reached:
            return ""
        return (f"the budget of {self.budget_flops:.3g} FLOPs holds {self.samples} of the "
                f"{self.asked} samples asked for at {self.sample_flops:.3g} FLOPs each")


def rho_budget(working: WorkingCopy, asked: int, *, n_directions: int,
               budget_flops: float | None, layers: Sequence[int] | None = None
               ) -> RhoBudget:
    """The :class:`RhoBudget` of ρ on ``working``'s model with ``asked`` samples."""
    flops = rho_sample_flops(working.model, working.x, n_directions=n_directions,
                             layers=layers)
    return RhoBudget(min(asked, working.n), flops, budget_flops)


def model_copy(model: nn.Module, dtype: torch.dtype) -> ResidualNet:
    """An eval-mode copy of ``model`` in ``dtype`` (the caller's model stays as it is)."""
    clone = copy.deepcopy(model)
    clone.to(dtype=dtype)
    clone.eval()
    return clone  # type: ignore[return-value]


def _cast_input(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.to(dtype) if x.is_floating_point() else x


@dataclass
class WorkingPart:
    """Samples ``start … stop − 1`` of a :class:`WorkingCopy`'s pass: ``states``
    [h_0 … h_L] ``(n, …)``, ``logits`` ``(n, C)``, labels ``y`` ``(n,)`` and, when asked
    for, ``bp`` [g_0 … g_L] (∂ of the mean CE over the samples the caller named, shaped
    like the states)."""

    start: int
    stop: int
    states: list[Tensor]
    logits: Tensor
    y: Tensor
    bp: list[Tensor] | None = None


@dataclass
class _Chunk:
    states: list[Tensor]
    logits: Tensor
    bp: list[Tensor] | None = None
    bp_over: int = 0  # bp is ∂ of the mean CE over the first bp_over samples

    @property
    def nbytes(self) -> int:
        tensors = [*self.states, self.logits, *(self.bp or [])]
        return sum(t.numel() * t.element_size() for t in tensors)


class WorkingCopy:
    """What ρ and nudging perturb: the model in the working dtype and its pass over N samples.

    ``model`` is a copy in the working dtype (the caller's model itself when the dtype is
    None), ``x`` ``(N, …)`` the inputs cast to it, ``y`` ``(N,)``. The pass — states,
    logits and BP gradients, no graph kept — runs in chunks of ``chunk`` samples, each
    computed when first asked for and kept while the kept chunks take at most
    ``keep_bytes`` (the least recently used go first; None: only the chunks the last part
    needed); with ``chunk = N`` it is one pass over every sample, kept for every stage.
    ``max_rows``: the most rows one perturbed forward may take (None: no limit). Built once
    per end-of-run block, it serves ρ, nudging and their BP controls.
    """

    def __init__(self, model: ResidualNet, x: Tensor, y: Tensor, *, chunk: int | None = None,
                 max_rows: int | None = None, keep_bytes: float | None = None) -> None:
        self.model, self.x, self.y = model, x, y
        self.chunk = self.n if chunk is None else max(1, min(int(chunk), self.n))
        self.max_rows, self.keep_bytes = max_rows, keep_bytes
        self._chunks: dict[int, _Chunk] = {}  # in the order they were last used

    @classmethod
    def of(cls, model: nn.Module, x: Tensor, y: Tensor, dtype: torch.dtype | None, *,
           chunk: int | None = None, max_rows: int | None = None,
           keep_bytes: float | None = None) -> WorkingCopy:
        """A copy of ``model`` in ``dtype`` (None: the model itself) on ``x``, ``y``."""
        work = model if dtype is None else model_copy(model, dtype)
        x_in = x if dtype is None else _cast_input(x, dtype)
        return cls(work, x_in, y, chunk=chunk, max_rows=max_rows,  # type: ignore[arg-type]
                   keep_bytes=keep_bytes)

    @classmethod
    def planned(cls, model: nn.Module, x: Tensor, y: Tensor, dtype: torch.dtype | None, *,
                memory_bytes: float) -> WorkingCopy:
        """:meth:`of` with the chunk and row limits measured on the model.

        A chunk of the pass holds its graph and backward (the BP gradients) plus three
        copies of the states per sample (states, gradients, one perturbed state) within
        ``memory_bytes``;
        a perturbed forward takes at most as many rows as ``memory_bytes`` holds graphs;
        computed chunks are kept within half of ``memory_bytes``.
        """
        copy_ = cls.of(model, x, y, dtype)
        footprint = measure_footprint(copy_.model.forward_states, copy_.x, y)
        chunk = footprint.samples_within(memory_bytes, copies=3, backward=True)
        copy_.chunk = max(1, min(chunk, copy_.n))
        copy_.max_rows = footprint.samples_within(memory_bytes)
        copy_.keep_bytes = memory_bytes / 2
        return copy_

    def first(self, n: int) -> WorkingCopy:
        """The same copy of the model on the first ``n`` samples only (itself when ``n``
        covers all): its pass never computes a sample past them."""
        if n >= self.n:
            return self
        return WorkingCopy(self.model, self.x[:n], self.y[:n], chunk=self.chunk,
                           max_rows=self.max_rows, keep_bytes=self.keep_bytes)

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    def chunks_over(self, n: int) -> int:
        """How many chunks the first ``n`` samples span."""
        return -(-min(n, self.n) // self.chunk)

    def part(self, start: int, stop: int, *, bp_over: int | None = None,
             any_scale: bool = False) -> WorkingPart:
        """Samples ``start … stop − 1``; with ``bp_over`` (≥ ``stop``) also their BP
        gradients of the mean CE over the first ``bp_over`` samples — or, with
        ``any_scale``, of whichever mean a kept chunk already has."""
        needed = range(start // self.chunk, (stop - 1) // self.chunk + 1)
        self._drop(keeping=needed)
        pieces = []
        for index in needed:
            chunk = self._compute(index, bp_over, any_scale)
            offset = index * self.chunk
            keep = slice(max(start, offset) - offset, min(stop, offset + self.chunk) - offset)
            pieces.append((chunk, keep))

        def joined(get: Callable[[_Chunk], Tensor]) -> Tensor:
            parts = [get(chunk)[keep] for chunk, keep in pieces]
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        n_states = len(pieces[0][0].states)
        states = [joined(lambda c, l=l: c.states[l]) for l in range(n_states)]
        grads = ([joined(lambda c, l=l: c.bp[l]) for l in range(n_states)]  # type: ignore[index]
                 if bp_over is not None else None)
        return WorkingPart(start, stop, states, joined(lambda c: c.logits),
                           self.y[start:stop], grads)

    def parts(self, n: int, *, bp: bool = False, any_scale: bool = False
              ) -> Iterator[WorkingPart]:
        """The first ``n`` samples chunk by chunk (with ``bp``: their BP gradients of the
        mean CE over the n, or any mean with ``any_scale``)."""
        n = min(n, self.n)
        for start in range(0, n, self.chunk):
            yield self.part(start, min(start + self.chunk, n), bp_over=n if bp else None,
                            any_scale=any_scale)

    def _drop(self, keeping: range) -> None:
        """Drop the least recently used chunks outside ``keeping`` beyond ``keep_bytes``."""
        others = [k for k in self._chunks if k not in keeping]
        kept = sum(c.nbytes for c in self._chunks.values())
        for index in others:
            if self.keep_bytes is not None and kept <= self.keep_bytes:
                break
            kept -= self._chunks.pop(index).nbytes

    def _compute(self, index: int, bp_over: int | None, any_scale: bool = False) -> _Chunk:
        start, stop = index * self.chunk, min((index + 1) * self.chunk, self.n)
        chunk = self._chunks.pop(index, None)
        if chunk is None:
            with torch.no_grad():
                states, logits = self.model.forward_states(self.x[start:stop])
            chunk = _Chunk(list(states), logits)
        self._chunks[index] = chunk  # the most recently used, last
        reuse = any_scale and chunk.bp is not None and chunk.bp_over >= min(stop, bp_over or 0)
        if bp_over is not None and chunk.bp_over != bp_over and not reuse:
            # Within one chunk: one pass over its first bp_over samples (as before chunking);
            # across chunks: each chunk's mean rescaled to the mean over bp_over.
            stop = min(stop, bp_over)
            grads = bp_state_gradients(self.model, self.x[start:stop], self.y[start:stop])
            if stop - start != bp_over:
                grads = [g * ((stop - start) / bp_over) for g in grads]
            chunk.bp, chunk.bp_over = grads, bp_over
        return chunk


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (AttributeError, OSError):  # not glibc (macOS, musl): nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> None:
    """Hand the memory glibc's allocator keeps after frees back to the OS.

    ρ's forwards on token states free tensors of many sizes between 1 and 20 MB; glibc
    keeps them in its heap, fragmented, and on ViT-Mini at the README's size the resident
    memory grew by 10–20 MB per sample of ρ (past 10 GB in 15 minutes) while the live
    tensors stayed under 2 GB. Trimming every few seconds keeps it flat at what is live.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class StageProgress:
    """Progress of one end-of-run stage: ``update(done)`` says ``"{stage}: done/total
    samples, … elapsed, ETA …"`` at most once per :data:`PROGRESS_SECONDS`, and hands
    freed memory back to the OS (:func:`release_freed_memory`) at most once per
    :data:`TRIM_SECONDS` — rarely enough that the allocator's warm pages, which spare each
    forward its page faults, stay in use. The clock only paces these lines and trims: it
    never decides what is computed.
    """

    def __init__(self, say: Say | None, stage: str, total: int, *,
                 clock: Clock = time.perf_counter) -> None:
        self.say, self.stage, self.total = say, stage, total
        self.clock = clock
        self.started = self.last = self.trimmed = clock()

    def update(self, done: int, now: float) -> None:
        if now - self.trimmed >= TRIM_SECONDS:
            self.trimmed = now
            release_freed_memory()
        if self.say is None or done >= self.total or now - self.last < PROGRESS_SECONDS:
            return
        self.last = now
        elapsed = now - self.started
        eta = elapsed / done * (self.total - done) if done else None
        self.say(f"{self.stage}: {done}/{self.total} samples, {duration(elapsed)} elapsed, "
                 f"ETA {duration(eta)}")


def _unit_directions(b: int, m: int, shape: tuple[int, ...], *, generator: torch.Generator,
                     dtype: torch.dtype, device: torch.device) -> Tensor:
    """(b, m, D) unit directions, D = prod(shape), from a CPU generator (reproducible on
    any device). Drawn in float32 — a third of float64's cost on the CPU — then cast: a
    direction only has to be uniformly random on the sphere, not float64-exact."""
    v = torch.randn((b, m, math.prod(shape)), generator=generator, dtype=torch.float32)
    v = v.to(device=device, dtype=dtype)
    return v / torch.linalg.vector_norm(v, dim=2, keepdim=True)


def _directions(shapes: Sequence[tuple[int, ...]], b: int, m: int, *,
                generator: torch.Generator, dtype: torch.dtype, device: torch.device
                ) -> dict[tuple[int, ...], Tensor]:
    """One draw per distinct state shape, in layer order: every layer of a shape shares it."""
    out: dict[tuple[int, ...], Tensor] = {}
    for shape in shapes:
        if shape not in out:
            out[shape] = _unit_directions(b, m, shape, generator=generator, dtype=dtype,
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
    :class:`RhoBudget` that decided it (None without ``budget_flops``). ``bp`` is the positive
    control (credit = exact g_l, computed on the working-dtype copy), ``random`` the
    negative control (Gaussian credit from a generator seeded ``seed + 1``), and
    ``measurable[l]`` is True when ``bp[l] >= 0.9`` — below that no ρ on this model means
    anything. Directions are the same for all three credits (a paired comparison).
    ``dtype=None`` runs the caller's model as it is (in eval mode) instead of a copy.
    ``working``: a :class:`WorkingCopy` of ``model`` on ``x`` to reuse (``dtype`` and
    ``memory_bytes`` are then ignored); else one is planned for ``memory_bytes``.

    ``budget_flops``: ρ's compute budget in floating-point operations (None: none). ρ then
    uses the first ``samples`` = ⌊budget_flops / :func:`rho_sample_flops`⌋ samples (at
    least :data:`MIN_RHO_SAMPLES`, at most ``n_samples``), decided before any forward, and
    every value is exactly what ``n_samples=samples`` gives. ``progress`` (e.g. ``print``)
    gets a line with the samples done and the ETA at most every :data:`PROGRESS_SECONDS`;
    ``clock`` paces those lines only.
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
        # pass with n_samples = used draws it; its directions are drawn again.
        like = w.part(0, min(1, used)).states[layers[0]]
        noise_gen = torch.Generator().manual_seed(seed + 1)
        noise = {layer: torch.randn((used, *perturbed.shapes[layer]), generator=noise_gen,
                                    dtype=like.dtype).to(like.device) for layer in layers}
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
            out["measurable"].append(bool(bp >= MEASURABLE_BP_RHO))
    return out
