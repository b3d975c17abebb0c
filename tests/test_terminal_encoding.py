"""A terminal or pipe that cannot encode ‖, σ or × (``PYTHONIOENCODING=ascii``, a Latin-1
locale) gets those characters as ``\\uXXXX`` escapes, not an internal UnicodeEncodeError;
JSON written to it stays JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_closed_stdout import TINY_TRAIN


def _creditaudit(*args: str, encoding: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    return subprocess.run([sys.executable, "-m", "creditaudit", *args], capture_output=True,
                          env=env, timeout=300)


def test_help_on_an_ascii_terminal_escapes_what_it_cannot_encode():
    done = _creditaudit("train", "--help", encoding="ascii")
    assert done.returncode == 0, done.stderr
    assert b"\\u" in done.stdout and b"internal error" not in done.stderr


def test_a_run_and_its_json_audit_on_an_ascii_terminal(tmp_path):
    out = tmp_path / "runs"
    trained = _creditaudit(*TINY_TRAIN, "--out", str(out), "--no-progress", encoding="ascii")
    assert trained.returncode == 0, trained.stderr
    assert b"\\u2016" in trained.stdout  # the table's ‖h_L‖
    (run,) = out.iterdir()
    audited = _creditaudit("audit", str(run), "--format", "json", "--no-metrics",
                           encoding="latin-1")
    assert audited.returncode == 0, audited.stderr
    report = json.loads(audited.stdout.decode("latin-1"))
    reasons = [str(result.get("reason")) for result in report["diagnostics"].values()]
    assert any("‖" in reason for reason in reasons), reasons
