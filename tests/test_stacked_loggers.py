"""A logger handed to a stack (``train_stacked(configs, loggers=[…])``) hears K runs at once:
each call tells which run it is for (``current_run_id()``), and the logger's error fails the
run it was raised in, not the stack (docs/logging.md, "Your own logger")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from creditaudit.errors import GuestError
from creditaudit.loggers import RunLogger, current_run_id
from creditaudit.records import load_record
from creditaudit.run.plan import run_id
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import train
from test_stacked import configs

pytestmark = pytest.mark.usefixtures("single_thread")


class PerRun(RunLogger):
    """Keeps what it hears by the run it is for."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.steps: dict[str, int] = defaultdict(int)
        self.epochs: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, str] = {}

    def start(self, run):  # noqa: ANN001
        assert current_run_id() == run.run_id
        self.started.append(run.run_id)

    def log_step(self, loss):  # noqa: ANN001
        self.steps[current_run_id()] += 1

    def log_epoch(self, entry):  # noqa: ANN001
        self.epochs[current_run_id()].append(entry.epoch)

    def finish(self, record):  # noqa: ANN001
        assert current_run_id() == record.run_id
        self.finished[record.run_id] = record.status


def test_one_logger_tells_the_runs_of_a_stack_apart(tmp_path):
    runs = configs(tmp_path, "dfa")
    logger = PerRun()
    results = train_stacked(runs, loggers=[logger])
    ids = [run_id(c) for c in runs]
    assert [r.record.environment["execution"]["stacked_runs"] for r in results] == [3] * 3
    assert sorted(logger.started) == sorted(ids)
    assert {i: logger.epochs[i] for i in ids} == {i: [0, 1, 2] for i in ids}
    assert {i: logger.steps[i] for i in ids} == {i: 2 * 4 for i in ids}  # 256 / 64 a epoch
    assert logger.finished == {i: "completed" for i in ids}
    assert current_run_id() is None  # outside a logger's method


class BreaksOnce(RunLogger):
    """Raises once, in its ``method``'s ``at``-th call."""

    def __init__(self, method: str, at: int = 1) -> None:
        self.method, self.at, self.calls = method, at, 0

    def _maybe(self, method: str) -> None:
        if method == self.method:
            self.calls += 1
            if self.calls == self.at:
                raise ValueError(f"{method} broke")

    def log_step(self, loss):  # noqa: ANN001
        self._maybe("log_step")

    def finish(self, record):  # noqa: ANN001
        self._maybe("finish")


def test_a_loggers_step_error_fails_only_the_run_it_was_raised_in(tmp_path):
    """Before, it left the shared step and failed every run of the stack."""
    runs = configs(tmp_path, "dfa")
    results = train_stacked(runs, loggers=[BreaksOnce("log_step", at=13)])  # epoch 2
    statuses = [r.status for r in results]
    assert statuses == ["failed", "completed", "completed"]  # run 1 steps first
    failed = load_record(Path(runs[0].run.out_dir) / run_id(runs[0]))
    assert failed.status == "failed" and failed.error.startswith(
        "logger BreaksOnce.log_step raised ValueError: log_step broke")
    assert [e.epoch for e in failed.log] == [0, 1]  # what was saved is kept: it resumes
    assert train(runs[0], resume=True).status == "completed"


def test_a_loggers_finish_error_leaves_every_record_completed(tmp_path):
    """Before, the first run's finish error failed every run still open, itself included,
    though their records were final."""
    runs = configs(tmp_path, "dfa")
    with pytest.raises(GuestError, match=r"^logger BreaksOnce\.finish raised ValueError: "
                                         "finish broke"):
        train_stacked(runs, loggers=[BreaksOnce("finish")])
    assert {load_record(Path(c.run.out_dir) / run_id(c)).status for c in runs} == {"completed"}
