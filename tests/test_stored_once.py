"""Each number of a new record is stored once (issue #36): the last epoch's ‖g_L‖ at most
twice (its epoch entry and the statistic of diagnostic (b)); ‖h_L‖, the test accuracy and the
verdict never in `final` nor in the protocol state beside its report; copies are derived on
read, and records of earlier schemas (which stored the copies) read to the same values."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

import creditaudit
from creditaudit import RunConfig
from creditaudit.errors import RunRecordError
from creditaudit.records import RECORD_FILE, EpochEntry, EpochMeasures, RunRecord, load_record
from creditaudit.run.results import final_results

LEGACY = Path(__file__).parent / "legacy_records"


def occurrences(raw: Any, target: Any, path: str = "") -> list[str]:
    """The JSON paths in ``raw`` whose value is exactly ``target`` (same type and value)."""
    if isinstance(raw, dict):
        return [p for k, v in raw.items() for p in occurrences(v, target, f"{path}/{k}")]
    if isinstance(raw, list):
        return [p for i, v in enumerate(raw) for p in occurrences(v, target, f"{path}/{i}")]
    return [path] if type(raw) is type(target) and raw == target else []


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    config = RunConfig().replace(**{
        "method.name": "dfa", "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(tmp_path_factory.mktemp("once")),
        "run.device": "cpu"})
    return creditaudit.train(config)


def test_a_new_record_stores_the_last_epochs_numbers_once(tiny_run):
    raw = json.loads((tiny_run.run_dir / RECORD_FILE).read_text())
    last = tiny_run.record.log[-1]
    assert raw["status"] == "completed" and last.epoch == 2
    assert tiny_run.record.protocol.epoch == 2 and last.verdict is not None
    # earlier epochs' own numbers may equal the last one's (an accuracy of 10/128 twice)
    others = {f"/log/{i}/" for i in range(len(raw["log"]) - 1)}

    def count(value: Any) -> list[str]:
        return [p for p in occurrences(raw, value)
                if not any(p.startswith(o) for o in others)]

    g_paths = count(last.measures.g_L_norm)
    assert len(g_paths) <= 2, g_paths
    assert "/protocol/report/diagnostics/b/value" in g_paths, g_paths
    # ‖h_L‖ and the accuracy in the entry, and under the original study's names
    # (`h_L_norm`, `test_acc`) that scripts reading record.json expect; the verdict in the
    # entry and in the report (scripts rebuild the report from it): never in final or
    # beside the report
    for name, value, twice in (("h_L", last.measures.h_L_norm, "/log/2/h_L_norm"),
                               ("test accuracy", last.acc_eval, "/log/2/test_acc"),
                               ("verdict", last.verdict, "/protocol/report/verdict")):
        paths = count(value)
        assert len(paths) == 2 and twice in paths, (name, paths)


def test_a_new_record_reads_back_what_the_run_held(tiny_run):
    held = tiny_run.record
    read = load_record(tiny_run.run_dir / RECORD_FILE)
    assert read.final == held.final and read.final is not None
    assert read.final.g_L_norm == held.log[-1].value("g_L_norm")
    assert read.protocol == held.protocol
    assert read.protocol.report == held.protocol.report
    assert list(read.protocol.report) == list(held.protocol.report)  # key order kept
    assert read.log == held.log
    assert read.final_acc == held.final_acc and read.recorded_statuses() == \
        held.recorded_statuses()


def test_a_schema_3_record_reads_to_the_values_it_stored():
    raw = json.loads((LEGACY / "run3_dfa.json").read_text())
    assert raw["schema"] == "creditaudit.run/3"
    record = RunRecord.from_dict(copy.deepcopy(raw), "run3_dfa.json")
    final = raw["final"]
    assert record.final is not None
    for key, value in final.items():
        assert getattr(record.final, key) == value, key
    for key in ("epoch", "verdict", "fired", "first_fired", "report"):
        assert getattr(record.protocol, key) == raw["protocol"][key], key
    last, stored = record.log[-1], raw["log"][-1]
    for key in ("test_acc", "h_L_norm", "g_2_norm", "g_L_nonzero_median"):
        assert last.value(key) == stored[key], key
    # written again in the current schema, it reads to the same record
    for stored in (True, False):
        again = RunRecord.from_dict(json.loads(json.dumps(record.to_dict(stored=stored))),
                                    "rewritten")
        assert again == record
        assert list(again.protocol.report) == list(record.protocol.report)


def _entry(epoch: int, loss: float, g: float) -> EpochEntry:
    return EpochEntry(epoch=epoch, test_loss=loss, acc_eval=0.5, train_loss=loss,
                      measures=EpochMeasures(
                          hidden_norms=[1.0, 2.0, 3.0], bp_grad_norms_per_sample_med=[g, g, g],
                          g_L_zero_fraction=0.0, g_L_nonzero_median=g,
                          cos_per_layer=[0.1, 0.2, 0.3]))


@pytest.mark.parametrize("losses", [(1.0, 0.5), (1.0, math.nan), (math.nan, math.nan)])
def test_final_results_are_those_of_the_last_finite_epoch_after_reading(losses):
    """A diverged run's headline numbers are its last finite epoch's (or none), also when
    ``final`` is derived on read."""
    log = [_entry(i + 1, loss, 0.01 * (i + 1)) for i, loss in enumerate(losses)]
    record = RunRecord(run_id="r", status="diverged", log=log, final=final_results(log))
    read = RunRecord.from_dict(json.loads(json.dumps(record.to_dict(stored=True))), "r")
    assert read.final == record.final
    finite = [e for e in log if math.isfinite(e.test_loss)]
    assert read.final.g_L_norm == (finite[-1].value("g_L_norm") if finite else None)
    assert read.final.from_epoch == (finite[-1].epoch if finite and finite[-1] is not log[-1]
                                     else None)


@pytest.mark.parametrize(("part", "change", "named"), [
    ("final", {"numbers_from": 7}, "final.numbers_from 7 names no logged epoch"),
    ("protocol", {"report_copies": {"nope": 0}}, "protocol.report_copies has an unexpected "
                                                 "entry 'nope'"),
])
def test_a_pointer_to_nothing_is_one_line_naming_it(tiny_run, tmp_path, plant, part, change,
                                                    named):
    raw = json.loads((tiny_run.run_dir / RECORD_FILE).read_text())
    raw[part].update(change)
    path = plant(tmp_path / RECORD_FILE, json.dumps(raw))
    with pytest.raises(RunRecordError) as caught:
        load_record(path)
    assert named in str(caught.value) and "\n" not in str(caught.value)
