"""Credit-quality metrics: Γ aggregations, nudging, drift, ρ, fresh-B null, credit_quality."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.data import make_teacher_student
from creditaudit.errors import ConfigError
from creditaudit.measures import null as null_module
from creditaudit.measures import perturbation
from creditaudit.measures.alignment import gamma_aggregations, layer_cosine_table
from creditaudit.measures.drift import feature_drift
from creditaudit.measures.nudging import nudging_deltas, nudging_table
from creditaudit.measures.null import fresh_feedback_null
from creditaudit.measures.perturbation import (
    SAMPLE_CHUNK,
    perturbation_rho,
    rho_controls,
    rho_per_layer,
    rho_table,
)
from creditaudit.measures.quality import credit_quality, full_credits
from creditaudit.methods import bp_state_gradients, build_rule
from creditaudit.models import ResidualMLP
from creditaudit.models.contract import ResidualNet

R2 = 1 / math.sqrt(2)


# --- Γ aggregations by hand ----------------------------------------------------------------
def _two_layer_example() -> tuple[list[Tensor], list[Tensor]]:
    credits = [torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
               torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]])]
    grads = [torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]),
             torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])]
    return credits, grads


def test_gamma_aggregations_by_hand():
    credits, grads = _two_layer_example()
    # cos per (sample, layer): layer 0 → [1, 0, 1/√2]; layer 1 → [1/√2, -1, 1].
    layers_then_samples = ((1 + R2) / 2 + (0 - 1) / 2 + (R2 + 1) / 2) / 3
    samples_then_layers = ((1 + 0 + R2) / 3 + (R2 - 1 + 1) / 3) / 2
    # Concatenations: s0 a=[1,0,1,1] g=[1,0,1,0]; s1 a=[0,1,2,0] g=[1,0,-1,0];
    # s2 a=[1,1,0,3] g=[1,0,0,1].
    pooled = (2 / math.sqrt(6) - 2 / math.sqrt(10) + 4 / math.sqrt(22)) / 3
    gamma = gamma_aggregations(credits, grads)
    assert gamma["layers_then_samples"] == pytest.approx(layers_then_samples)
    assert gamma["samples_then_layers"] == pytest.approx(samples_then_layers)
    assert gamma["pooled"] == pytest.approx(pooled)
    assert gamma["deep_only"] == pytest.approx((R2 - 1 + 1) / 3)
    # With every cosine defined the two orders of means agree; pooled and deep-only differ.
    assert len({round(v, 6) for v in gamma.values()}) == 3


def test_gamma_skips_undefined_cosines():
    credits, grads = _two_layer_example()
    grads[1][1] = 0.0  # sample 1 has no reference direction at layer 1
    gamma = gamma_aggregations(credits, grads)
    assert gamma["layers_then_samples"] == pytest.approx(((1 + R2) / 2 + 0 + (R2 + 1) / 2) / 3)
    # …and now the order of the means matters.
    assert gamma["samples_then_layers"] == pytest.approx(((1 + R2) / 3 + (R2 + 1) / 2) / 2)
    assert gamma["deep_only"] == pytest.approx((R2 + 1) / 2)


def test_layer_cosine_table_marks_invalid_references():
    credits, grads = _two_layer_example()
    grads[1] = grads[1] * 1e-9  # cosine unchanged, reference below the floor
    table = layer_cosine_table(credits, grads, floor=1e-7)
    assert [row["valid_reference"] for row in table] == [True, False]
    assert table[1]["cos"] == pytest.approx((R2 - 1 + 1) / 3)
    assert table[1]["g_norm"] == pytest.approx(1e-9)
    assert table[0]["g_norm"] == pytest.approx(1.0)


def test_layer_cosine_table_says_how_many_samples_the_cosine_covers():
    """A zero credit has no direction: the cosine averages over the rest, and `defined`
    says over how many."""
    credits, grads = _two_layer_example()
    credits[1][0] = 0.0
    table = layer_cosine_table(credits, grads, floor=1e-7)
    assert table[0]["defined"] == 1.0
    assert table[1]["defined"] == pytest.approx(2 / 3)
    assert table[1]["cos"] == pytest.approx(0.0, abs=1e-12)  # (−1 + 1) / 2: sample 0 left out


# --- nudging on a model computable by hand -------------------------------------------------
class ZeroBranch(nn.Module):
    def forward(self, h: Tensor) -> Tensor:
        return torch.zeros_like(h)


class LinearReadoutNet(ResidualNet):
    """h_0 = x, blocks add nothing, logits = W h + b: forward_from(l, h) = W h + b."""

    def __init__(self, d: int, n_classes: int) -> None:
        super().__init__()
        self.d, self.n_classes = d, n_classes
        self.embed = nn.Identity()
        self.blocks = nn.ModuleList([ZeroBranch(), ZeroBranch()])
        self.head = nn.Linear(d, n_classes)

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)


def _mean_ce_by_hand(z: Tensor, y: Tensor) -> float:
    z = z.double()
    log_norm = torch.log(torch.exp(z - z.max(dim=1, keepdim=True).values).sum(dim=1)) + \
        z.max(dim=1).values
    return float((log_norm - z[torch.arange(len(y)), y]).mean())


def test_nudging_delta_by_hand_on_a_linear_readout():
    torch.manual_seed(0)
    model = LinearReadoutNet(4, 3)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    a = torch.randn(6, 4)
    credits = [a * 0, a * 5.0, -a]
    deltas = nudging_deltas(model, x, y, credits, etas=(0.01, 0.5))
    w, b = model.head.weight.detach().double(), model.head.bias.detach().double()
    xd = x.double()
    before = _mean_ce_by_hand(xd @ w.T + b, y)
    for eta in (0.01, 0.5):
        expected = []
        for credit in credits[1:]:
            c = credit.double()
            a_hat = c / c.pow(2).mean(dim=1, keepdim=True).sqrt()  # unit RMS, no eps
            expected.append(_mean_ce_by_hand((xd - eta * a_hat) @ w.T + b, y) - before)
        assert deltas[repr(eta)] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert set(deltas) == {"0.01", "0.5"}


def test_nudging_is_scale_free_and_a_zero_credit_does_not_move():
    torch.manual_seed(0)
    model = LinearReadoutNet(4, 3).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    a = torch.randn(6, 4, dtype=torch.float64)
    zero_row = a.clone()
    zero_row[2] = 0.0
    base = nudging_deltas(model, x, y, [a, a, zero_row], etas=(0.1,))["0.1"]
    for scale in (1e-12, 1e-200, 3.0, 1e150):
        scaled = nudging_deltas(model, x, y, [a, a * scale, zero_row * scale],
                                etas=(0.1,))["0.1"]
        assert scaled == pytest.approx(base, rel=1e-12, abs=1e-15), scale
    # Sample 2 does not move: Δ equals the Δ of the other samples' moves alone.
    moved = nudging_deltas(model, x, y, [a, a, zero_row], etas=(0.1,))["0.1"][1]
    assert moved == pytest.approx(base[1])
    assert nudging_deltas(model, x, y, [a, a * 0, a * 0], etas=(0.1,))["0.1"] == [0.0, 0.0]


def test_nudging_below_the_precisions_resolution_is_not_measurable_not_zero():
    """A float64 readout scaled by 1e-150: every step moves the mean loss by far less than
    a float64 step of it, and Δ read 0.0 — a measured "no change" — for the credit and its
    BP control alike. Where even the BP step is not resolved every credit's Δ is NaN; a
    zero credit (which truly does not move) beside a resolved BP step still reads 0.0."""
    from creditaudit.measures.perturbation import BP_CREDIT

    torch.manual_seed(0)
    model = ResidualMLP(4, 4, 3, 2, out_ln=False).double().eval()  # no LN to rescale it
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,))
    a = torch.randn(6, 4, dtype=torch.float64)
    credits, zero = [a, a, a], [a * 0] * 3
    rule, bp, still = nudging_table(model, x, y, [credits, BP_CREDIT, zero], (0.1,))
    assert all(math.isfinite(v) and v != 0 for v in rule["0.1"])
    assert all(v < 0 for v in bp["0.1"]) and still["0.1"] == [0.0, 0.0]
    with torch.no_grad():
        model.out_head.weight.mul_(1e-150)
        model.out_head.bias.zero_()
    assert nudging_deltas(model, x, y, credits, etas=(0.1,))["0.1"] == [0.0, 0.0]  # alone
    for deltas in nudging_table(model, x, y, [credits, BP_CREDIT, zero], (0.1,)):
        assert all(math.isnan(v) for v in deltas["0.1"])


def test_nudging_is_the_same_for_any_chunking_of_the_evaluation_set():
    # A rule's credits follow the batch-mean convention: computed in chunks of B they scale
    # with 1/B per sample. The nudging value must not depend on B.
    from creditaudit.measures.quality import full_credits

    rule = _dfa_rule()
    rule.model.double()
    x, y = torch.randn(384, 16, dtype=torch.float64), torch.randint(0, 10, (384,))
    values = []
    for chunk in (64, 128, 384):
        credits = [c / chunk for c in full_credits(rule, x, y, chunk=chunk)]
        values.append(nudging_deltas(rule.model, x, y, credits, etas=(0.01,))["0.01"])
    for other in values[1:]:
        assert other == pytest.approx(values[0], rel=1e-12, abs=1e-18)


def test_nudging_along_the_gradient_lowers_the_loss():
    torch.manual_seed(1)
    model = ResidualMLP(8, 16, 4, 3)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    grads = bp_state_gradients(model, x, y)
    assert all(v < 0 for v in nudging_deltas(model, x, y, grads)["0.01"])
    flipped = nudging_deltas(model, x, y, [-g for g in grads])["0.01"]
    assert all(v > 0 for v in flipped)


def test_feature_drift_by_hand():
    initial = {"w": torch.tensor([3.0, 4.0]), "bias": torch.zeros(2)}
    final = {"w": torch.tensor([3.0, 5.0]), "bias": torch.tensor([0.0, 2.0])}
    drift = feature_drift(initial, final)
    assert drift["w"] == pytest.approx(1 / 5)
    assert drift["bias"] == pytest.approx(2.0)  # zero init: absolute change


# --- perturbation correlation ρ -------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_tiny():
    """A tiny terminal-LN ResidualMLP after 40 BP steps on the teacher–student task."""
    x, y, test_x, test_y = make_teacher_student(n_train=2048, n_test=1024, in_dim=16,
                                                alpha=1.0, seed=5, teacher_width=32)
    torch.manual_seed(5)
    model = ResidualMLP(16, 24, 10, 2)
    for step in range(40):  # plain SGD steps
        batch = slice((step * 128) % 2048, (step * 128) % 2048 + 128)
        grads = torch.autograd.grad(F.cross_entropy(model(x[batch]), y[batch]),
                                    list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= 0.2 * g
    model.eval()
    return model, test_x, test_y


def test_rho_positive_and_negative_controls(trained_tiny):
    model, x, y = trained_tiny
    grads = bp_state_gradients(model, x, y)  # fp32 BP credit from the caller's model
    table = rho_table(model, x, y, grads, seed=3)  # n = 1024 samples × M = 32 directions
    assert len(table["rho"]) == 3
    assert min(table["rho"]) >= 0.99 and min(table["bp"]) >= 0.99
    assert max(abs(v) for v in table["random"]) < 0.02
    assert table["measurable"] == [True, True, True]
    noise = [torch.randn(g.shape, generator=torch.Generator().manual_seed(11)) for g in grads]
    assert abs(perturbation_rho(model, x, y, noise, 1)) < 0.02
    controls = rho_controls(model, x, y, layers=[2], n_directions=4, n_samples=256, seed=3)
    assert controls["bp"][0] >= 0.99 and abs(controls["random"][0]) < 0.05


def test_rho_of_a_credit_zero_at_every_sample_is_not_measurable(trained_tiny):
    """A layer whose credit is exactly zero (a block a rule leaves untrained) has ρ NaN — a
    zero credit predicts no loss change — while its BP control passes; the record said
    rho_measurable True there, so nothing said why ρ was NaN. It is now not measurable, and
    the other layers' ρ and every control are what they were."""
    model, x, y = trained_tiny
    grads = bp_state_gradients(model, x, y)
    zeroed = [torch.zeros_like(g) if layer == 1 else g for layer, g in enumerate(grads)]
    table = rho_table(model, x, y, zeroed, n_directions=4, n_samples=64, seed=3)
    full = rho_table(model, x, y, grads, n_directions=4, n_samples=64, seed=3)
    assert math.isnan(table["rho"][1]) and table["bp"][1] >= 0.99
    assert table["measurable"] == [True, False, True]
    assert table["rho"][0::2] == full["rho"][0::2] and table["bp"] == full["bp"]
    assert rho_table(model, x, y, None, n_directions=4, n_samples=64,
                     seed=3)["measurable"] == [True, True, True]  # controls alone


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_rho_and_its_error_are_scale_free_at_float64_extremes(scale):
    # a float64 credit of 1e200 scored ρ = 0.0 (its sums of squares overflowed), one of
    # 1e-200 NaN ("flat"): ρ promises any scale
    gen = torch.Generator().manual_seed(0)
    predicted = torch.randn(16, 8, generator=gen, dtype=torch.float64)
    true = predicted + torch.randn(16, 8, generator=gen, dtype=torch.float64)
    rho = perturbation.pearson(predicted, true)
    assert 0.5 < rho < 0.9
    assert perturbation.pearson(predicted * scale, true) == pytest.approx(rho, rel=1e-12)
    assert perturbation.pearson(predicted * scale, true * scale) == pytest.approx(rho,
                                                                                  rel=1e-12)
    se = perturbation.jackknife_se(predicted, true)
    assert perturbation.jackknife_se(predicted * scale, true) == pytest.approx(se, rel=1e-9)

def test_rho_batches_all_directions_in_one_forward_and_matches_a_loop(trained_tiny):
    model, x, y = trained_tiny
    n, m, layer, eps = 32, 5, 1, 1e-3
    # A half-aligned credit (ρ well inside (0, 1)), so a mis-paired direction shows.
    grads = [g + torch.randn(g.shape, generator=torch.Generator().manual_seed(1)) * g.std()
             for g in bp_state_gradients(model, x[:n], y[:n])]
    calls = []
    original = ResidualMLP.forward_from

    def counting(self, layer_, h):
        calls.append(h.shape[0])
        return original(self, layer_, h)

    ResidualMLP.forward_from = counting
    try:
        rho = perturbation_rho(model, x, y, grads, layer, n_directions=m, n_samples=n,
                               generator=torch.Generator().manual_seed(9))
    finally:
        ResidualMLP.forward_from = original
    assert n <= SAMPLE_CHUNK and calls == [n, n * m]  # base + ONE pass for all directions
    # The same quantity by an explicit loop over samples and directions.
    work = copy.deepcopy(model).double()
    # Drawn in float32, used in float64; each sample's m·24 = 120 entries as whole blocks of
    # torch's 16 normals (128, the last 8 dropped).
    v = torch.randn((n, 128), generator=torch.Generator().manual_seed(9), dtype=torch.float32)
    v = v[:, :m * 24].reshape(n * m, 24).double()
    v = v / v.norm(dim=1, keepdim=True)
    pred, true = [], []
    with torch.no_grad():
        h = work.forward_states(x[:n].double())[0][layer]
        for i in range(n):
            base = F.cross_entropy(work.forward_from(layer, h[i:i + 1]), y[i:i + 1])
            for j in range(m):
                vij = v[i * m + j]
                moved = work.forward_from(layer, h[i:i + 1] + eps * vij)
                true.append(float(F.cross_entropy(moved, y[i:i + 1]) - base))
                pred.append(eps * float(grads[layer][i].double() @ vij))
    expected = float(torch.corrcoef(torch.tensor([pred, true], dtype=torch.float64))[0, 1])
    assert 0.2 < expected < 0.95
    assert rho == pytest.approx(expected, abs=1e-9)


def test_rho_table_shares_directions_across_layers_without_changing_any_layers_rho(
        trained_tiny):
    """One draw of directions per chunk serves every layer: each layer's ρ is what the
    single-layer function gives with the same generator."""
    model, x, y = trained_tiny
    grads = bp_state_gradients(model, x[:40], y[:40])
    table = rho_table(model, x, y, grads, n_directions=6, n_samples=40, controls=False,
                      generator=torch.Generator().manual_seed(3))
    for layer, value in zip(table["layers"], table["rho"]):
        alone = perturbation_rho(model, x, y, grads, layer, n_directions=6, n_samples=40,
                                 generator=torch.Generator().manual_seed(3))
        assert value == pytest.approx(alone, abs=1e-12)


def test_rho_does_not_depend_on_how_the_samples_are_chunked(trained_tiny, monkeypatch):
    """The sample chunk only bounds memory: directions come from one generator stream in
    sample order, so 1-sample chunks and one chunk of every sample give the same ρ (for
    any M: a sample's M·D entries are drawn as whole blocks of torch's 16 normals;
    tests/test_measure_invariances.py draws M·D that are not multiples of 16)."""
    model, x, y = trained_tiny
    grads = bp_state_gradients(model, x[:48], y[:48])

    def table(max_elements: int) -> dict:
        monkeypatch.setattr(perturbation, "MAX_ELEMENTS", max_elements)
        return rho_table(model, x, y, grads, n_directions=8, n_samples=48, seed=4)

    whole, single = table(1 << 23), table(1)  # 48 samples in one chunk / 1 per chunk
    for key in ("rho", "bp", "random"):
        assert whole[key] == pytest.approx(single[key], abs=1e-12)


@pytest.mark.parametrize("method", ["bp", "fa"])
def test_a_batch_mean_credit_keeps_one_scale_across_a_short_last_chunk(trained_tiny, method):
    """Credits on the batch-mean scale, taken in chunks of 512, must not put a short last
    chunk's samples on another scale: ρ pools samples, so BP's own credit over 600 samples
    (chunks of 512 and 88) read ρ ≈ 0.71 against its control's 1.0."""
    model, x, y = trained_tiny
    rule = build_rule(copy.deepcopy(model), MethodConfig(name=method), n_classes=10, seed=0)
    x, y = x[:600], y[:600]
    chunked = full_credits(rule, x, y, chunk=512)
    tail = rule.credits(x[88:], y[88:])  # the last 88 samples inside a batch of 512
    for got, want in zip(chunked, tail):
        torch.testing.assert_close(got[512:], want[-88:], rtol=1e-4, atol=1e-9)
    quality = credit_quality(rule, x, y, rho_directions=8, null_draws=2)
    if method == "bp":
        assert quality["perturbation_rho"] == pytest.approx(quality["rho_controls"]["bp"],
                                                            abs=1e-6)


def test_rho_float64_survives_an_exploded_model_where_fp32_fails(trained_tiny):
    model, x, y = trained_tiny
    exploded = copy.deepcopy(model)
    with torch.no_grad():
        exploded.embed.weight.mul_(1e5)
        exploded.embed.bias.mul_(1e5)
    kwargs = {"layers": [0, 2], "n_directions": 8, "n_samples": 256, "seed": 0}
    fp64 = rho_controls(exploded, x, y, dtype=torch.float64, **kwargs)["bp"]
    fp32 = rho_controls(exploded, x, y, dtype=torch.float32, **kwargs)["bp"]
    assert min(fp64) > 0.99
    assert all(not (v > 0.5) for v in fp32)  # ~0 or NaN: the loss change is below fp32
    table = rho_table(exploded, x, y, None, dtype=torch.float32, **kwargs)
    assert table["measurable"] == [False, False]
    # The caller's model is never converted.
    assert exploded.embed.weight.dtype == torch.float32


def test_rho_per_layer_lists_every_state(trained_tiny):
    model, x, y = trained_tiny
    grads = bp_state_gradients(model, x, y)
    values = rho_per_layer(model, x, y, grads, n_directions=4, n_samples=128)
    assert len(values) == 3 and min(values) > 0.98


# --- fresh-B null --------------------------------------------------------------------------
def _dfa_rule(seed: int = 0):
    torch.manual_seed(seed)
    model = ResidualMLP(16, 24, 10, 3)
    return build_rule(model, MethodConfig(name="dfa"), n_classes=10, seed=seed)


def test_fresh_feedback_null_is_centred_on_zero():
    rule = _dfa_rule()
    x, y, _, _ = make_teacher_student(n_train=512, n_test=1, in_dim=16, alpha=1.0, seed=2,
                                      teacher_width=32)
    training = rule.feedback
    result = fresh_feedback_null(rule, x, y, n=20, seed=4)
    assert rule.feedback is training
    assert len(result["values"]) == 20 and result["std"] > 0
    assert abs(result["mean"]) < 3 * result["std"] / math.sqrt(20) + 0.01
    assert result["z"] == pytest.approx((result["training_value"] - result["mean"])
                                        / result["std"])


def test_fresh_feedback_null_restores_feedback_on_error(monkeypatch):
    rule = _dfa_rule()
    training = rule.feedback
    calls = []

    original = null_module.summary_vectors

    def failing(state):
        calls.append(1)
        if len(calls) == 9:  # the first state of the third draw (4 states per draw)
            raise RuntimeError("boom")
        return original(state)

    monkeypatch.setattr(null_module, "summary_vectors", failing)
    with pytest.raises(RuntimeError, match="boom"):
        fresh_feedback_null(rule, torch.randn(8, 16), torch.randint(0, 10, (8,)), n=5)
    assert rule.feedback is training


def test_fresh_feedback_null_refuses_rules_without_feedback():
    torch.manual_seed(0)
    rule = build_rule(ResidualMLP(16, 24, 10, 2), MethodConfig(name="bp"), n_classes=10,
                      seed=0)
    with pytest.raises(ConfigError, match="no fixed random feedback"):
        fresh_feedback_null(rule, torch.randn(8, 16), torch.randint(0, 10, (8,)))


# --- the end-of-run block --------------------------------------------------------------------
def test_credit_quality_block_has_every_metric_with_controls():
    rule = _dfa_rule()
    x, y = torch.randn(256, 16), torch.randint(0, 10, (256,))
    out = credit_quality(rule, x, y, rho_samples=64, rho_directions=4, null_draws=3)
    n_states = 4
    for key in ("bp_cosine", "perturbation_rho", "rho_measurable"):
        assert len(out[key]) == n_states, key
    assert set(out["gamma"]) == {"layers_then_samples", "samples_then_layers", "pooled",
                                 "deep_only"}
    assert out["cosine_controls"]["bp"] == pytest.approx([1.0] * n_states)
    assert set(out["rho_controls"]) == {"bp", "random"}
    assert all(isinstance(v, bool) for v in out["rho_measurable"])
    assert set(out["nudging"]) == {"0.01", "0.1"} and len(out["nudging"]["0.01"]) == 3
    assert set(out["nudging_controls"]) == {"bp", "random"}
    assert out["fresh_b_null"]["n"] == 3
    bp_rule = build_rule(rule.model, MethodConfig(name="bp"), n_classes=10, seed=0)
    bp_out = credit_quality(bp_rule, x, y, rho_samples=64, rho_directions=4)
    assert "fresh_b_null" not in bp_out
    assert bp_out["bp_cosine"] == pytest.approx([1.0] * n_states)
    assert min(bp_out["perturbation_rho"]) > 0.99


def test_bp_nudging_control_is_steepest_even_on_an_exploded_model():
    # First order: among steps of equal RMS the gradient direction lowers the loss most,
    # so the BP control must beat the rule at every layer — also when the gradients are
    # ~1e-10 per entry and an absolute eps in the normalisation could swallow the step.
    rule = _dfa_rule()
    with torch.no_grad():
        rule.model.embed.weight.mul_(1e5)
        rule.model.embed.bias.mul_(1e5)
    x, y = torch.randn(256, 16), torch.randint(0, 10, (256,))
    out = credit_quality(rule, x, y, rho_samples=32, rho_directions=2, null_draws=2)
    for eta, deltas in out["nudging"].items():
        bp = out["nudging_controls"]["bp"][eta]
        assert all(b < 0 for b in bp)
        assert all(b <= d for b, d in zip(bp, deltas)), (eta, bp, deltas)
