"""The protocol says no more than its evidence: (b) names LN cancellation only for a stream
that grew (by the run's own (a) threshold), a saturated softmax only where the logits show
one, and says in words when every gradient is 0; (d) is not evaluated on an untrained
network (a 0-epoch run), in the record, `audit`, `report` and `depth_utility_diagnostic`; a
plugin diagnostic reads the evidence on the CPU, as the conformance suite checked it."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import pytest
import torch

from creditaudit.audit.checkpoint import audit_run
from creditaudit.audit.diagnose import diagnose
from creditaudit.config import RunConfig, opt
from creditaudit.models import ResidualMLP
from creditaudit.protocol import (
    CAUSE_FLOOR,
    CAUSE_LN,
    CAUSE_NO_PATH,
    CAUSE_SATURATION,
    CAUSE_SATURATION_NO_LN,
    CAUSE_WEAK_HEAD,
    NOT_EVALUATED,
    DirectionStability,
    Evidence,
    Protocol,
    ProtocolDiagnostic,
    ReferenceValidity,
    Thresholds,
    depth_utility_diagnostic,
    evaluate_protocol,
)
from creditaudit.protocol.checks import unsaturated_share
from creditaudit.protocol.records import record_report, record_verdict
from creditaudit.records import load_record
from creditaudit.report.runs import diverged_text, format_run_summary
from creditaudit.run.trainer import train
from test_protocol import make_sg, tiny_config


# --- (b): the cause the evidence supports ----------------------------------------------------
@pytest.mark.parametrize(("h_last", "cause", "grew"), [(5.0, CAUSE_FLOOR, False),
                                                        (5e4, CAUSE_LN, True)])
def test_b_names_ln_cancellation_only_when_the_stream_grew(h_last, cause, grew):
    """A model with a terminal LN whose ‖g_L‖ is below the floor although its stream did not
    grow read "LN cancellation of a grown residual stream"."""
    sg = make_sg(h_norms=(5.0, 5.0, 5.0, 5.0, h_last), g_norms=(1e-3,) * 4 + (1e-9,))
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=True).diagnostic("b")
    assert b.status == "fired" and b.details["stream_grew"] is grew
    assert b.details["cause"] == cause
    assert ("LN cancellation of a grown" in b.reason) is grew
    if not grew:
        assert "did not grow by more than 50×: not LN cancellation" in b.reason


def test_b_on_a_live_ln_model_with_tiny_head_weights_is_no_ln_cancellation():
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    with torch.no_grad():
        model.out_head.weight.mul_(1e-6)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    report = diagnose(model, x, y)
    b = report.diagnostic("b")
    assert report.diagnostic("a").status == "passed"
    assert b.status == "fired" and b.details["cause"] == CAUSE_FLOOR


def test_b_says_in_words_that_every_gradient_is_zero():
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    with torch.no_grad():
        model.out_head.weight.zero_()
    report = diagnose(model, torch.randn(16, 8), torch.randint(0, 4, (16,)))
    b = report.diagnostic("b")
    assert b.details["zero_fraction"] == 1.0
    assert "nan" not in b.reason.lower()
    assert "every per-sample gradient is exactly 0" in b.reason
    assert "nan" not in json.loads(report.to_json())["diagnostics"]["b"]["reason"].lower()


# --- (b) without a terminal LN: saturation only where the softmax is saturated ------------
@pytest.mark.parametrize(("top_logit", "cause"), [(0.0, CAUSE_WEAK_HEAD),
                                                   (40.0, CAUSE_SATURATION_NO_LN)])
def test_b_without_ln_names_saturation_only_for_a_saturated_softmax(top_logit, cause):
    """Without a terminal LN a sub-floor ‖g_L‖ read "saturated softmax" even when the
    softmax was uniform (g_L = W_headᵀ e / 128 small because the head's weights are)."""
    sg = make_sg(g_norms=(1e-3,) * 4 + (1e-9,))
    sg.logits[:, 0] = top_logit  # 0: uniform; 40: 1 − max softmax ≈ 4e-17
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=False).diagnostic("b")
    assert b.status == "fired" and b.details["cause"] == cause and cause in b.reason


def test_b_without_logits_keeps_saturation_as_the_cause():
    """A record judged again from its stored numbers has no logits: today's cause stays."""
    evidence = Evidence(hidden_norms=[5.0] * 3, grad_norms=[1e-3, 1e-3, 1e-9],
                        g_L_zero_fraction=0.0, g_L_nonzero_median=1e-9, terminal_ln=False)
    b = ReferenceValidity().evaluate(evidence)
    assert b.status == "fired" and b.details["cause"] == CAUSE_SATURATION_NO_LN


@pytest.mark.parametrize(("head_scale", "top_bias", "cause"), [
    (1e-6, 0.0, CAUSE_WEAK_HEAD),              # tiny head weights, softmax near uniform
    (1.0, 30.0, CAUSE_SATURATION_NO_LN)])      # ordinary head, 1 − max softmax ≈ 8e-13
def test_b_on_a_live_model_without_ln_names_what_made_g_L_small(head_scale, top_bias, cause):
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2, out_ln=False)
    with torch.no_grad():
        model.out_head.weight.mul_(head_scale)
        model.out_head.bias.zero_()
        model.out_head.bias[0] = top_bias
    b = diagnose(model, torch.randn(16, 8), torch.zeros(16, dtype=torch.long)).diagnostic("b")
    assert b.status == "fired" and b.details["zero_fraction"] == 0.0
    assert b.details["cause"] == cause


@pytest.mark.parametrize(("g_norm", "unsaturated"), [(1e-9, 1.0), (1e-8, 0.0)])
def test_the_softmax_is_saturated_when_the_error_is_further_from_1_than_the_head_from_init(
        g_norm, unsaturated):
    """1 − max softmax = 1e-3: 128·‖g‖ = 1.28e-7 is a head of gain 1.3e-4 (4 500× below
    1/√3, the error 1 000× below 1): the head's doing; 1.28e-6, gain 1.3e-3: the error's."""
    logits = torch.tensor([[math.log(999.0), 0.0]], dtype=torch.float64)  # p = 0.999, 0.001
    grad = torch.tensor([[g_norm, 0.0]])
    assert unsaturated_share(grad, logits, below=1e-7) == unsaturated
    assert unsaturated_share(torch.zeros(1, 2), logits) == 1.0  # exactly 0: not one-hot
    assert unsaturated_share(torch.zeros(1, 2), torch.tensor([[200.0, 0.0]])) == 0.0


def test_b_names_ln_cancellation_where_an_overflowed_terminal_ln_zeroes_every_gradient():
    """A stream grown 1e19× overflows the terminal LayerNorm's variance in fp32: every sample
    gets the same logits and an exactly-zero g_L. (b) said "no gradient reaches h_L (… zero
    or dead weights between h_L and the logits; not LN cancellation)"."""
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=16, n_classes=4, n_blocks=2)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    initial = diagnose(model, x, y).hidden_norms
    with torch.no_grad():
        model.embed.weight.mul_(1e19)
        model.embed.bias.mul_(1e19)
    b = diagnose(model, x, y, initial_hidden_norms=initial).diagnostic("b")
    assert b.status == "fired" and b.details["zero_fraction"] >= 0.5
    assert b.details["stream_grew"] and b.details["cause"] == CAUSE_LN


@pytest.mark.parametrize(("terminal_ln", "cause"), [(True, CAUSE_LN), (False, CAUSE_NO_PATH)])
def test_b_a_confidently_wrong_softmax_is_no_saturation(terminal_ln, cause):
    """Every sample one-hot on class 0, labelled 1: the softmax is saturated on the wrong
    class, so the output error is ‖e‖ = √2, not 0, and an exactly-zero g_L is the path's
    doing. (b) named a saturated softmax (confidently-correct samples)."""
    sg = make_sg(h_norms=(5.0, 5.0, 5.0, 5.0, 5e4), g_norms=(1e-3,) * 4 + (0.0,))
    sg.logits[:, 0] = 200.0
    sg.losses = torch.full_like(sg.losses, 200.0)  # CE of label 1
    assert unsaturated_share(sg.grads[-1], sg.logits) == 0.0
    assert unsaturated_share(sg.grads[-1], sg.logits, losses=sg.losses) == 1.0
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=terminal_ln).diagnostic("b")
    assert b.status == "fired" and b.details["cause"] == cause
    sg.losses.zero_()  # labelled 0: confidently right, the softmax's doing
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=terminal_ln).diagnostic("b")
    assert b.details["cause"] == CAUSE_SATURATION


# --- (b) judges growth by the run's own (a) threshold -------------------------------------
@pytest.mark.parametrize(("growth", "h_last", "a_status", "grew", "cause"), [
    (10.0, 100.0, "fired", True, CAUSE_LN),      # 20×: grown by the run's 10, not by 50
    (100.0, 300.0, "passed", False, CAUSE_FLOOR)])  # 60×: grown by 50, not by the run's 100
def test_b_calls_the_stream_grown_by_the_runs_own_a_threshold(growth, h_last, a_status,
                                                                grew, cause):
    """(b) decided stream_grew against (a)'s default 50× whatever the run configured, so
    (a) could fire on a stream (b) called not grown, and the reverse."""
    config = RunConfig().replace(**{"diagnostics.a.growth": growth})
    sg = make_sg(h_norms=(5.0, 5.0, 5.0, 5.0, h_last), g_norms=(1e-3,) * 4 + (1e-9,))
    for protocol, thresholds in [(Protocol.from_config(config.diagnostics), None),
                                 (None, Thresholds(growth=growth))]:
        report = evaluate_protocol(sg, headline_acc=None, frozen_acc=None, terminal_ln=True,
                                   protocol=protocol,
                                   **({} if thresholds is None else {"thresholds": thresholds}))
        b = report.diagnostic("b")
        assert report.diagnostic("a").status == a_status
        assert b.details["stream_grew"] is grew and b.details["cause"] == cause
        if not grew:
            assert f"did not grow by more than {growth:g}×" in b.reason


# --- (d) on two accuracies --------------------------------------------------------------
def test_depth_utility_diagnostic_is_the_one_rejudging_function():
    """The public depth_utility_diagnostic duplicated protocol.records' function and could
    not say that the accuracy is of an untrained network."""
    from creditaudit.protocol.records import depth_utility

    fired = depth_utility_diagnostic(0.30, 0.50, Thresholds())
    assert fired.status == "fired" and fired.value == pytest.approx(-20.0)
    assert depth_utility_diagnostic(0.30, 0.50, Thresholds(), trained=False).status \
        == NOT_EVALUATED
    assert depth_utility_diagnostic is depth_utility


# --- (d) on an untrained network -------------------------------------------------------------
@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    """A 0-epoch run given a frozen-blocks accuracy: the protocol judges the network at
    initialisation once."""
    out = tmp_path_factory.mktemp("untrained")
    return train(tiny_config(out, **{"optim.epochs": 0, "method.name": "bp",
                                      "diagnostics.frozen_acc": 0.5,
                                      "diagnostics.end_of_run": False})).run_dir


def test_a_zero_epoch_run_records_d_not_evaluated(untrained_run):
    record = load_record(untrained_run)
    assert record.protocol.first_fired["d"] is None
    assert record.protocol.epoch == 0 and "d" not in record.protocol.fired
    d = record.protocol.report["diagnostics"]["d"]
    assert d["status"] == NOT_EVALUATED and "untrained network" in d["reason"]
    assert record.log[0].protocol["d"] == NOT_EVALUATED
    assert "d" in record.protocol.report["not_evaluated"]
    verdict = record_verdict(record, frozen_acc=0.9, frozen_runs=1)
    assert verdict.statuses["d"] == NOT_EVALUATED and "d" not in verdict.fired


def test_audit_of_a_zero_epoch_run_leaves_d_not_evaluated(untrained_run):
    report = audit_run(untrained_run, frozen="0.5", metrics=False)
    d = report.diagnostic("d")
    assert d.status == NOT_EVALUATED and "untrained network" in d.reason
    assert "d" in report.not_evaluated and "d" not in report.fired


def test_a_record_that_judged_d_at_epoch_0_reads_it_not_evaluated(untrained_run):
    """Records written before: (d) fired at epoch 0 (first_fired d = 0)."""
    record = load_record(untrained_run)
    stored = record.protocol.report["diagnostics"]["d"]
    stored.update(status="fired", value=-38.4, reason="accuracy 0.116 vs frozen blocks 0.500")
    record.protocol.report["verdict"], record.protocol.report["fired"] = "needs walk-back", ["d"]
    report = record_report(record)
    assert report.diagnostic("d").status == NOT_EVALUATED
    assert report.diagnostic("d").details["claimed"] == "fired"
    assert "d" not in report.fired


@pytest.fixture(scope="module")
def first_epoch_diverged(tmp_path_factory):
    """A run that diverged in its first epoch: its last finite epoch is 0."""
    out = tmp_path_factory.mktemp("diverged")
    return train(tiny_config(out, **{"method.name": "fa", "optim.lr": 1e9,
                                     "data.n_test": 256, "optim.epochs": 1,
                                     "diagnostics.eval_samples": 256,
                                     "diagnostics.end_of_run": False})).run_dir


def test_audit_of_a_run_diverged_in_its_first_epoch_judges_d_as_its_record_does(
        first_epoch_diverged):
    """Its checkpoint is of epoch 0, the last finite one: `audit` said (d) not evaluated
    (untrained network), where the record, `report` and docs judge (d) on epoch 0's
    numbers — the run did train."""
    run_dir = first_epoch_diverged
    record = load_record(run_dir)
    assert record.status == "diverged" and record.numbers_epoch == 0
    d = audit_run(run_dir, frozen="0.5", metrics=False).diagnostic("d")
    assert d.status == "fired" and d.value == pytest.approx(100 * (record.final_acc - 0.5))
    assert record_verdict(record, frozen_acc=0.5).statuses["d"] == "fired"


def test_a_run_diverged_in_its_first_epoch_says_why_no_other_diagnostic_is_judged(
        first_epoch_diverged):
    """No trained epoch was finite, so the protocol never ran: (a)–(c) are not evaluated,
    the verdict "—", and its note said only which epoch its numbers are of; the docs said
    (a)–(c) were judged on epoch 0's numbers."""
    record = load_record(first_epoch_diverged)
    assert record.protocol.epoch is None and record.numbers_epoch == 0
    verdict = record_verdict(record, frozen_acc=0.5)
    assert [verdict.statuses[i] for i in "abc"] == [NOT_EVALUATED] * 3
    assert verdict.statuses["d"] == "fired"
    note = diverged_text(record)
    assert "the protocol never judged it" in note and "network at initialisation" in note
    assert note in format_run_summary([record])


def test_report_of_a_run_diverged_in_its_first_epoch_shows_the_d_audit_judges(
        first_epoch_diverged):
    """Its record holds no protocol block, so `report` had no report of it: its (d) column
    and verdict read "—" against a frozen baseline, where `audit` of the same run judged
    (d) (and the verdict behind the table did too). The report now judges (d) as `audit`
    does, (a)–(c) not evaluated; without a baseline there is still nothing to judge."""
    from creditaudit.report.tables import diagnostic_cell

    record = load_record(first_epoch_diverged)
    assert not record.protocol.report
    assert record_report(record) is None
    report = record_report(record, frozen_acc=0.5, frozen_runs=1)
    assert report is not None
    audited = audit_run(first_epoch_diverged, frozen="0.5", metrics=False).diagnostic("d")
    d = report.diagnostic("d")
    assert (d.value, d.status) == (audited.value, audited.status) == (d.value, "fired")
    assert [report.diagnostic(i).status for i in "abc"] == [NOT_EVALUATED] * 3
    assert diagnostic_cell(report, "d").startswith("**fired**")
    assert report.metadata["headline_acc"] == record.final_acc
    assert record_verdict(record, frozen_acc=0.5, frozen_runs=1).judgement == report.judgement
    unfinished = dataclasses.replace(record, status="interrupted")  # its table says "— (run …)"
    assert record_report(unfinished, frozen_acc=0.5, frozen_runs=1) is None


def test_a_record_with_a_threshold_out_of_todays_range_stays_readable(untrained_run, tmp_path):
    """Earlier versions accepted a stability of 1 (and a floor of 0, …): such a record is
    read, reported and audited with the thresholds its run used, never refused."""
    import shutil

    from creditaudit.records.files import CONTENT_KEY, content_digest

    run_dir = tmp_path / untrained_run.name
    shutil.copytree(untrained_run, run_dir)
    path = run_dir / "record.json"
    stored = json.loads(path.read_text())
    stored["config"]["diagnostics"]["c"]["stability"] = 1.0
    stored["config"]["diagnostics"]["b"]["grad_floor"] = 0.0
    stored["protocol"]["report"]["metadata"]["thresholds"]["stability"] = 1.0
    stored[CONTENT_KEY] = content_digest(stored)
    path.write_text(json.dumps(stored))
    record = load_record(run_dir)
    assert record.config.diagnostics.c.stability == 1.0
    assert record_report(record, frozen_acc=0.5).thresholds.stability == 1.0
    assert set(record_verdict(record).statuses) == {"a", "b", "c", "d"}
    assert audit_run(run_dir, metrics=False).diagnostic("c").threshold == 1.0


# --- a plugin reads its evidence on the CPU -------------------------------------------------
@dataclass
class HostOptions:
    limit: float = opt(1e9, "(h) fires when the summed losses exceed this", min=0.0)


class HostOnly(ProtocolDiagnostic[HostOptions]):
    """A plugin that works on the CPU only (as the conformance suite ran it): it adds a CPU
    tensor to the evidence's losses and reads its logits through NumPy."""

    name = "h"
    label = "host only"
    statistic = "summed losses"
    operator, threshold = ">", "limit"
    hint = "never fires"
    rank = 70

    def __init__(self, options: HostOptions | None = None) -> None:
        super().__init__(options)
        self.seen: list[Evidence] = []

    def evaluate(self, evidence):
        self.seen.append(evidence)
        value = float((torch.zeros(evidence.losses.shape) + evidence.losses).sum())
        evidence.logits.numpy()
        return self.judge(value, f"{value:g}", devices=sorted(
            {t.device.type for t in (*evidence.grads, evidence.logits, evidence.labels,
                                     evidence.losses)}))


def _evidence(device: str, n: int = 16) -> Evidence:
    """Evidence of ``n`` samples (too few for (c)'s batches) whose tensors are on
    ``device``."""
    tensors = {"logits": torch.zeros(n, 4), "labels": torch.zeros(n, dtype=torch.long),
               "losses": torch.ones(n)}
    return Evidence([1.0, 1.1, 1.2], [1e-3, 1e-3, 1e-3], g_L_zero_fraction=0.0,
                    g_L_nonzero_median=1e-3,
                    grads=[torch.ones(n, 3, device=device) for _ in range(3)],
                    **{k: v.to(device) for k, v in tensors.items()},
                    headline_acc=0.9, frozen_acc=0.5, terminal_ln=True,
                    initial_hidden_norms=[1.0, 1.0, 1.0])


def test_a_plugin_reads_evidence_off_the_cpu_moved_there_once_and_the_builtins_theirs(
        monkeypatch):
    """In a CUDA run the protocol handed plugins its GPU evidence: a plugin that passed the
    conformance suite (CPU evidence) then failed mid-run. The meta device stands in for the
    GPU, and a stand-in move gives CPU tensors of the same shapes."""
    import creditaudit.protocol.base as base

    moved: list[torch.Tensor] = []

    def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
        moved.append(tensor)
        return torch.ones(tensor.shape, dtype=tensor.dtype)

    monkeypatch.setattr(base, "_to_cpu", to_cpu, raising=False)
    builtin_seen: list[Evidence] = []
    real = vars(DirectionStability)["evaluate"]

    def seen_by_c(self, evidence):  # noqa: ANN001, ANN202 - (c)'s own evaluate, watched
        builtin_seen.append(evidence)
        return real.__get__(self, DirectionStability)(evidence)

    monkeypatch.setattr(DirectionStability, "evaluate", seen_by_c)
    first, second = HostOnly(), HostOnly()
    second.name = "i"
    protocol = Protocol((*Protocol.default().diagnostics, first, second))
    evidence = _evidence("meta")
    results = {r.id: r for r in protocol.evaluate(evidence)}
    assert results["h"].status == results["i"].status == "passed"
    assert results["h"].value == 16.0 and results["h"].details["devices"] == ["cpu"]
    (given,) = builtin_seen  # the built-ins read the evidence as it was
    assert given.grads is evidence.grads and given.logits is evidence.logits
    assert given.logits.device.type == "meta"
    assert first.seen[0] is not second.seen[0]  # each plugin its own copy …
    assert len(moved) == 3 + 3  # … of tensors moved once: three grads, logits, labels, losses
    on_cpu = first.seen[0]
    assert torch.equal(on_cpu.logits, second.seen[0].logits)
    for name in ("hidden_norms", "grad_norms", "initial_hidden_norms"):
        assert getattr(on_cpu, name) == getattr(evidence, name)  # copies of what was given
        assert getattr(on_cpu, name) is not getattr(evidence, name)
    assert (on_cpu.headline_acc, on_cpu.terminal_ln, on_cpu.growth_limit) == (0.9, True, 50.0)
    assert on_cpu.labels.dtype == torch.long and evidence.logits.device.type == "meta"


def test_evidence_already_on_the_cpu_is_not_moved_for_a_plugin(monkeypatch):
    import creditaudit.protocol.base as base

    monkeypatch.setattr(base, "_to_cpu", lambda t: pytest.fail("moved a CPU tensor"),
                        raising=False)
    plugin = HostOnly()
    protocol = Protocol((*Protocol.default().diagnostics, plugin))
    evidence = _evidence("cpu")
    protocol.evaluate(evidence)
    given = plugin.seen[0]  # a copy of its own (tests/test_diagnostic_evidence.py), not moved
    assert torch.equal(given.logits, evidence.logits) and given.logits is not evidence.logits
    assert evidence.on_cpu() is evidence
    partly = dataclasses.replace(evidence, grads=None, logits=None)
    assert partly.on_cpu() is partly
