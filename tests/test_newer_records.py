"""A run record written by a newer creditaudit (a later schema): every reader says to
upgrade, in one line, and nothing replaces it — a sweep refuses the run instead of starting
it over, and train asks for --force before deleting it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.errors import NewerRecordError, RunRecordError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.records.files import CONTENT_KEY, content_digest
from integrity_support import assert_one_line_error
from sweep_files import write_tiny_sweep


def make_newer(record_file: Path, schema: str = "creditaudit.run/5") -> bytes:
    """Rewrite ``record_file`` as a newer version would (a later schema, a field this
    version does not know, its own content digest); returns the bytes written."""
    raw = json.loads(record_file.read_text())
    raw.pop(CONTENT_KEY, None)
    raw.update(schema=schema, field_of_a_later_version=1)
    raw[CONTENT_KEY] = content_digest(raw)
    record_file.write_text(json.dumps(raw))
    return record_file.read_bytes()


@pytest.mark.parametrize(("schema", "newer"), [("creditaudit.run/5", True),
                                               ("creditaudit.run/12", True),
                                               ("creditaudit.run/0", False),
                                               ("creditaudit.run/x", False),
                                               ("someone.else/9", False)])
def test_a_later_schema_says_to_upgrade_and_a_foreign_one_does_not(tmp_path, schema, newer):
    (tmp_path / RECORD_FILE).write_text(json.dumps({"schema": schema}))
    with pytest.raises(RunRecordError) as caught:
        load_record(tmp_path)
    assert isinstance(caught.value, NewerRecordError) == newer
    assert ("newer version of creditaudit" in str(caught.value)) == newer
    assert ("upgrade creditaudit to read it" in str(caught.value)) == newer


def test_a_sweep_refuses_a_newer_versions_run_and_leaves_it_as_it_is(tmp_path, capsys,
                                                                      caplog):
    """The sweep used to read the record as unreadable and start the run over, deleting
    what the newer version trained; now it refuses that run (exit 1) and says why, and
    --retry-failed does not replace it either."""
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp", "dfa"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    run_dir = next(d for d in (tmp_path / "out").iterdir() if d.name.startswith("dfa-"))
    written = make_newer(run_dir / RECORD_FILE)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--dry-run"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("name=dfa"))
    assert "refused" in row and "upgrade creditaudit" in row and "to restart" not in row
    for extra in ([], ["--retry-failed"]):
        with caplog.at_level(logging.WARNING):
            assert main(["sweep", str(sweep), "--workers", "0", "-q", *extra]) == 1
        assert "upgrade creditaudit to read it" in capsys.readouterr().out
        assert not any("starting" in r.getMessage() for r in caplog.records)
        assert (run_dir / RECORD_FILE).read_bytes() == written
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert {run["status"] for run in summary["runs"]} == {"completed", "newer"}


def test_train_says_to_upgrade_before_it_offers_force(tmp_path, capsys):
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    written = make_newer(run_dir / RECORD_FILE)
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / "config.toml"), "-q"]) == 2
    out, err = capsys.readouterr()
    line = assert_one_line_error(out, err, "newer version of creditaudit",
                                 "upgrade creditaudit to read it")
    assert "--force would delete it" in line
    assert (run_dir / RECORD_FILE).read_bytes() == written


def test_an_experiment_leaves_a_newer_versions_run_alone_and_says_why(tmp_path):
    """The experiment runner read such a record as corrupt, so it sent the run to its sweep
    to start over; it now refuses it before the sweep, naming the newer version."""
    from creditaudit.config import load_config
    from creditaudit.run.plan import plan_run
    from creditaudit.study.experiments.runner import run_state

    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    make_newer(run_dir / RECORD_FILE)
    status, record, error = run_state(plan_run(load_config(run_dir / "config.toml")))
    assert (status, record) == ("newer", None)
    assert "upgrade creditaudit to read it" in error


def test_a_newer_record_given_as_config_says_to_upgrade_only(tmp_path, capsys):
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    make_newer(run_dir / RECORD_FILE)
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / RECORD_FILE), "-q"]) == 2
    out, err = capsys.readouterr()
    line = assert_one_line_error(out, err, "upgrade creditaudit to read it")
    assert "pass a TOML config" not in line and "not a readable" not in line


def test_a_newer_versions_run_counts_as_newer_not_failed(tmp_path, capsys):
    """The sweep's progress line counted a refused newer-version run as failed while its
    summary said newer; both say newer now, and the sweep still exits 1."""
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp", "dfa"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    run_dir = next(d for d in (tmp_path / "out").iterdir() if d.name.startswith("dfa-"))
    make_newer(run_dir / RECORD_FILE)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--workers", "0"]) == 1
    progress = capsys.readouterr().err.strip().splitlines()[-1]
    assert "done 1," in progress and "failed 0," in progress and "newer 1," in progress
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert summary["counts"] == {"completed": 1, "newer": 1}
    [refused] = [run for run in summary["runs"] if run["status"] == "newer"]
    assert refused["action"] == "refused"


def test_a_worker_that_finds_a_newer_versions_run_says_newer(tmp_path):
    """A record rewritten by a newer version after the sweep looked (the worker's own
    check): the worker's outcome was status failed; it is newer, refused, and says why."""
    from creditaudit.config import load_config
    from creditaudit.sweep.worker import run_task

    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out",
                             '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    written = make_newer(run_dir / RECORD_FILE)
    config = load_config(run_dir / "config.toml").to_dict()
    outcome = run_task({"config": config, "run_id": run_dir.name}, retry_failed=True)
    assert (outcome["status"], outcome["action"]) == ("newer", "refused")
    assert "upgrade creditaudit to read it" in outcome["error"]
    assert (run_dir / RECORD_FILE).read_bytes() == written
