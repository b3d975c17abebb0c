"""(d) of a run whose protocol last judged the epoch it diverged in: the run's headline
accuracy is that of its last finite epoch, and (d) judges that one — in the record, in
`report` and in `audit` of its checkpoint alike."""

from __future__ import annotations

import copy

import pytest

from creditaudit.audit.checkpoint import audit_run
from creditaudit.protocol.checks import margin_pp
from creditaudit.protocol.records import record_report, record_verdict
from creditaudit.records import load_record
from creditaudit.run.trainer import Trainer, train
from integrity_support import nan_weights_after, nan_weights_before
from test_protocol import tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def diverged_on_evaluation(tmp_path_factory):
    """A run whose epoch-2 steps were finite but whose last update overflowed: its epoch-2
    evaluation (the protocol's last) is the NaN network's, its numbers those of epoch 1."""
    out = tmp_path_factory.mktemp("diverged_on_evaluation")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        result = train(tiny_config(out, **{"optim.epochs": 3, "diagnostics.frozen_acc": 0.2,
                                           "diagnostics.end_of_run": False}))
    return result.run_dir


def test_d_of_a_diverged_epoch_judges_the_last_finite_accuracy(diverged_on_evaluation):
    """(d) compared the diverged epoch's accuracy — the share of the one class a NaN
    network predicts — with the baseline, while the run's test accuracy (and `audit` of its
    checkpoint) is epoch 1's: the record and `audit` gave (d) different values."""
    record = load_record(diverged_on_evaluation)
    assert record.status == "diverged"
    assert (record.protocol.epoch, record.numbers_epoch) == (2, 1)
    assert record.log[-1].acc_eval != record.final_acc  # the NaN network's, another number
    d = record.protocol.report["diagnostics"]["d"]
    assert d["details"]["headline_acc"] == record.final_acc
    assert d["value"] == margin_pp(record.final_acc, 0.2)
    assert record.protocol.report["metadata"]["headline_acc"] == record.final_acc
    audited = audit_run(diverged_on_evaluation, metrics=False).diagnostic("d")
    assert (audited.value, audited.status) == (d["value"], d["status"])


def test_report_rejudges_d_of_an_earlier_record_on_the_last_finite_accuracy(
        diverged_on_evaluation):
    """A record written before: its report's headline accuracy is the diverged epoch's;
    against frozen-blocks runs `report` re-judged (d) on it."""
    record = copy.deepcopy(load_record(diverged_on_evaluation))
    record.protocol.report["metadata"]["headline_acc"] = record.log[-1].acc_eval
    d = record_report(record, frozen_acc=0.3, frozen_runs=1).diagnostic("d")
    assert d.value == margin_pp(record.final_acc, 0.3)
    assert record_verdict(record, frozen_acc=0.3, frozen_runs=1).margin_pp == d.value


def test_report_rejudges_d_of_a_protocol_epoch_before_the_divergence_on_its_own_accuracy(
        tmp_path):
    """protocol_every=2 of 5 epochs, diverged in epoch 4's steps: the protocol last judged
    epoch 2 (finite), and the run's headline accuracy is epoch 3's. `report` against
    frozen-blocks runs re-judged (d) on epoch 3's accuracy beside epoch 2's (a)-(c) and
    accuracy column: the same baseline as diagnostics.frozen_acc gave another margin."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_before(4))
        result = train(tiny_config(tmp_path, **{
            "optim.epochs": 5, "diagnostics.protocol_every": 2,
            "diagnostics.frozen_acc": 0.2, "diagnostics.end_of_run": False}))
    record = load_record(result.run_dir)
    assert record.status == "diverged"
    assert (record.protocol.epoch, record.numbers_epoch) == (2, 3)
    judged = record.entry(2).acc_eval
    assert judged != record.final_acc
    recorded = record.protocol.report["diagnostics"]["d"]["value"]
    assert recorded == margin_pp(judged, 0.2)
    report = record_report(record, frozen_acc=0.2, frozen_runs=1)
    assert report.metadata["headline_acc"] == judged
    assert report.diagnostic("d").value == recorded
    assert record_verdict(record, frozen_acc=0.2, frozen_runs=1).margin_pp == recorded
