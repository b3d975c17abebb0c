"""One number from what a user's loop hands over: a Python or numpy number or a one-element
tensor or array."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from torch import Tensor


def recordable_number(value: Any) -> float | None:
    """``value`` as the float a record holds, when it is a number: a Python or numpy int or
    float, or a one-element tensor (its grad left behind) or numpy array (0-d:
    ``np.array(0.5)``) of one; NaN and ±inf kept. None for anything else (a bool, a string,
    a list, a tensor or array of several elements, a meta tensor: it holds no value)."""
    if isinstance(value, Tensor):
        value = value.detach().item() if value.numel() == 1 and not value.is_meta else None
    elif isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


__all__ = ["recordable_number"]
