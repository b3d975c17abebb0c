"""Per-sample state gradients, norms, cosines and the small statistics built on them."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.deep_layers import deep_mean
from creditaudit.descriptions import max_block_growth
from creditaudit.measures.alignment import (
    ReferenceDirections,
    cosine_per_sample,
    layer_cosines,
    mean_cosine,
)
from creditaudit.measures.gradients import (
    REFERENCE_BATCH,
    median_norms,
    per_sample_norms,
    state_gradients,
    zero_gradient_stats,
)
from creditaudit.methods import build_rule
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.models import ResidualMLP, ViTMini
from creditaudit.run.results import epoch_record

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def mlp() -> ResidualMLP:
    torch.manual_seed(0)
    return ResidualMLP(in_dim=6, d=10, n_classes=4, n_blocks=3, w2_std=0.3).double()


def vit() -> ViTMini:
    torch.manual_seed(0)
    return ViTMini(n_classes=4, d=16, n_blocks=2, heads=2, mlp_ratio=2, w2_std=0.3).double()


def loop_reference(model, x, y):
    """One sample at a time: (1/128)·∂CE_i/∂h_l, CLS token for token states."""
    states_out, grads_out = [], []
    for i in range(x.shape[0]):
        states, logits = model.forward_states(x[i:i + 1])
        loss = F.cross_entropy(logits, y[i:i + 1])
        grads = torch.autograd.grad(loss, states)
        pick = (lambda t: t[0, 0]) if states[0].dim() == 3 else (lambda t: t[0])
        states_out.append([pick(h.detach()) for h in states])
        grads_out.append([pick(g) / 128 for g in grads])
    n_layers = len(states_out[0])
    return ([torch.stack([s[l] for s in states_out]) for l in range(n_layers)],
            [torch.stack([g[l] for g in grads_out]) for l in range(n_layers)])


@pytest.mark.parametrize("kind", ["mlp", "vit"])
def test_state_gradients_equal_one_sample_loop(kind):
    model = mlp() if kind == "mlp" else vit()
    gen = torch.Generator().manual_seed(1)
    shape = (7, 6) if kind == "mlp" else (5, 3, 32, 32)
    x = torch.randn(*shape, generator=gen, dtype=F64)
    y = torch.randint(0, 4, (shape[0],), generator=gen)
    sg = state_gradients(model.forward_states, x, y, chunk=3)  # chunks of 3, 3, 1 (or 3, 2)
    ref_states, ref_grads = loop_reference(model, x, y)
    assert sg.n_layers == model.n_blocks + 1
    assert sg.layout == ("vectors" if kind == "mlp" else "tokens")
    for l in range(sg.n_layers):
        assert sg.grads[l].shape == (shape[0], model.d)
        torch.testing.assert_close(sg.states[l], ref_states[l], rtol=1e-12, atol=1e-14)
        assert ref_grads[l].abs().max() > 1e-6
        torch.testing.assert_close(sg.grads[l], ref_grads[l], rtol=1e-10,
                                   atol=1e-12 * float(ref_grads[l].abs().max()))
    with torch.no_grad():
        logits = model(x)
    torch.testing.assert_close(sg.logits, logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(sg.losses, F.cross_entropy(logits, y, reduction="none"),
                               rtol=0, atol=1e-12)
    assert all(p.grad is None for p in model.parameters())


def test_state_gradients_scale_convention():
    """Per-sample grads are those of a batch-mean CE over 128, whatever the batch size."""
    assert REFERENCE_BATCH == 128
    model = mlp()
    gen = torch.Generator().manual_seed(2)
    for n in (128, 40):
        x = torch.randn(n, 6, generator=gen, dtype=F64)
        y = torch.randint(0, 4, (n,), generator=gen)
        sg = state_gradients(model.forward_states, x, y)
        for g_batch, g in zip(bp_state_gradients(model, x, y), sg.grads):
            torch.testing.assert_close(g, g_batch * n / 128, rtol=1e-12, atol=1e-18)


def test_median_norms_use_feature_axis():
    v = torch.tensor([[3.0, 4.0, 0.0, 0.0],
                      [1.0, 0.0, 0.0, 0.0],
                      [0.0, 0.0, 6.0, 8.0]])
    # per-sample L2 norms 5, 1, 10 → median 5; x.norm(-1) is the L-1 "norm" of everything
    assert median_norms([v]) == [5.0]
    assert float(v.norm(-1)) != 5.0
    v2 = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    assert float(v2.norm(-1)) != pytest.approx(math.sqrt(8))
    assert median_norms([v, v2]) == [5.0, pytest.approx(math.sqrt(8), rel=1e-15)]
    norms = per_sample_norms(v)
    assert norms.dtype == F64 and norms.tolist() == [5.0, 1.0, 10.0]


def test_median_norms_on_tiny_values_do_not_underflow():
    v = torch.tensor([[3e-30, 4e-30], [6e-30, 8e-30], [0.0, 1e-30]])
    assert median_norms([v])[0] == pytest.approx(5e-30, rel=1e-6)



@pytest.mark.parametrize("scale", [1e-170, 1e-300, 1e160])
def test_float64_norms_neither_underflow_nor_overflow(scale):
    # a float64 model's 1e-170 gradients squared underflow to 0: the norm read exactly 0,
    # and (b) named a saturated softmax (every sample's gradient "exactly zero")
    v = torch.tensor([[3.0, 4.0], [6.0, 8.0], [0.0, 1.0]], dtype=F64) * scale
    assert per_sample_norms(v).tolist() == pytest.approx([5 * scale, 10 * scale, scale],
                                                         rel=1e-15)
    assert median_norms([v])[0] == pytest.approx(5 * scale, rel=1e-15)
    assert zero_gradient_stats(v)[0] == 0.0
    edge = torch.tensor([[0.0, 0.0], [math.inf, 1.0], [math.nan, 1.0]], dtype=F64)
    assert per_sample_norms(edge)[:2].tolist() == [0.0, math.inf]
    assert math.isnan(per_sample_norms(edge)[2])

def test_float64_norms_in_range_keep_torchs_bits():
    # Rescaling every float64 row (to save the extreme ones) changed the last bit of ~40%
    # of ordinary norms — float64 models' recorded norms — and cost ~9× the time; only a
    # row whose norm may have under- or overflowed is rescaled.
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(200, 64, generator=gen, dtype=F64)
    v[3] *= 1e-170  # one extreme row beside them
    got = per_sample_norms(v)
    plain = torch.linalg.vector_norm(v, dim=-1)
    keep = torch.arange(200) != 3
    assert torch.equal(got[keep], plain[keep])
    assert plain[3] == 0 and got[3] == pytest.approx(float(
        torch.linalg.vector_norm(v[3] * 1e170)) * 1e-170, rel=1e-15)


@pytest.mark.parametrize("scale", [1e-10, 1e-200])
def test_cosine_per_sample_exact_on_tiny_vectors(scale):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 16, generator=gen, dtype=F64)
    b = a + 0.7 * torch.randn(6, 16, generator=gen, dtype=F64)
    if scale == 1e-10:
        a32, b32 = (scale * a).float(), (scale * b).float()
        a64, b64 = a32.double(), b32.double()
    else:  # float64 only: squares of 1e-200 underflow to 0
        a64, b64 = scale * a, scale * b
    # the exact cosine, by hand, on rescaled float64 copies (the cosine is scale-free)
    ua, ub = a64 / scale, b64 / scale
    exact = (ua * ub).sum(1) / (ua.pow(2).sum(1).sqrt() * ub.pow(2).sum(1).sqrt())
    assert exact.abs().min() > 0.1
    got = cosine_per_sample(a32, b32) if scale == 1e-10 else cosine_per_sample(a64, b64)
    assert got.dtype == F64
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-12)
    if scale == 1e-10:
        clamped = F.cosine_similarity(a32, b32, dim=1).double()
        assert (exact.abs() / clamped.abs().clamp_min(1e-300)).min() > 10


def test_cosine_zero_vector_is_nan_and_excluded():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [2.0, 0.0]], dtype=F64)
    g = torch.tensor([[1.0, 1.0], [1.0, 0.0], [-1.0, -1.0], [0.0, 0.0]], dtype=F64)
    cos = cosine_per_sample(a, g)
    assert cos[0].item() == pytest.approx(1 / math.sqrt(2), abs=1e-15)
    assert math.isnan(cos[1]) and math.isnan(cos[3])
    assert cos[2].item() == pytest.approx(-1.0, abs=1e-15)
    assert mean_cosine(a, g) == pytest.approx((1 / math.sqrt(2) - 1) / 2, abs=1e-15)
    assert math.isnan(mean_cosine(torch.zeros(3, 2), torch.ones(3, 2)))


def test_cosine_token_tensors_flatten():
    a = torch.randn(3, 5, 4, dtype=F64)
    g = torch.randn(3, 5, 4, dtype=F64)
    fa, fg = a.flatten(1), g.flatten(1)
    exact = (fa * fg).sum(1) / (fa.norm(dim=1) * fg.norm(dim=1))
    torch.testing.assert_close(cosine_per_sample(a, g), exact, rtol=0, atol=1e-14)


def test_reference_directions_score_like_layer_cosines():
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(50, 6, generator=g) * 1e-9, torch.randn(50, 6, generator=g)]
    grads[1][3] = 0.0  # no direction: left out of the mean
    credits = [torch.randn(50, 6, generator=g), grads[1] + torch.randn(50, 6, generator=g)]
    want = layer_cosines(credits, grads)
    assert ReferenceDirections(grads).cosines(credits) == pytest.approx(want, abs=1e-15)


def test_layer_cosines_and_deep_mean():
    g = [torch.randn(4, 3, dtype=F64) for _ in range(3)]
    credits = [g[0], -2.0 * g[1], torch.zeros(4, 3)]
    cos = layer_cosines(credits, g)
    assert cos[0] == pytest.approx(1.0, abs=1e-14)
    assert cos[1] == pytest.approx(-1.0, abs=1e-14)
    assert math.isnan(cos[2])
    assert deep_mean(cos) == pytest.approx(-1.0, abs=1e-14)


def test_deep_mean_ignores_layer_zero_and_nan():
    assert deep_mean([100.0, 1.0, float("nan"), 3.0]) == 2.0
    assert deep_mean([0.9, 0.1]) == 0.1
    assert math.isnan(deep_mean([0.5]))
    assert math.isnan(deep_mean([0.5, float("nan")]))


def test_zero_gradient_stats():
    grad = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0], [6.0, 8.0], [1.0, 0.0]])
    fraction, median = zero_gradient_stats(grad)
    assert fraction == pytest.approx(0.4)
    assert median == 5.0  # median of 5, 10, 1
    fraction, median = zero_gradient_stats(torch.zeros(4, 3))
    assert fraction == 1.0 and math.isnan(median)
    fraction, median = zero_gradient_stats(torch.tensor([[1e-45, 0.0], [0.0, 2e-45],
                                                         [3e-45, 0.0]]))
    assert fraction == 0.0 and median > 0  # subnormal but nonzero is not "exactly zero"


def test_max_block_growth():
    assert max_block_growth([1.0, 2.0, 10.0, 5.0]) == 5.0
    assert max_block_growth([4.0, 2.0, 1.0]) == 0.5
    assert max_block_growth([0.0, 1.0]) == float("inf")
    assert max_block_growth([3.0]) == 1.0
    assert max_block_growth([2.0, 0.0, 0.0]) == 1.0  # a stream that stays 0 does not grow


def test_epoch_diagnostics_bp_record():
    model = mlp()
    rule = build_rule(model, MethodConfig(name="bp"), n_classes=4, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(20, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 4, (20,), generator=gen)
    torch.manual_seed(9)
    expected_rng = torch.rand(2)
    torch.manual_seed(9)
    record, sg = epoch_record(rule, x, y)
    assert torch.equal(torch.rand(2), expected_rng)
    L = model.n_blocks
    assert len(record["hidden_norms"]) == len(record["bp_grad_norms_per_sample_med"]) == L + 1
    assert record["h_L_norm"] == record["hidden_norms"][-1]
    assert record["g_L_norm"] == record["bp_grad_norms_per_sample_med"][-1]
    assert record["g_2_norm"] == record["bp_grad_norms_per_sample_med"][2]
    assert record["hidden_norms"] == median_norms(sg.states)
    assert record["max_block_growth"] == max_block_growth(record["hidden_norms"])
    for c in record["cos_per_layer"]:
        assert c == pytest.approx(1.0, abs=1e-12)
    assert record["deep_cos"] == pytest.approx(1.0, abs=1e-12)
    assert record["g_L_zero_fraction"] == 0.0
    assert all(p.grad is None for p in model.parameters())
    assert record["cos_valid"] == [True] * (L + 1) and record["deep_cos_valid"] is True
    assert record["cos_defined"] == [1.0] * (L + 1)


def test_epoch_cosines_carry_their_validity():
    """A layer whose reference ‖g_l‖ is below the 1e-7 floor keeps its cosine, marked
    invalid; deep_cos_valid says whether any deep layer is."""
    model = mlp()
    with torch.no_grad():  # a grown stream: the terminal LN cancels it, g_l shrinks ∝ 1/‖h‖
        model.embed.weight.mul_(1e9)
        model.embed.bias.mul_(1e9)
    rule = build_rule(model, MethodConfig(name="dfa"), n_classes=4, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(20, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 4, (20,), generator=gen)
    record, _ = epoch_record(rule, x, y)
    grads = record["bp_grad_norms_per_sample_med"]
    assert max(grads) < 1e-7
    assert record["cos_valid"] == [False] * len(grads)
    assert record["deep_cos_valid"] is False
    assert all(isinstance(c, float) for c in record["cos_per_layer"])  # value kept beside


def test_epoch_cosines_say_how_many_samples_they_average_over():
    """A sample whose credit is exactly zero has no direction: the cosine is over the rest,
    and cos_defined says what share that is (an EP relaxation once returned confident
    samples to their free states with zero credit, and the per-epoch cosine hid it)."""
    model = mlp()
    rule = build_rule(model, MethodConfig(name="dfa"), n_classes=4, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(20, 6, generator=gen, dtype=F64)
    y = torch.randint(0, 4, (20,), generator=gen)
    full, _ = epoch_record(rule, x, y)
    keep = (torch.arange(20) % 4 != 0).to(F64)  # samples 0, 4, 8, … get zero credit
    credits = rule.credits
    rule.credits = lambda xs, ys: [a * keep[:xs.shape[0]].view(-1, 1) for a in credits(xs, ys)]
    record, sg = epoch_record(rule, x, y)
    L = model.n_blocks
    assert record["cos_defined"] == [0.75] * (L + 1)
    kept = keep.bool()
    for layer, cos in enumerate(record["cos_per_layer"]):
        want = cosine_per_sample(credits(x, y)[layer][kept], sg.grads[layer][kept]).mean()
        assert cos == pytest.approx(float(want), abs=1e-12)
    assert full["cos_defined"] == [1.0] * (L + 1)
