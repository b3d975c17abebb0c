"""A plugin diagnostic sees the evaluation labels: ``Evidence.labels`` holds the class index
of every sample whose states, gradients, logits and losses it sees, in the same order —
from :func:`evaluate_protocol`, ``diagnose()``, training's record and ``audit``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.nn import functional as F

from creditaudit.audit.checkpoint import audit_run
from creditaudit.audit.diagnose import diagnose
from creditaudit.config import RunConfig, opt
from creditaudit.measures.gradients import state_gradients
from creditaudit.models import ResidualMLP
from creditaudit.protocol import NOT_EVALUATED, Protocol, ProtocolDiagnostic, evaluate_protocol
from creditaudit.registry import DIAGNOSTICS, Origin
from creditaudit.run.trainer import train


@dataclass
class LabelsOptions:
    tolerance: float = opt(1e-6, "(l) fires when a loss differs from CE(logits, label) by "
                           "more than this", min=0.0)


class LabelsSeen(ProtocolDiagnostic[LabelsOptions]):
    """The largest |CE(logits_i, labels_i) − losses_i|: 0 when ``labels`` are the labels of
    the samples whose logits and losses the evidence holds, row for row."""

    name = "l"
    label = "labels seen"
    statistic = "max |CE(logits, labels) − losses|"
    operator, threshold = ">", "tolerance"
    hint = "the labels are not those of the evaluated samples"
    rank = 60

    def evaluate(self, evidence):
        self.seen = evidence.labels
        if evidence.labels is None or evidence.logits is None or evidence.losses is None:
            return self.result(None, NOT_EVALUATED, "needs the evaluation labels")
        if evidence.labels.shape != evidence.losses.shape:
            return self.result(None, NOT_EVALUATED, "labels and losses differ in count")
        ce = F.cross_entropy(evidence.logits.double(), evidence.labels, reduction="none")
        value = float((ce - evidence.losses.double()).abs().max())
        return self.judge(value, f"max difference {value:.3g}",
                          n_labels=int(evidence.labels.numel()))


def with_labels_seen() -> tuple[Protocol, LabelsSeen]:
    seen = LabelsSeen(LabelsOptions())
    return Protocol((*Protocol.default().diagnostics, seen)), seen


def tiny_model_and_data(n: int = 40) -> tuple[ResidualMLP, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    return model, torch.randn(n, 8), torch.randint(0, 4, (n,))


def test_evaluate_protocol_gives_a_plugin_the_labels_of_its_samples():
    model, x, y = tiny_model_and_data()
    protocol, seen = with_labels_seen()
    sg = state_gradients(model.forward_states, x, y, chunk=16)  # several chunks, one order
    result = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                               protocol=protocol).diagnostic("l")
    assert torch.equal(seen.seen, y)
    assert result.status == "passed"
    assert result.details["n_labels"] == x.shape[0] == sg.logits.shape[0]


def test_diagnose_gives_a_plugin_the_labels_of_its_samples():
    model, x, y = tiny_model_and_data()
    protocol, seen = with_labels_seen()
    result = diagnose(model, x, y, protocol=protocol).diagnostic("l")
    assert torch.equal(seen.seen, y)
    assert result.status == "passed" and result.details["n_labels"] == x.shape[0]


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory):
    """One tiny BP run whose protocol lists the labels-checking diagnostic (registered the
    way a plugin is, then gone)."""
    DIAGNOSTICS.names()
    DIAGNOSTICS._plugins[LabelsSeen.name] = DIAGNOSTICS.validate(LabelsSeen, "test")
    DIAGNOSTICS._origins[LabelsSeen.name] = Origin(builtin=False, distribution="tests")
    out = tmp_path_factory.mktemp("labels")
    previous = torch.get_num_threads()
    try:
        result = train(RunConfig().replace(**{
            "data.n_train": 128, "data.n_test": 96, "data.in_dim": 8, "model.d": 8,
            "model.n_blocks": 2, "optim.batch_size": 64, "optim.epochs": 1,
            "diagnostics.eval_samples": 96, "diagnostics.end_of_run": False,
            "diagnostics.protocol": ["a", "b", "c", "d", "l"], "method.name": "bp",
            "run.out_dir": str(out), "run.progress": False, "run.threads": 1}))
        yield result
    finally:
        torch.set_num_threads(previous)
        del DIAGNOSTICS._plugins[LabelsSeen.name], DIAGNOSTICS._origins[LabelsSeen.name]


def test_training_and_audit_give_a_plugin_the_labels_of_their_samples(labelled_run):
    report = labelled_run.record.protocol.report
    seen = report["diagnostics"]["l"]
    assert seen["status"] == "passed"
    assert seen["details"]["n_labels"] == report["metadata"]["n_samples"] == 96
    audited = audit_run(labelled_run.run_dir, metrics=False).diagnostic("l")
    assert audited.status == "passed" and audited.details["n_labels"] == 96
