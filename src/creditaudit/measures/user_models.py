"""Auditing a user's own network: checks of what ``diagnose()`` is given.

A user's ``nn.Module`` needs two functions beside it:

- ``states_fn(x) -> ([h_0, …, h_L], logits)``: the states to audit, in the autograd graph;
- ``forward_from(layer, h) -> logits``: the network run on from state ``h`` at ``layer``
  (blocks ``layer … L−1`` and the head) — only for ρ and nudging, which move a state and
  watch the loss respond.

Each check raises a one-line :class:`~creditaudit.errors.ModelContractError` that names the
argument at fault, on a two-sample probe before any real work. The module the reference
check and the metrics run the two functions on is
:class:`~creditaudit.measures.model_copies.StatesNet`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.measures.gradients import StatesFn
from creditaudit.models.adapt_probe import REPRODUCE_RTOL
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet

ForwardFrom = Callable[[int, Tensor], Tensor]
CreditFn = Callable[[Tensor, Tensor], Sequence[Tensor]]
PROBE = 2  # samples the checks run on


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_inputs(model: nn.Module, eval_x: Any, eval_y: Any) -> None:
    """What every boundary of the Python API (``diagnose``, ``Recorder``) asks of the
    evaluation set: ``eval_x`` a tensor of N ≥ 1 finite inputs of the shape and dtype the
    model takes — as an adapted model was probed (``input_shape``, and its parameters' dtype
    for floating inputs) or a built contract model declares (``input_shape``) — and
    ``eval_y`` (N,) integer labels (:func:`check_labels`), neither made inside
    ``torch.inference_mode()`` (:func:`check_not_inference`). One-line ModelContractError
    (ConfigError for an inference tensor) otherwise, before any of it reaches the model."""
    if not isinstance(eval_x, Tensor):
        raise ModelContractError(f"eval_x must be a tensor of model inputs (N, …), got "
                                 f"{type(eval_x).__name__}")
    if eval_x.dim() < 1 or eval_x.shape[0] == 0:
        raise ModelContractError(f"eval_x holds no samples (shape {tuple(eval_x.shape)}): pass "
                                 "N ≥ 1 inputs (N ≥ 1024 for diagnostic (c))")
    shape, floating = _model_inputs(model)
    if shape and tuple(eval_x.shape) == shape:  # before the labels, which it would blame
        raise ModelContractError(f"eval_x is one sample of shape {shape}, not a batch: pass "
                                 f"inputs (N, {', '.join(map(str, shape))}), the batch first "
                                 "(one sample: eval_x.unsqueeze(0))")
    if shape and tuple(eval_x.shape[1:]) != shape:
        raise ModelContractError(f"eval_x holds samples of shape {tuple(eval_x.shape[1:])} but "
                                 f"the model takes {shape}: pass inputs as the model reads "
                                 "them (flattened or not, as it was built or adapted)")
    check_labels(eval_x, eval_y)
    check_not_inference(eval_x, eval_y)
    reference = next((p for p in model.parameters() if p.is_floating_point()), None)
    if floating and not eval_x.is_floating_point() and reference is not None:
        raise ModelContractError(f"eval_x is {dtype_name(eval_x.dtype)} but the model takes "
                                 f"{dtype_name(reference.dtype)} inputs: pass "
                                 f"eval_x.to(torch.{dtype_name(reference.dtype)})")
    probed = model.input_dtype if isinstance(model, AdaptedModel) else None
    if probed is not None and not probed.is_floating_point and eval_x.is_floating_point():
        raise ModelContractError(f"eval_x is {dtype_name(eval_x.dtype)} but the model takes "
                                 f"{dtype_name(probed)} inputs (as adapt() probed it: token "
                                 f"ids or other indices): pass eval_x.to(torch."
                                 f"{dtype_name(probed)})")
    if probed is not None and not probed.is_floating_point and not eval_x.is_floating_point():
        check_token_ids(model, eval_x)
    if eval_x.is_floating_point() and reference is not None \
            and eval_x.dtype != reference.dtype:
        raise ModelContractError(f"eval_x is {dtype_name(eval_x.dtype)} but the model's "
                                 f"parameters are {dtype_name(reference.dtype)}: pass "
                                 f"eval_x.to(torch.{dtype_name(reference.dtype)})")
    if eval_x.is_floating_point() and not bool(torch.isfinite(eval_x).all()):
        raise ModelContractError("eval_x holds NaN/Inf: the diagnostics need finite inputs")


def check_not_inference(eval_x: Tensor, eval_y: Tensor) -> None:
    """One-line ConfigError for an evaluation tensor made inside ``torch.inference_mode()``:
    autograd refuses to save one for the backward every diagnostic takes (torch's own
    RuntimeError from deep inside the first state gradient otherwise)."""
    for name, tensor in (("eval_x", eval_x), ("eval_y", eval_y)):
        if tensor.is_inference():
            raise ConfigError(f"{name} was made inside torch.inference_mode(), and autograd "
                              f"cannot take gradients through such a tensor: pass "
                              f"{name}.clone() made outside inference mode (or make it under "
                              "torch.no_grad() instead)")


def check_same_device(model: nn.Module, eval_x: Tensor, eval_y: Tensor) -> None:
    """One-line ConfigError unless ``eval_x`` and ``eval_y`` are on the device of ``model``'s
    (first) parameters: on another, the first forward fails with torch's device error."""
    device = next((p.device for p in model.parameters()), eval_x.device)
    if eval_x.device != device or eval_y.device != device:
        raise ConfigError(f"eval_x and eval_y are on {eval_x.device} and {eval_y.device} "
                          f"but the model is on {device}: move them with .to({str(device)!r})")


def check_token_ids(model: AdaptedModel, eval_x: Tensor) -> None:
    """Integer ``eval_x`` (N, …) for a model adapt() probed with integer inputs: when the
    probe's forward called embeddings (``nn.Embedding``/``nn.EmbeddingBag``), every id must
    be ≥ 0 and below the largest one's rows — an id past every embedding is past the one
    that reads it (which one that is, is not known: an id between the sizes of a token and
    a position embedding passes). One-line ModelContractError otherwise, instead of the
    embedding's bare IndexError (a device-side assert on CUDA)."""
    called = model.probe_calls
    tables = [(name, int(module.num_embeddings)) for name, module in model.net.named_modules()
              if isinstance(module, nn.Embedding | nn.EmbeddingBag)
              and (called is None or name in called)]
    if not tables or eval_x.is_meta or eval_x.dtype == torch.bool:
        return
    name, rows = max(tables, key=lambda table: table[1])
    low, high = int(eval_x.min()), int(eval_x.max())
    if low < 0 or high >= rows:
        which = f"embedding {name!r}" if len(tables) == 1 else f"largest embedding {name!r}"
        raise ModelContractError(
            f"eval_x holds token id {low if low < 0 else high}, but the model's {which} has "
            f"{rows} rows: token ids must be 0 … {rows - 1}; pass ids of the model's "
            "vocabulary (as the inputs adapt() probed it with)")


def _model_inputs(model: nn.Module) -> tuple[tuple[int, ...] | None, bool]:
    """(one input's shape as the model takes it, or None when it does not say; whether its
    inputs are floating)."""
    if isinstance(model, AdaptedModel):
        return tuple(model.input_shape), model.input_dtype.is_floating_point
    if isinstance(model, ResidualNet):
        return (tuple(model.input_shape) or None), False
    return None, False


def check_labels(eval_x: Tensor, eval_y: Tensor) -> None:
    """``eval_y``: ``(N,)`` int64 class labels for the N inputs."""
    if not isinstance(eval_y, Tensor):
        raise ModelContractError(f"eval_y must be a tensor of integer class labels, got "
                                 f"{type(eval_y).__name__}")
    if eval_y.is_floating_point() or eval_y.is_complex() or eval_y.dtype == torch.bool:
        raise ModelContractError(f"eval_y must hold integer class labels, got "
                                 f"{dtype_name(eval_y.dtype)}: pass eval_y.long() (class "
                                 "indices, not one-hot rows or probabilities)")
    if eval_y.dtype != torch.long:  # cross-entropy and the output error index with int64
        raise ModelContractError(f"eval_y is {dtype_name(eval_y.dtype)}, but class labels are "
                                 "int64 (what cross-entropy takes): pass eval_y.long()")
    if eval_y.dim() != 1 or eval_y.shape[0] != eval_x.shape[0]:
        raise ModelContractError(f"eval_y must be ({eval_x.shape[0]},) labels for the "
                                 f"{eval_x.shape[0]} inputs, got shape {tuple(eval_y.shape)}")


def probe_states(states_fn: StatesFn, x: Tensor, y: Tensor
                 ) -> tuple[list[Tensor], Tensor]:
    """Run ``states_fn`` on the first samples and check what it returns: a list of states,
    each ``(B, …)`` and in the autograd graph, and ``(B, C)`` logits with every label of
    ``y`` below C. Returns (states, logits) of the probe."""
    xb = x[:PROBE]
    with torch.enable_grad():
        out = states_fn(xb)
    if not (isinstance(out, tuple | list) and len(out) == 2
            and isinstance(out[0], list | tuple) and isinstance(out[1], Tensor)):
        raise ModelContractError(f"states_fn must return ([h_0, …, h_L], logits), got "
                                 f"{_describe(out)}")
    states, logits = list(out[0]), out[1]
    if len(states) < 2 or not all(isinstance(h, Tensor) for h in states):
        raise ModelContractError(f"states_fn must return at least two state tensors "
                                 f"[h_0, …, h_L], got {_describe(out[0])}")
    for index, h in enumerate(states):
        if h.shape[0] != xb.shape[0]:
            raise ModelContractError(f"states_fn returned h_{index} of shape {tuple(h.shape)} "
                                     f"for {xb.shape[0]} inputs: states need the batch "
                                     "dimension first")
        if not h.requires_grad:
            raise ModelContractError(
                f"states_fn returned states without a graph (detached): h_{index} does not "
                "require grad; return the states of the forward pass itself (no .detach(), "
                "no torch.no_grad(), parameters with requires_grad=True)")
    if logits.dim() != 2 or logits.shape[0] != xb.shape[0]:
        raise ModelContractError(f"states_fn must return logits of shape (batch, classes), "
                                 f"got {tuple(logits.shape)}")
    check_states_reach_logits(states, logits)
    if logits.is_floating_point() and not bool(torch.isfinite(logits).all()):
        raise ModelContractError("states_fn gives NaN/Inf logits on the first evaluation "
                                 "samples (finite inputs): the model's weights hold NaN/Inf or "
                                 "an operation overflows")
    n_classes = logits.shape[1]
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= n_classes:
        raise ModelContractError(f"eval_y holds labels {low} … {high} but the model has "
                                 f"{n_classes} logits: labels must be class indices "
                                 f"0 … {n_classes - 1}")
    return states, logits


def check_states_reach_logits(states: list[Tensor], logits: Tensor) -> None:
    """Every state must be a tensor the logits are computed from: a copy (``h.clone()``,
    ``h.float()``, ``h.to(device)``) is in a graph but no gradient of the loss reaches it,
    and (b) would fire on its zero gradients, blaming the network's weights. Read from the
    autograd graph's nodes (no backward runs: the model's own is checked later)."""
    if not logits.requires_grad:
        raise ModelContractError(
            "states_fn returned logits without a graph (detached): return the logits of the "
            "forward pass itself (no .detach(), no torch.no_grad())")
    nodes, leaves = _graph_below(logits.grad_fn)
    for index, h in enumerate(states):
        if (id(h) not in leaves) if h.grad_fn is None else (h.grad_fn not in nodes):
            raise ModelContractError(
                f"states_fn returned h_{index}, which the logits are not computed from (a "
                "copy such as h.clone(), h.float() or h.to(device)?): return the tensors the "
                "forward pass itself computes the logits from")


def _graph_below(root: Any) -> tuple[set[Any], set[int]]:
    """(the autograd nodes the node ``root`` is computed from, itself included; the ids of
    the leaf tensors it accumulates into)."""
    nodes: set[Any] = set()
    leaves: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf tensor
        if isinstance(variable, Tensor):
            leaves.add(id(variable))
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes, leaves


def check_forward_from(forward_from: ForwardFrom, states: list[Tensor], logits: Tensor
                       ) -> None:
    """``forward_from(l, h_l)`` must reproduce the logits of the probe at every layer."""
    scale = float(logits.detach().abs().max()) + 1.0
    with torch.no_grad():
        for layer, h in enumerate(states):
            try:
                out = forward_from(layer, h.detach())
            except Exception as err:  # noqa: BLE001 — the user's function: say which call
                raise ModelContractError(
                    f"forward_from({layer}, h_{layer}) raised {type(err).__name__}: "
                    f"{' '.join(str(err).split())}") from None
            if not isinstance(out, Tensor) or out.shape != logits.shape:
                raise ModelContractError(
                    f"forward_from({layer}, h_{layer}) must return logits of shape "
                    f"{tuple(logits.shape)}, got {_describe(out)}")
            gap = float((out.detach().double() - logits.detach().double()).abs().max())
            if not gap <= REPRODUCE_RTOL * scale:
                raise ModelContractError(
                    f"forward_from({layer}, h_{layer}) does not reproduce the logits of "
                    f"states_fn (max difference {gap:.3g}): forward_from(layer, h) must run "
                    "the network on from state h_layer (blocks layer … L-1, then the head)")


def check_credits(credit: CreditFn, x: Tensor, y: Tensor, states: list[Tensor]) -> None:
    """A credit function must return one tensor per state, shaped like the state and on
    its device (a credit moved to the CPU met the GPU's gradients in torch's own error)."""
    check_credit_output(credit(x[:PROBE], y[:PROBE]), [(h.shape, h.device) for h in states])


def check_credit_output(out: Any, states: Sequence[tuple[tuple[int, ...], torch.device]],
                        *, batch: str = "") -> None:
    """What a credit function returned must be one tensor per state, of that state's
    ``(shape, device)`` in ``states``; else a one-line ModelContractError naming the credit
    (``batch``: which call it was, when not the two-sample probe)."""
    if not isinstance(out, list | tuple) or len(out) != len(states):
        raise ModelContractError(f"credit(x, y){batch} must return {len(states)} tensors "
                                 f"[a_0, …, a_{len(states) - 1}], one per state, got "
                                 f"{_describe(out)}")
    for index, (a, (shape, device)) in enumerate(zip(out, states)):
        if not isinstance(a, Tensor) or a.shape != shape:
            raise ModelContractError(f"credit(x, y)[{index}]{batch} must have the shape of "
                                     f"h_{index} {tuple(shape)}, got {_describe(a)}")
        if a.device != device:
            raise ModelContractError(f"credit(x, y)[{index}]{batch} is on {a.device} but "
                                     f"h_{index} is on {device}: return each credit on its "
                                     f"state's device (a.to({str(device)!r}))")


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__
