"""Random unit directions: what ρ perturbs a state along, and what the reference check
compares a backward along."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# torch draws float32 normals on the CPU in blocks of this many (Box–Muller over 16
# uniforms), and a draw whose size is not a multiple of it draws its last block anew.
NORMAL_BLOCK = 16


def unit_directions(b: int, m: int, shape: tuple[int, ...], *, generator: torch.Generator,
                    dtype: torch.dtype, device: torch.device) -> Tensor:
    """(b, m, D) unit directions, D = prod(shape), from a CPU generator (reproducible on
    any device). Drawn in float32 — a third of float64's cost on the CPU — then cast: a
    direction only has to be uniformly random on the sphere, not float64-exact.

    Each sample's m·D entries are drawn as a whole number of torch's blocks of
    :data:`NORMAL_BLOCK` normals (the rest of its last block drawn and dropped), so sample
    i's directions are the same whether it is drawn alone or with others: ρ's directions do
    not depend on how many samples one draw takes (its memory slices, ``MAX_ELEMENTS``).
    Where m·D is a multiple of the block (ρ's default 32 directions) nothing is dropped and
    the draw is the plain (b, m, D) one.
    """
    entries = m * math.prod(shape)
    padded = -(-entries // NORMAL_BLOCK) * NORMAL_BLOCK
    v = torch.randn((b, padded), generator=generator, dtype=torch.float32, device="cpu")
    v = v[:, :entries].reshape(b, m, math.prod(shape))
    v = v.to(device=device, dtype=dtype)
    return v / torch.linalg.vector_norm(v, dim=2, keepdim=True)
