"""The local surrogate that local credit rules train on, and the per-sample helpers it is
built from.

Local rules train every module with the credit of the state it writes (science.md §4): block
l minimises ⟨f_l(h_l), â_{l+1}⟩ with h_l detached and â the per-sample RMS-normalised credit;
the embedding minimises ⟨h_0, â_0⟩; the readout takes its exact local cross-entropy gradient
on the detached h_L. :func:`local_forward` runs the pass in which no gradient flows between
blocks, :func:`local_objective` writes the surrogate out as one scalar, and
:func:`local_backward` gives every module its update in one backward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.models.contract import ResidualNet, block_is_trainable

RMS_EPS = 1e-6


@dataclass
class LocalPass:
    """One forward pass in which no gradient can flow between blocks.

    ``inputs[l]`` is the detached h_l fed to block l; ``branches[l]`` is f_l(h_l) (with a
    graph to block l's parameters only); ``h0`` keeps its graph to the embedding;
    ``states`` are the detached h_0 … h_L; ``logits`` come from the readout on the detached
    h_L (graph to the readout parameters only).
    """

    h0: Tensor
    branches: list[Tensor | None]
    states: list[Tensor]
    logits: Tensor


def rms_normalise(a: Tensor) -> Tensor:
    """â = a / (RMS(a) + 1e-6) per sample (RMS over every non-batch entry)."""
    rms = a.flatten(1).pow(2).mean(dim=1).sqrt()
    return a / (rms + RMS_EPS).view(-1, *([1] * (a.dim() - 1)))


def per_sample_dot(a: Tensor, b: Tensor) -> Tensor:
    """⟨a_i, b_i⟩ per sample, summed over every non-batch axis (broadcasting b)."""
    return (a * b).flatten(1).sum(dim=1) if a.shape == b.shape else (
        (a * b.expand_as(a)).flatten(1).sum(dim=1))


def branch_penalty(branches: list[Tensor | None]) -> Tensor | float:
    """Σ_l batch-mean ‖f_l(h_l)‖² over the branches that have a graph."""
    total: Tensor | float = 0.0
    for f in branches:
        if f is not None:
            total = total + f.flatten(1).pow(2).sum(dim=1).mean()
    return total


def local_forward(model: ResidualNet, x: Tensor, *, with_readout: bool = True,
                  trains: Sequence[bool] | None = None, embed_grad: bool = True) -> LocalPass:
    """Forward pass with every block input detached (no input gradients are ever asked for).

    Frozen blocks run without a graph; their ``branches`` entry is None. With
    ``with_readout=False`` the caller computes ``logits`` itself (FA needs the readout's
    input gradient). ``trains``: which blocks train (default: asked of their parameters;
    a stacked functional model says it); ``embed_grad=False`` embeds without a graph.
    """
    if embed_grad:
        h0 = model.embed(x)
    else:
        with torch.no_grad():
            h0 = model.embed(x)
    h = h0.detach()
    states = [h]
    branches: list[Tensor | None] = []
    for i, block in enumerate(model.blocks):
        if block_is_trainable(block) if trains is None else trains[i]:
            f = block(h)
            branches.append(f)
            h = model.next_state(h, f.detach())
        else:
            with torch.no_grad():
                h = model.next_state(h, block(h))
            branches.append(None)
        states.append(h)
    logits = model.readout(h) if with_readout else h.new_empty(0)
    return LocalPass(h0=h0, branches=branches, states=states, logits=logits)


def local_objective(model: ResidualNet, local: LocalPass, credits: list[Tensor], y: Tensor,
                    penalty: float) -> tuple[Tensor, Tensor]:
    """(objective to backward, batch-mean CE) for the local surrogate of science.md §4.

    ``credits[l]`` is a_l for state l (detached), shape of h_l or broadcastable to it.
    One backward of the objective gives every module its local update at once. This is the
    surrogate written out as one scalar (the definition, and the reference the tests hold
    :func:`local_backward` to); training steps use :func:`local_backward`, which feeds the
    same gradients to autograd without building the elementwise products.
    """
    ce = F.cross_entropy(local.logits, y)
    objective = ce
    if local.h0.requires_grad:
        objective = objective + per_sample_dot(local.h0, rms_normalise(credits[0])).mean()
    for index, f in enumerate(local.branches):
        if f is not None:
            objective = objective + per_sample_dot(f, rms_normalise(credits[index + 1])).mean()
    if penalty > 0:
        objective = objective + penalty * branch_penalty(local.branches)
    return objective, ce


def credit_gradient(credit: Tensor, batch: int, *, normalise: bool = True) -> Tensor:
    """â / B = a / ((RMS(a) + 1e-6)·B), RMS per row of dim 0 over every other entry.

    This is ∂⟨f, â⟩_batch-mean/∂f, the gradient the surrogate sends into a module's output.
    Rows may be stacked states ``(n·B, …)``: each row is normalised on its own, so one call
    covers every state of a batched credit. ``normalise=False`` gives a / B, the raw credit
    on the batch-mean scale (``method.normalise_credit=false``; the field's usual DFA).
    """
    if not normalise:
        return credit / batch
    rows = credit.flatten(1)
    # one fused norm kernel instead of pow → mean → sqrt over the whole credit
    rms = torch.linalg.vector_norm(rows, dim=1) / rows.shape[1] ** 0.5
    return credit / ((rms + RMS_EPS) * batch).view(-1, *([1] * (credit.dim() - 1)))


def local_backward(local: LocalPass, ce: Tensor, credit_grads: Sequence[Tensor],
                   penalty: float) -> None:
    """Accumulate every module's local update into ``.grad`` in one backward pass.

    ``credit_grads[l]`` is â_l / B for state l (:func:`credit_gradient`), shaped like h_l or
    (B, d) for token states and feature maps (broadcast over the tokens or positions). The
    surrogate is linear in each module output given its credit, so its gradients are known
    without building it:
    ∂/∂h_0 = â_0/B, ∂/∂f_l = â_{l+1}/B + 2λ·f_l/B (the penalty λ·mean_b‖f_l‖²), and the
    readout gets ∂CE. The parameter gradients equal ``local_objective(...)[0].backward()``'s
    to rounding. Frozen blocks have no branch graph, so neither their credit nor their
    penalty reaches anything.
    """
    batch = local.h0.shape[0]
    outputs, grads = [ce], [torch.ones_like(ce)]
    if local.h0.requires_grad:
        outputs.append(local.h0)
        grads.append(state_credit_shape(credit_grads[0], local.h0).to(local.h0.dtype))
    for f, grad in zip(local.branches, credit_grads[1:]):
        if f is None:
            continue
        grad = state_credit_shape(grad, f)
        if penalty > 0:
            grad = torch.add(grad, f.detach(), alpha=2.0 * penalty / batch)
        outputs.append(f)
        grads.append(grad.to(f.dtype))
    torch.autograd.backward(outputs, grads)


def state_credit_shape(credit: Tensor, state: Tensor) -> Tensor:
    """Broadcast a (B, d) credit over the tokens of a (B, T, d) state or the positions of a
    (B, d, H, W) feature map."""
    if credit.dim() == 2 and state.dim() == 3:
        return credit.unsqueeze(1).expand_as(state)
    if credit.dim() == 2 and state.dim() == 4:
        return credit[:, :, None, None].expand_as(state)
    return credit
