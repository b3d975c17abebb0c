"""A logger handed to a stack (``train_stacked(configs, loggers=[…])``) hears K runs at once:
each call tells which run it is for (``current_run_id()``), and the logger's error fails the
run it was raised in, not the stack (docs/logging.md, "Your own logger")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from creditaudit.errors import GuestError
from creditaudit.loggers import RunLogger, current_run_id
from creditaudit.records import comparable, load_record
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


class BreaksFor(RunLogger):
    """Raises in ``log_step`` for the run ``failing`` only (every call of it)."""

    def __init__(self, failing: str) -> None:
        self.failing = failing

    def log_step(self, loss):  # noqa: ANN001
        if current_run_id() == self.failing:
            raise ValueError("log_step broke")


def test_a_loggers_step_error_in_a_group_of_one_fails_only_that_run(tmp_path, monkeypatch,
                                                                     kill_run_at):
    """A run alone in its group (here: the one run starting at epoch 0, the others resumed
    from epoch 2) takes its own step; before, its logger's log_step error left the stack
    and no run of the later groups trained. Now it fails that run alone, and the others'
    records are bit for bit those of the stack without the broken logger."""
    from test_stacked import checkpoint_gap

    def stack(out: Path) -> list:
        runs = configs(out, "dfa", **{"optim.epochs": 3})
        for config in runs[1:]:
            kill_run_at(config, epoch=2)  # resumed from epoch 2: a group of two
        return runs

    plain = train_stacked(stack(tmp_path / "a"), resume=[False, True, True])
    runs = stack(tmp_path / "b")
    results = train_stacked(runs, resume=[False, True, True],
                            loggers=[BreaksFor(run_id(runs[0]))])
    assert [r.status for r in results] == ["failed", "completed", "completed"]
    assert results[0].record.error.startswith(
        "logger BreaksFor.log_step raised ValueError: log_step broke")
    failed = load_record(Path(runs[0].run.out_dir) / run_id(runs[0]))
    assert failed.status == "failed" and [e.epoch for e in failed.log] == [0]
    for a, b in zip(plain[1:], results[1:], strict=True):
        assert comparable(a.record) == comparable(b.record)
        assert checkpoint_gap(a.run_dir, b.run_dir) == 0.0


def test_an_epoch_trained_again_after_the_once_per_epoch_check_logs_its_steps_once(tmp_path):
    """check="epoch" (a stack on a GPU, captured steps): an epoch in which a run turned
    non-finite is trained again with per-step checks; the loggers heard its steps in the
    first pass, and hear them no second time (they heard every step of it twice: a
    progress bar went past its end, and named the wrong epoch from then on). A logger's
    step error of the first pass still fails its run."""
    from creditaudit.loggers import LoggerGroup
    from creditaudit.run.steps.epochs import StackedEpochs
    from creditaudit.run.trainer import Trainer

    runs = configs(tmp_path, "bp")
    runs[0] = runs[0].replace(**{"optim.lr": 1e300})

    class Broken(RunLogger):
        def log_step(self, loss):  # noqa: ANN001
            raise ValueError("no")

    def steps_heard(check: str) -> tuple[list[int], list]:
        trainers = [Trainer(c) for c in runs]
        heard = [PerRun() for _ in trainers]
        for trainer, logger in zip(trainers, heard, strict=True):
            trainer.loggers = LoggerGroup([logger])
        trainers[2].loggers.loggers.append(Broken())
        runner = StackedEpochs(trainers, check=check)
        stats = [runner.train_epoch(1), runner.train_epoch(2)]
        return [sum(logger.steps.values()) for logger in heard], stats

    (per_step, step_stats), (per_epoch, epoch_stats) = steps_heard("step"), steps_heard("epoch")
    assert per_epoch[1] == per_step[1] == 2 * len(Trainer(runs[1]).train_loader)
    assert epoch_stats[0][0] is None  # run 0 diverged in epoch 1
    for stats in (step_stats, epoch_stats):
        assert isinstance(stats[0][2], GuestError)


def test_the_console_lines_of_a_stack_say_which_run_they_are(tmp_path, capsys):
    """`train_stacked` with progress on printed K interleaved lines per epoch, each led by
    the method name alone (`dfa epoch 1/2 | …` three times): no line said which run's
    accuracy and verdict it was. Each now leads with its run id."""
    runs = [c.replace(**{"run.progress": True}) for c in configs(tmp_path, "dfa")]
    train_stacked(runs)
    ids = [run_id(c) for c in runs]
    lines = capsys.readouterr().out.splitlines()
    epoch_lines = [line.split(" | ")[0] for line in lines if " epoch " in line]
    assert sorted(epoch_lines) == sorted(f"{i} epoch {e}/2" for i in ids for e in (0, 1, 2))
    assert {line.split(":")[0] for line in lines if "completed after" in line} == {
        f"run {i}" for i in ids}
