"""Random unit directions: what ρ perturbs a state along, and what the reference check
compares a backward along."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def unit_directions(b: int, m: int, shape: tuple[int, ...], *, generator: torch.Generator,
                    dtype: torch.dtype, device: torch.device) -> Tensor:
    """(b, m, D) unit directions, D = prod(shape), from a CPU generator (reproducible on
    any device). Drawn in float32 — a third of float64's cost on the CPU — then cast: a
    direction only has to be uniformly random on the sphere, not float64-exact."""
    v = torch.randn((b, m, math.prod(shape)), generator=generator, dtype=torch.float32,
                    device="cpu")
    v = v.to(device=device, dtype=dtype)
    return v / torch.linalg.vector_norm(v, dim=2, keepdim=True)
