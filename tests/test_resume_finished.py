"""``--resume`` on a finished run serves it as it is, exactly as without ``--resume``
(docs/reliability.md §2).

A completed or diverged run has nothing left to continue: its end-of-run metrics are
computed and its record is final. Resuming it used to load its last checkpoint, find no
epoch left, run the end-of-run stage again and rewrite its record (a new ``updated`` and a
resumed part "from epoch 3" of a 2-epoch run). Now its files stay byte for byte, no stage
runs, and loggers asked for get the record replayed, as docs/logging.md says.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import Trainer, train
from integrity_support import nan_weights_after, snapshot

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"method.name": "dfa", "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
        "data.teacher_width": 16, "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2,
        "optim.batch_size": 64, "diagnostics.eval_samples": 128,
        "diagnostics.rho_samples": 16, "diagnostics.rho_directions": 2,
        "diagnostics.null_draws": 2, "run.progress": False}
STATUSES = ("completed", "diverged")


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def finish(config: RunConfig, status: str) -> Path:
    """Train ``config`` to ``status`` (diverged: its epoch-2 update leaves NaN weights);
    its run folder."""
    with pytest.MonkeyPatch.context() as patch:
        if status == "diverged":
            patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        result = train(config)
    assert result.status == status
    return result.run_dir


class Seen:
    """A logger that notes the kind of every call (the RunLogger interface, duck-typed)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.replayed: bool | None = None

    def start(self, run):  # noqa: ANN001, ANN201
        self.calls.append("start")
        self.replayed = run.replayed

    def __getattr__(self, name: str):  # noqa: ANN204 — log_step, log_epoch, …
        return lambda *args: self.calls.append(name)


def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, building a Trainer fails the test: a finished run is served, so
    nothing is trained, evaluated or measured at its end again."""

    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise AssertionError("a finished run was set up to train again")

    monkeypatch.setattr(Trainer, "__init__", refuse)


@pytest.mark.parametrize("status", STATUSES)
def test_resume_on_a_finished_run_serves_it_as_without_resume(tmp_path, monkeypatch, status):
    config = tiny(tmp_path)
    run_dir = finish(config, status)
    before = snapshot(run_dir)
    no_training(monkeypatch)
    seen = Seen()
    result = train(config, resume=True, loggers=[seen])
    assert snapshot(run_dir) == before  # record.json (its `updated`, no part added) included
    assert result.status == status and result.record.resumed == []
    assert seen.replayed is True
    assert seen.calls == ["start", *["log_epoch"] * len(result.record.log), "finish", "close"]
    # exactly what the same call without resume serves
    plain = Seen()
    assert train(config, loggers=[plain]).record.to_dict() == result.record.to_dict()
    assert plain.calls == seen.calls


def test_train_resume_cli_on_a_completed_run_leaves_its_folder_alone(tmp_path, capsys,
                                                                    monkeypatch):
    args = ["train", "-q", "--out", str(tmp_path), "--method", "dfa", "--epochs", "2",
            "--width", "16", "--blocks", "2", "--threads", "1", "--set", "data.n_train=256",
            "--set", "data.n_test=128", "--set", "diagnostics.eval_samples=128",
            "--set", "diagnostics.rho_samples=16", "--set", "diagnostics.null_draws=2"]
    assert main(args) == 0
    run_dir = next(tmp_path.iterdir())
    before = snapshot(run_dir)
    capsys.readouterr()
    no_training(monkeypatch)
    assert main([*args, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "resuming" not in out + err
    assert "completed" in out  # the summary of the run served
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("status", STATUSES)
def test_a_stack_resuming_a_finished_run_serves_it(tmp_path, monkeypatch, status):
    """The sweep worker's path: ``train_stacked`` with ``resume=True`` (a run the worker
    found interrupted and another process finished before it trained)."""
    config = tiny(tmp_path)
    run_dir = finish(config, status)
    before = snapshot(run_dir)
    no_training(monkeypatch)
    [result] = train_stacked([config], resume=True)
    assert result.status == status and result.record.resumed == []
    assert snapshot(run_dir) == before
