"""What ``train`` and ``--resume`` make of a run folder without the record.json a run's
epochs leave (docs/reliability.md §2): one whose record.json is gone but whose checkpoint
holds trained epochs, and a run planned under another torch default dtype, whose folder is
another run id's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import RunRecordError
from creditaudit.records import (
    CHECKPOINT_FILE,
    RECORD_FILE,
    comparable,
    load_checkpoint,
    load_record,
)
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import train
from integrity_support import assert_one_line_error, snapshot, toml_of

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 3, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "method.name": "dfa"}


def tiny(out: Path) -> dict[str, object]:
    return {**TINY, "run.out_dir": str(out)}


def test_a_run_whose_record_is_gone_resumes_from_its_checkpoint_and_is_never_trained_over(
        tmp_path, kill_run_at):
    # record.json deleted (or left out of a copy), checkpoint.pt of epoch 2 beside it: a
    # plain `train` trained the run again from scratch over that checkpoint without a word,
    # and `train --resume` said "cannot resume: no run at …"
    straight = train(RunConfig().replace(**tiny(tmp_path / "a")))
    config = RunConfig().replace(**tiny(tmp_path / "b"))
    kill_run_at(config, epoch=3)
    run_dir = tmp_path / "b" / run_id(config)
    (run_dir / RECORD_FILE).unlink()
    assert load_checkpoint(run_dir / CHECKPOINT_FILE)["epoch"] == 2
    _refused_then_resumed(config, run_dir, straight, r"has no record\.json, but its "
                          r"checkpoint\.pt holds trained epoch 2 .*resume=True .*force=True")
    a, b = load_checkpoint(straight.run_dir / CHECKPOINT_FILE), load_checkpoint(
        run_dir / CHECKPOINT_FILE)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_another_runs_checkpoint_in_a_folder_without_record_is_named_not_resumed(
        tmp_path, kill_run_at):
    # a dfa run's checkpoint copied into a bp run's folder that holds no record.json:
    # `train` said "pass --resume to continue it", and --resume then refused it
    import shutil

    other = train(RunConfig().replace(**tiny(tmp_path / "a")))
    config = RunConfig().replace(**{**tiny(tmp_path / "b"), "method.name": "bp"})
    kill_run_at(config, epoch=3)
    run_dir = tmp_path / "b" / run_id(config)
    (run_dir / RECORD_FILE).unlink()
    shutil.copy(other.run_dir / CHECKPOINT_FILE, run_dir / CHECKPOINT_FILE)
    before = snapshot(run_dir)
    with pytest.raises(RunRecordError, match=rf"holds the record of run {other.record.run_id}"
                       r", not of .*belongs to another run: .*force=True") as raised:
        train(config)
    assert "resume=True" not in str(raised.value)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("damage", ["truncated", "edited", "duplicate key"])
def test_a_damaged_record_beside_a_trained_checkpoint_is_resumed_not_trained_over(
        tmp_path, kill_run_at, damage):
    # record.json cut short (a disk that filled mid-copy) or edited by hand, checkpoint.pt of
    # epoch 2 beside it: `train --resume` refused it ("pass --force to start this run
    # over"), and a sweep started it over, losing its trained epochs; the checkpoint holds
    # the record as of its epoch, as when record.json is gone
    from creditaudit.sweep import prepare_configs

    straight = train(RunConfig().replace(**tiny(tmp_path / "a")))
    for out in ("b", "c"):
        [config] = prepare_configs([RunConfig().replace(**tiny(tmp_path / out))], threads=1)
        kill_run_at(config, epoch=3)
        path = tmp_path / out / run_id(config) / RECORD_FILE
        text = path.read_text()
        path.write_text({
            "truncated": text[:len(text) // 2],
            "edited": text.replace('"interrupted"', '"completed"'),
            "duplicate key": text.replace('"status": "interrupted"',
                                          '"status": "interrupted", "status": "completed"'),
        }[damage])
    config = RunConfig().replace(**tiny(tmp_path / "b"))
    run_dir = tmp_path / "b" / run_id(config)
    _refused_then_resumed(config, run_dir, straight,
                          r"its checkpoint\.pt holds trained epoch 2 and the record as of it: "
                          r"pass resume=True to continue it from there, or force=True")
    [config] = prepare_configs([RunConfig().replace(**tiny(tmp_path / "c"))], threads=1)
    _swept_to(config, straight)


def test_an_edited_record_with_nothing_trained_saved_is_not_sent_to_resume(tmp_path,
                                                                           kill_run_at):
    # killed in epoch 1 (its checkpoint holds the initial weights), then record.json
    # edited: --resume cannot rebuild it, so the line offers --force alone
    config = RunConfig().replace(**tiny(tmp_path))
    kill_run_at(config, epoch=1)
    path = tmp_path / run_id(config) / RECORD_FILE
    path.write_text(path.read_text().replace('"interrupted"', '"completed"'))
    for resume in (False, True):
        with pytest.raises(RunRecordError) as raised:
            train(config, resume=resume)
        text = str(raised.value)
        assert "changed after creditaudit wrote it" in text
        assert "resume=True" not in text and text.endswith(
            "; pass force=True to start this run over"), text
    # a reader (report, audit) names --resume only beside a checkpoint to rebuild from
    from creditaudit.errors import ChangedRecordError

    (path.parent / CHECKPOINT_FILE).unlink()
    with pytest.raises(ChangedRecordError) as raised:
        load_record(path)
    assert str(raised.value).endswith(": restore the file, or train the run again with "
                                      "force=True"), str(raised.value)


def test_a_sweep_resumes_a_run_whose_record_is_gone_from_its_checkpoint(tmp_path,
                                                                       kill_run_at):
    # the sweep trained such a folder over, from scratch (force), losing its trained epochs
    from creditaudit.sweep import prepare_configs

    straight = train(RunConfig().replace(**tiny(tmp_path / "a")))
    [config] = prepare_configs([RunConfig().replace(**tiny(tmp_path / "b"))], threads=1)
    kill_run_at(config, epoch=3)
    run_dir = tmp_path / "b" / run_id(config)
    (run_dir / RECORD_FILE).unlink()
    _swept_to(config, straight)


def _refused_then_resumed(config: RunConfig, run_dir: Path, straight,  # noqa: ANN001
                          refusal: str) -> None:
    """``train`` refuses ``config`` (killed at epoch 3) with ``refusal``, touching nothing;
    ``--resume`` then ends it with ``straight``'s record."""
    before = snapshot(run_dir)
    with pytest.raises(RunRecordError, match=refusal) as raised:
        train(config)
    text = str(raised.value)  # one advice, in the caller's spelling
    assert text.count("force=True") == 1 and "--force" not in text, text
    assert snapshot(run_dir) == before
    resumed = train(config, resume=True)
    assert comparable(resumed.record) == comparable(straight.record)
    assert [part.epoch for part in load_record(run_dir).resumed] == [3]


def _swept_to(config: RunConfig, straight) -> None:  # noqa: ANN001 - a RunResult
    """A sweep of ``config`` (killed at epoch 3) resumes it to ``straight``'s record."""
    from creditaudit.sweep import InlineExecutor, run_sweep

    [outcome] = run_sweep([config], InlineExecutor()).outcomes
    assert (outcome["action"], outcome["status"]) == ("resumed", "completed")
    run_dir = Path(config.run.out_dir) / run_id(config)
    assert comparable(load_record(run_dir)) == comparable(straight.record)
    assert [part.epoch for part in load_record(run_dir).resumed] == [3]


def test_train_without_record_and_checkpoint_of_epoch_0_still_starts_over(tmp_path,
                                                                          kill_run_at):
    # killed in epoch 1: nothing trained is saved, so losing record.json loses nothing
    config = RunConfig().replace(**tiny(tmp_path))
    kill_run_at(config, epoch=1)
    run_dir = tmp_path / run_id(config)
    (run_dir / RECORD_FILE).unlink()
    assert train(config).status == "completed"


def test_resume_of_a_run_planned_in_another_default_dtype_names_it(tmp_path, capsys,
                                                                  kill_run_at, float64):
    # a float64 run (torch.set_default_dtype in the caller's code) killed, then resumed
    # from float32: "cannot resume: no run at …" though the run was there
    overrides = tiny(tmp_path / "out")
    config = RunConfig().replace(**overrides)
    kill_run_at(config, epoch=2)
    held = tmp_path / "out" / run_id(config)
    torch.set_default_dtype(torch.float32)
    with pytest.raises(RunRecordError) as raised:
        train(config, resume=True)
    message = str(raised.value)
    assert f"{held} has this config but was trained with torch's default dtype float64" \
        in message, message
    assert "call torch.set_default_dtype(torch.float64) first to resume it" in message
    config_file = tmp_path / "run.toml"
    config_file.write_text(toml_of(overrides))
    capsys.readouterr()
    assert main(["train", "--config", str(config_file), "--resume"]) == 2
    assert_one_line_error(*capsys.readouterr(), "default dtype float64",
                          "resume it from Python after torch.set_default_dtype(torch.float64)",
                          "or train it in float32 without --resume")
    torch.set_default_dtype(torch.float64)  # as the message says: it resumes
    assert train(config, resume=True).status == "completed"
