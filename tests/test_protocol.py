"""The four-diagnostic protocol: statistics by hand, verdicts, renderers, diagnose(), training."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from creditaudit.audit.diagnose import diagnose
from creditaudit.config import MethodConfig, RunConfig
from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.measures.gradients import StateGradients
from creditaudit.methods import build_rule
from creditaudit.models import ResidualMLP
from creditaudit.protocol import (
    CAUSE_FLOOR,
    CAUSE_LN,
    CAUSE_NO_PATH,
    CAUSE_SATURATION,
    CAUSE_WEAK_HEAD,
    NO_FROZEN_REASON,
    DiagnosticReport,
    cross_batch_stability,
    evaluate_protocol,
)
from creditaudit.protocol.diagnostics import ReferenceOptions, ReferenceValidity
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.report import render, render_markdown, render_text
from creditaudit.report.protocol import layer_rows, value_text
from creditaudit.study.experiments.decision_utility import seed_decisions
from creditaudit.study.experiments.temporal import depth_utility_trace
from creditaudit.testing.diagnostics import evidence_cases


def make_sg(*, n: int = 1024, d: int = 32, h_norms=(5.0, 5.0, 5.0, 5.0, 5.0),
            g_norms=(1e-3, 1e-3, 1e-3, 1e-3, 1e-3), common_at: int | None = None,
            seed: int = 0) -> StateGradients:
    """States/gradients with every sample's norm set exactly; random directions.

    ``common_at``: give the gradients at that layer a shared direction (fires (c)).
    """
    gen = torch.Generator().manual_seed(seed)

    def rows(norm: float, common: bool = False) -> torch.Tensor:
        v = torch.randn(n, d, generator=gen, dtype=torch.float64)
        if common:
            v = v + 3.0 * torch.ones(d, dtype=torch.float64)
        return (v / v.norm(dim=1, keepdim=True) * norm).float()

    states = [rows(h) for h in h_norms]
    grads = [rows(g, common=(layer == common_at)) for layer, g in enumerate(g_norms)]
    logits = torch.zeros(n, 10)
    return StateGradients(states=states, grads=grads, logits=logits, losses=torch.zeros(n))


def test_a_report_records_the_thresholds_its_protocol_judged_by():
    """Given a protocol only, the report records its thresholds, not the defaults: (b) at a
    floor of 1 fires on ‖g_L‖ = 1e-3 and the per-layer table flags the same norms
    (:func:`render` reads ``report.thresholds``); given both and apart: one line."""
    from creditaudit.protocol import Protocol, Thresholds

    protocol = Protocol.default(Thresholds(grad_floor=1.0, growth=20.0))
    report = evaluate_protocol(make_sg(n=16), headline_acc=None, frozen_acc=None,
                               protocol=protocol, credits=make_sg(n=16).grads)
    assert report.diagnostic("b").status == "fired"
    assert report.thresholds == protocol.thresholds()
    assert report.metadata["thresholds"]["grad_floor"] == 1.0
    assert all(not row["valid_reference"] for row in report.layer_cosines)
    same = evaluate_protocol(make_sg(n=16), headline_acc=None, frozen_acc=None,
                             protocol=protocol, thresholds=Thresholds(grad_floor=1.0,
                                                                      growth=20.0))
    assert same.thresholds == report.thresholds
    with pytest.raises(ConfigError, match=r"^thresholds= and protocol= disagree: growth=50.0 "
                                          r"\(its \(a\) holds 20.0\), grad_floor=1e-07 \(its "
                                          r"\(b\) holds 1.0\); give"):
        evaluate_protocol(make_sg(n=16), headline_acc=None, frozen_acc=None,
                          protocol=protocol, thresholds=Thresholds())


# --- the statistics by hand ---------------------------------------------------------------
def test_growth_and_norms_match_hand_computation():
    # Sample i at layer l is s_l · k_i · [1, 2, 2, 0]: per-sample norm 3·s_l·k_i.
    k = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])
    base = torch.tensor([1.0, 2.0, 2.0, 0.0])
    scales = [1.0, 2.0, 200.0, 300.0]
    states = [s * k[:, None] * base for s in scales]
    sg = StateGradients(states=states, grads=[torch.ones(5, 4) * 1e-3] * 4,
                        logits=torch.zeros(5, 3), losses=torch.zeros(5))
    report = evaluate_protocol(sg, headline_acc=None, frozen_acc=None)
    assert report.hidden_norms == pytest.approx([9.0 * s for s in scales])
    a = report.diagnostic("a")
    assert a.value == pytest.approx(100.0)  # 2 → 200 is the largest single-block growth
    assert a.details["block"] == 1
    assert a.details["block_growth"] == pytest.approx([2.0, 100.0, 1.5])
    assert a.status == "fired"
    assert report.grad_norms == pytest.approx([2e-3] * 4)


def test_norms_are_per_sample_l2_over_features_not_l_minus_one():
    # x.norm(-1) would be the L₋₁ norm of the whole tensor: (Σ|x|⁻¹)⁻¹ = 1/(N·d) here.
    n, d = 9, 16
    states = [torch.ones(n, d), torch.ones(n, d) * 3.0]
    grads = [torch.full((n, d), 1e-4), torch.full((n, d), 1e-4)]
    sg = StateGradients(states=states, grads=grads, logits=torch.zeros(n, 2),
                        losses=torch.zeros(n))
    report = evaluate_protocol(sg, headline_acc=None, frozen_acc=None)
    assert report.hidden_norms == pytest.approx([4.0, 12.0])
    assert report.grad_norms == pytest.approx([4e-4, 4e-4])
    assert report.diagnostic("b").value == pytest.approx(4e-4)
    wrong = float(states[0].norm(-1))
    assert wrong == pytest.approx(1 / (n * d))
    assert report.hidden_norms[0] != pytest.approx(wrong)


def test_reference_gradient_median_zero_fraction_and_nonzero_median():
    grad_last = torch.zeros(7, 3)
    grad_last[4] = torch.tensor([2e-3, 0.0, 0.0])
    grad_last[5] = torch.tensor([0.0, 1e-3, 0.0])
    grad_last[6] = torch.tensor([0.0, 0.0, 3e-3])
    saturated = torch.tensor([[200.0, 0.0]] * 4 + [[1.0, 0.0]] * 3)  # softmax one-hot
    sg = StateGradients(states=[torch.ones(7, 3)] * 2, grads=[torch.ones(7, 3), grad_last],
                        logits=saturated, losses=torch.zeros(7))
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=True).diagnostic("b")
    # Sorted norms [0, 0, 0, 0, 1e-3, 2e-3, 3e-3]: median 0, 4/7 zero, median of rest 2e-3.
    assert b.value == 0.0
    assert b.details["zero_fraction"] == pytest.approx(4 / 7)
    assert b.details["nonzero_median"] == pytest.approx(2e-3)
    assert b.status == "fired"
    assert b.details["cause"] == CAUSE_SATURATION  # saturation wins even with an LN



def test_reference_gradient_exactly_zero_without_saturation_is_no_path_to_h_L():
    # A zero (or dead) head: every g_L is exactly 0 while the softmax is uniform. It read
    # "saturated softmax"; the output error is not 0, the gradient never reaches h_L.
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    with torch.no_grad():
        model.out_head.weight.zero_()
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    b = diagnose(model, x, y).diagnostic("b")
    assert b.status == "fired" and b.details["zero_fraction"] == 1.0
    assert b.details["cause"] == CAUSE_NO_PATH and "not saturated" in b.reason

@pytest.mark.parametrize(("terminal_ln", "h_last", "cause"), [
    (True, 5e4, CAUSE_LN), (True, 5.0, CAUSE_FLOOR), (False, 5e4, CAUSE_WEAK_HEAD),
    (None, 5e4, CAUSE_LN), (None, 5.0, CAUSE_FLOOR)])
def test_reference_cause_without_saturation(terminal_ln, h_last, cause):
    sg = make_sg(h_norms=(5.0, 5.0, 5.0, 5.0, h_last),
                 g_norms=(1e-3, 1e-3, 1e-3, 1e-3, 1e-9))
    b = evaluate_protocol(sg, headline_acc=None, frozen_acc=None,
                          terminal_ln=terminal_ln).diagnostic("b")
    assert b.status == "fired" and b.value == pytest.approx(1e-9)
    assert b.details["zero_fraction"] == 0.0
    assert b.details["cause"] == cause
    assert cause in b.reason


def test_stability_is_mean_pairwise_cosine_of_normalised_batch_means_k8():
    gen = torch.Generator().manual_seed(3)
    grad = torch.randn(8 * 128, 6, generator=gen, dtype=torch.float64) + 0.15
    units = []
    for k in range(8):
        mean = grad[k * 128:(k + 1) * 128].mean(dim=0)
        units.append(mean / mean.norm())
    pairs = [float(units[i] @ units[j]) for i, j in itertools.combinations(range(8), 2)]
    assert len(pairs) == 28
    value, k = cross_batch_stability(grad.float(), 128)
    assert k == 8
    assert value == pytest.approx(sum(pairs) / 28, abs=1e-6)


def test_stability_reads_state_l_half_and_needs_eight_batches():
    fired = evaluate_protocol(make_sg(common_at=2), headline_acc=None, frozen_acc=None)
    assert fired.diagnostic("c").details["layer"] == 2
    assert fired.diagnostic("c").status == "fired" and fired.diagnostic("c").value > 0.9
    elsewhere = evaluate_protocol(make_sg(common_at=4), headline_acc=None, frozen_acc=None)
    assert elsewhere.diagnostic("c").status == "passed"
    short = evaluate_protocol(make_sg(n=7 * 128 + 100), headline_acc=None, frozen_acc=None)
    c = short.diagnostic("c")
    assert c.status == "not evaluated" and c.value is None
    assert "8 full batches" in c.reason and "not evaluated" in short.verdict_text


@pytest.mark.parametrize("n_classes", [2, 10, 100])
def test_stability_on_samples_sorted_by_class_is_not_evaluated(n_classes):
    """(c)'s batches are consecutive samples: sorted by class, each batch holds one class (or
    a few) and its mean gradient differs by class. Not judged; the reason says to shuffle."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, n_classes, (1024,), generator=gen)
    shuffled = evaluate_protocol(dataclasses.replace(make_sg(common_at=2), labels=labels),
                                 headline_acc=None, frozen_acc=None).diagnostic("c")
    unlabelled = evaluate_protocol(make_sg(common_at=2), headline_acc=None,
                                   frozen_acc=None).diagnostic("c")
    assert shuffled == unlabelled and shuffled.status == "fired"
    ordered = dataclasses.replace(make_sg(common_at=2), labels=labels.sort().values)
    c = evaluate_protocol(ordered, headline_acc=None, frozen_acc=None).diagnostic("c")
    assert c.status == "not evaluated" and c.value is None
    assert "look sorted by class" in c.reason and "shuffle them" in c.reason


def test_diagnose_on_an_evaluation_set_sorted_by_class_leaves_c_not_evaluated():
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=8, d=8, n_classes=4, n_blocks=2)
    x, y = torch.randn(1024, 8), torch.randint(0, 4, (1024,))
    assert diagnose(model, x, y).diagnostic("c").status in ("passed", "fired")
    order = y.argsort(stable=True)
    c = diagnose(model, x[order], y[order]).diagnostic("c")
    assert c.status == "not evaluated" and "look sorted by class" in c.reason


def test_an_imbalanced_shuffled_set_is_not_called_sorted():
    """One class in a hundred: a batch of 128 often holds one class by chance alone."""
    gen = torch.Generator().manual_seed(0)
    labels = (torch.rand(1024, generator=gen) < 0.01).long()
    c = evaluate_protocol(dataclasses.replace(make_sg(), labels=labels), headline_acc=None,
                          frozen_acc=None).diagnostic("c")
    assert c.status == "passed"


def test_overflowed_states_fire_a_and_leave_b_c_not_evaluated():
    sg = make_sg()
    sg.states[3] = torch.full_like(sg.states[3], float("nan"))
    for index in (2, 4):
        sg.grads[index] = torch.full_like(sg.grads[index], float("nan"))
    report = evaluate_protocol(sg, headline_acc=0.5, frozen_acc=0.3)
    assert report.diagnostic("a").status == "fired" and "overflowed" in report.diagnostic(
        "a").reason
    assert report.diagnostic("b").status == "not evaluated"
    assert report.diagnostic("c").status == "not evaluated"
    assert report.verdict == "needs walk-back" and report.not_evaluated == ["b", "c"]


def test_a_stream_that_stays_exactly_zero_does_not_grow():
    # dead ReLUs: the median ‖h‖ is 0 from state 3 on; 0 → 0 read as inf growth, (a) fired
    report = evaluate_protocol(make_sg(h_norms=(5.0, 5.0, 5.0, 0.0, 0.0)), headline_acc=None,
                               frozen_acc=None)
    a = report.diagnostic("a")
    assert a.details["block_growth"][2:] == [0.0, 1.0]
    assert a.status == "passed" and a.value == pytest.approx(1.0)

def test_depth_utility_in_percentage_points():
    report = evaluate_protocol(make_sg(), headline_acc=0.365, frozen_acc=0.349)
    d = report.diagnostic("d")
    assert d.value == pytest.approx(1.6) and d.status == "fired"
    assert evaluate_protocol(make_sg(), headline_acc=0.40,
                             frozen_acc=0.349).diagnostic("d").status == "passed"
    with pytest.raises(ConfigError, match="fraction"):
        evaluate_protocol(make_sg(), headline_acc=61.5, frozen_acc=0.349)



@pytest.mark.parametrize(("headline", "frozen"), [(0.35, 0.33), (0.09, 0.07), (0.12, 0.10)])
def test_depth_utility_margin_of_exactly_the_threshold_passes(headline, frozen):
    # 100·(0.35 − 0.33) is 1.9999999999999996 in floating point: (d) fired at 2.00 pp.
    d = evaluate_protocol(make_sg(), headline_acc=headline,
                          frozen_acc=frozen).diagnostic("d")
    assert d.value == 2.0 and d.status == "passed"
    # the temporal experiment's per-epoch (d) margin reads the same
    record = SimpleNamespace(series=lambda key: ([1], [headline]))
    assert depth_utility_trace(record, {1: frozen})["margins"] == {1: 2.0}


def test_a_value_rounded_onto_its_threshold_is_shown_with_the_digits_that_tell_its_status():
    """A margin of 1.997 pp (against the mean of three frozen runs) fires (d) at < 2 pp,
    yet every table showed it as ``+2.00 pp``, which reads as a margin the threshold
    passes; a growth of 50.04 fired (a) at > 50× reading ``50``. The value now carries the
    digits that tell its status; one its format already tells is shown as before."""
    from creditaudit.report.tables import diagnostic_cell

    frozen = (0.50 + 0.50 + 0.5001) / 3  # three frozen runs on 10 000 test samples
    report = evaluate_protocol(make_sg(), headline_acc=0.52, frozen_acc=frozen)
    d = report.diagnostic("d")
    assert d.status == "fired" and 1.99 < d.value < 2.0
    assert diagnostic_cell(report, "d") == "**fired** +1.997 pp"
    assert "| (d) | depth utility | +1.997 pp | < 2 pp | fired |" in render_markdown(report)
    assert "+1.997 pp" in render_text(report)
    a = dataclasses.replace(report.diagnostic("a"), value=50.04, status="fired")
    assert value_text(a) == "50.04"
    assert value_text(dataclasses.replace(a, value=694.2)) == "694"
    passed = evaluate_protocol(make_sg(), headline_acc=0.52, frozen_acc=0.50)
    assert diagnostic_cell(passed, "d") == "passed +2.00 pp"


def test_per_layer_cells_tell_their_thresholds_and_cosines_keep_three_decimals():
    """The per-layer table flagged a block growth of 50.04 'growth > threshold' (> 50×)
    reading ``50``, and a ‖g_l‖ of 9.9996e-08 'below floor' (< 1e-07) reading ``1e-07``;
    and the Markdown template's per-layer Γ had 2 decimals (+0.00 for a cosine of +0.004,
    whose sign the aggregates' +0.004 beside it show) where every other cosine has 3. The
    cells now carry the digits that tell their thresholds, and per-layer Γ has 3 decimals."""
    report = evaluate_protocol(make_sg(h_norms=(1.0, 1.0, 50.04, 50.04, 50.04),
                                       g_norms=(1e-3, 1e-3, 1e-3, 1e-3, 9.9996e-8)),
                               **HEALTHY)
    rows = {row[0]: row for row in layer_rows(report)}
    assert rows["2"][2] == "50.04" and "growth > threshold" in rows["2"][5]
    assert rows["3"][2] == "1"  # told by its format already
    assert rows["4"][3] == "9.9996e-08" and "below floor" in rows["4"][5]
    assert rows["0"][3] == "0.001"
    cosines = [{"cos": 0.25}, {"cos": 0.004}, {"cos": -0.1}, {"cos": 0.5}, {"cos": 0.125}]
    md = render_markdown(dataclasses.replace(report, layer_cosines=cosines))
    cells = [cell.strip() for cell in md.splitlines()[2].split("|")]
    per_layer = cells[md.splitlines()[0].split("|").index(" per-layer Γ ")]
    assert per_layer.split(", ")[1] == "+0.004", per_layer
    assert all(len(cos.split(".")[1]) == 3 for cos in per_layer.split(", "))


def test_a_reason_states_a_value_rounded_onto_its_threshold_with_the_digits_that_tell():
    """The reason a record keeps said ``margin +2.00 pp (< 2 pp)`` for a fired margin of
    1.997 pp: it now carries the same digits as the tables."""
    frozen = (0.50 + 0.50 + 0.5001) / 3
    d = evaluate_protocol(make_sg(), headline_acc=0.52, frozen_acc=frozen).diagnostic("d")
    assert d.status == "fired" and "margin +1.997 pp (< 2 pp)" in d.reason, d.reason
    passed = evaluate_protocol(make_sg(), headline_acc=0.52, frozen_acc=0.50).diagnostic("d")
    assert "margin +2.00 pp (≥ 2 pp)" in passed.reason, passed.reason


def test_a_value_format_with_grouping_or_fill_tells_its_status_too():
    """A plugin diagnostic's ``value_format = ",.0f"`` made every table of a judged value
    raise ValueError (the digits were read back with float('1,234')): the number shown is now
    read back without the spec's grouping, sign or fill."""
    from creditaudit.formatting import telling_number

    assert telling_number(1234.4, ",.0f", ">", 1234.0) == "1,234.4"
    assert telling_number(98765.0, ",.0f", ">", 1000.0) == "98,765"
    assert telling_number(1.997, "*>+9.2f", "<", 2.0) == "***+1.997"
    assert telling_number(0.4996, ".1%", "<", 0.5) == "49.96%"


def test_a_reference_floor_of_more_than_one_digit_is_stated_as_it_is():
    """(b)'s floor was written with ``.0e``: diagnostics.b.grad_floor = 1.5e-7 read
    ``1e-07`` in its threshold column and in the reason a record keeps, so a median ‖g_L‖ of
    1.2e-07 fired reading ``1.2e-07 (< 1e-07)``. The floor now has the digits it holds; the
    default 1e-07 reads as before."""
    floor = 1.5e-7
    b = ReferenceValidity(ReferenceOptions(grad_floor=floor))
    typical = evidence_cases()["typical"]
    for value, sign in ((1.2e-7, "<"), (1.6e-7, "≥")):
        evidence = dataclasses.replace(typical, grad_norms=[*typical.grad_norms[:-1], value])
        result = b.evaluate(evidence)
        assert f"median ‖g_L‖ = {value:.2g} ({sign} 1.5e-07)" in result.reason, result.reason
    assert b.threshold_text(floor) == "< 1.5e-07"
    assert ReferenceValidity.threshold_text(1e-7) == "< 1e-07"
    assert ReferenceValidity.threshold_text(1e-4) == "< 1e-04"


def test_decision_utility_accuracy_exactly_2pp_above_chance_is_not_at_chance():
    record = SimpleNamespace(final_acc=0.12, chance=0.1, headline_gamma=0.5, seed=42,
                             run_id="r")
    decision = seed_decisions(record, {})
    assert decision["above_chance_pp"] == 2.0 and not decision["walked_back"]["S0"]

# --- verdicts -----------------------------------------------------------------------------
HEALTHY = {"headline_acc": 0.60, "frozen_acc": 0.349}
CASES = {
    "a": ({"h_norms": (5.0, 5.0, 600.0, 600.0, 600.0)}, HEALTHY),
    "b": ({"g_norms": (1e-3, 1e-3, 1e-3, 1e-3, 1e-9)}, HEALTHY),
    "c": ({"common_at": 2}, HEALTHY),
    "d": ({}, {"headline_acc": 0.355, "frozen_acc": 0.349}),
}


def test_no_flag_is_trustworthy():
    report = evaluate_protocol(make_sg(), **HEALTHY)
    assert report.verdict == "trustworthy"
    assert report.fired == [] and report.not_evaluated == []
    assert [r.status for r in report.diagnostics] == ["passed"] * 4


@pytest.mark.parametrize("flag", ["a", "b", "c", "d"])
def test_each_flag_alone_walks_back_naming_it(flag):
    sg_kwargs, accs = CASES[flag]
    report = evaluate_protocol(make_sg(**sg_kwargs), **accs, terminal_ln=True)
    assert report.verdict == "needs walk-back"
    assert report.fired == [flag]
    assert f"({flag})" in report.verdict_text
    others = [r.status for r in report.diagnostics if r.id != flag]
    assert others == ["passed"] * 3


def test_missing_frozen_accuracy_is_not_evaluated_everywhere():
    report = evaluate_protocol(make_sg(), headline_acc=0.6, frozen_acc=None)
    d = report.diagnostic("d")
    assert d.status == "not evaluated" and d.reason == NO_FROZEN_REASON
    assert report.verdict == "incomplete" and report.not_evaluated == ["d"]
    assert report.verdict_text == "no walk-back in (a)–(c); (d) not evaluated"
    assert str(report) == report.verdict_text
    assert "(d) not evaluated" in render_text(report)
    md = render_markdown(report)
    assert "not evaluated" in md and NO_FROZEN_REASON in md
    data = json.loads(report.to_json())
    assert data["diagnostics"]["d"]["status"] == "not evaluated"
    assert data["not_evaluated"] == ["d"]
    assert evaluate_protocol(make_sg(), headline_acc=None, frozen_acc=0.3).diagnostic(
        "d").status == "not evaluated"


def test_the_layer_table_flags_a_cosine_over_part_of_the_samples():
    sg = make_sg()
    credits = [g.clone() for g in sg.grads]
    credits[2][: sg.grads[2].shape[0] // 4] = 0.0  # a quarter of the samples get no credit
    report = evaluate_protocol(sg, **HEALTHY, credits=credits)
    assert report.layer_cosines[2]["defined"] == pytest.approx(0.75)
    assert "cos over 75% of samples" in render_text(report)
    assert "cos over" not in render_text(evaluate_protocol(sg, **HEALTHY, credits=sg.grads))


def test_renderers():
    report = evaluate_protocol(make_sg(**CASES["a"][0]), **HEALTHY,
                               metadata={"method": "dfa", "arch": "resmlp_d=256", "seeds": "42"})
    text = render(report, "text")
    for label in ("(a)", "(b)", "(c)", "(d)", "needs walk-back (a)", "FIRED"):
        assert label in text
    md = render(report, "md")
    assert md.splitlines()[0].startswith("| method |") and "| dfa |" in md
    assert md.count("| (a) |") == 1 and "growth > threshold" in md
    data = json.loads(report.to_json())
    assert set(data["diagnostics"]) == {"a", "b", "c", "d"}
    assert DiagnosticReport.from_dict(data).to_dict() == report.to_dict()
    assert render(report, "json") == report.to_json()
    table = render(report, "latex").splitlines()
    row = table[4]  # \begin{tabular}, \hline, the header, \hline, the run
    assert row.endswith(r"\\") and row.count(" & ") == 8
    assert "needs walk-back (a)" in row and r"resmlp\_d=256" in row
    assert r"\textbf{120}" in row  # the fired value is bold


# --- diagnose() on live models -------------------------------------------------------------
def _tiny_resmlp(seed: int = 0) -> ResidualMLP:
    torch.manual_seed(seed)
    return ResidualMLP(12, 16, 4, 2)


def test_diagnose_leaves_parameters_grads_buffers_and_rng_untouched():
    model = _tiny_resmlp()
    rule = build_rule(model, MethodConfig(name="dfa"), n_classes=4, seed=0)
    x, y = torch.randn(300, 12), torch.randint(0, 4, (300,))
    for index, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, float(index))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    feedback = [b.clone() for b in rule.feedback]
    model.train()
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    numpy_rng, python_rng = np.random.get_state(), random.getstate()
    report = diagnose(model, x, y, credit=rule, headline_acc=0.5, metrics=True,
                      metric_options={"rho_samples": 64, "rho_directions": 4,
                                      "null_draws": 3})
    assert torch.equal(torch.get_rng_state(), rng)
    after = np.random.get_state()
    assert numpy_rng[0] == after[0] and np.array_equal(numpy_rng[1], after[1])
    assert numpy_rng[2:] == after[2:] and random.getstate() == python_rng
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)
    assert all(torch.equal(a, b) for a, b in zip(rule.feedback, feedback))
    assert report.metrics is not None and report.layer_cosines is not None
    assert report.metadata["method"] == "dfa" and report.metadata["terminal_ln"] is True


class Plain(nn.Module):
    """A plain MLP with a BatchNorm (whose running stats must not move)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.bn, self.l2, self.head = (nn.Linear(6, 8), nn.BatchNorm1d(8),
                                                nn.Linear(8, 8), nn.Linear(8, 3))

    def states(self, x):
        h0 = torch.relu(self.bn(self.l1(x)))
        h1 = torch.relu(self.l2(h0))
        return [h0, h1], self.head(h1)


def test_diagnose_plain_module_with_states_fn():
    torch.manual_seed(0)
    model = Plain()
    x, y = torch.randn(256, 6), torch.randint(0, 3, (256,))
    model.train()
    running = model.bn.running_mean.clone()
    report = diagnose(model, x, y, states_fn=model.states)
    assert torch.equal(model.bn.running_mean, running) and model.training
    model.eval()
    with torch.no_grad():
        states, _ = model.states(x)
    expected = [statistics.median(h.double().norm(dim=1).tolist()) for h in states]
    assert report.hidden_norms == pytest.approx(expected)
    assert report.metadata["terminal_ln"] is None and report.metadata["model"] == "Plain"
    assert report.diagnostic("c").status == "not evaluated"  # 256 samples = 2 batches
    with pytest.raises(ModelContractError, match="states_fn"):
        diagnose(model, x, y)


def test_diagnose_token_states_read_the_cls_token():
    torch.manual_seed(0)
    embed, head = nn.Linear(5, 8), nn.Linear(8, 3)

    def states_fn(x):
        h0 = embed(x)  # (B, T, d) tokens
        h1 = h0 + torch.tanh(h0)
        return [h0, h1], head(h1[:, 0])

    x, y = torch.randn(64, 4, 5), torch.randint(0, 3, (64,))
    report = diagnose(nn.ModuleList([embed, head]), x, y, states_fn=states_fn)
    with torch.no_grad():
        states, _ = states_fn(x)
    assert report.hidden_norms == pytest.approx(
        [statistics.median(h[:, 0].double().norm(dim=1).tolist()) for h in states])
    assert report.metadata["layout"] == "tokens"


def test_diagnose_metrics_need_a_credit():
    model = _tiny_resmlp()
    with pytest.raises(ModelContractError, match="credit"):
        diagnose(model, torch.randn(8, 12), torch.randint(0, 4, (8,)), metrics=True)


# --- training integration ------------------------------------------------------------------
def tiny_config(tmp_path, **overrides) -> RunConfig:
    base = {"data.n_train": 256, "data.n_test": 1280, "data.in_dim": 16, "model.d": 16,
            "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
            "method.name": "dfa", "diagnostics.rho_samples": 64,
            "diagnostics.rho_directions": 4, "diagnostics.null_draws": 3,
            "run.out_dir": str(tmp_path), "run.progress": False}
    base.update(overrides)
    return RunConfig().replace(**base)


def test_training_records_protocol_per_epoch(tmp_path):
    from creditaudit.run.trainer import train

    record = train(tiny_config(tmp_path)).record.to_dict()
    protocol = record["protocol"]
    assert set(protocol["first_fired"]) == {"a", "b", "c", "d"}
    for epoch in protocol["first_fired"].values():
        assert epoch is None or (isinstance(epoch, int) and epoch >= 1)
    for entry in record["log"][1:]:
        assert entry["verdict"] in ("incomplete", "needs walk-back")
        assert set(entry["protocol"]) == {"a", "b", "c", "d"}
        assert entry["protocol"]["d"] == "not evaluated"
    assert "protocol" not in record["log"][0]  # no protocol before training
    assert protocol["verdict"] == record["log"][-1]["verdict"]
    assert protocol["report"]["metadata"]["epoch"] == 2
    for key in ("drift", "bp_cosine", "gamma", "perturbation_rho", "rho_controls",
                "rho_measurable", "nudging", "fresh_b_null"):
        assert key in record["diagnostics"], key
    assert set(record["diagnostics"]["nudging"]) == {"0.01", "0.1"}


def test_stop_on_walkback_ends_after_first_firing_epoch(tmp_path):
    from creditaudit.run.trainer import train

    config = tiny_config(tmp_path, **{"optim.epochs": 3, "diagnostics.frozen_acc": 1.0,
                                      "diagnostics.stop_on_walkback": True})
    record = train(config).record.to_dict()
    assert record["status"] == "completed"
    assert [e["epoch"] for e in record["log"]] == [0, 1]
    assert record["stopped_early"]["epoch"] == 1
    assert "(d)" in record["stopped_early"]["reason"]
    assert record["protocol"]["first_fired"]["d"] == 1


def test_a_walk_back_at_the_last_epoch_is_no_early_stop(tmp_path):
    """A run that trained every epoch of its recipe did not stop early, walk-back or not: it
    was recorded as stopped early at its last epoch, left out of the end-of-run means and,
    a frozen-blocks run, out of (d)'s baselines ("no frozen baseline of (d): stopped
    early")."""
    from creditaudit.protocol.records import baseline_runs, not_a_baseline
    from creditaudit.run.trainer import train

    done = train(tiny_config(tmp_path, **{
        "optim.epochs": 1, "method.name": "frozen", "diagnostics.frozen_acc": 1.0,
        "diagnostics.stop_on_walkback": True})).record
    assert done.status == "completed" and [e.epoch for e in done.log] == [0, 1]
    assert done.log[-1].verdict == "needs walk-back"
    assert done.stopped_early is None and not_a_baseline(done) is None
    assert baseline_runs(done, [done]) == [done]
    # records written before this fix said stopped early at the last epoch: read as not
    from creditaudit.records import load_record, save_record

    done.stopped_early = {"epoch": 1, "reason": "protocol verdict needs walk-back: (d)"}
    save_record(tmp_path / "old", done)
    assert load_record(tmp_path / "old").stopped_early is None
    done.stopped_early = {"epoch": 0, "reason": "protocol verdict needs walk-back: (d)"}
    save_record(tmp_path / "earlier", done)
    assert load_record(tmp_path / "earlier").stopped_early == done.stopped_early


def test_training_is_bit_identical_with_and_without_diagnostics(tmp_path):
    from creditaudit.run.trainer import train

    with_diag = train(tiny_config(tmp_path / "on")).run_dir
    without = train(tiny_config(tmp_path / "off", **{
        "diagnostics.protocol_every": 0, "diagnostics.every": 1000,
        "diagnostics.end_of_run": False})).run_dir
    a = torch.load(with_diag / CHECKPOINT_FILE, weights_only=False)["model"]
    b = torch.load(without / CHECKPOINT_FILE, weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_credit_quality_refuses_a_non_finite_model():
    from creditaudit.measures.quality import NonFiniteModelError, credit_quality

    model = _tiny_resmlp()
    rule = build_rule(model, MethodConfig(name="bp"), n_classes=4, seed=0)
    with torch.no_grad():
        model.embed.weight[0, 0] = math.inf
    with pytest.raises(NonFiniteModelError, match="embed.weight"):
        credit_quality(rule, torch.randn(8, 12), torch.randint(0, 4, (8,)))


@pytest.mark.slow
def test_docs_example_audits_a_plain_module(capsys):
    """docs/examples/audit_own_model.py runs and prints a verdict (slow: trains a model)."""
    import runpy
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "audit_own_model.py"
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert "verdict" in out.lower()


@pytest.mark.parametrize("method,draws", [
    ("fa", True), ("dfa", True), ("drtp", True), ("fa-linear", True), ("frsf", True),
    ("brsf", True), ("kp", True), ("state-bridge", True), ("credit-bridge", True),
    ("bp", False), ("usf", False), ("ep", False), ("frozen", False), ("local-ce", False)])
def test_metadata_shows_the_feedback_seed_of_every_rule_that_draws_from_it(method, draws):
    from creditaudit.protocol.records import record_metadata
    from creditaudit.records import RunRecord

    config = RunConfig().replace(**{"method.name": method, "run.seed": 7})
    assert record_metadata(RunRecord(config=config))["feedback_seed"] == (7 if draws else None)
    if not draws:  # a rule that draws nothing does not read the option: setting it is an error
        with pytest.raises(ConfigError, match=f"method.feedback_seed is not read by {method}"):
            config.replace(**{"method.feedback_seed": 3})
        return
    config = config.replace(**{"method.feedback_seed": 3})
    assert record_metadata(RunRecord(config=config))["feedback_seed"] == 3


def test_a_margin_of_exactly_the_threshold_between_float32_accuracies_passes():
    """A loop of the user's own computes its accuracy as a float32 mean, as the docs' own
    Recorder examples did: 415/500 and 405/500 read 0.8299999833 and 0.8100000024, a margin
    of 1.999998 pp, and (d) fired on a run whose blocks add exactly the 2 pp it asks for
    (the margin was rounded to 1e-9 pp, which mends float64's rounding only)."""
    headline = float((torch.arange(500) < 415).float().mean())
    frozen = float((torch.arange(500) < 405).float().mean())
    assert 100 * (headline - frozen) < 2.0  # what float32 made of them
    d = evaluate_protocol(make_sg(), headline_acc=headline, frozen_acc=frozen).diagnostic("d")
    assert d.value == 2.0 and d.status == "passed"
    one_below = float((torch.arange(500) < 414).float().mean())  # 1.8 pp still fires
    assert evaluate_protocol(make_sg(), headline_acc=one_below,
                             frozen_acc=frozen).diagnostic("d").status == "fired"
