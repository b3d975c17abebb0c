"""A run record says which arrays the run trained and evaluated on, by their content, and a
finished run is served, resumed or audited only on those arrays.

The data fingerprint (part of the run id) says what *would* be loaded: the files' content or
a generator's arguments. A dataset whose ``load()`` gives other arrays each call keeps one
fingerprint for different data, so the record also keeps the digest of the arrays loaded
(``data.arrays_sha256``), and every gate compares it: the guest ``data-drifting``
(tests/guest_pkg/creditaudit_guests/data_datasets.py) draws its arrays from a file the tests
edit between runs.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.data import Dataset, load_dataset
from creditaudit.data.identity import tensor_digest
from creditaudit.errors import ConfigError, DataError, RunRecordError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.registry import reload_plugins
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train
from integrity_support import (
    as_written,
    assert_one_line_error,
    snapshot,
    tiny_config,
    toml_of,
    write_idx_dataset,
)
from plugin_support import GUESTS

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False,
        "run.progress": False}
SYNTHETIC = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
             "data.teacher_width": 16, **TINY}


@pytest.fixture
def drifting(tmp_path, monkeypatch):
    """The guest dataset installed in this process; yields its draw file (holding 1)."""
    site = GUESTS.install(tmp_path / "site", only=["data-drifting"])
    monkeypatch.syspath_prepend(str(site))
    reload_plugins()
    draw = tmp_path / "draw.txt"
    draw.write_text("1")
    yield draw
    monkeypatch.undo()
    GUESTS.forget()
    reload_plugins()


def drifting_overrides(draw: Path, out: Path, **overrides) -> dict:
    return {"data.name": "data-drifting", "data.draw_file": str(draw), "data.n_train": 128,
            "data.n_test": 64, **TINY, "run.out_dir": str(out), **overrides}


def drifting_config(draw: Path, out: Path, **overrides) -> RunConfig:
    return RunConfig().replace(**drifting_overrides(draw, out, **overrides))


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_record_keeps_the_digest_of_the_arrays_trained_on(tmp_path):
    """The digest is of the arrays as trained on — after data.train_subset — and equal for
    equal arrays only."""
    config = RunConfig().replace(**SYNTHETIC, **{"run.out_dir": str(tmp_path)})
    record = train(config).record
    data = load_dataset(config.data, seed=config.run.seed)
    whole = tensor_digest(data.train_x, data.train_y, data.test_x, data.test_y)
    assert record.data.arrays_sha256 == whole == data.content_digest()
    subset = config.replace(**{"data.train_subset": 100})
    part = train(subset).record.data.arrays_sha256
    assert part != whole
    assert part == tensor_digest(data.train_x[:100], data.train_y[:100], data.test_x,
                                 data.test_y)
    data.test_y[0] = (data.test_y[0] + 1) % 10  # one label changed in place
    assert data.content_digest() != whole


def test_data_handed_to_train_must_be_what_its_config_loads(tmp_path):
    """train(config, dataset=…) records the run under the id its config names: arrays loaded
    for another seed or options, edited since, or built by hand are refused, not recorded
    as the config's data."""
    config = RunConfig().replace(**SYNTHETIC, **{"run.out_dir": str(tmp_path)})
    data = load_dataset(config.data, seed=config.run.seed)
    trained = train(config, dataset=data)
    assert trained.record.data.arrays_sha256 == data.content_digest()
    other_seed = load_dataset(config.data, seed=7)
    fewer = load_dataset(config.replace(**{"data.n_train": 128}).data, seed=config.run.seed)
    by_hand = Dataset("synthetic", data.train_x, data.train_y, data.test_x, data.test_y,
                      n_classes=10)
    for handed, why in ((other_seed, "loaded for other data"), (fewer, "loaded for other data"),
                        (by_hand, "not loaded by load_dataset")):
        with pytest.raises(ConfigError, match=why):
            train(config.replace(**{"run.out_dir": str(tmp_path / "other")}), dataset=handed)
    data.train_y[0] = (data.train_y[0] + 1) % 10
    with pytest.raises(ConfigError, match="changed after it was loaded"):
        train(config.replace(**{"run.out_dir": str(tmp_path / "edited")}), dataset=data)
    assert not (tmp_path / "other").exists() and not (tmp_path / "edited").exists()


@pytest.mark.parametrize(("field", "value"), [
    ("mean", (0.9,)), ("std", (0.01,)), ("augment", True), ("augment_flip", False),
    ("augment_padding", 3), ("n_classes", 12), ("name", "fashion-mnist"),
    ("provenance", {"content_sha256": "0" * 64})])
def test_data_handed_to_train_with_other_handling_is_refused(tmp_path, field, value):
    """Arrays unchanged, but normalised, augmented, counted or described otherwise than as
    loaded: the run would train on other inputs (or record another provenance) under the
    id and record its config names, so it is refused like edited arrays. (Before, a
    normalisation or augmentation set on loaded data trained under the config's run id.)"""
    folder = write_idx_dataset(tmp_path / "data")
    config = RunConfig().replace(**tiny_config(folder, tmp_path / "runs"))
    data = load_dataset(config.data, seed=config.run.seed)
    setattr(data, field, value)
    with pytest.raises(ConfigError, match=rf"changed after it was loaded \(its {field} edited\)"):
        train(config, dataset=data)
    assert not (tmp_path / "runs").exists()


def test_data_loaded_by_an_earlier_version_is_refused_in_one_line(tmp_path):
    """A Dataset kept from an earlier creditaudit (pickled, or cached by joblib.Memory
    around load_dataset) holds the 2-tuple loaded_as that version wrote: train() stopped
    with ValueError: not enough values to unpack (expected 3, got 2). It is refused in one
    line saying what to do."""
    config = RunConfig().replace(**SYNTHETIC, **{"run.out_dir": str(tmp_path)})
    data = load_dataset(config.data, seed=config.run.seed)
    data.loaded_as = data.loaded_as[:2]  # what ea9c677's load_dataset left
    with pytest.raises(ConfigError, match=r"^the data handed to the run \(synthetic\) was "
                       "loaded by another version of creditaudit .*: pass what load_dataset"):
        train(config, dataset=data)
    assert not any(tmp_path.iterdir())


def test_a_device_copy_of_loaded_data_may_be_handed_to_train(tmp_path):
    """Dataset.to(device) is the same data: a run handed the copy (data loaded once, put on
    the GPU, shared by many runs) trains as with the data loaded, not refused as data
    load_dataset never returned."""
    config = RunConfig().replace(**SYNTHETIC, **{"run.out_dir": str(tmp_path)})
    data = load_dataset(config.data, seed=config.run.seed)
    moved = data.to(torch.device("cpu"))
    assert moved.loaded_as == data.loaded_as
    trained = train(config, dataset=moved)
    assert trained.record.data.arrays_sha256 == data.content_digest()


def test_other_arrays_under_one_fingerprint_are_never_served_resumed_or_audited(
        drifting, tmp_path, capsys, kill_run_at):
    out = tmp_path / "runs"
    config = drifting_config(drifting, out)
    first = train(config)
    assert first.status == "completed" and first.record.data.arrays_sha256
    config_file = tmp_path / "run.toml"
    config_file.write_text(toml_of(drifting_overrides(drifting, out)))
    assert plan_run(config).run_id == first.run_dir.name
    drifting.write_text("2")  # load() now draws other arrays: same run id, same fingerprint
    assert plan_run(config).run_id == first.run_dir.name
    before = snapshot(out)
    # the guest whose load() changed is named: its entry point and distribution
    plugin = f"dataset plugin 'data-drifting' ({GUESTS.distribution}=={GUESTS.version})"
    with pytest.raises(RunRecordError, match=f"the data changed: {re.escape(plugin)} loads"):
        train(config)  # never served as "already completed"
    code, stdout, err = run_cli(capsys, ["train", "--config", str(config_file)])
    assert code == 2
    assert_one_line_error(stdout, err, "the data changed", "data-drifting", "--force", plugin)
    code, stdout, err = run_cli(capsys, ["audit", str(first.run_dir), "--no-metrics"])
    assert code == 2
    assert_one_line_error(stdout, err, "the data changed", plugin)
    assert snapshot(out) == before
    # an interrupted run resumes only on its own arrays
    two = drifting_config(drifting, out, **{"optim.epochs": 2})
    kill_run_at(two, epoch=2)
    drifting.write_text("3")
    with pytest.raises(RunRecordError, match="the data changed"):
        train(two, resume=True)
    drifting.write_text("2")
    assert train(two, resume=True).status == "completed"
    drifting.write_text("1")  # the first run's arrays again: served, not retrained
    assert train(config).record.log == first.record.log
    assert train(config, force=True).status == "completed"


def test_a_record_without_the_digest_is_checked_by_fingerprint_only_and_says_so(
        tmp_path, caplog):
    config = RunConfig().replace(**SYNTHETIC, **{"run.out_dir": str(tmp_path)})
    run = train(config)
    path = run.run_dir / RECORD_FILE
    raw = json.loads(path.read_text())
    del raw["data"]["arrays_sha256"]  # as written before array digests existed
    path.write_text(as_written(raw, digest=False))
    assert load_record(path).data.arrays_sha256 is None
    with caplog.at_level(logging.WARNING):
        served = train(config)
    assert served.record.log == run.record.log  # usable: served, not retrained
    assert "checked by its fingerprint only, not by its content" in caplog.text


def test_files_changed_after_planning_are_refused_not_trained_under_the_planned_id(tmp_path):
    """A sweep plans every run before the first trains: a data folder that changes meanwhile
    must not give a run the old data's id (its fingerprint) beside the new data's arrays."""
    data = write_idx_dataset(tmp_path / "data")
    config = RunConfig().replace(**tiny_config(data, tmp_path / "runs"))
    plan = plan_run(config)
    labels = data / "train-labels-idx1-ubyte"
    content = bytearray(labels.read_bytes())
    content[-1] = (content[-1] + 1) % 10  # one label of the training split
    labels.write_bytes(bytes(content))
    with pytest.raises(DataError, match=r"^the files of mnist in .* changed after the run was "
                       r"planned \(train-labels-idx1-ubyte: fingerprint"):
        train(plan)
    assert not (tmp_path / "runs").exists()
    again = plan_run(config)
    assert again.run_id != plan.run_id
    assert train(again).record.data.fingerprint == again.identity.fingerprint


def test_a_generator_that_makes_other_data_is_named_not_sent_to_a_data_folder(
        tmp_path, capsys, monkeypatch):
    """A generated dataset has no data folder: when its generator makes other data from the
    run's options (another version), audit and --resume say so, not "point data.data_dir"."""
    overrides = {**SYNTHETIC, "run.out_dir": str(tmp_path / "runs")}
    run = train(RunConfig().replace(**overrides))
    config_file = tmp_path / "run.toml"
    config_file.write_text(toml_of(overrides))
    monkeypatch.setattr("creditaudit.data.synthetic.GENERATOR",
                        "creditaudit.data.make_teacher_student/2")
    for argv in (["audit", str(run.run_dir), "--no-metrics"],
                 ["train", "--config", str(config_file), "--resume"]):
        code, stdout, err = run_cli(capsys, argv)
        assert code == 2
        assert_one_line_error(stdout, err, "its generator makes other data from the same "
                              "options now: generator 'creditaudit.data.make_teacher_student/1' "
                              "then, 'creditaudit.data.make_teacher_student/2' now",
                              "the generator version the run was trained with")
        assert "data_dir" not in err
