"""A run's ``init.pt``: the model's parameters at initialisation, which the end-of-run
feature drift compares the trained weights with.

Written when a run starts, with its digest kept in every checkpoint (``init_sha256``) to tie
the file to the run; checked when the run resumes, before training, so a missing, damaged or
foreign file is refused in one line then — not after every epoch has trained (a KeyError
from an extra tensor, a missing file, or another run's weights giving a wrong drift) — and
again where the drift reads it (a file replaced while the run trained).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from creditaudit.caller import FORCE
from creditaudit.data.identity import tensor_digest
from creditaudit.errors import RunRecordError
from creditaudit.models.contract import parameter_snapshot
from creditaudit.records import INIT_FILE, atomic_torch_save, load_parameters

INIT_DIGEST = "init_sha256"  # the checkpoint entry holding init.pt's digest


def init_fix() -> str:
    """What to do about a run's init.pt that is missing, unreadable or another run's."""
    return f"restore the run's own init.pt, or start the run over with {FORCE}"


def initial_digest(parameters: Mapping[str, Tensor]) -> str:
    """sha256 (hex) of a parameter snapshot: its names, in order, and each tensor's dtype,
    shape and bytes."""
    names = "\n".join(parameters).encode()
    return hashlib.sha256(names + tensor_digest(*parameters.values()).encode()).hexdigest()


def write_initial(run_dir: Path, model: nn.Module) -> str:
    """Write ``model``'s parameters to ``run_dir``/init.pt (atomically); their digest."""
    snapshot = parameter_snapshot(model)
    atomic_torch_save(run_dir / INIT_FILE, snapshot)
    return initial_digest(snapshot)


def check_initial(run_dir: Path, model: nn.Module, digest: str | None, *,
                  needed: bool) -> None:
    """One-line RunRecordError (starting "cannot resume") unless ``run_dir``/init.pt is
    ``model``'s (:func:`read_initial`); a missing file is refused only when the run will read
    it (``needed``: the end-of-run metrics are on)."""
    if (run_dir / INIT_FILE).exists() or needed:
        read_initial(run_dir, model, digest, doing="cannot resume")


def read_initial(run_dir: Path, model: nn.Module, digest: str | None, *, doing: str,
                 map_location: Any = "cpu") -> dict[str, Tensor]:
    """``run_dir``/init.pt's parameters (loaded to ``map_location``), checked to be
    ``model``'s — the same names, shapes and dtypes — with ``digest`` (the one the
    checkpoint keeps; None for runs written before digests were kept: not compared). Read
    where the run resumes and again where the drift reads it (a file replaced while the run
    trained); a one-line RunRecordError starting with ``doing`` when any check fails."""
    path = run_dir / INIT_FILE
    if not path.is_file():
        state = "is not a regular file" if path.exists() else "is missing"
        raise RunRecordError(f"{doing}: {path} {state}, and the end-of-run drift "
                             f"compares the trained weights with it: {init_fix()}")
    saved = load_parameters(path, map_location=map_location)
    expected = dict(model.named_parameters())
    missing = [name for name in expected if name not in saved]
    extra = [name for name in saved if name not in expected]
    if missing or extra:
        what = (f"lacks parameter {missing[0]!r}" if missing
                else f"holds {extra[0]!r}, which is no parameter of this run's model")
        raise RunRecordError(f"{doing}: {path} {what}: {init_fix()}")
    for name, param in expected.items():
        tensor = saved[name]
        if tensor.shape != param.shape or tensor.dtype != param.dtype:
            raise RunRecordError(
                f"{doing}: {path} holds {name} of shape {tuple(tensor.shape)} and "
                f"{tensor.dtype}, but the model's is {tuple(param.shape)} and {param.dtype}: "
                f"{init_fix()}")
    if digest is not None:
        found = initial_digest({name: saved[name] for name in expected})
        if found != digest:
            raise RunRecordError(
                f"{doing}: {path} is not this run's initial weights (digest "
                f"{found[:12]}…, its checkpoint records {digest[:12]}…: another run's "
                f"init.pt?): {init_fix()}")
    return saved
