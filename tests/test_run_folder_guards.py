"""A run folder's own files are guarded where commands read and write beside them:

- no command writes its output over a run's record, checkpoint, init, config or claim;
- ``audit`` takes the data from ``--data-dir`` when the recorded folder is not there;
- a record whose config was edited after it was written is refused where it is served,
  audited or reported;
- a checkpoint's non-finite weights are named as the checkpoint's;
- a sweep that meets a truncated checkpoint says what works for ``sweep``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.records import RUN_FOLDER_FILES
from integrity_support import assert_one_line_error, snapshot, tiny_config, write_idx_dataset


@pytest.fixture(scope="module")
def finished(tmp_path_factory, single_thread) -> SimpleNamespace:
    """One finished tiny DFA run on tiny MNIST-layout IDX files, shared by the module."""
    from creditaudit.run.trainer import train

    root = tmp_path_factory.mktemp("guards")
    data = write_idx_dataset(root / "mnist")
    overrides = tiny_config(data, root / "results", **{"method.name": "dfa"})
    run = train(RunConfig().replace(**overrides))
    assert run.status == "completed"
    return SimpleNamespace(root=root, data=data, results=root / "results", run=run,
                           overrides=overrides)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def copy_run(finished: SimpleNamespace, tmp_path: Path) -> Path:
    """A copy of the finished run's folder in a results folder of its own."""
    run_dir = tmp_path / "results" / finished.run.run_dir.name
    shutil.copytree(finished.run.run_dir, run_dir)
    return run_dir


# --- 1. no output over a run's own files ---------------------------------------------------
@pytest.mark.parametrize("name", RUN_FOLDER_FILES)
def test_audit_refuses_to_write_its_report_over_a_run_file(finished, tmp_path, capsys, name):
    run_dir = copy_run(finished, tmp_path)
    (run_dir / "claim.json").write_text("{}")  # as while a sweep worker holds the run
    before = snapshot(run_dir)
    code, out, err = run_cli(capsys, ["audit", str(run_dir), "--no-metrics", "-q",
                                      "--output", str(run_dir / name)])
    assert code == 2
    assert_one_line_error(out, err, str(run_dir / name), "run's own files")
    assert snapshot(run_dir) == before
    # Another run's files are refused too, and a file of another name beside them is fine.
    code, out, err = run_cli(capsys, ["audit", str(run_dir), "--no-metrics", "-q",
                                      "--output", str(run_dir / "audit.txt")])
    assert code == 0, err
    assert "verdict" in (run_dir / "audit.txt").read_text().lower()


@pytest.mark.parametrize("command", [["report", "--out"], ["figures", "--out"], ["export"]])
def test_folder_outputs_never_replace_a_run_file(finished, tmp_path, capsys, command):
    """report, figures and export write fixed names (report.md, figures/*.png, the export
    layout) into a folder: one that is a run's file is a file in the way."""
    run_dir = copy_run(finished, tmp_path)
    before = snapshot(run_dir)
    argv = [command[0], str(run_dir.parent), *command[1:], str(run_dir / "record.json")]
    code, out, err = run_cli(capsys, argv)
    assert code == 2
    assert_one_line_error(out, err, "record.json")
    assert snapshot(run_dir) == before
