"""What a bound rule holds besides its model: how much memory (what a run plan adds to the
model's own training memory before it decides whether a run fits on this machine), and which
of the parts it trains itself holds NaN/Inf (what a run names when its credits are not
finite)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor

from creditaudit.methods.base import CreditRule, all_finite

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


def nonfinite_part(rule: CreditRule[Any]) -> str | None:
    """``its value net V_φ holds NaN/Inf (method.bridge_lr=1e+30, …)``: the first of the
    rule's own parts (:attr:`CreditRule.own_parts`) whose floating tensors hold NaN/Inf, and
    the settings of the options that drive it; None when every part is finite."""
    state = rule.state_dict()
    for key, (what, options) in rule.own_parts.items():
        if all(all_finite(t) for t in _tensors(state.get(key)) if t.is_floating_point()):
            continue
        settings = ", ".join(f"method.{name}={getattr(rule.options, name)!r}"
                             for name in options)
        return f"its {what} holds NaN/Inf (it trains with {settings})"
    return None


__all__ = ["rule_bytes", "nonfinite_part"]
