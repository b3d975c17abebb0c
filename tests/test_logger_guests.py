"""A user's own logger is a guest: what it changes in what it is given never reaches the
record, and its exception or ``sys.exit`` is one line naming it, with the run resumable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from creditaudit.config import RunConfig
from creditaudit.errors import GuestError
from creditaudit.loggers import RunLogger
from creditaudit.records import load_record
from creditaudit.run.trainer import train
from sweep_files import TINY_SWEEP_BASE

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {**TINY_SWEEP_BASE, "method.name": "dfa", "data.teacher_width": 32,
        "optim.epochs": 2, "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def tiny(out: Path) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out)})


def numbers(record) -> list[dict]:  # noqa: ANN001 — a RunRecord
    return [{k: v for k, v in entry.to_dict().items() if k != "seconds"}
            for entry in record.log]


class Meddler(RunLogger):
    """Changes everything it is handed, in place."""

    def start(self, run):  # noqa: ANN001
        run.reference.clear()
        run.config.optim.epochs = 1  # the trainer's own config before: one epoch trained

    def log_epoch(self, entry):  # noqa: ANN001
        entry.acc_eval = 0.5
        entry.extras["mine"] = 1.0
        if entry.protocol:
            entry.protocol.clear()
        entry.measures.hidden_norms[-1] = 123.0
        entry.measures.cos_per_layer[:] = [0.0] * len(entry.measures.cos_per_layer)

    def finish(self, record):  # noqa: ANN001
        record.status = "failed"
        record.log.clear()


def test_a_logger_that_changes_what_it_is_given_changes_no_record(tmp_path):
    plain = train(tiny(tmp_path / "plain"))
    meddled = train(tiny(tmp_path / "meddled"), loggers=[Meddler()])
    assert meddled.record.status == "completed"
    assert meddled.record.config.optim.epochs == 2 and len(meddled.record.log) == 3
    assert numbers(meddled.record) == numbers(plain.record)
    assert numbers(load_record(meddled.run_dir)) == numbers(plain.record)
    assert meddled.record.reference.to_dict() == plain.record.reference.to_dict()


class Broken(RunLogger):
    def __init__(self, method: str) -> None:
        self.method = method

    def log_epoch(self, entry):  # noqa: ANN001
        if self.method == "log_epoch" and entry.epoch == 1:
            raise ValueError("my logger broke")

    def log_step(self, loss):  # noqa: ANN001
        if self.method == "log_step":
            sys.exit(3)

    def finish(self, record):  # noqa: ANN001
        if self.method == "finish":
            raise RuntimeError("finish broke")

    def close(self):
        if self.method == "close":
            raise RuntimeError("close broke")


def test_a_logger_that_raises_is_named_in_one_line_and_the_run_resumes(tmp_path):
    config = tiny(tmp_path)
    with pytest.raises(GuestError, match=r"^logger Broken\.log_epoch raised ValueError: my "
                       r"logger broke \(at test_logger_guests\.py:\d+ in log_epoch\)") as err:
        train(config, loggers=[Broken("log_epoch")])
    assert "\n" not in str(err.value)
    failed = load_record(tmp_path / run_dir_name(tmp_path))
    assert failed.status == "failed"
    assert failed.error == str(err.value)  # named as the logger's, not as creditaudit's
    assert [e.epoch for e in failed.log] == [0, 1]
    resumed = train(config, resume=True)  # epoch 1 is saved: nothing is lost
    assert resumed.record.status == "completed"
    assert numbers(resumed.record) == numbers(train(tiny(tmp_path / "again")).record)


def test_a_logger_that_exits_or_fails_at_the_end_is_named(tmp_path):
    with pytest.raises(GuestError, match=r"^logger Broken\.log_step called sys\.exit\(3\)"):
        train(tiny(tmp_path / "exit"), loggers=[Broken("log_step")])
    with pytest.raises(GuestError, match=r"^logger Broken\.finish raised RuntimeError: "
                       "finish broke"):
        train(tiny(tmp_path / "end"), loggers=[Broken("finish")])
    finished = load_record(tmp_path / "end" / run_dir_name(tmp_path / "end"))
    assert finished.status == "completed"  # its record was final before the logger's end


def test_the_runs_own_error_wins_over_a_logger_that_fails_to_close(tmp_path, monkeypatch,
                                                                    caplog):
    """The logger's close() ran while the run's error unwound, and its error replaced the
    run's: the caller saw 'close broke', the record said 'evaluation broke'."""
    from creditaudit.run.trainer import Trainer

    measure = Trainer.measure

    def broken_measure(self, epoch):  # noqa: ANN001
        if epoch == 1:
            raise ArithmeticError("evaluation broke")
        return measure(self, epoch)

    monkeypatch.setattr(Trainer, "measure", broken_measure)
    with pytest.raises(ArithmeticError, match="^evaluation broke$"):
        train(tiny(tmp_path / "failed"), loggers=[Broken("close")])
    failed = load_record(tmp_path / "failed" / run_dir_name(tmp_path / "failed"))
    assert failed.status == "failed" and "evaluation broke" in failed.error
    (line,) = [r.getMessage() for r in caplog.records if "close broke" in r.getMessage()]
    assert line.startswith("warning: logger Broken.close raised RuntimeError: close broke")
    assert "\n" not in line
    monkeypatch.setattr(Trainer, "measure", measure)
    # a run that succeeded: the logger's close failure is its one-line error, as before
    with pytest.raises(GuestError, match=r"^logger Broken\.close raised RuntimeError: "
                       "close broke"):
        train(tiny(tmp_path / "done"), loggers=[Broken("close")])
    assert load_record(tmp_path / "done" / run_dir_name(tmp_path / "done")).status == "completed"


class BrokenEnd(RunLogger):
    def finish(self, record):  # noqa: ANN001
        raise RuntimeError("finish broke")

    def close(self):
        raise RuntimeError("close broke")


def test_a_replay_raises_the_loggers_first_error_not_its_close_failure(tmp_path, caplog):
    train(tiny(tmp_path))
    with pytest.raises(GuestError, match=r"^logger BrokenEnd\.finish raised RuntimeError"):
        train(tiny(tmp_path), loggers=[BrokenEnd()])  # finished: replayed into the logger
    assert any("logger BrokenEnd.close raised RuntimeError: close broke" in r.getMessage()
               for r in caplog.records)


def run_dir_name(out: Path) -> str:
    (folder,) = [p.name for p in out.iterdir() if p.is_dir()]
    return folder


class FiveMethods:
    """A logger without ``log_stage`` (which the end-of-run metrics call)."""

    def start(self, run): ...  # noqa: ANN001
    def log_step(self, loss): ...  # noqa: ANN001
    def log_epoch(self, entry): ...  # noqa: ANN001
    def finish(self, record): ...  # noqa: ANN001
    def close(self): ...


def test_a_logger_without_a_method_stops_the_run_before_it_starts(tmp_path):
    with pytest.raises(GuestError, match=r"^logger FiveMethods has no log_stage method: .* "
                       r"subclass creditaudit\.loggers\.RunLogger"):
        train(tiny(tmp_path), loggers=[FiveMethods()])
    assert not any(tmp_path.iterdir())  # nothing written, nothing trained
