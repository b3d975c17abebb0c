"""A reader that closes stdout (``creditaudit experiment --list | head -1``) ends the command
quietly: no "error: … Broken pipe" line, no traceback, the exit status of a closed pipe
(141); a command whose stdout is read to the end is unaffected."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from creditaudit.cli import CLOSED_STDOUT_EXIT


def _run_with_stdout_closed(*args: str) -> subprocess.CompletedProcess:
    """``python -m creditaudit ARGS`` whose stdout pipe has no reader by the time it writes
    (the read end is closed at once: deterministic, unlike ``| head -1``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "creditaudit", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)


def test_a_closed_stdout_ends_the_command_quietly():
    done = _run_with_stdout_closed("experiment", "--list")
    assert done.stderr == ""
    assert done.returncode == CLOSED_STDOUT_EXIT == 141


def test_a_read_stdout_is_unaffected():
    done = subprocess.run([sys.executable, "-m", "creditaudit", "experiment", "--list"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[0].startswith("audit_table")


TINY_TRAIN = ("train", "--method", "dfa", "--epochs", "2", "--threads", "1",
              "--set", "data.n_train=128", "--set", "data.n_test=64", "--set", "data.in_dim=8",
              "--set", "data.teacher_width=16", "--set", "model.d=8",
              "--set", "model.n_blocks=2", "--set", "optim.batch_size=64",
              "--set", "diagnostics.eval_samples=64", "--set", "diagnostics.end_of_run=false")


@pytest.mark.slow
def test_a_run_whose_stdout_reader_has_gone_trains_on(tmp_path):
    """``creditaudit train … | head -1``: the console's epoch lines meet the closed pipe;
    the run trains to its end (completed) and the command ends quietly. Before, the first
    line's BrokenPipeError failed the run (its record said ``failed: BrokenPipeError``)."""
    from creditaudit.records import load_record

    done = _run_with_stdout_closed(*TINY_TRAIN, "--out", str(tmp_path))
    assert done.stderr == ""
    assert done.returncode == CLOSED_STDOUT_EXIT
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert load_record(run_dir).status == "completed"


@pytest.mark.slow
def test_a_run_without_stdout_trains_and_exits_cleanly(tmp_path):
    """stdout closed before the command starts (``>&-``: ``sys.stdout`` is None): the run
    trains to its end, with and without progress, and exits 0. Before, the console logger
    (and, with ``-q``, the summary's print) stopped it with an internal AttributeError."""
    from creditaudit.records import load_record

    for quiet, out in (((), tmp_path / "a"), (("-q",), tmp_path / "b")):
        done = subprocess.run([sys.executable, "-m", "creditaudit", *TINY_TRAIN, *quiet,
                               "--out", str(out)], stdin=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=300,
                              preexec_fn=lambda: os.close(1))  # noqa: PLW1509
        assert (done.returncode, done.stderr) == (0, "")
        (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
        assert load_record(run_dir).status == "completed"


class _ReaderGone(io.StringIO):
    """A stdout whose reader has gone: every write raises BrokenPipeError."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


class _Terminal(io.StringIO):
    """A stdout that is a terminal: the console draws its bar on stderr."""

    def isatty(self) -> bool:
        return True


class _TerminalGone(_ReaderGone):
    """A terminal whose reader has gone (a closed ssh session): every write raises."""

    def isatty(self) -> bool:
        return True


def _closed() -> io.StringIO:
    stream = io.StringIO()
    stream.close()
    return stream


def _tiny_console_run(tmp_path):  # noqa: ANN202 — a RunConfig
    from creditaudit.config import RunConfig

    return RunConfig().replace(**{
        "method.name": "dfa", "optim.epochs": 2, "run.threads": 1, "data.n_train": 128,
        "data.n_test": 64, "data.in_dim": 8, "data.teacher_width": 16, "model.d": 8,
        "model.n_blocks": 2, "optim.batch_size": 64, "diagnostics.eval_samples": 64,
        "diagnostics.end_of_run": True,
        "run.out_dir": str(tmp_path), "run.progress": True})


@pytest.mark.parametrize("stdout", [_ReaderGone, lambda: None, _closed],
                         ids=["reader gone", "none", "closed"])
def test_the_console_of_a_run_without_a_stdout_is_silent(tmp_path, monkeypatch, stdout):
    """In process, the quick twin of the two above: the console logger on a stdout whose
    reader has gone, on none (``sys.stdout`` None) or on one closed (in Python), prints
    nothing and the run completes (before: failed with BrokenPipeError, or an
    AttributeError or a ValueError from isatty before it started)."""
    from creditaudit.run.trainer import train

    monkeypatch.setattr(sys, "stdout", stdout())
    assert train(_tiny_console_run(tmp_path)).record.status == "completed"


@pytest.mark.parametrize("stderr", [_TerminalGone, lambda: None, _closed],
                         ids=["reader gone", "none", "closed"])
def test_the_bar_of_a_run_without_a_stderr_is_silent(tmp_path, monkeypatch, stderr):
    """stdout a terminal, so the console draws its bar on stderr, which is closed
    (``2>&-``: None; closed in Python) or has no reader: no bar, no epoch lines, and the
    run completes (before: it failed with a BrokenPipeError, an AttributeError or a
    ValueError)."""
    from creditaudit.run.trainer import train

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", stderr())
    assert train(_tiny_console_run(tmp_path)).record.status == "completed"
    assert terminal.getvalue() == ""


def test_a_terminal_with_stderr_sent_to_a_file_shows_the_epoch_lines(tmp_path, monkeypatch):
    """`creditaudit train … 2> err.log` in a terminal: the bar went to err.log (frame after
    frame, lines of carriage returns) and the terminal showed nothing until the run ended.
    Now the epoch lines are printed on stdout, as when it is piped, and err.log gets no bar."""
    from creditaudit.run.trainer import train

    terminal, log_file = _Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", log_file)
    assert train(_tiny_console_run(tmp_path)).record.status == "completed"
    lines = terminal.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines if " epoch " in line] == [
        "dfa epoch 0/2", "dfa epoch 1/2", "dfa epoch 2/2"]
    assert "\r" not in log_file.getvalue() and "%|" not in log_file.getvalue()


class _WriteOnly:
    """A stand-in stream that only writes, as a researcher's ``sys.stderr = Tee(...)``."""

    def __init__(self) -> None:
        self.text = io.StringIO()

    def write(self, text: str) -> int:
        return self.text.write(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("replaced", ["stdout", "stderr"])
def test_a_stream_replaced_by_an_object_without_isatty_is_no_terminal(tmp_path, monkeypatch,
                                                                       replaced):
    """train() in a terminal with sys.stderr (or sys.stdout) replaced by a writer without
    isatty stopped with AttributeError: 'Tee' object has no attribute 'isatty' (for
    stderr since the bar needs both streams to be terminals). Such a stream is no
    terminal: the run trains and prints its epoch lines."""
    from creditaudit.run.trainer import train

    streams = {"stdout": _Terminal(), "stderr": _Terminal(), replaced: _WriteOnly()}
    monkeypatch.setattr(sys, "stdout", streams["stdout"])
    monkeypatch.setattr(sys, "stderr", streams["stderr"])
    assert train(_tiny_console_run(tmp_path)).record.status == "completed"
    stdout = streams["stdout"]
    printed = (stdout.text if isinstance(stdout, _WriteOnly) else stdout).getvalue()
    assert "dfa epoch 2/2 | " in printed
