"""A reader that closes stdout (``creditaudit experiment --list | head -1``) ends the command
quietly: no "error: … Broken pipe" line, no traceback, the exit status of a closed pipe
(141); a command whose stdout is read to the end is unaffected."""

from __future__ import annotations

import os
import subprocess
import sys

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
