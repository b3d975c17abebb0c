"""A guest that raises a ``BaseException`` of its own — neither an ``Exception``, an interrupt
nor a ``sys.exit`` — is named in one line like any other failure of its code, and the run it
stops is recorded failed, not left 'running'."""

from __future__ import annotations

import json

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
    site = site_with(tmp_path, "p57-step-aborts", "door-mixture")
    out = tmp_path / "runs"
    done = cli(site, "train", *cli_args(out, **{"method.name": "p57-step-aborts"}),
               cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: credit rule plugin 'p57-step-aborts' "
                           f"({ORIGIN}) raised Abort: the step gave up (at p57_guests.py:"), line
    record = json.loads((out / run_dir_name(out) / "record.json").read_text())
    assert record["status"] == "failed", record["status"]
    assert "p57-step-aborts" in record["error"], record["error"]
