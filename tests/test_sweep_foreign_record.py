"""A run folder that holds ANOTHER run's record (a folder copied or renamed by hand): the
sweep counted it as that run — finished, so skipped, its numbers another run's — or trained
over it. It now refuses the run, says why in one line and exits 1, as ``train`` and
``creditaudit experiment`` refuse it; the record is left as it is."""

from __future__ import annotations

import json
import shutil

from creditaudit.cli import main
from creditaudit.records import RECORD_FILE
from sweep_files import write_tiny_sweep


def _copied_over(tmp_path):
    """A two-run sweep, trained; then the dfa run's folder replaced by a copy of the bp
    run's. Returns (sweep file, dfa run folder, bp run id, the copied record's bytes, the
    dfa run's config)."""
    from creditaudit.config import load_config

    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp", "dfa"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    dirs = {d.name.split("-")[0]: d for d in (tmp_path / "out").iterdir() if d.is_dir()}
    config = load_config(dirs["dfa"] / "config.toml").to_dict()
    shutil.rmtree(dirs["dfa"])
    shutil.copytree(dirs["bp"], dirs["dfa"])
    written = (dirs["dfa"] / RECORD_FILE).read_bytes()
    return sweep, dirs["dfa"], dirs["bp"].name, written, config


def test_a_sweep_refuses_a_folder_holding_another_runs_record(tmp_path, capsys):
    sweep, run_dir, other, written, _ = _copied_over(tmp_path)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--dry-run"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("name=dfa"))
    assert f"refused: {run_dir / RECORD_FILE} holds the record of run {other}" in row
    assert "done" not in row
    for extra in ([], ["--retry-failed"]):
        assert main(["sweep", str(sweep), "--workers", "0", *extra]) == 1
        out, err = capsys.readouterr()
        [line] = [line for line in out.splitlines() if line.startswith("refused: ")]
        assert f"refused: {run_dir.name}: " in line and f"holds the record of run {other}" \
            in line and "move it away" in line
        assert "refused 1," in err.strip().splitlines()[-1]
        assert (run_dir / RECORD_FILE).read_bytes() == written  # neither trained over
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert summary["counts"] == {"completed": 1, "refused": 1}
    [refused] = [run for run in summary["runs"] if run["run_id"] == run_dir.name]
    assert refused["action"] == "refused" and other in refused["error"]


def test_a_worker_refuses_a_folder_holding_another_runs_record(tmp_path):
    """The worker's own check (a folder copied after the sweep looked)."""
    from creditaudit.sweep.worker import run_task

    _, run_dir, other, written, config = _copied_over(tmp_path)
    outcome = run_task({"config": config, "run_id": run_dir.name}, retry_failed=True)
    assert (outcome["status"], outcome["action"]) == ("refused", "refused")
    assert f"holds the record of run {other}" in outcome["error"]
    assert (run_dir / RECORD_FILE).read_bytes() == written
