"""What Ctrl-C says is true: "the last finished epoch is checkpointed, continue with --resume"
was printed even when no epoch had finished. The interrupted run now says what it saved —
epochs up to N, continue with --resume; or nothing trained, run the same command again (which
then starts it: a run whose only checkpoint is its initial weights starts over) — and any
other command says it was interrupted, claiming nothing."""

from __future__ import annotations

import os
import signal
import time

import pytest

from creditaudit.cli import main
from creditaudit.records import load_record
from integrity_support import interrupted_at, toml_of

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def run(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("epoch", [1, 2], ids=["before-any-epoch", "after-epoch-1"])
def test_ctrl_c_says_what_was_saved_and_the_advice_works(tmp_path, capsys, monkeypatch,
                                                         epoch):
    config = tmp_path / "run.toml"
    config.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "runs")}))
    with monkeypatch.context() as patch:
        interrupted_at(patch, epoch)
        code, err = run(capsys, ["train", "--config", str(config)])
    assert code == 130
    line = err.strip().splitlines()[-1]
    if epoch == 1:
        assert "checkpointed" not in line and "--resume" not in line, line
        assert "before its first epoch finished" in line and "run the same command" in line
        code, err = run(capsys, ["train", "--config", str(config)])  # as it says
    else:
        assert "stopped after epoch 1, which is checkpointed: continue with --resume" in line
        code, err = run(capsys, ["train", "--config", str(config), "--resume"])
    assert code == 0, err
    (folder,) = (tmp_path / "runs").iterdir()
    assert load_record(folder).status == "completed"


def test_sigterm_exits_143_saying_what_was_saved(tmp_path, capsys, monkeypatch):
    """SIGTERM (a job scheduler's stop) stops a run as Ctrl-C does, with the same line, but
    exited 130, Ctrl-C's code; it now exits 143 (128 + SIGTERM), as a shell reports it."""
    from creditaudit.run.trainer import Trainer

    def close_epoch(self, *args, **kwargs):  # noqa: ANN001, ANN202
        os.kill(os.getpid(), signal.SIGTERM)  # after epoch 1's training, before it is saved
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM did not interrupt the run")

    config = tmp_path / "run.toml"
    config.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "runs")}))
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "close_epoch", close_epoch)
        code, err = run(capsys, ["train", "--config", str(config)])
    assert code == 143, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("creditaudit: interrupted") and "run the same command" in line, line
    (folder,) = (tmp_path / "runs").iterdir()
    assert load_record(folder).status == "interrupted"


def test_ctrl_c_elsewhere_claims_no_checkpoint(tmp_path, capsys, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("creditaudit.records.load_records", interrupt)
    monkeypatch.setattr("creditaudit.protocol.records.find_runs", interrupt)
    (tmp_path / "runs").mkdir()
    code, err = run(capsys, ["report", str(tmp_path / "runs")])
    assert code == 130
    assert err.strip() == "creditaudit: interrupted", err


def test_ctrl_c_while_a_resume_starts_the_run_over_leaves_it_resumable(tmp_path, capsys,
                                                                        monkeypatch):
    """A run stopped in its first epoch is started over by ``--resume``, which clears its
    files; Ctrl-C before the restarted run wrote one left its folder empty, and the same
    ``--resume`` then refused it: 'cannot resume: no run at …'. The folder keeps the run's
    config.toml until the run writes its own, so the same command starts it over."""
    from creditaudit.run.trainer import Trainer

    config = tmp_path / "run.toml"
    config.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "runs")}))
    argv = ["train", "--config", str(config), "--resume"]
    with monkeypatch.context() as patch:
        interrupted_at(patch, 1)
        assert run(capsys, ["train", "--config", str(config)])[0] == 130

    def interrupt(self, *args, **kwargs):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "run", interrupt)
        assert run(capsys, argv)[0] == 130
    (folder,) = (tmp_path / "runs").iterdir()
    # cleared to start over (it was left empty), nothing written since
    assert [path.name for path in folder.iterdir()] == ["config.toml"]
    code, err = run(capsys, argv)  # the same command again
    assert code == 0, err
    assert load_record(folder).status == "completed"
