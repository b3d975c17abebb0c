"""What ``creditaudit experiment`` says it did: the runs trained, diverged, failed, busy and
skipped counted apart (a run that failed in training is not "trained"), and a line, also
under ``-q``, while it waits for a run another process holds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

from creditaudit.cli import experiment as experiment_cli
from creditaudit.cli import main
from creditaudit.records import CLAIM_FILE
from creditaudit.study.experiments import get_experiment
from creditaudit.sweep import plan_runs


def test_runs_that_failed_diverged_or_were_busy_are_not_counted_trained(tmp_path, capsys,
                                                                         monkeypatch):
    """The closing line said "8 trained now" of runs of which one failed in training (and
    one was busy elsewhere): every run the sweep handed a worker counted as trained."""
    import creditaudit.sweep

    ends = [("failed", "trained", "RuntimeError: boom"), ("diverged", "resumed", None),
            ("busy", "busy", None), ("interrupted", "trained", None)]

    def sweep(todo, executor, **kwargs):  # noqa: ANN001, ANN003, ANN202 - run_sweep's
        outcomes = []
        for i, plan in enumerate(todo):
            status, action, error = ends[i] if i < len(ends) else ("completed", "trained",
                                                                   None)
            outcomes.append({"run_id": plan.run_id, "status": status, "action": action,
                             "error": error, "seconds": 0.0, "pid": None, "host": None})
        return SimpleNamespace(outcomes=outcomes)

    monkeypatch.setattr(creditaudit.sweep, "run_sweep", sweep)
    assert main(["experiment", "fresh_null", "--scale", "smoke", "--out", str(tmp_path),
                 "-q"]) == 1  # no record on disk: every run is missing
    out = capsys.readouterr().out
    assert ("(0/8 runs, 4 trained now, 1 diverged, 1 failed, 1 interrupted, 1 busy)"
            in out)
    summary = json.loads((tmp_path / "experiments" / "fresh_null.smoke.synthetic.json"
                          ).read_text())
    execution = summary["meta"]["execution"]
    assert {key: execution[key] for key in ("trained", "diverged", "failed", "interrupted",
                                            "busy", "skipped", "refused")} == {
        "trained": 4, "diverged": 1, "failed": 1, "interrupted": 1, "busy": 1, "skipped": 0,
        "refused": 0}
    assert execution["actions"] == {"trained": 6, "resumed": 1, "busy": 1}


def test_quiet_experiment_says_which_run_it_waits_for_and_when_it_stops(tmp_path, capsys,
                                                                         monkeypatch):
    """``experiment -q`` waited silently for a run another process held: minutes without a
    word. It names the run and its holder (the claim's words), and says when the wait ends."""
    held = plan_runs(get_experiment("fresh_null").configs("smoke", out_dir=tmp_path))[0]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held.run_dir.mkdir(parents=True)
        (held.run_dir / CLAIM_FILE).write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "time": "then",
             "unix_time": time.time(), "token": "someone-else"}))
        report = experiment_cli._LazyProgress.__call__

        def reported(self, state, outcome) -> None:  # noqa: ANN001
            report(self, state, outcome)
            if outcome is not None and outcome["status"] == "busy":
                holder.kill()  # the holder ends once waited for: its claim holds nothing
                holder.wait()

        monkeypatch.setattr(experiment_cli._LazyProgress, "__call__", reported)
        assert main(["experiment", "fresh_null", "--scale", "smoke", "--out", str(tmp_path),
                     "-q"]) == 0
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.splitlines()
    waits = [line for line in err if held.run_id in line]
    assert waits == [
        f"waiting for {held.run_id}: another process holds it: pid {holder.pid} on "
        f"{socket.gethostname()}",
        f"stopped waiting for {held.run_id}: its holder released it; training it here"]


def test_a_run_its_holder_finishes_ends_the_wait_without_training_it(capsys):
    progress = experiment_cli._LazyProgress(quiet=True)
    state = SimpleNamespace(total=2, tasks=[])
    progress(state, {"run_id": "r1", "status": "busy", "action": "busy", "error": None,
                     "holder": {"pid": 7, "host": "elsewhere"}})
    progress(state, {"run_id": "r1", "status": "completed", "action": "skipped",
                     "error": None})
    assert capsys.readouterr().err.splitlines() == [
        "waiting for r1: another process holds it: pid 7 on elsewhere",
        "stopped waiting for r1: its holder ended it (completed); not trained here"]


def test_a_busy_run_names_its_holder_in_words(tmp_path):
    """A run busy in this invocation's sweep, without a record, was listed missing with its
    claim's raw dict ("{'pid': 7, 'host': ...}") as the reason."""
    from creditaudit.study.experiments.runner import summarise_experiment

    experiment = get_experiment("fresh_null")
    plans = plan_runs(experiment.configs("smoke", out_dir=tmp_path))
    busy = {plans[0].run_id: {"run_id": plans[0].run_id, "status": "busy", "action": "busy",
                              "error": None, "holder": {"pid": 7, "host": "elsewhere"}}}
    summary = summarise_experiment(experiment, plans, scale="smoke", dataset="synthetic",
                                   out_dir=tmp_path, outcomes=busy)
    assert summary["meta"]["missing"][0] == {
        "run_id": plans[0].run_id, "status": "busy",
        "error": "another process holds it: pid 7 on elsewhere"}
    assert summary["meta"]["execution"]["busy"] == 1
