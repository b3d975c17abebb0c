"""What ``creditaudit experiment`` says it did: the runs trained, diverged, failed, busy and
skipped counted apart (a run that failed in training is not "trained"), and a line, also
under ``-q``, while it waits for a run another process holds."""

from __future__ import annotations

import json
from types import SimpleNamespace

from creditaudit.cli import main


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
