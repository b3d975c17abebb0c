"""What the door tests share (tests/test_door*.py): the guests of tests/guest_pkg
(``creditaudit_guests.door_*``) installed a few at a time — in this process, or in a site
folder for the command line — and tiny runs on their data.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from creditaudit import RunConfig
from plugin_support import GUESTS, plugins_on_path

ORIGIN = f"{GUESTS.distribution}=={GUESTS.version}"
# A tiny run on the well-behaved door-mixture dataset (8 features, 4 classes).
TINY = {"data.name": "door-mixture", "data.n_train": 256, "data.n_test": 256,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 256, "diagnostics.rho_samples": 32,
        "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2,
        "run.progress": False}
FACTORIES = "creditaudit_guests.door_factories"
FACTORY_STATES = ["stem", "b1", "b2"]


def tiny_values(out: Path, **overrides: object) -> dict[str, object]:
    """The tiny run's dotted keys writing below ``out`` (``overrides``: more keys; None
    drops a key of the tiny run)."""
    values = {**TINY, "run.out_dir": str(out), **overrides}
    return {key: value for key, value in values.items() if value is not None}


def tiny_config(out: Path, **overrides: object) -> RunConfig:
    """The tiny run as a config (see :func:`tiny_values`)."""
    return RunConfig().replace(**tiny_values(out, **overrides))


def image_run(data: Path, **overrides: object) -> dict[str, object]:
    """Overrides of the tiny run for a ``module`` factory of creditaudit_guests on the MNIST
    layout IDX files in ``data`` (tests/integrity_support.py: 64 + 32 images)."""
    return {"data.name": "mnist", "data.data_dir": str(data), "data.n_train": None,
            "data.n_test": None, "model.d": None, "model.n_blocks": None,
            "model.states": FACTORY_STATES, "diagnostics.eval_samples": 32, **overrides}


def cli_args(out: Path, **overrides: object) -> list[str]:
    """``--set`` flags of the tiny run (values written as TOML; see :func:`tiny_values`)."""
    return [item for key, value in tiny_values(out, **overrides).items()
            for item in ("--set", f"{key}={_toml(value)}")]


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list):
        return json.dumps(value)  # a TOML string or array of strings
    return str(value)


@contextlib.contextmanager
def guests(site: Path, *names: str) -> Iterator[Path]:
    """The entry points ``names`` of tests/guest_pkg installed in this process (gone
    afterwards); yields the site folder."""
    GUESTS.install(site, only=names)
    with plugins_on_path(site, GUESTS.forget):
        yield site


def site_with(root: Path, *names: str) -> Path:
    """A site folder holding the entry points ``names`` (for plugin_support.cli)."""
    return GUESTS.install(root / "site", only=names)


def last_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else ""


def error_line(done) -> str:  # noqa: ANN001 - a CompletedProcess
    """The one error line of a refused command (exit 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    line = last_line(done.stderr)
    assert line.startswith("creditaudit: error: "), done.stderr[-2000:]
    return line


class Net(nn.Module):
    """A user's network of 8 features and 4 classes (the door-mixture's, the Recorder tests'
    data), adapted at ``stem`` and ``b1``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b1, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.b1(torch.relu(self.stem(x)))))
