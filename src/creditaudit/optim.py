"""The optimiser every trained part of a run uses: AdamW, fused where torch has the kernel.

The model's parameters (training loop) and the auxiliary nets the rules train on the side
(the State Bridge's predictor, the Credit Bridge's value net) all take their steps here.
"""

from __future__ import annotations

from collections.abc import Iterable

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
