"""An interrupted run whose record logs trained epochs but whose checkpoint is gone (a
results folder copied without its ``.pt`` files, as old records travel): the sweep deleted
the record and trained the run from scratch, without a word, where ``train --resume`` refuses
it. It now refuses the run in one line and exits 1; the record is left as it is. ``train``
(without --resume) said to pass --resume, which then fails: it now says the checkpoint is
gone and what to do."""

from __future__ import annotations

import json

from creditaudit.cli import main
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, load_record, save_record
from sweep_files import write_tiny_sweep


def _lost_checkpoint(tmp_path):
    """A tiny 2-epoch sweep, trained; then its run as if interrupted after epoch 1, its
    checkpoint gone. Returns (sweep file, run folder, the record's bytes)."""
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", epochs=2)
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    [run_dir] = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    record = load_record(run_dir)
    record.status, record.final, record.log = "interrupted", None, record.log[:2]  # epoch 1
    save_record(run_dir, record)
    (run_dir / CHECKPOINT_FILE).unlink()
    return sweep, run_dir, (run_dir / RECORD_FILE).read_bytes()


def test_a_sweep_refuses_an_interrupted_run_whose_checkpoint_is_gone(tmp_path, capsys):
    sweep, run_dir, written = _lost_checkpoint(tmp_path)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--dry-run"]) == 0
    assert f"refused: {run_dir / CHECKPOINT_FILE} is missing" in capsys.readouterr().out
    assert main(["sweep", str(sweep), "--workers", "0"]) == 1
    out = capsys.readouterr().out
    assert f"refused: {run_dir.name}: " in out and "logs training up to epoch 1" in out
    assert (run_dir / RECORD_FILE).read_bytes() == written  # not trained over
    assert not (run_dir / CHECKPOINT_FILE).exists()
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert summary["counts"] == {"refused": 1}


def test_train_says_an_interrupted_runs_checkpoint_is_gone_not_to_resume(tmp_path, capsys):
    _, run_dir, written = _lost_checkpoint(tmp_path)
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / "config.toml"), "-q"]) != 0
    err = capsys.readouterr().err
    assert "pass --resume" not in err and "Traceback" not in err
    assert f"no {CHECKPOINT_FILE}: its record logs training up to epoch 1" in err
    assert (run_dir / RECORD_FILE).read_bytes() == written
