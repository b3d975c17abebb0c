"""A rule's per-epoch values (``end_epoch``) are written after the entry's own keys in
record.json: one named like such a key (``train_loss``, ``lr``, …) replaced the training
loop's number there. Such a value stops the run in one line naming the rule and the key,
trained alone or in a stack (the Recorder's own loop: tests/test_recorder_rule_epochs.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.errors import GuestError
from creditaudit.methods.dfa import DFA
from creditaudit.records import load_record
from creditaudit.run.plan import run_id
from creditaudit.run.results import rule_extras
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


# --- the values must be numbers a record holds ---------------------------------------------
REFUSED = [("a string", "high"), ("a list", [1.0, 2.0]), ("a tensor of several elements",
           torch.ones(3)), ("a bool", True), ("a dict", {"a": 1.0})]


@pytest.mark.parametrize("value", [v for _, v in REFUSED], ids=[i for i, _ in REFUSED])
def test_a_rule_value_that_is_no_number_fails_the_run_in_one_line(tmp_path, monkeypatch,
                                                                   value):
    """Before, a string was written and the record then refused by its reader; a list or a
    tensor gave a traceback when the record was written."""
    monkeypatch.setattr(DFA, "end_epoch", lambda self, epoch, n: {"mine": value})
    config = configs(tmp_path, "dfa")[0]
    with pytest.raises(RuntimeError, match=r"^credit rule 'dfa': end_epoch\(\) returned a "
                                           r".* as the per-epoch value 'mine', which a record "
                                           "cannot hold"):
        train(config)
    record = load_record(tmp_path / run_id(config))
    assert record.status == "failed" and "'mine'" in record.error


def test_numbers_of_every_kind_are_recorded_as_floats(tmp_path, monkeypatch):
    """A tensor with grad (before: a traceback writing record.json), numpy scalars (before:
    written as they could be, or a traceback), NaN and inf are kept as the floats they are."""
    weight = torch.tensor(2.0, requires_grad=True)
    values = {"grad": weight * 1.5, "f32": np.float32(0.25), "i64": np.int64(3), "int": 4,
              "nan": float("nan"), "inf": np.float64("inf"), "one": torch.tensor([0.5])}
    monkeypatch.setattr(DFA, "end_epoch", lambda self, epoch, n: dict(values))
    config = configs(tmp_path, "dfa")[0]
    assert train(config).status == "completed"
    extras = load_record(tmp_path / run_id(config)).log[-1].extras
    assert {k: type(v) for k, v in extras.items()} == {k: float for k in values}
    assert extras["grad"] == 3.0 and extras["f32"] == 0.25 and extras["i64"] == 3.0
    assert math.isnan(extras["nan"]) and extras["inf"] == math.inf and extras["one"] == 0.5


def test_your_own_rules_value_is_its_own_failure():
    class Mine(DFA):
        pass

    rule = Mine.__new__(Mine)
    with pytest.raises(GuestError, match=r"\(your own class\): end_epoch\(\) returned a str as "
                                         r"the per-epoch value 'mine'.* not in creditaudit"):
        rule_extras(rule, {"mine": "x"})
    with pytest.raises(GuestError, match=r"under the key 3, a int: name each value"):
        rule_extras(rule, {3: 1.0})
    # an empty key was logged as the bare tag "train/"
    with pytest.raises(GuestError, match=r"under the key '', no name: name each value"):
        rule_extras(rule, {"": 1.0})
    assert rule_extras(rule, {"a": np.float32(1.5), "b": None}) == {"a": 1.5, "b": None}


# --- the end-of-run metrics of a rule: keys JSON spells alike ------------------------------
def test_run_metrics_keys_json_spells_alike_fail_the_run_naming_the_rule(tmp_path, monkeypatch):
    """``{1: …, "1": …}`` from ``run_metrics`` was written as ``"1"`` twice: one number lost,
    and the run's own record.json then refused on reading as not written by creditaudit."""
    monkeypatch.setattr(DFA, "run_metrics", lambda self, x, y: {"mine": {1: 0.5, "1": 0.7}})
    config = configs(tmp_path, "dfa", **{"optim.epochs": 1, "diagnostics.end_of_run": True,
                                         "diagnostics.rho_samples": 16,
                                         "diagnostics.rho_directions": 2,
                                         "diagnostics.null_draws": 2})[0]
    with pytest.raises(RuntimeError, match=r"^credit rule 'dfa': run_metrics\(\) returned the "
                                           r"keys 1 and '1' in one object, which JSON spells "
                                           r"alike \('1'\)"):
        train(config)
    record = load_record(tmp_path / run_id(config))  # readable, and says why it failed
    assert record.status == "failed" and "run_metrics()" in record.error


def test_run_metrics_of_your_own_rule_is_its_own_failure():
    from creditaudit.run.results import rule_metrics

    class Mine(DFA):
        pass

    rule = Mine.__new__(Mine)
    with pytest.raises(GuestError, match=r"\(your own class\): run_metrics\(\) returned the keys "
                                         r"True and 'true'.* not in creditaudit"):
        rule_metrics(rule, {"per_layer": [{"a": 1.0}, {True: 1.0, "true": 2.0}]})
    fine = {"a": {1: 0.5, 2: 0.7}, "b": [1.0, {"c": None}]}  # "1", "2": no value lost
    assert rule_metrics(rule, fine) is fine


# --- the end-of-run metrics of a rule: values a record cannot hold --------------------------
def test_run_metrics_a_record_cannot_hold_fail_the_run_naming_the_rule(tmp_path, monkeypatch):
    """A tensor (or numpy float32) among ``run_metrics``' values failed the record's write at
    the end of the run as creditaudit's "internal error: TypeError: Object of type Tensor is
    not JSON serializable", the record left ``running``; ``audit --format json`` of a run of
    such a rule failed alike. The run now fails in one line naming the rule."""
    monkeypatch.setattr(DFA, "run_metrics", lambda self, x, y: {"cos": torch.tensor(0.5)})
    config = configs(tmp_path, "dfa", **{"optim.epochs": 1, "diagnostics.end_of_run": True,
                                         "diagnostics.rho_samples": 16,
                                         "diagnostics.rho_directions": 2,
                                         "diagnostics.null_draws": 2})[0]
    with pytest.raises(RuntimeError, match=r"^credit rule 'dfa': run_metrics\(\) returned a "
                                           r"value a record cannot hold \(Object of type "
                                           r"Tensor is not JSON serializable\): return plain"):
        train(config)
    record = load_record(tmp_path / run_id(config))
    assert record.status == "failed" and "run_metrics()" in record.error


def test_run_metrics_of_your_own_rule_must_be_a_dict_of_plain_values():
    from creditaudit.run.results import rule_metrics

    class Mine(DFA):
        pass

    rule = Mine.__new__(Mine)
    with pytest.raises(GuestError, match=r"\(your own class\): run_metrics\(\) returned a value "
                                         r"a record cannot hold \(Object of type float32 .*"
                                         r"not in creditaudit"):
        rule_metrics(rule, {"per_layer": [np.float32(0.5)]})
    with pytest.raises(GuestError, match=r"run_metrics\(\) returned a list, not a dict"):
        rule_metrics(rule, [0.5])
    fine = {"a": math.nan, "b": [math.inf, {"c": None}], "d": np.float64(0.5)}
    assert rule_metrics(rule, fine) is fine
