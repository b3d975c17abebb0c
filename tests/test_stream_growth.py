"""Diagnostic (a) sees the whole network: growth before the first named state (an
embedding, a stem, the first encoder layer of an adapted model) is measured as ‖h_0‖
against its value at initialisation, and fires (a) like a block's growth does; healthy
runs, whose ‖h_0‖ moves a few times at most, do not fire."""

from __future__ import annotations

import math

import pytest
import torch

from creditaudit import RunConfig, adapt, diagnose
from creditaudit.audit import audit_run
from creditaudit.errors import ConfigError
from creditaudit.protocol import Evidence, ReferenceValidity, ResidualStreamScale, embed_growth
from creditaudit.protocol.diagnostics import GrowthOptions, ReferenceOptions
from creditaudit.report import render
from creditaudit.run.trainer import train
from creditaudit.testing.zoo import TransformerClassifier
from plugin_support import GUESTS

pytestmark = pytest.mark.usefixtures("single_thread")

OPTIONS = GrowthOptions()
STEM = "creditaudit_guests.sweep_factories:GrowingStem"
TINY = {"data.n_train": 256, "data.n_test": 256, "data.in_dim": 8, "optim.epochs": 2,
        "optim.batch_size": 64, "diagnostics.eval_samples": 256,
        "diagnostics.end_of_run": False, "run.progress": False}


def judge(hidden: list[float], initial: list[float] | None):
    return ResidualStreamScale(OPTIONS).evaluate(Evidence(hidden, [1e-3] * len(hidden),
                                                          initial_hidden_norms=initial))


# --- the statistic -------------------------------------------------------------------------
def test_growth_before_h0_fires_where_every_block_ratio_is_flat():
    """‖h_0‖ 1.8 → 299, every block ×1.1 (the shape of DFA on the transformer of
    docs/results.md §3): the block ratios pass, the growth since initialisation fires."""
    hidden = [299.0, 330.0, 360.0, 395.0]
    blocks_only = judge(hidden, None)
    assert blocks_only.status == "passed" and blocks_only.details["embed_growth"] is None
    assert "segment before h_0 is not judged" in blocks_only.reason
    result = judge(hidden, [1.8, 2.0, 2.2, 2.4])
    assert result.status == "fired"
    assert result.value == pytest.approx(299.0 / 1.8)
    assert result.details["embed_growth"] == pytest.approx(299.0 / 1.8)
    assert result.details["block_growth"] == pytest.approx([330 / 299, 360 / 330, 395 / 360])
    assert "‖h_0‖ grew 166× since initialisation (before the first state)" in result.reason


def test_the_statistic_is_the_largest_growth_anywhere():
    # a block grows more than h_0 did: the block names the value, h_0's growth is a detail
    result = judge([2.0, 400.0], [1.0, 1.2])
    assert result.status == "fired" and result.value == pytest.approx(200.0)
    assert result.details["block"] == 0 and result.details["embed_growth"] == 2.0
    assert "block 0 grows the residual stream 200×" in result.reason
    healthy = judge([19.2, 19.0, 19.5, 20.4, 23.0], [8.78, 8.8, 8.9, 9.0, 9.1])
    assert healthy.status == "passed"
    assert healthy.value == pytest.approx(19.2 / 8.78)  # h_0's growth beats every block's
    assert "‖h_0‖ 2.19× its initial value" in healthy.reason


@pytest.mark.parametrize("initial", [[0.0, 1.0], [math.nan, 1.0], [], None])
def test_no_initial_scale_leaves_the_segment_unjudged(initial):
    assert embed_growth([5.0, 6.0], initial) is None
    assert judge([5.0, 6.0], initial).value == pytest.approx(1.2)


def test_one_state_is_judged_by_its_growth_since_initialisation():
    assert judge([80.0], [1.0]).status == "fired"
    assert judge([80.0], None).status == "not evaluated"


def test_b_names_ln_cancellation_when_the_stream_grew_before_h0():
    """A model that does not say whether it ends in a LayerNorm: (b) blames a grown stream
    when it grew anywhere, the segment before h_0 included."""
    evidence = Evidence([300.0, 310.0], [1e-3, 1e-9], g_L_zero_fraction=0.0,
                        g_L_nonzero_median=1e-9, terminal_ln=None)
    validity = ReferenceValidity(ReferenceOptions())
    assert validity.evaluate(evidence).details["cause"] == "gradient below floor"
    evidence.initial_hidden_norms = [1.0, 1.1]
    result = validity.evaluate(evidence)
    assert result.details["stream_grew"] and "LN cancellation" in result.details["cause"]


# --- a live network: diagnose() --------------------------------------------------------------
def test_diagnose_sees_an_embedding_that_grew(single_thread):
    """A transformer of PyTorch's own layers whose embedding (before the first named state)
    is scaled ×5000: the pre-LN blocks add bounded branches, so no block ratio moves and (a)
    passed before; with the initial norms it fires."""
    torch.manual_seed(0)
    net = TransformerClassifier(image_shape=(1, 1, 40), patch=(1, 4), d=16, depth=2, heads=2,
                                mlp_ratio=2)
    model = adapt(net, ["encoder.layers.0", "encoder.layers.1"], input_shape=(40,))
    x, y = torch.randn(256, 40), torch.randint(0, 10, (256,))
    initial = diagnose(model, x, y).hidden_norms
    with torch.no_grad():
        for parameter in (net.patch_embed.weight, net.patch_embed.bias, net.cls_token, net.pos):
            parameter.mul_(5000.0)
    grown = diagnose(model, x, y)
    assert grown.diagnostic("a").status == "passed"  # blind without the initial norms
    report = diagnose(model, x, y, initial_hidden_norms=initial)
    a = report.diagnostic("a")
    assert a.status == "fired" and a.value > 50 and max(a.details["block_growth"]) < 2
    assert "(a)" in report.verdict_text
    assert "growth since initialisation > threshold" in render(report, "text")


@pytest.mark.parametrize("bad", [[1.0, "x"], "12", [-1.0], []])
def test_diagnose_refuses_initial_norms_that_are_not_norms(bad):
    torch.manual_seed(0)
    net = TransformerClassifier(image_shape=(1, 1, 40), patch=(1, 4), d=8, depth=1, heads=2,
                                mlp_ratio=2)
    model = adapt(net, ["patch_embed", "encoder.layers.0"], input_shape=(40,))
    with pytest.raises(ConfigError, match="initial_hidden_norms must be a list of median"):
        diagnose(model, torch.randn(8, 40), torch.randint(0, 10, (8,)),
                 initial_hidden_norms=bad)


# --- trained runs: records and audit -----------------------------------------------------------
@pytest.fixture
def guests(tmp_path, monkeypatch):
    site = GUESTS.install(tmp_path / "site", only=[])
    monkeypatch.syspath_prepend(str(site))
    yield site
    GUESTS.forget()


def stem_run(out, growth: float, method: str = "bp") -> RunConfig:
    return RunConfig().replace(**{
        **TINY, "method.name": method, "model.arch": "module", "model.factory": STEM,
        "model.args": {"in_dim": 8, "width": 16, "growth": growth},
        "model.states": ["blocks.0", "blocks.1"], "model.readout": ["norm", "head"],
        "run.out_dir": str(out)})


@pytest.mark.parametrize("method", ["bp", "dfa"])
def test_a_run_whose_stem_grows_fires_a_and_its_audit_agrees(guests, tmp_path, method):
    """The stem doubles its scale each step (8 steps: ×256) while the blocks' ratios stay
    near 1: the record's protocol fires (a) from the growth since epoch 0, and auditing
    the checkpoint says the same."""
    result = train(stem_run(tmp_path / "runs", 2.0, method))
    record = result.record
    entry, first = record.log[-1].measures, record.log[0].measures
    assert entry is not None and first is not None
    blocks = entry.max_block_growth
    assert blocks is not None and blocks < 2
    a = record.protocol.report["diagnostics"]["a"]
    assert a["status"] == "fired", a["reason"]
    assert a["details"]["embed_growth"] == pytest.approx(
        entry.hidden_norms[0] / first.hidden_norms[0])
    assert a["details"]["embed_growth"] > 50
    assert record.first_fired()["a"] is not None
    audited = audit_run(result.run_dir, metrics=False).diagnostic("a")
    assert audited.status == "fired"
    assert audited.value == pytest.approx(a["value"], rel=1e-5)


def test_healthy_runs_do_not_fire_a(guests, tmp_path):
    """The stem's twin that does not grow, and a tiny BP ResidualMLP: (a) passes, and the
    record says how far ‖h_0‖ moved (a few times at most)."""
    stem = train(stem_run(tmp_path / "runs", 1.0)).record
    resmlp = train(RunConfig().replace(**{**TINY, "model.d": 16, "model.n_blocks": 2,
                                           "run.out_dir": str(tmp_path / "runs")})).record
    for record in (stem, resmlp):
        a = record.protocol.report["diagnostics"]["a"]
        assert a["status"] == "passed", a["reason"]
        assert 0.2 < a["details"]["embed_growth"] < 5
