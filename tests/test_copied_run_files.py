"""A record or checkpoint copied from another run's folder is refused, never resumed or
served as the run whose folder it is in: the folder of the lr=0.001 run held the lr=0.003
run's checkpoint, was resumed from it ("completed", exit 0), and the next `train` of the
lr=0.001 config served the lr=0.003 run's record."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, load_record
from integrity_support import toml_of
from test_interrupt_text import TINY, interrupted_at

pytestmark = pytest.mark.usefixtures("single_thread")


def config_file(tmp_path: Path, name: str, lr: float) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_of({**TINY, "optim.lr": lr, "run.out_dir": str(tmp_path / "runs")}))
    return path


def train(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["train", "-q", *argv])
    return code, capsys.readouterr().err.strip()


def folders(tmp_path: Path) -> dict[str, Path]:
    return {load_record(d).config.optim.lr: d for d in (tmp_path / "runs").iterdir()}


def test_a_checkpoint_copied_from_another_run_is_not_resumed(tmp_path, capsys, monkeypatch):
    a, b = config_file(tmp_path, "a", 1e-3), config_file(tmp_path, "b", 3e-3)
    with monkeypatch.context() as patch:
        interrupted_at(patch, 2)  # both stop after epoch 1, checkpointed
        assert train(capsys, "--config", str(a))[0] == 130
        assert train(capsys, "--config", str(b))[0] == 130
    runs = folders(tmp_path)
    shutil.copy(runs[3e-3] / CHECKPOINT_FILE, runs[1e-3] / CHECKPOINT_FILE)
    code, err = train(capsys, "--config", str(a), "--resume")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"creditaudit: error: {runs[1e-3] / CHECKPOINT_FILE} holds the record "
                          f"of run {runs[3e-3].name}, not of {runs[1e-3].name}"), err
    assert err.endswith("start this one again with --force")
    assert load_record(runs[1e-3]).status == "interrupted"


def test_a_record_copied_from_another_run_is_not_served(tmp_path, capsys):
    a, b = config_file(tmp_path, "a", 1e-3), config_file(tmp_path, "b", 3e-3)
    assert train(capsys, "--config", str(a))[0] == 0
    assert train(capsys, "--config", str(b))[0] == 0
    runs = folders(tmp_path)
    shutil.copy(runs[3e-3] / RECORD_FILE, runs[1e-3] / RECORD_FILE)
    code, err = train(capsys, "--config", str(a))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"creditaudit: error: {runs[1e-3] / RECORD_FILE} holds the record of "
                          f"run {runs[3e-3].name}, not of {runs[1e-3].name}"), err


def test_audit_names_the_record_copied_into_a_run_folder(tmp_path, capsys):
    """The folder and its checkpoint are of one run, record.json of another: audit blamed the
    run's own checkpoint ("holds the record of run A, not of B whose folder it is in", in A's
    folder) instead of the copied record."""
    a, b = config_file(tmp_path, "a", 1e-3), config_file(tmp_path, "b", 3e-3)
    assert train(capsys, "--config", str(a))[0] == 0
    assert train(capsys, "--config", str(b))[0] == 0
    runs = folders(tmp_path)
    shutil.copy(runs[3e-3] / RECORD_FILE, runs[1e-3] / RECORD_FILE)
    capsys.readouterr()
    assert main(["audit", str(runs[1e-3]), "--no-metrics", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"creditaudit: error: {runs[1e-3] / RECORD_FILE} holds the record of "
                          f"run {runs[3e-3].name}, not of {runs[1e-3].name}"), err
