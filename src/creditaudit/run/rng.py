"""The random streams a checkpoint saves and a resume goes on with: torch's CPU stream, the
data order's generator and, for a model on a CUDA device (whose dropout draws there), that
device's stream."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def cuda_device(model: torch.nn.Module) -> torch.device | None:
    """The CUDA device ``model`` is on (its first parameter's or buffer's), else None."""
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None and tensor.device.type == "cuda" else None


def rng_states(model: torch.nn.Module, generator: torch.Generator) -> dict[str, Any]:
    """The streams to save with ``model``'s checkpoint: ``torch`` (CPU), ``data`` (the data
    order's ``generator``) and, on a CUDA device, ``cuda``."""
    states = {"torch": torch.get_rng_state(), "data": generator.get_state()}
    device = cuda_device(model)
    if device is not None:
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_rng_states(states: Mapping[str, Any], model: torch.nn.Module,
                       generator: torch.Generator) -> None:
    """Go on with the saved ``states``: the data order's, torch's CPU stream and — for a
    model on a CUDA device, where the checkpoint holds one — the device's stream (resumed
    on the CPU, or from a checkpoint written before it was saved, that stream stays as
    seeded)."""
    generator.set_state(states["data"].cpu())
    torch.set_rng_state(states["torch"].cpu())
    device, cuda = cuda_device(model), states.get("cuda")
    if device is not None and isinstance(cuda, torch.Tensor):
        torch.cuda.set_rng_state(cuda.cpu(), device)
