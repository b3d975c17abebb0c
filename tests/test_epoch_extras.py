"""A rule's per-epoch values (``end_epoch``) are written after the entry's own keys in
record.json: one named like such a key (``train_loss``, ``lr``, …) replaced the training
loop's number there. Such a value stops the run in one line naming the rule and the key,
trained alone or in a stack (the Recorder's own loop: tests/test_recorder_rule_epochs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit.methods.dfa import DFA
from creditaudit.records import load_record
from creditaudit.run.plan import run_id
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import train
from test_stacked import configs

pytestmark = pytest.mark.usefixtures("single_thread")

NAMED = r"^credit rule 'dfa': end_epoch\(\) returned per-epoch values named 'train_loss', "


@pytest.fixture
def loud_dfa(monkeypatch):
    monkeypatch.setattr(DFA, "end_epoch", lambda self, epoch, n: {"train_loss": 9.0,
                                                                    "mine": 1.0})


def test_a_rule_value_named_like_a_record_key_fails_the_run(tmp_path, loud_dfa):
    config = configs(tmp_path, "dfa")[0]
    with pytest.raises(RuntimeError, match=NAMED + "keys the epoch entry writes itself"):
        train(config)
    record = load_record(tmp_path / run_id(config))
    assert record.status == "failed" and "'train_loss'" in record.error
    assert [entry.epoch for entry in record.log] == [0]  # no epoch with a wrong train_loss


def test_it_fails_a_stack_the_same_way(tmp_path, loud_dfa):
    runs = configs(tmp_path, "dfa")[:2]
    with pytest.raises(RuntimeError, match=NAMED):
        train_stacked(runs)
    for config in runs:
        record = load_record(Path(config.run.out_dir) / run_id(config))
        assert record.status == "failed" and [entry.epoch for entry in record.log] == [0]
