"""A guest that raises a ``BaseException`` of its own — neither an ``Exception``, an interrupt
nor a ``sys.exit`` — is named in one line like any other failure of its code, and the run it
stops is recorded failed, not left 'running'."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from creditaudit.errors import GuestError
from creditaudit.guests.blame import blame
from creditaudit.loggers import RunLogger
from creditaudit.records import load_record
from creditaudit.run.trainer import train
from door_support import ORIGIN, cli_args, error_line, site_with
from plugin_support import cli
from test_logger_guests import run_dir_name, tiny

pytestmark = pytest.mark.usefixtures("single_thread")


class Abort(BaseException):
    """Not an Exception."""


def test_blame_names_a_guests_own_base_exception():
    with pytest.raises(GuestError, match=r"^my plugin raised Abort: gave up \(at "), \
            blame("my plugin"):
        raise Abort("gave up")
    with pytest.raises(KeyboardInterrupt), blame("my plugin"):  # an interrupt stays one
        raise KeyboardInterrupt


class AbortingLogger(RunLogger):
    def log_epoch(self, entry):  # noqa: ANN001
        if entry.epoch == 1:
            raise Abort("the logger gave up")


@pytest.mark.slow  # a tiny run: about 7 s
def test_a_logger_raising_a_base_exception_is_named_and_the_run_failed(tmp_path):
    with pytest.raises(GuestError, match=r"^logger AbortingLogger\.log_epoch raised Abort: "
                       "the logger gave up"):
        train(tiny(tmp_path), loggers=[AbortingLogger()])
    failed = load_record(tmp_path / run_dir_name(tmp_path))
    assert failed.status == "failed" and "AbortingLogger" in failed.error


@pytest.mark.slow  # a tiny run in a subprocess: about 11 s
def test_a_rules_base_exception_in_training_is_one_line_and_recorded(tmp_path):
    site = site_with(tmp_path, "late-step-aborts", "door-mixture")
    out = tmp_path / "runs"
    done = cli(site, "train", *cli_args(out, **{"method.name": "late-step-aborts"}),
               cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: credit rule plugin 'late-step-aborts' "
                           f"({ORIGIN}) raised Abort: the step gave up (at late_guests.py:"), line
    record = json.loads((out / run_dir_name(out) / "record.json").read_text())
    assert record["status"] == "failed", record["status"]
    assert "late-step-aborts" in record["error"], record["error"]


def stack_of_two(out):
    """Two tiny backprop runs (seeds 1 and 2) that train as one stack."""
    from creditaudit.config import RunConfig
    from test_stacked import TINY

    return [RunConfig().replace(**{**TINY, "run.out_dir": str(out), "method.name": "bp",
                                   "run.seed": seed}) for seed in (1, 2)]


def aborting(original, seed: int):
    """``original`` (a Trainer method of the epoch, or of none), raising Abort — as a guest's
    forward or rule would — in run ``seed``'s epoch 1, or its finish."""
    def method(self, *epoch):
        if self.config.run.seed == seed and epoch in ((), (1,)):
            raise Abort("the forward gave up")
        return original(self, *epoch)
    return method


@pytest.mark.parametrize("where", ["measure", "finish"])
def test_a_base_exception_in_one_stacked_run_fails_it_as_alone(tmp_path, monkeypatch, where):
    """A stacked run's evaluation or end of run that raises a guest's own BaseException is
    recorded failed, as the run alone records it, and the other run trains on (it was left
    'running', and the error ended the whole stack)."""
    from creditaudit.run.stacked import train_stacked
    from creditaudit.run.trainer import Trainer

    monkeypatch.setattr(Trainer, where, aborting(getattr(Trainer, where), seed=2))
    with pytest.raises(Abort):
        train(stack_of_two(tmp_path / "alone")[1])
    alone = load_record(next((tmp_path / "alone").iterdir()))
    first, second = train_stacked(stack_of_two(tmp_path / "stacked"))
    assert (first.status, second.status) == ("completed", "failed")
    record = load_record(second.run_dir)
    assert (record.status, record.error) == ("failed", alone.error) == (
        "failed", "Abort: the forward gave up"), record.error


def test_a_base_exception_in_the_shared_step_fails_every_run_of_the_stack(tmp_path,
                                                                        monkeypatch):
    """The shared step raising a guest's own BaseException fails each run still training
    (recorded, not left 'running') and is raised, as an Exception there is."""
    from creditaudit.run.stacked import train_stacked
    from creditaudit.run.steps.epochs import StackedEpochs

    def train_epoch(self, epoch):
        raise Abort("the step gave up")

    monkeypatch.setattr(StackedEpochs, "train_epoch", train_epoch)
    with pytest.raises(Abort):
        train_stacked(stack_of_two(tmp_path))
    records = [load_record(folder) for folder in sorted(tmp_path.iterdir())]
    assert [(r.status, r.error) for r in records] == [
        ("failed", "Abort: the step gave up")] * 2


def test_rays_worker_shutdown_inside_guest_code_passes_as_ray_raised_it():
    """Ray shuts a sweep's worker down with a SystemExit raised wherever the worker is — in a
    plugin's code (a diagnostic, a dataset's load) or a user's logger too: blame() and a
    logger's call named it the guest's 'sys.exit(1)', so the run was recorded failed, its
    plugin blamed, where the trainer and the sweep keep it interrupted, to resume."""
    raylet = pytest.importorskip("ray._raylet")
    from creditaudit.loggers.base import LoggerGroup

    with pytest.raises(SystemExit) as shut, blame("my plugin"):
        raylet.raise_sys_exit_with_custom_error_message("worker shut down", 1)
    assert hasattr(shut.value, "ray_terminate_msg")  # Ray's own, unchanged

    class ShutDownLogger(RunLogger):
        def log_epoch(self, entry):  # noqa: ANN001
            raylet.raise_sys_exit_with_custom_error_message("worker shut down", 1)

    with pytest.raises(SystemExit) as shut:
        LoggerGroup([ShutDownLogger()]).log_epoch(SimpleNamespace(epoch=1))
    assert hasattr(shut.value, "ray_terminate_msg")  # Ray's own, unchanged


def test_pytest_skip_inside_guest_code_passes_as_pytest_raised_it():
    """pytest.skip and pytest.fail are BaseExceptions: a user's test that skips inside a
    factory or plugin (no GPU there) was failed with a GuestError instead of skipped."""
    from creditaudit.loggers.base import LoggerGroup

    with pytest.raises(pytest.skip.Exception), blame("my plugin"):
        pytest.skip("no GPU here")
    with pytest.raises(pytest.fail.Exception), blame("my plugin"):
        pytest.fail("the plugin's own test failed")

    class SkippingLogger(RunLogger):
        def log_epoch(self, entry):  # noqa: ANN001
            pytest.skip("no GPU here")

    with pytest.raises(pytest.skip.Exception):
        LoggerGroup([SkippingLogger()]).log_epoch(SimpleNamespace(epoch=1))
