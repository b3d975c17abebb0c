"""Local steps for credits of rank C: a_l = s·B_l for a per-sample C-vector s (DFA, DRTP).

DFA's credit for state l is a_l = e·B_l (e the (B, C) output error, B_l a fixed (C, d)
matrix), and the local surrogate sends â_l/B = diag(c_l)·e·B_l into the module that writes
state l, c_l the per-sample normalisation 1/((RMS(a_l) + 1e-6)·B). Every row of that
gradient lies in the C-dimensional row space of B_l, so for a module whose output is a
Linear's, y = u·Wᵀ + b with U_l = diag(c_l)·e (B × C):

    ∂W = (U_l B_l)ᵀ u = B_lᵀ (U_lᵀ u)      ∂b = B_lᵀ (U_lᵀ 1)      ∂u = U_l (B_l W)

— products of width C instead of d. Autograd computes exactly these when it backpropagates
U_l from the *projected* output p_l = y·B_lᵀ = F.linear(u, B_l·W, B_l·b) (B × C), so the
step builds p_l with a graph and computes y's value without one. ⟨y, U_l B_l⟩ = ⟨p_l, U_l⟩,
so the surrogate and every parameter update are those of :func:`~.surrogate.local_backward`, to
rounding. On the ResidualMLP this skips the embedding's B×n×d weight product and two of
each block's three remaining d-wide backward products (benchmarks/step_flops.py).

Which modules take this route: the embedding when it is one ``nn.Linear``, and every block
whose branch ends in one Linear (an ``nn.Sequential`` ending in one, or a block with
``hidden`` and ``output_layer``: :func:`~creditaudit.models.contract.split_branch`). A block
whose branch is skip + last(u) (a transformer block's attention output and MLP) sends the
dense credit into the skip and U_l into the projected last layer; autograd adds both where
they meet. Any other trainable module gets the dense credit as before; frozen ones get
nothing. The per-sample
normalisation needs ‖a_l‖ only, which the C×C Gram matrix B_l B_lᵀ gives without forming
a_l: ‖s B_l‖² = s (B_l B_lᵀ) sᵀ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.surrogate import RMS_EPS, state_credit_shape
from creditaudit.models.contract import ResidualNet, block_is_trainable, split_branch

_projection_enabled = True


@contextlib.contextmanager
def dense_route() -> Iterator[None]:
    """Within the block, :func:`projected_forward` projects nothing: every trainable module
    takes the dense credit (the step before the projected route; for references in tests
    and the "before" timings of benchmarks)."""
    global _projection_enabled
    previous, _projection_enabled = _projection_enabled, False
    try:
        yield
    finally:
        _projection_enabled = previous


@dataclass
class Writer:
    """What the credit of one state enters: the module that writes the state.

    ``output``: the projected output p_l = y_l·B_lᵀ (B, [T,] C) where ``projected``, else
    the module output y_l itself (shape of h_l), with a graph to that module's parameters
    only; None when the module is frozen. ``skip``: a projected block's inner skip
    (f = skip + last(u), e.g. a transformer block's attention output), which takes the
    dense credit. ``branch``: a projected block's f_l(h_l) with a graph, kept only when a
    penalty needs it (a dense block's penalty enters through ``output``).
    """

    output: Tensor | None = None
    projected: bool = False
    skip: Tensor | None = None
    branch: Tensor | None = None


@dataclass
class ProjectedPass:
    """One forward pass of a local step whose credits are C-vectors times fixed matrices.

    ``writers[l]`` is the :class:`Writer` of state l (embedding, then the blocks);
    ``states`` the detached h_0 … h_L; ``logits`` the readout on the detached h_L (graph to
    the readout's parameters only).
    """

    writers: list[Writer]
    states: list[Tensor]
    logits: Tensor

    @property
    def outputs(self) -> list[Tensor | None]:
        return [w.output for w in self.writers]

    @property
    def projected(self) -> list[bool]:
        return [w.projected for w in self.writers]

    @property
    def skips(self) -> list[Tensor | None]:
        return [w.skip for w in self.writers]


def projected_linear(u: Tensor, layer: nn.Linear, feedback: Tensor) -> Tensor:
    """p = layer(u)·Bᵀ as F.linear(u, B·W, B·b): (…, in) → (…, C), graph to W and b.

    ``feedback`` B is (C, out); it is cast to the layer's dtype and never trained.
    """
    b = feedback.to(device=layer.weight.device, dtype=layer.weight.dtype)
    bias = None if layer.bias is None else b @ layer.bias
    return F.linear(u, b @ layer.weight, bias)


def projected_forward(model: ResidualNet, x: Tensor, feedback: Sequence[Tensor], *,
                      keep_branches: bool) -> ProjectedPass:
    """The forward pass of :class:`ProjectedPass`; ``feedback[l]`` is B_l, (C, d).

    Values are those of :func:`~creditaudit.methods.surrogate.local_forward`: every block input
    detached, the next state from the detached branch output.
    """
    embed = model.embed
    if not block_is_trainable(embed):
        with torch.no_grad():
            h = embed(x)
        writers = [Writer()]
    elif _projection_enabled and isinstance(embed, nn.Linear) and x.dim() in (2, 3):
        with torch.no_grad():
            h = embed(x)
        writers = [Writer(projected_linear(x, embed, feedback[0]), projected=True)]
    else:
        h0 = embed(x)
        writers = [Writer(h0)]
        h = h0.detach()
    states = [h]
    for index, block in enumerate(model.blocks):
        # A Linear acts on the last axis: (B, d) vectors and (B, T, d) tokens, not the
        # contract's (B, d, H, W) feature maps.
        split = split_branch(block) if _projection_enabled and h.dim() in (2, 3) else None
        if not block_is_trainable(block):
            with torch.no_grad():
                f = block(h)
            writers.append(Writer())
        elif split is None:
            f = block(h)
            writers.append(Writer(f))  # its penalty goes in with its credit
        else:
            hidden, last = split
            u, skip = _hidden_and_skip(hidden(h))
            with contextlib.nullcontext() if keep_branches else torch.no_grad():
                f = last(u) if skip is None else skip + last(u)
            writers.append(Writer(projected_linear(u, last, feedback[index + 1]),
                                  projected=True, skip=skip,
                                  branch=f if keep_branches else None))
        h = model.next_state(h, f.detach())
        states.append(h)
    return ProjectedPass(writers=writers, states=states, logits=model.readout(h))


def _hidden_and_skip(hidden: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    """``hidden(h)``'s u and inner skip (None when it returns u alone)."""
    if isinstance(hidden, tuple):
        u, skip = hidden
        return u, skip
    return hidden, None


def credit_scales(signal: Tensor, feedback: Sequence[Tensor], batch: int, *,
                  normalise: bool) -> Tensor:
    """(L+1, B) factors c_l with â_l/B = c_l·(signal·B_l) per sample.

    1/((RMS(signal·B_l) + 1e-6)·B), RMS over B_l's d columns (the RMS over a token state's
    T·d entries when the credit is broadcast over its tokens), or 1/B with
    ``normalise=False``. ``signal`` (B, C) in fp32 or float64; computed in its dtype even
    under autocast.
    """
    if not normalise:
        return signal.new_full((len(feedback), signal.shape[0]), 1.0 / batch)
    with torch.autocast(signal.device.type, enabled=False):
        stacked = torch.stack(list(feedback)).to(device=signal.device, dtype=signal.dtype)
        gram = stacked @ stacked.mT  # (L+1, C, C)
        squared = ((signal @ gram) * signal).sum(dim=2)  # (L+1, B): ‖signal·B_l‖²
        rms = (squared.clamp_min(0.0) / stacked.shape[2]).sqrt()
        return 1.0 / ((rms + RMS_EPS) * batch)


def projected_backward(local: ProjectedPass, ce: Tensor, signal: Tensor, scales: Tensor,
                       feedback: Sequence[Tensor], penalty: float) -> None:
    """Accumulate every module's local update into ``.grad`` in one backward pass.

    A projected output gets U_l = c_l·signal (B, C); a dense output and an inner skip get
    the credit gradient U_l·B_l (:func:`~creditaudit.methods.surrogate.local_backward`'s â_l/B);
    block branches also get the penalty's 2λ·f_l/B, the readout its cross-entropy.
    """
    batch = signal.shape[0]
    outputs, grads = [ce], [torch.ones_like(ce)]

    def add(out: Tensor, grad: Tensor) -> None:
        outputs.append(out)
        grads.append(state_credit_shape(grad, out).to(out.dtype))

    for index, writer in enumerate(local.writers):
        out = writer.output
        if out is None:
            continue
        u = signal * scales[index].unsqueeze(1)
        dense = None if writer.projected and writer.skip is None else (
            u @ feedback[index].to(u))  # â_l/B, (B, d)
        if writer.skip is not None:
            add(writer.skip, dense)
        if writer.projected:
            add(out, u)
            if writer.branch is not None:  # the penalty, on f_l itself
                add(writer.branch, writer.branch.detach() * (2.0 * penalty / batch))
        elif index > 0 and penalty > 0:
            add(out, torch.add(state_credit_shape(dense, out), out.detach(),
                               alpha=2.0 * penalty / batch))
        else:
            add(out, dense)
    torch.autograd.backward(outputs, grads)
