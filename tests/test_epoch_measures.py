"""One measures type per epoch (issue #36): the training loop, the Recorder, the protocol and
the record hold the one :class:`EpochMeasures` an epoch measured; its fields are declared
once (the epoch entry composes it and writes them as its own keys, as records always
had them); records of every schema read to the values they stored."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import creditaudit
from creditaudit import Recorder, RunConfig, rule
from creditaudit.errors import RunRecordError
from creditaudit.records import RECORD_FILE, EpochEntry, EpochMeasures, RunRecord, load_record
from creditaudit.records.docs import render_record_docs
from creditaudit.run import results

LEGACY = Path(__file__).parent / "legacy_records"
LEGACY_FILES = sorted(LEGACY.glob("run*.json"))
MEASURE_FIELDS = [f.name for f in dataclasses.fields(EpochMeasures)]


def test_an_epochs_fields_are_declared_once():
    """No field of the entry repeats one of its measures: the entry holds them, typed."""
    own = {f.name for f in dataclasses.fields(EpochEntry)}
    assert own.isdisjoint(MEASURE_FIELDS)
    hints = {f.name: f.type for f in dataclasses.fields(EpochEntry)}
    assert "EpochMeasures" in str(hints["measures"])
    # docs/records.md lists each measures key once, in the entry's table, with its domain
    docs = render_record_docs()
    for name in MEASURE_FIELDS:
        assert docs.count(f"| `{name}` |") == 1, name
    assert "| `hidden_norms` | `list[float]` | ≥ 0 |" in docs
    assert "`measures`" not in docs.split("### Per-epoch entries")[1].split("###")[0] \
        .split("\n| key")[1]


def _captured(monkeypatch) -> list[Any]:
    """The ``measures`` the protocol is handed, call by call."""
    seen: list[Any] = []
    evaluate = results.evaluate_protocol

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["measures"])
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(results, "evaluate_protocol", spy)
    return seen


def test_the_training_loop_judges_and_records_one_measures_object(tmp_path, monkeypatch):
    seen = _captured(monkeypatch)
    config = RunConfig().replace(**{
        "method.name": "fa", "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(tmp_path), "run.device": "cpu"})
    record = creditaudit.train(config).record
    judged = [e.measures for e in record.log if e.protocol]
    assert len(judged) == len(seen) == 2
    assert all(a is b for a, b in zip(seen, judged))
    assert all(isinstance(e.measures, EpochMeasures) for e in record.log)


def test_the_recorder_judges_and_records_one_measures_object(tmp_path, monkeypatch):
    seen = _captured(monkeypatch)
    torch.manual_seed(0)
    model = creditaudit.models.ResidualMLP(in_dim=8, d=8, n_blocks=2, n_classes=10)
    x, y = torch.randn(32, 8), torch.arange(32) % 10
    rec = Recorder(rule("dfa", model), x, y, out=tmp_path, name="run", progress=False,
                   config={"diagnostics.end_of_run": False, "diagnostics.protocol_every": 1})
    entry = rec.epoch(0, test_acc=0.1)
    entry = rec.epoch(1, test_acc=0.2)
    assert seen and seen[-1] is entry.measures is rec.record.log[-1].measures
    assert load_record(tmp_path / "run").log == rec.record.log


@pytest.mark.parametrize("path", LEGACY_FILES, ids=[p.name for p in LEGACY_FILES])
def test_records_of_every_schema_read_to_the_values_they_stored(path):
    """What a file stored per epoch — the measures, and the copies schemas 1–3 wrote
    (`h_L_norm`, `g_L_norm`, `max_block_growth`, `deep_cos`, …) — is what reading gives."""
    raw = json.loads(path.read_text())
    record = RunRecord.from_dict(copy.deepcopy(raw), path.name)
    assert len(record.log) == len(raw["log"]) >= 2
    for entry, stored in zip(record.log, raw["log"]):
        assert entry.measures is not None
        for key, value in stored.items():
            if key != "hidden_norms_cls":
                assert entry.value(key) == value, (entry.epoch, key)
    assert {"hidden_norms", "cos_per_layer"} <= set(raw["log"][-1])


def test_schema_1_records_without_later_measures_read_as_not_recorded():
    """A run/1 record predates `cos_valid` and `cos_defined`: None, not invented."""
    record = RunRecord.from_dict(json.loads((LEGACY / "run1_dfa.json").read_text()), "run1")
    last = record.last_measures()
    assert last is not None and last.cos_valid is None and last.cos_defined is None
    assert last.deep_cos_valid is None
    assert record.deep_cos == last.deep_cos == pytest.approx(
        sum(last.cos_per_layer[1:]) / (len(last.cos_per_layer) - 1))


def test_a_current_record_is_written_back_to_the_same_json():
    """record.json of schema 4 (a run with feedback matrices) reads and writes back key for
    key, in order: the entry's measures are its keys, where they always were."""
    raw = json.loads((LEGACY / "run4_fa_linear.json").read_text())
    record = RunRecord.from_dict(copy.deepcopy(raw), "run4")
    assert record.log[-1].measures is not None and record.log[-1].measures.feedback_layers
    assert json.dumps(record.to_dict(stored=True)) == json.dumps(raw)
    assert list(raw["log"][1])[:12] == [
        "epoch", "test_loss", "acc_eval", "train_loss", "train_acc", "lr", "seconds",
        "hidden_norms", "bp_grad_norms_per_sample_med", "g_L_zero_fraction",
        "cos_per_layer", "cos_valid"]


def test_an_epoch_without_diagnostics_has_no_measures_keys():
    entry = EpochEntry(epoch=3, test_loss=1.0, acc_eval=0.5)
    out = entry.to_dict()
    assert out == {"epoch": 3, "test_loss": 1.0, "acc_eval": 0.5, "test_acc": 0.5}
    assert EpochEntry.from_dict(out) == entry and entry.value("h_L_norm") is None


def test_the_older_attribute_spelling_reads_the_measures():
    """Code written before the measures had a type (``entry.hidden_norms``,
    ``entry.h_L_norm``, ``entry.max_block_growth``) keeps reading the same numbers; an epoch
    without diagnostics gives None, as it did; any other name is still an AttributeError."""
    record = RunRecord.from_dict(json.loads((LEGACY / "run4_fa_linear.json").read_text()),
                                 "run4")
    last = record.log[-1]
    for key in ("hidden_norms", "cos_per_layer", "h_L_norm", "g_L_norm", "max_block_growth",
                "deep_cos", "feedback_angle"):
        assert getattr(last, key) == getattr(last.measures, key) is not None
    bare = EpochEntry(epoch=3, test_loss=1.0, acc_eval=0.5)
    assert bare.hidden_norms is None and bare.h_L_norm is None
    with pytest.raises(AttributeError, match="no_such_measure"):
        last.no_such_measure  # noqa: B018
    assert copy.deepcopy(last) == last


@pytest.mark.parametrize("missing", ["hidden_norms", "cos_per_layer", "g_L_zero_fraction"])
def test_an_entry_with_part_of_the_diagnostics_is_refused_in_one_line(tmp_path, missing):
    raw = json.loads((LEGACY / "run4_fa_linear.json").read_text())
    del raw["log"][1][missing]
    path = tmp_path / RECORD_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(RunRecordError) as caught:
        load_record(path)
    message = str(caught.value)
    assert f"log entry 1 holds diagnostics without {missing}" in message
    assert str(path) in message and "\n" not in message


def test_the_measures_derive_their_statistics_once():
    measures = EpochMeasures(hidden_norms=[2.0, 0.0, 3.0], bp_grad_norms_per_sample_med=[1e-3,
                             2e-3], g_L_zero_fraction=0.5, g_L_nonzero_median=4e-3,
                             cos_per_layer=[1.0, math.nan, 0.25], cos_valid=[True, True, False])
    assert measures.h_L_norm == 3.0 and measures.g_L_norm == measures.g_2_norm == 2e-3
    assert measures.max_block_growth == math.inf  # after a zero norm
    assert measures.deep_cos == 0.25 and measures.deep_cos_valid is False
    entry = EpochEntry(epoch=1, measures=measures)
    for key in ("h_L_norm", "g_L_norm", "max_block_growth", "deep_cos", "deep_cos_valid"):
        assert entry.value(key) == getattr(measures, key)
