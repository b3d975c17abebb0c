"""``OUT/sweep_summary.json`` keeps the runs of every sweep and experiment written into the
folder: a second invocation (run at once, or after) used to replace the file with its own
runs only, losing the other's."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from creditaudit.config import RunConfig
from creditaudit.sweep import SUMMARY_FILE, InlineExecutor, prepare_configs, run_sweep
from creditaudit.sweep.runner import SUMMARY_SCHEMA, reported_status
from sweep_files import TINY_SWEEP_BASE

TINY = {**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128, "run.progress": False}


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


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
                       "runs": [{"run_id": f"run-{i}", "status": "busy", "error": None}]},
                      reported_status)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert sorted(run["run_id"] for run in summary["runs"]) == sorted(
        f"run-{i}" for i in range(12))
    assert summary["counts"] == {"busy": 12}


def test_an_unreadable_summary_is_replaced(tmp_path):
    from creditaudit.sweep.summary_file import write_summary

    (tmp_path / SUMMARY_FILE).write_text("{not json")
    write_summary(tmp_path / SUMMARY_FILE,
                  {"schema": SUMMARY_SCHEMA, "n_runs": 1, "counts": {"busy": 1},
                   "runs": [{"run_id": "r", "status": "busy", "error": None}]},
                  reported_status)
    assert json.loads((tmp_path / SUMMARY_FILE).read_text())["n_runs"] == 1


def test_an_earlier_run_whose_record_is_gone_is_not_counted_as_finished(tmp_path):
    """An earlier invocation's entry kept its written status when its run's folder was
    deleted since: the merged summary counted a run without a record as completed (found by
    p49)."""
    import shutil

    first = run_sweep(prepare_configs([tiny(tmp_path, **{"run.seed": 1})], threads=1),
                      InlineExecutor())
    gone = first.outcomes[0]["run_id"]
    shutil.rmtree(tmp_path / gone)
    from creditaudit.sweep.summary_file import write_summary

    write_summary(tmp_path / SUMMARY_FILE,
                  {"schema": SUMMARY_SCHEMA, "n_runs": 1, "counts": {"busy": 1},
                   "runs": [{"run_id": "r", "status": "busy", "error": None}]},
                  reported_status)
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert [(run["run_id"], run["status"]) for run in summary["runs"]] == [
        (gone, "not started"), ("r", "busy")]
    assert summary["counts"] == {"not started": 1, "busy": 1}
