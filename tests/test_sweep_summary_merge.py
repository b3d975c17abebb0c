"""``OUT/sweep_summary.json`` keeps the runs of every sweep and experiment written into the
folder: a second invocation (run at once, or after) used to replace the file with its own
runs only, losing the other's."""

from __future__ import annotations

import json
import threading

import pytest

from creditaudit.sweep import SUMMARY_FILE, InlineExecutor, prepare_configs, run_sweep
from creditaudit.sweep.summary_file import SUMMARY_SCHEMA, reported_status
from sweep_files import tiny_sweep_run as tiny

pytestmark = pytest.mark.usefixtures("single_thread")


def test_a_second_sweep_into_one_folder_keeps_the_first_ones_runs(tmp_path):
    first = run_sweep(prepare_configs([tiny(tmp_path, **{"run.seed": 1})], threads=1),
                      InlineExecutor(), summary_extra={"sweep_file": "a.toml"})
    second = run_sweep(prepare_configs([tiny(tmp_path, **{"run.seed": 2})], threads=1),
                       InlineExecutor(), summary_extra={"experiments": ["fresh_null"]})
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    ids = [run["run_id"] for run in summary["runs"]]
    assert ids == [first.outcomes[0]["run_id"], second.outcomes[0]["run_id"]]
    assert summary["n_runs"] == 2 and summary["counts"] == {"completed": 2}
    assert summary["experiments"] == ["fresh_null"]  # the last writer's top-level fields
    # what each invocation returns is its own runs only
    assert [run["run_id"] for run in second.summary["runs"]] == ids[1:]
    # the same runs again replace their own entries, once each
    run_sweep(prepare_configs([tiny(tmp_path, **{"run.seed": 1})], threads=1),
              InlineExecutor())
    again = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert sorted(run["run_id"] for run in again["runs"]) == sorted(ids)
    assert [run["action"] for run in again["runs"]] == ["trained", "skipped"]


def test_writers_at_once_lose_no_run(tmp_path):
    """Read, merge and replace under a lock on the folder: writers at once each keep their
    run (unlocked, one's read could miss another's write)."""
    from creditaudit.sweep.summary_file import write_summary


    def write(i: int) -> None:
        write_summary(tmp_path / SUMMARY_FILE,
                      {"schema": SUMMARY_SCHEMA, "n_runs": 1, "counts": {"busy": 1},
                       "runs": [{"run_id": f"run-{i}", "status": "failed", "error": "e"}]},
                      reported_status)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert sorted(run["run_id"] for run in summary["runs"]) == sorted(
        f"run-{i}" for i in range(12))
    assert summary["counts"] == {"failed": 12}


def test_an_unreadable_summary_is_replaced(tmp_path):
    from creditaudit.sweep.summary_file import write_summary

    (tmp_path / SUMMARY_FILE).write_text("{not json")
    write_summary(tmp_path / SUMMARY_FILE,
                  {"schema": SUMMARY_SCHEMA, "n_runs": 1, "counts": {"busy": 1},
                   "runs": [{"run_id": "r", "status": "busy", "error": None}]},
                  reported_status)
    assert json.loads((tmp_path / SUMMARY_FILE).read_text())["n_runs"] == 1


def test_an_earlier_entry_says_what_the_folder_holds_now(tmp_path):
    """An earlier invocation's entry is read again from its folder: a run deleted since is
    not started (it was still listed as completed), one whose record a process killed
    since left running is interrupted (it was still completed), a run a live claim holds
    is busy, and a busy run whose holder left no record and no claim is not started."""
    from creditaudit.records import load_record, save_record
    from creditaudit.records.claims import release_claim, try_claim
    from creditaudit.sweep.summary_file import write_summary

    first = run_sweep(prepare_configs([tiny(tmp_path, **{"run.seed": s}) for s in (1, 2)],
                                      threads=1), InlineExecutor())
    deleted, retrained = (outcome["run_id"] for outcome in first.outcomes)
    record = load_record(tmp_path / retrained)  # trained again since, and killed
    record.status = "running"
    save_record(tmp_path / retrained, record)
    for path in sorted((tmp_path / deleted).iterdir()):
        path.unlink()
    (tmp_path / deleted).rmdir()
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    summary["runs"] += [{"run_id": "held-run", "status": "not started", "error": None},
                        {"run_id": "gone-holder", "status": "busy", "error": None}]
    (tmp_path / SUMMARY_FILE).write_text(json.dumps(summary))
    claim, _ = try_claim(tmp_path / "held-run")
    try:
        write_summary(tmp_path / SUMMARY_FILE,
                      {"schema": SUMMARY_SCHEMA, "runs": [
                          {"run_id": "own", "status": "failed", "error": "e"}]},
                      reported_status)
    finally:
        release_claim(claim)
    merged = json.loads((tmp_path / SUMMARY_FILE).read_text())
    status = {run["run_id"]: run["status"] for run in merged["runs"]}
    assert status == {deleted: "not started", retrained: "interrupted", "held-run": "busy",
                      "gone-holder": "not started", "own": "failed"}
    assert merged["counts"] == {"not started": 2, "interrupted": 1, "busy": 1, "failed": 1}
