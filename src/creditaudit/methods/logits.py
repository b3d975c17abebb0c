"""The logits a training step computes its loss on must be ``(batch, n_classes)``.

A network (a plugin's architecture, a factory's) can pass the door's check on its tiny batch
and return logits of another shape for another batch size — a class too many, half the
rows. Cross-entropy then either trains on a class the data do not have, silently, or raises
deep in torch as creditaudit's own error. Every training path checks the shape where it
computes the loss (a comparison of two shapes: nothing is read from the device) and names
the network's guest when it is wrong.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from creditaudit.errors import GuestError, ModelContractError
from creditaudit.guests.blame import VALUE_ADVICE
from creditaudit.registry import ARCHITECTURES


def checked_logits(model: Any, logits: Tensor, y: Tensor) -> Tensor:
    """``logits`` when shaped ``(*y.shape, n_classes)`` — (B, C) for labels (B,), (K, B, C)
    for a stack's (K, B) — with ``n_classes`` the model's; else one line naming the network
    (GuestError for a guest's, ModelContractError otherwise)."""
    n_classes = getattr(model, "n_classes", None)
    shape = logits.shape
    if shape[:-1] == y.shape and len(shape) == y.dim() + 1 and (
            not isinstance(n_classes, int) or shape[-1] == n_classes):
        return logits
    classes = f" of {n_classes} classes" if isinstance(n_classes, int) else ""
    want = (*y.shape, n_classes if isinstance(n_classes, int) else "C")
    problem = (f"returned logits of shape {tuple(shape)} for a batch of {y.shape[-1]} "
               f"samples{classes}, not {tuple(want)}")
    guest = built_by(model)
    if guest is not None:
        raise GuestError(f"{guest}: its network {problem}; {VALUE_ADVICE}")
    raise ModelContractError(f"the network {type(model).__name__} {problem}: its readout must "
                             "return one row of n_classes logits per sample")


def built_by(model: Any) -> str | None:
    """How messages name the guest that built ``model`` (an adapted network's ``origin``, a
    plugin architecture), None for creditaudit's own."""
    origin = getattr(model, "origin", None)
    if isinstance(origin, str):
        return origin
    architecture = getattr(model, "architecture", None)
    name = getattr(architecture, "name", None)
    guest = ARCHITECTURES.guest(name) if isinstance(name, str) else None
    return guest.what if guest is not None else None


__all__ = ["checked_logits", "built_by"]
