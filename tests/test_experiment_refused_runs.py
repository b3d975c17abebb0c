"""A run an experiment's sweep refused is listed as refused, with why, even under ``-q``.

A run whose folder cannot be claimed (a file stands where its folder is needed) is refused
by the sweep while the others go on. The experiment's missing list — on stderr, which
``-q`` keeps — and its summary (``meta.missing`` and the Markdown) say ``refused`` and the
sweep's reason, not "not started" with no reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from creditaudit.cli import main
from creditaudit.study.experiments import get_experiment
from creditaudit.sweep import plan_runs

pytestmark = pytest.mark.usefixtures("single_thread")

WHY = "a file stands where a folder is needed"


def test_refused_runs_are_listed_as_refused_with_why_under_quiet(tmp_path, capsys):
    out = tmp_path / "b"
    out.mkdir()
    # a file at every run's folder: every run is refused, so nothing trains
    ids = [plan.run_id for plan in plan_runs(
        get_experiment("fresh_null").configs("smoke", out_dir=out))]
    for run_id in ids:
        (out / run_id).write_text("x\n")
    code = main(["experiment", "fresh_null", "--scale", "smoke", "--out", str(out), "-q"])
    captured = capsys.readouterr()
    assert code == 1
    lines = [line for line in captured.err.splitlines() if line.startswith("missing: ")]
    assert len(lines) == len(ids)
    for run_id, line in zip(ids, lines):
        assert line.startswith(f"missing: {run_id} (refused): {out / run_id}: a file ")
        assert WHY in line
    summary = json.loads((out / "experiments" / "fresh_null.smoke.synthetic.json").read_text())
    meta = summary["meta"]
    assert meta["execution"]["actions"] == {"refused": len(ids)}
    assert [m["status"] for m in meta["missing"]] == ["refused"] * len(ids)
    assert all(WHY in m["error"] for m in meta["missing"])
    markdown = (out / "experiments" / "fresh_null.smoke.synthetic.md").read_text()
    assert f"`{ids[0]}` (refused: {out / ids[0]}: a file " in markdown


def test_a_run_not_trained_with_no_train_stays_not_started(tmp_path, capsys):
    """--no-train starts nothing: its missing runs are "not started" (no sweep outcome)."""
    out = tmp_path / "c"
    code = main(["experiment", "fresh_null", "--scale", "smoke", "--out", str(out), "-q",
                 "--no-train"])
    assert code == 1
    err = capsys.readouterr().err
    assert "(not started)" in err and "refused" not in err


def test_a_changed_record_is_reported_without_advice_the_experiment_does_not_need(tmp_path):
    """An experiment starts a run whose record changed after it was written over (its
    sweep does), so its state says what is wrong, not "train it again with --force"."""
    from types import SimpleNamespace

    from creditaudit.config import RunConfig
    from creditaudit.records import RECORD_FILE, new_record, save_record
    from creditaudit.study.experiments.runner import run_state

    save_record(tmp_path, new_record(RunConfig(), device="cpu", run_id=tmp_path.name))
    raw = json.loads((tmp_path / RECORD_FILE).read_text())
    raw["status"] = "completed"  # edited by hand
    (tmp_path / RECORD_FILE).write_text(json.dumps(raw))
    status, record, why = run_state(SimpleNamespace(run_dir=tmp_path))
    assert status == "corrupt" and record is None
    assert "changed after creditaudit wrote it" in why and "--force" not in why


def test_no_train_says_which_runs_another_process_trains_and_which_were_killed(tmp_path):
    """--no-train beside a running experiment (the documented use): a run another live
    process holds is ``busy`` (not "not started", nor the failure it is being trained again
    after), one whose record says ``running`` but
    whose process was killed is ``interrupted`` (the next experiment resumes it), each with
    who and why."""
    from creditaudit.records import CLAIM_FILE, new_record, save_record
    from creditaudit.study.experiments import run_experiment

    held, killed, retried, *_ = plan_runs(
        get_experiment("fresh_null").configs("smoke", out_dir=tmp_path))

    def claim(run_dir, pid):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CLAIM_FILE).write_text(json.dumps(
            {"pid": pid, "host": socket.gethostname(), "time": "then",
             "unix_time": time.time(), "token": "someone-else"}))

    claim(held.run_dir, os.getpid())  # alive: training it now
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    save_record(killed.run_dir, new_record(killed.config, device="cpu", run_id=killed.run_id))
    claim(killed.run_dir, gone.pid)  # kill -9 mid-run: its record still says running
    failed = new_record(retried.config, device="cpu", run_id=retried.run_id)
    failed.status, failed.error = "failed", "RuntimeError: boom"
    save_record(retried.run_dir, failed)
    claim(retried.run_dir, os.getpid())  # trained again elsewhere (--retry-failed)
    summary = run_experiment("fresh_null", scale="smoke", out_dir=tmp_path, train=False)
    by_id = {m["run_id"]: m for m in summary["meta"]["missing"]}
    assert by_id[held.run_id]["status"] == "busy"
    assert f"another process holds it: pid {os.getpid()}" in by_id[held.run_id]["error"]
    assert by_id[killed.run_id]["status"] == "interrupted"
    assert f"pid {gone.pid} on" in by_id[killed.run_id]["error"]
    assert "resume" in by_id[killed.run_id]["error"]
    assert by_id[retried.run_id]["status"] == "busy"
    others = [m["status"] for m in summary["meta"]["missing"]
              if m["run_id"] not in (held.run_id, killed.run_id, retried.run_id)]
    assert others and set(others) == {"not started"}


def test_a_run_several_experiments_miss_is_listed_once(tmp_path, capsys):
    """``all --no-train`` on an empty folder: every run is missing, and a run the
    experiments share (the audit table's, in up to nine of them) is named on stderr once,
    not once per experiment (240 lines for 142 runs)."""
    code = main(["experiment", "all", "--scale", "smoke", "--out", str(tmp_path), "--no-train",
                 "-q"])
    assert code == 1
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("missing: ")]
    summaries = [json.loads(path.read_text())
                 for path in (tmp_path / "experiments").glob("*.json")]
    needed = {run_id for s in summaries for run_id in s["meta"]["run_ids"]}
    named = [line.split()[1] for line in lines]
    assert sorted(named) == sorted(needed)  # each once
