"""How much memory a bound rule holds besides its model: what a run plan adds to the model's
own training memory before it decides whether a run fits on this machine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor

from creditaudit.methods.base import CreditRule

# What each parameter an auxiliary optimiser trains adds beside its value (counted with the
# rule's state): a gradient and AdamW's two moments.
TRAINED_COPIES = 3


def _tensors(state: Any) -> Iterator[Tensor]:
    """Every tensor in a (nested) state dict."""
    if isinstance(state, Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _tensors(value)


def rule_bytes(rule: CreditRule[Any]) -> int:
    """Bytes the rule holds of its own while it trains: every tensor of its ``state_dict``
    (feedback matrices, auxiliary nets and their EMA targets, local classifiers: what a
    checkpoint saves of it) plus a gradient and two AdamW moments for every parameter its
    own optimisers (:meth:`CreditRule.optimizers`) train. Works on a rule bound on the
    meta device (sizes only)."""
    held = sum(t.numel() * t.element_size() for t in _tensors(rule.state_dict()))
    trained = sum(p.numel() * p.element_size() for optimizer in rule.optimizers().values()
                  for group in optimizer.param_groups for p in group["params"])
    return held + TRAINED_COPIES * trained


__all__ = ["rule_bytes"]
