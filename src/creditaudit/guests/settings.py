"""Torch's process-wide settings, which a guest's code must leave as it found them.

A factory or plugin that calls ``torch.set_default_dtype(torch.float64)`` (or changes the
thread count, grad mode, default device, deterministic-algorithms mode, float32 matmul
precision or a cuDNN/TF32 switch) would change every number computed after it in the same
process: the run it belongs to (whose record says fp32) and, in a sweep worker, the next
runs too. :func:`settings_kept` runs guest code, puts back anything it changed, and refuses
the guest in one line naming it and the setting. The global RNG is not watched here: the
door's seed check covers it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from creditaudit.errors import GuestError
from creditaudit.formatting import counted


@dataclass(frozen=True)
class Setting:
    """One process-wide torch setting: how to read it, how to put a value back, and the
    usual way to get the same effect without changing the process."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    instead: str


def _deterministic() -> tuple[bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _set_default_device(device: torch.device) -> None:
    # None, not device("cpu"): no device mode left installed where there was none
    torch.set_default_device(None if device == torch.device("cpu") else device)


def _backend_flag(name: str, module: Any, attribute: str) -> Setting:
    return Setting(f"{name}.{attribute}", lambda: getattr(module, attribute),
                   lambda value: setattr(module, attribute, value),
                   "leave it to the command")


SETTINGS: tuple[Setting, ...] = (
    Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype,
            "give tensors and modules their dtype (dtype=…, .to(…); --precision "
            "chooses the training precision)"),
    Setting("default device", torch.get_default_device, _set_default_device,
            "let --device place the model"),
    Setting("number of threads", torch.get_num_threads, torch.set_num_threads,
            "let --threads set it"),
    Setting("grad mode", torch.is_grad_enabled, torch.set_grad_enabled,
            "use torch.no_grad() as a with-block"),
    Setting("deterministic-algorithms mode", _deterministic, _set_deterministic,
            "leave it to the command"),
    Setting("float32 matmul precision", torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision, "leave it to the command"),
    _backend_flag("backends.cudnn", torch.backends.cudnn, "deterministic"),
    _backend_flag("backends.cudnn", torch.backends.cudnn, "benchmark"),
    _backend_flag("backends.cudnn", torch.backends.cudnn, "allow_tf32"),
    _backend_flag("backends.cuda.matmul", torch.backends.cuda.matmul, "allow_tf32"),
)


def _name(value: Any) -> str:
    return str(value).removeprefix("torch.")


@contextlib.contextmanager
def settings_kept(what: str) -> Iterator[None]:
    """Run guest code (``what`` names the guest): whatever torch setting of :data:`SETTINGS`
    it changed is put back; after code that returned normally that is a one-line
    :class:`~creditaudit.errors.GuestError` naming the guest and the setting (after code
    that raised, its own error stands)."""
    before = [setting.read() for setting in SETTINGS]
    raised = True
    try:
        yield
        raised = False
    finally:
        changed = []
        for setting, value in zip(SETTINGS, before, strict=True):
            now = setting.read()
            if now != value:
                setting.write(value)
                changed.append((setting, value, now))
        if changed and not raised:
            setting, value, now = changed[0]
            more = f" (and {counted(len(changed) - 1, 'more setting')})" if len(changed) > 1 else ""
            raise GuestError(
                f"{what} changed torch's {setting.name} from {_name(value)} to {_name(now)}"
                f"{more} and left it so, which would change every number computed after it "
                f"in this process (creditaudit put it back): {setting.instead} instead of "
                "changing torch's global setting")


__all__ = ["SETTINGS", "Setting", "settings_kept"]
