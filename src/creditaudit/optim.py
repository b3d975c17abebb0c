"""The optimiser every trained part of a run uses: AdamW, fused where torch has the kernel,
and the check of a saved optimiser state against the optimiser it is to be loaded into.

The model's parameters (training loop) and the auxiliary nets the rules train on the side
(the State Bridge's predictor, the Credit Bridge's value net) all take their steps here.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def make_adamw(params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float
               ) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch build has one for the device.

    The fused update is 4–6× faster than torch's per-tensor loop, which is its default on
    the CPU (the optimiser was 20–40% of a training step; docs/benchmarks.md), and
    deterministic, though not bit-identical to the unfused one (differences ~1e-7).
    """
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError):  # e.g. torch < 2.4 has no fused CPU AdamW
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def optimizer_state_mismatch(optimizer: torch.optim.Optimizer, saved: Any, where: str
                             ) -> str | None:
    """What is wrong with ``saved`` (an optimiser ``state_dict``, read from a file) as the
    state of ``optimizer``, or None when it fits: its groups must list as many parameters as
    ``optimizer``'s; each parameter's state tensors must have that parameter's shape and a
    floating dtype (per-parameter moments such as AdamW's ``exp_avg``), its ``step`` a
    scalar; one group's states must hold the same entries.

    ``Optimizer.load_state_dict`` checks none of this (an optimiser's state is empty before
    its first step, so there is nothing to compare a layout with): a moment of another shape
    is loaded as it is and crashes the fused kernel, or — transposed — trains on silently.
    ``where`` names ``saved`` in the message (e.g. ``"optimizer"``).
    """
    if not (isinstance(saved, Mapping) and isinstance(saved.get("state"), Mapping)
            and isinstance(saved.get("param_groups"), list | tuple)):
        return f"{where} is not an optimiser state (no 'state' and 'param_groups')"
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return (f"{where} has {len(groups)} parameter groups, expected "
                f"{len(optimizer.param_groups)}")
    params: dict[Any, tuple[int, torch.Tensor]] = {}
    for index, (group, live) in enumerate(zip(groups, optimizer.param_groups)):
        ids = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(ids, list | tuple) or len(ids) != len(live["params"]):
            return (f"{where}.param_groups[{index}] does not list its "
                    f"{len(live['params'])} parameters")
        params.update((key, (index, param)) for key, param in zip(ids, live["params"]))
    entries: dict[int, set[str]] = {}  # the entries of each group's states, together
    for key, state in saved["state"].items():
        if key not in params:
            return f"{where}.state[{key!r}] is the state of no parameter of this run"
        if not isinstance(state, Mapping):
            return f"{where}.state[{key!r}] is not a dict"
        entries.setdefault(params[key][0], set()).update(state)
    for key, state in saved["state"].items():
        group, param = params[key]
        lacking = sorted(entries[group] - set(state))
        if lacking:
            return (f"{where}.state[{key!r}] lacks {lacking[0]!r}, which other parameters' "
                    "states hold")
        for name, value in state.items():
            problem = _state_value_mismatch(name, value, param)
            if problem:
                return f"{where}.state[{key!r}].{name} {problem}"
    return None


def _state_value_mismatch(name: str, value: Any, param: torch.Tensor) -> str | None:
    """What is wrong with one entry of a parameter's optimiser state, or None."""
    if name == "step":  # a count: a 0-d tensor in torch ≥ 1.12, a number before
        if isinstance(value, torch.Tensor):
            if value.ndim != 0 or not value.is_floating_point():
                return (f"is a {value.dtype} tensor of shape {tuple(value.shape)}, not a "
                        "floating scalar")
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return f"is a {type(value).__name__}, not a number"
        return None
    if not isinstance(value, torch.Tensor):
        return None  # options kept per parameter are not tensors of its shape
    if tuple(value.shape) != tuple(param.shape):
        return f"has shape {tuple(value.shape)}, its parameter {tuple(param.shape)}"
    if not value.is_floating_point():
        return f"is a {value.dtype} tensor, not floating"
    return None
