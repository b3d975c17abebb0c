"""The working copy ρ and nudging perturb, and its pass over the samples under a memory cap.

The end-of-run measures run on a float64 *copy* of the model
(:func:`~creditaudit.measures.model_copies.model_copy`, the copy the reference check runs
on too; the caller's model is never changed). Its pass over the samples — states h_l, logits and BP
gradients g_l — runs in chunks, and the perturbed forwards in slices of rows, each sized so
that what autograd saves for it stays under ``memory_bytes``: :func:`measure_footprint`
measures the model's bytes per sample on a few samples (:class:`Footprint`), and
:meth:`WorkingCopy.planned` sizes the chunks from it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.errors import CreditAuditError, ModelContractError
from creditaudit.guests.blame import out_of_memory
from creditaudit.measures.gradients import StatesFn
from creditaudit.measures.model_copies import KEEP_DTYPE, model_copy
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.models.contract import ResidualNet

DEFAULT_MEMORY_GB = 2.0
PROBE_SAMPLES = (2, 4)


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


def _cast_input(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.to(dtype) if x.is_floating_point() else x


@contextlib.contextmanager
def copy_runs(model: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Run the block, the first forward of ``model``'s copy in ``dtype`` (None: the model
    itself); a one-line ModelContractError naming the network when that copy's forward
    fails where the model's own ran — a forward that casts to its own dtype (``x.float()``
    on float64 weights) — instead of torch's error from deep inside it."""
    try:
        yield
    except Exception as err:
        if dtype is None or isinstance(err, CreditAuditError) or out_of_memory(err):
            raise
        kind = str(dtype).removeprefix("torch.")
        raise ModelContractError(
            f"the end-of-run metrics (ρ, nudging) run a {kind} copy of "
            f"{type(getattr(model, 'net', model)).__name__}, and its forward fails there "
            f"({type(err).__name__}: {' '.join(str(err).split())}): {KEEP_DTYPE}, or leave "
            "the end-of-run metrics out (diagnostics.end_of_run=false; diagnose(…, "
            "metrics=False))") from None


def check_copy_runs(model: nn.Module, x: Tensor, dtype: torch.dtype = torch.float64) -> None:
    """:func:`copy_runs` ahead of time, on one sample of ``x`` ``(N, …)``: for a caller that
    would otherwise find out only after training (a Recorder's ``finish()``). Under a
    forked RNG, on a copy: the model and every random stream are left as they were. Outside
    the caller's ``torch.inference_mode()``, as the end-of-run metrics run: a copy made
    inside it holds inference tensors, whose forward fails for want of a version counter,
    which read as the network's own dtype fault."""
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), copy_runs(model, dtype), \
            torch.inference_mode(False), torch.no_grad():
        model_copy(model, dtype).forward_states(_cast_input(x[:1], dtype))


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
        with copy_runs(model, dtype):  # the copy's first forward
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
        grads = ([joined(lambda c, l=l: c.bp[l]) for l in range(n_states)]
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
