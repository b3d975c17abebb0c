"""A run folder's own files are guarded where commands read and write beside them:

- no command writes its output over a run's record, checkpoint, init, config or claim;
- ``audit`` takes the data from ``--data-dir`` when the recorded folder is not there;
- a checkpoint's non-finite weights are named as the checkpoint's;
- a sweep that meets a truncated checkpoint says what works for ``sweep``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.records import RUN_FOLDER_FILES
from integrity_support import (
    as_written,
    assert_one_line_error,
    finished_dfa_run,
    snapshot,
    write_idx_dataset,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, single_thread) -> SimpleNamespace:
    """One finished tiny DFA run on tiny MNIST-layout IDX files, shared by the module."""
    return finished_dfa_run(tmp_path_factory.mktemp("guards"))


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


# --- 2. the data folder: recorded absolute, and audit --data-dir ---------------------------
def test_a_relative_data_folder_is_recorded_absolute_with_the_same_run_id(
        finished, tmp_path, monkeypatch):
    from creditaudit.records import load_record
    from creditaudit.run.plan import run_id
    from creditaudit.run.trainer import train

    shutil.copytree(finished.data, tmp_path / "mnist")
    monkeypatch.chdir(tmp_path)
    relative = RunConfig().replace(**{**finished.overrides, "data.data_dir": "mnist",
                                      "run.out_dir": "runs"})
    absolute = relative.replace(**{"data.data_dir": str(tmp_path / "mnist")})
    assert run_id(relative) == run_id(absolute) == finished.run.run_dir.name
    run = train(relative)  # the finished run's id in another folder: trained here anew
    record = load_record(run.run_dir)
    assert record.config.data.data_dir == str(tmp_path / "mnist")
    assert f'data_dir = "{tmp_path / "mnist"}"' in (run.run_dir / "config.toml").read_text()


def test_audit_finds_moved_data_with_data_dir_and_checks_it(finished, tmp_path, capsys,
                                                            monkeypatch):
    run_dir = copy_run(finished, tmp_path)
    record_file = run_dir / "record.json"
    raw = json.loads(record_file.read_text())
    raw["config"]["data"]["data_dir"] = "mnist"  # as older versions recorded `--data-dir mnist`
    record_file.write_text(as_written(raw, digest=False))
    monkeypatch.chdir(tmp_path)  # no mnist/ here
    argv = ["audit", str(run_dir), "--no-metrics", "-q"]
    code, out, err = run_cli(capsys, argv)
    assert code == 2
    line = assert_one_line_error(out, err, "mnist", f"relative to {tmp_path}", "--data-dir")
    assert "apt-get" not in line and "pip install" not in line
    with monkeypatch.context() as inside:  # from inside its folder it said "run  trained on"
        inside.chdir(run_dir)
        code, out, err = run_cli(capsys, ["audit", ".", "--no-metrics", "-q"])
    assert code == 2
    assert_one_line_error(out, err, f"run {run_dir.name} trained on data folder mnist")
    code, out, err = run_cli(capsys, [*argv, "--data-dir", str(finished.data)])
    assert code == 0, err
    assert "verdict" in out.lower()
    # another folder of other data is refused by the recorded fingerprint, not audited
    other = write_idx_dataset(tmp_path / "other", seed=1)
    code, out, err = run_cli(capsys, [*argv, "--data-dir", str(other)])
    assert code == 2
    assert_one_line_error(out, err, "fingerprint")
    code, out, err = run_cli(capsys, [*argv, "--data-dir", str(tmp_path / "gone")])
    assert code == 2
    assert_one_line_error(out, err, "--data-dir", "gone", "does not exist")


def test_a_checkpoint_with_a_nan_weight_is_named_by_audit(finished, tmp_path, capsys):
    import torch

    run_dir = copy_run(finished, tmp_path)
    checkpoint = run_dir / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["model"]["blocks.1.w1.weight"][0, 0] = float("nan")
    torch.save(state, checkpoint)
    code, out, err = run_cli(capsys, ["audit", str(run_dir), "--no-metrics", "-q"])
    assert code == 2
    line = assert_one_line_error(out, err, str(checkpoint), "blocks.1.w1.weight", "NaN")
    assert "states_fn" not in line


# --- 5. a sweep meeting a killed run's truncated checkpoint ---------------------------------
def test_a_sweep_keeps_a_killed_runs_log_and_says_what_works_for_it(finished, tmp_path,
                                                                   capsys):
    from creditaudit.records import load_record
    from integrity_support import sweep_toml

    run_dir = copy_run(finished, tmp_path)
    record_file = run_dir / "record.json"
    raw = json.loads(record_file.read_text())
    raw["status"] = "running"  # as a kill -9 during the run leaves it
    record_file.write_text(as_written(raw))
    epochs = [entry["epoch"] for entry in raw["log"]]
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])  # killed while writing it
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml({**finished.overrides, "run.out_dir": str(run_dir.parent)}))
    code, out, err = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert code == 1
    record = load_record(run_dir)
    assert record.status == "failed"
    assert [entry.epoch for entry in record.log] == epochs  # the killed run's epochs kept
    assert f"delete {checkpoint} and rerun the sweep with --retry-failed" in record.error
    # what it says works: the run starts over and completes
    checkpoint.unlink()
    code, out, err = run_cli(capsys, ["sweep", str(sweep), "--workers", "0",
                                      "--retry-failed"])
    assert code == 0, out + err
    assert load_record(run_dir).status == "completed"


# --- 6. a record changed after it was written ---------------------------------------------
def test_a_record_changed_after_it_was_written_is_never_served_audited_or_reported(
        finished, tmp_path, capsys):
    from creditaudit.errors import RunRecordError
    from creditaudit.run.trainer import train

    for change in ("config", "result"):
        run_dir = copy_run(finished, tmp_path / change)
        record_file = run_dir / "record.json"
        raw = json.loads(record_file.read_text())
        if change == "config":
            raw["config"]["optim"]["lr"] = 0.5  # a run that did not happen
        else:
            raw["log"][-1]["acc_eval"] = 0.99  # a number the run did not reach
        record_file.write_text(json.dumps(raw, indent=1))
        before = snapshot(run_dir)
        config = RunConfig().replace(**{**finished.overrides,
                                        "run.out_dir": str(run_dir.parent)})
        with pytest.raises(RunRecordError, match="changed after creditaudit wrote it"):
            train(config)
        code, out, err = run_cli(capsys, ["audit", str(run_dir), "--no-metrics", "-q"])
        assert code == 2
        line = assert_one_line_error(out, err, str(record_file), "changed after", "--force")
        assert line.count("--force") == 1
        # report lists it among the unreadable records, with the reason (beside a readable
        # record: a folder of only unreadable ones has nothing to report, and is refused)
        code, out, err = run_cli(capsys, ["report", str(run_dir.parent), "--out",
                                          str(tmp_path / change / "rep")])
        assert code == 2 and "holds 1 run record but none that could be read" in err, err
        beside = run_dir.parent / "legacy" / "record.json"
        beside.parent.mkdir()
        beside.write_bytes((Path(__file__).parent / "legacy_records" / "run1_dfa.json")
                           .read_bytes())
        code, out, err = run_cli(capsys, ["report", str(run_dir.parent), "--out",
                                          str(tmp_path / change / "rep")])
        shutil.rmtree(beside.parent)
        assert code == 0, err
        assert "changed after creditaudit wrote it" in (
            tmp_path / change / "rep" / "report.md").read_text()
        assert snapshot(run_dir) == before
    # --force trains it again
    result = train(config.replace(**{"run.progress": False}), force=True)
    assert result.record.config.optim.lr == config.optim.lr
    assert result.record.run_id == finished.run.run_dir.name


@pytest.mark.parametrize("name", ["checkpoint.pt", "init.pt", "config.toml"])
def test_force_refuses_a_folder_named_as_a_run_file_before_removing_anything(
        finished, tmp_path, name):
    """A folder standing where a run keeps one of its files: `train … --force` once deleted
    record.json and then stopped with "checkpoint.pt: it is a folder, not a file" and no
    advice. Now one line says what to move away and how to go on; nothing is removed (the
    folder and what it holds are no run's file)."""
    from creditaudit.errors import OutputError
    from creditaudit.run.trainer import train

    run_dir = copy_run(finished, tmp_path)
    (run_dir / name).unlink()
    (run_dir / name).mkdir()
    (run_dir / name / "notes.txt").write_text("mine\n")
    before = snapshot(run_dir)
    config = RunConfig().replace(**{**finished.overrides, "run.out_dir": str(run_dir.parent)})
    with pytest.raises(OutputError) as err:
        train(config, force=True)
    assert str(err.value) == (f"{run_dir / name} is a folder where the run keeps its own "
                              f"{name} file: move it away, then pass force=True again")
    assert snapshot(run_dir) == before and (run_dir / "record.json").is_file()


def test_a_record_reformatted_or_without_a_digest_reads_and_an_edited_one_is_a_config(
        finished, tmp_path):
    from creditaudit.records import load_record
    from creditaudit.records.files import CONTENT_KEY, load_config_file

    run_dir = copy_run(finished, tmp_path)
    record_file = run_dir / "record.json"
    written = load_record(run_dir)
    raw = json.loads(record_file.read_text())
    assert CONTENT_KEY in raw
    record_file.write_text(json.dumps(raw, indent=4, sort_keys=True))  # as `jq -S` leaves it
    assert load_record(run_dir).to_dict() == written.to_dict()
    del raw[CONTENT_KEY]  # as written before the digest was kept: nothing to check
    record_file.write_text(json.dumps(raw))
    assert load_record(run_dir).to_dict() == written.to_dict()
    for legacy in sorted((Path(__file__).parent / "legacy_records").glob("*.json")):
        load_record(legacy)
    # `--config record.json` takes an edited record's config: the run gets that config's id
    raw["config"]["optim"]["lr"] = 0.5
    raw[CONTENT_KEY] = "0" * 64
    record_file.write_text(json.dumps(raw))
    assert load_config_file(record_file).optim.lr == 0.5


def test_the_content_digest_survives_non_finite_numbers():
    """A record's NaN and ±inf are written as null plus a mark: the digest read back is the
    digest written, and a mark changed by hand (NaN → Infinity) is a change."""
    from creditaudit.files import strict_json
    from creditaudit.records.files import CONTENT_KEY, content_digest

    stored = {"a": [1.0, float("nan"), 0.1 + 0.2], "b": {"c": float("inf"), "d": None}}
    stored[CONTENT_KEY] = content_digest(stored)
    read = strict_json.decode(json.loads(strict_json.dumps(stored)))
    assert content_digest(read) == read[CONTENT_KEY]
    text = strict_json.dumps(stored).replace('"Infinity"', '"-Infinity"')
    assert content_digest(strict_json.decode(json.loads(text))) != stored[CONTENT_KEY]


def test_a_record_holding_a_guests_int_keys_reads_back(tmp_path):
    """A guest's extras or components may use int keys, which JSON writes as strings (and
    a dict of ten or more sorts another way then): the digest is of the content as the file
    holds it, so such a record is written and reads back."""
    from creditaudit.records import content_digest, load_record, save_record
    from creditaudit.records.files import new_record

    record = new_record(RunConfig(), device="cpu", run_id="r")
    record.environment["guest"] = {i: float(i) for i in range(12)}
    record.environment["mixed"] = {3: 0.5, "a": 1.0}
    save_record(tmp_path, record)
    assert load_record(tmp_path).environment["guest"]["11"] == 11.0
    assert content_digest({"k": {2: 1.0, 10: 2.0}}) == content_digest({"k": {"2": 1.0,
                                                                           "10": 2.0}})
