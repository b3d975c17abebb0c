"""How often the walk of ``diagnose()`` re-enters a module it already left (issue #36).

Runs ``diagnose(metrics=True)`` once on a tiny adapted model (3 states, 64 samples) under
``sys.setprofile`` and records the module of every creditaudit function called. The *walk*
is that sequence restricted to the audit path — ``creditaudit.audit`` and the measures the
reference check and the working copy are made of — with repeats of one module merged; a
*re-entry* is a step of the walk into a module it has been in before. Calls are counted,
not returns, so a callback (central differences asking the forward for a loss) re-enters.

    .venv/bin/python benchmarks/trace_audit_walk.py          # the counts
    .venv/bin/python benchmarks/trace_audit_walk.py --walk   # and the walk, step by step

Measured on the commit that split ``diagnose`` into its steps: 48 re-entries before, 36
after (the reference check's part 30 → 12).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import Tensor, nn

import creditaudit
from creditaudit import adapt, diagnose

PACKAGE = str(Path(creditaudit.__file__).parent) + "/"
AUDIT_PATH = ("measures.working", "measures.reference_check", "measures.reference_modules",
              "measures.perturbation", "measures.user_models", "measures.central_differences",
              "measures.directions")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))

    def forward(self, h: Tensor) -> Tensor:
        return h + self.f(h)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b1, self.b2 = nn.Linear(8, 16), _Block(), _Block()
        self.head = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.b2(self.b1(self.stem(x))))


def calls() -> list[tuple[str, str]]:
    """(module below creditaudit, function) of every creditaudit call one diagnose makes."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    model = adapt(_Net(), ["stem", "b1", "b2"], example=x)
    generator = torch.Generator().manual_seed(1)

    def credit(xb: Tensor, yb: Tensor) -> list[Tensor]:
        return [torch.randn(h.shape, generator=generator) for h in model.forward_states(xb)[0]]

    seen: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(PACKAGE):
            seen.append((name[len(PACKAGE):-3].replace("/", "."), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        diagnose(model, x, y, credit=credit, metrics=True,
                 metric_options={"rho_samples": 16, "rho_directions": 4, "null_draws": 2})
    finally:
        sys.setprofile(None)
    return seen


def walk(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The audit path's steps, a module's consecutive calls merged (its first one kept)."""
    out: list[tuple[str, str]] = []
    for module, function in steps:
        on_path = module.startswith("audit.") or module in AUDIT_PATH
        if on_path and (not out or out[-1][0] != module):
            out.append((module, function))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--walk", action="store_true", help="print the walk step by step")
    show = parser.parse_args().walk
    steps = walk(calls())
    entered: set[str] = set()
    reentries = 0
    for module, function in steps:
        again = module in entered
        reentries += again
        entered.add(module)
        if show:
            print(f"{'re-enters' if again else 'enters   '} {module}.{function}")
    print(f"walk of {len(steps)} steps through {len(entered)} modules: {reentries} re-entries")


if __name__ == "__main__":
    main()
