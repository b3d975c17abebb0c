"""A guest that changes torch's process-wide settings (default dtype, threads, grad mode, …)
is refused in one line naming it and the setting, and the setting is put back: left changed,
it would train its own run in float64 under a record saying fp32 and, in a sweep worker,
change the numbers of the built-in runs after it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.errors import GuestError
from creditaudit.guests.blame import blame
from creditaudit.guests.settings import SETTINGS, settings_kept

CHANGES: dict[str, Callable[[], None]] = {
    "default dtype": lambda: torch.set_default_dtype(torch.float64),
    "number of threads": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
    "grad mode": lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
    "deterministic-algorithms mode": lambda: torch.use_deterministic_algorithms(True),
    "float32 matmul precision": lambda: torch.set_float32_matmul_precision("medium"),
    "backends.cudnn.benchmark": lambda: setattr(torch.backends.cudnn, "benchmark", True),
    "backends.cuda.matmul.allow_tf32": lambda: setattr(torch.backends.cuda.matmul,
                                                       "allow_tf32", True),
    "default device": lambda: torch.set_default_device("meta"),
}


def snapshot() -> list[object]:
    return [setting.read() for setting in SETTINGS]


@pytest.mark.parametrize("name", CHANGES)
def test_a_changed_setting_is_put_back_and_the_guest_named(name):
    before = snapshot()
    with pytest.raises(GuestError) as error, blame("model factory 'nets:make'"):
        CHANGES[name]()
    message = str(error.value)
    # TF32 matmuls are the float32 matmul precision "high" (putting that back undoes both)
    named = "float32 matmul precision" if name.endswith("allow_tf32") else name
    assert message.startswith(f"model factory 'nets:make' changed torch's {named} from ")
    assert "\n" not in message and "creditaudit put it back" in message
    assert snapshot() == before


def test_every_watched_setting_has_a_change_tested():
    assert {setting.name for setting in SETTINGS} - set(CHANGES) == {
        "backends.cudnn.deterministic", "backends.cudnn.allow_tf32"}  # same kind of flag


def test_a_guest_that_raises_keeps_its_own_error_and_the_settings_are_put_back():
    before = snapshot()
    with pytest.raises(GuestError, match="raised ValueError: its own"), blame("plugin 'p'"):
        torch.set_default_dtype(torch.float64)
        raise ValueError("its own")
    assert snapshot() == before


def test_a_change_undone_before_returning_is_no_change():
    with settings_kept("plugin 'p'"):
        torch.set_default_dtype(torch.float64)
        torch.set_default_dtype(torch.float32)
    assert torch.get_default_dtype() == torch.float32


FACTORY = """
import torch
from torch import nn


def make(in_dim=16, n_classes=10):
    torch.set_default_dtype(torch.float64)
    return nn.Sequential(nn.Linear(in_dim, 16), nn.Tanh(), nn.Linear(16, n_classes))
"""


def test_train_refuses_a_factory_that_changes_the_default_dtype(tmp_path: Path, monkeypatch,
                                                                 capsys):
    (tmp_path / "float64_net.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CREDITAUDIT_CACHE", str(tmp_path / "cache"))
    code = main(["train", "-q", "--arch", "module:float64_net:make", "--dataset", "synthetic",
                 "--set", "data.in_dim=16", "--set", "data.teacher_width=16",
                 "--set", "data.n_train=64", "--set", "data.n_test=64",
                 "--set", 'model.states=["0", "1"]', "--epochs", "1",
                 "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("creditaudit: error: model factory 'float64_net:make' changed "
                          "torch's default dtype from float32 to float64"), err
    assert torch.get_default_dtype() == torch.float32
    assert not list((tmp_path / "runs").glob("*/record.json"))
