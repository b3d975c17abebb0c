"""Feature drift: how far each parameter moved from its initial value."""

from __future__ import annotations

import torch
from torch import Tensor


def feature_drift(initial: dict[str, Tensor], final: dict[str, Tensor]) -> dict[str, float]:
    """‖W_final − W_init‖ / ‖W_init‖ per parameter name (Frobenius norms, float64).

    A parameter initialised at exactly zero (e.g. a bias) reports the absolute change.
    """
    drift = {}
    for name, w0 in initial.items():
        w0_64, w1_64 = w0.double(), final[name].detach().double().to(w0.device)
        base = torch.linalg.vector_norm(w0_64)
        change = torch.linalg.vector_norm(w1_64 - w0_64)
        drift[name] = float(change / base) if base > 0 else float(change)
    return drift
