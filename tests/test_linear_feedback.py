"""The per-layer feedback rules (fa-linear, usf, brsf, frsf, kp) and DRTP: each rule's
defining identity on tiny float64 networks — Linear layers and convolutions — and weight
alignment in the per-epoch record."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.errors import ModelContractError
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.methods import bp_state_gradients, build_rule, rule_class
from creditaudit.methods.linear_feedback import backward_fan_in, replaced_backward
from creditaudit.models import ConvMixer, ResidualMLP, ResidualNet, ViTMini
from creditaudit.records import EpochEntry
from creditaudit.testing import CLASSES, IMAGE, make_rule, tiny_batch, tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
PER_LINEAR = ("fa-linear", "usf", "brsf", "frsf", "kp")
TOL = 1e-12


def rel_error(a: Tensor, b: Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def gradients_after_step(rule, x, y) -> dict[str, Tensor]:
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    assert rule.train_step(x, y, optimizer).finite
    return {n: p.grad.detach().clone() for n, p in rule.model.named_parameters()}


def bp_gradients(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def with_feedback(rule, matrices: list[Tensor]) -> None:
    """Give fa-linear (or kp) these B matrices."""
    rule.feedback = [b.detach().clone() for b in matrices]


# --- fa-linear ------------------------------------------------------------------------------
def tiny_vit() -> ViTMini:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ViTMini(n_classes=CLASSES, d=8, n_blocks=2, heads=2, mlp_ratio=2, patch=16,
                        w2_std=0.1)
    return model.to(F64)


def vit_batch() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(2)
    return (torch.randn(3, 3, 32, 32, generator=gen, dtype=F64),
            torch.randint(0, CLASSES, (3,), generator=gen))


def assert_b_equal_w_is_backprop(model, x, y) -> tuple[dict, dict]:
    """fa-linear with B = W on ``model``: BP's credits, and BP's parameter gradients after a
    step; returns (the step's gradients, BP's)."""
    rule = build_rule(model, MethodConfig(name="fa-linear"), n_classes=CLASSES, seed=0)
    with_feedback(rule, rule.weights())
    for a, g in zip(rule.credits(x, y), bp_state_gradients(model, x, y), strict=True):
        assert rel_error(a, g) < TOL
    want = bp_gradients(model, x, y)
    got = gradients_after_step(rule, x, y)
    for name, grad in want.items():
        assert rel_error(got[name], grad) < TOL, name
    return got, want


@pytest.mark.parametrize("arch", ["resmlp", "vit"])
def test_fa_linear_with_b_equal_w_is_backprop(arch):
    model, (x, y) = (tiny_model(), tiny_batch()) if arch == "resmlp" else (tiny_vit(),
                                                                         vit_batch())
    assert_b_equal_w_is_backprop(model, x, y)


def test_fa_linear_with_random_b_is_not_backprop():
    rule = make_rule(rule_class("fa-linear"))
    x, y = tiny_batch()
    credits = rule.credits(x, y)
    reference = bp_state_gradients(rule.model, x, y)
    assert all(rel_error(a, g) > 1e-2 for a, g in zip(credits, reference))


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_fa_linear_with_zero_feedback_trains_only_the_head(arch):
    rule = make_rule(rule_class("fa-linear"), arch=arch)
    with_feedback(rule, [torch.zeros_like(w) for w in rule.weights()])
    x, y = tiny_batch(arch=arch)
    want = bp_gradients(rule.model, x, y)
    for name, grad in gradients_after_step(rule, x, y).items():
        if name.startswith("out_head."):
            assert rel_error(grad, want[name]) < TOL, name  # its own weight gradient is exact
        else:
            assert not bool(grad.abs().max() > 0), f"{name} got a gradient through B = 0"


def test_fa_linear_changes_only_the_signal_passed_down_a_linear():
    """B = 0 in one layer, B = W elsewhere: the layer's own weight gradient stays exact; what
    sits below it in the same branch (its LayerNorm) gets nothing; the skip stays exact."""
    rule = make_rule(rule_class("fa-linear"))
    names = [name for name, _ in rule.layers]
    cut = names.index("blocks.1.w1")
    matrices = [torch.zeros_like(w) if i == cut else w for i, w in enumerate(rule.weights())]
    with_feedback(rule, matrices)
    x, y = tiny_batch()
    want = bp_gradients(rule.model, x, y)
    got = gradients_after_step(rule, x, y)
    for name in ("blocks.1.w1.weight", "blocks.1.w2.weight", "blocks.2.w1.weight",
                 "out_head.weight"):
        assert rel_error(got[name], want[name]) < TOL, name
    assert not bool(got["blocks.1.ln.weight"].abs().max() > 0)
    assert not bool(got["blocks.1.ln.bias"].abs().max() > 0)
    # Below block 1 the exact skip still carries the gradient of everything above it.
    assert bool(got["blocks.0.w2.weight"].abs().max() > 0)
    assert bool(got["embed.weight"].abs().max() > 0)


def test_fa_linear_feedback_is_drawn_once_with_the_fan_in_of_the_backward_map():
    rule = build_rule(tiny_model(dtype=torch.float32), MethodConfig(name="fa-linear"),
                      n_classes=CLASSES, seed=5)
    assert [tuple(b.shape) for b in rule.feedback] == [tuple(w.shape) for w in rule.weights()]
    twin = build_rule(tiny_model(dtype=torch.float32), MethodConfig(name="fa-linear"),
                      n_classes=CLASSES, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(rule.feedback, twin.feedback))
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-2)
    start = [b.clone() for b in rule.feedback]
    rule.train_step(*tiny_batch(dtype=torch.float32), optimizer)
    assert all(torch.equal(a, b) for a, b in zip(rule.feedback, start))  # never trained


def test_feedback_is_not_correlated_with_the_initial_weights():
    """The feedback generator and the model share the run seed; the first B must not be
    drawn from the same stream as the embedding's initial weights (with the run seed itself
    as the generator's seed the cosine was ≈ −0.34 for every rule)."""
    for method in ("fa", "dfa", "drtp", "fa-linear", "kp", "frsf", "brsf"):
        cosines = []
        for seed in (0, 42, 123):
            torch.manual_seed(seed)
            model = ResidualMLP(256, 32, 10, 1)
            rule = build_rule(model, MethodConfig(name=method), n_classes=10, seed=seed)
            w = model.embed.weight.detach().flatten().double()
            if method in ("frsf", "brsf"):  # B ∘ sign(W) agrees with W by design; the
                # random part is |M|: compare it with |W|, both centred
                m = (rule.feedback if method == "frsf" else rule.magnitudes)[0]
                b = m.flatten().double() - m.double().mean()
                w = w.abs() - w.abs().mean()
            elif method in ("fa", "dfa", "drtp"):
                b = rule.feedback[0].flatten().double()
            else:
                b = rule.feedback_matrices()[0].flatten().double()
            n = min(b.numel(), w.numel())
            b, w = b[:n], w[:n]
            # independent draws: cosine ~ N(0, 1/n); 4 standard deviations
            cosines.append(float(b @ w / (b.norm() * w.norm())) * n ** 0.5 / 4)
        assert max(abs(c) for c in cosines) < 1.0, (method, cosines)


# --- usf, frsf, brsf ------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_usf_feedback_has_the_weights_signs_and_one_magnitude_per_layer(arch):
    rule = make_rule(rule_class("usf"), feedback_scale=2.0, arch=arch)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=0.05)
    for step in range(2):
        for (_, layer), b, w in zip(rule.layers, rule.feedback_matrices(), rule.weights(),
                                    strict=True):
            assert torch.equal(torch.sign(b), torch.sign(w))
            fan = backward_fan_in(layer)
            assert torch.allclose(b.abs(), torch.full_like(b, 2.0 / fan ** 0.5),
                                  rtol=0, atol=1e-15)
        rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer)


def test_usf_credit_is_fa_linear_with_the_usf_matrices():
    usf = make_rule(rule_class("usf"))
    fa = make_rule(rule_class("fa-linear"))
    with_feedback(fa, usf.feedback_matrices())
    x, y = tiny_batch()
    for a, b in zip(usf.credits(x, y), fa.credits(x, y), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_frsf_keeps_its_magnitudes_and_follows_the_signs_of_w(arch):
    rule = make_rule(rule_class("frsf"), arch=arch)
    magnitudes = [m.clone() for m in rule.feedback]
    assert all(bool((m >= 0).all()) for m in magnitudes)
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=5.0)  # big: signs flip
    signs = [torch.sign(w.detach()).clone() for w in rule.weights()]
    for step in range(3):
        rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer)
    flipped = sum(int((torch.sign(w.detach()) != s).sum()) for w, s in zip(rule.weights(), signs))
    assert flipped > 0
    for b, m, w in zip(rule.feedback_matrices(), magnitudes, rule.weights(), strict=True):
        assert torch.equal(b, m * torch.sign(w.detach()))


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_brsf_draws_new_magnitudes_every_step_from_its_own_generator(arch):
    rule = make_rule(rule_class("brsf"), arch=arch)
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.1)
    x, y = tiny_batch(arch=arch)
    seen = [[m.clone() for m in rule.magnitudes]]
    for step in range(2):
        rng = torch.get_rng_state()
        rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer)
        assert torch.equal(torch.get_rng_state(), rng)  # never the global RNG
        seen.append([m.clone() for m in rule.magnitudes])
        # The credit (and the record) use the magnitudes of the step just taken.
        for b, m, w in zip(rule.feedback_matrices(), seen[-1], rule.weights()):
            assert torch.equal(b, m * torch.sign(w.detach()))
        assert not torch.equal(seen[-1][0], seen[-2][0])
    assert all(bool((m >= 0).all()) for m in seen[-1])
    credits = rule.credits(x, y)
    assert all(torch.equal(a, b) for a, b in zip(credits, rule.credits(x, y)))


# --- kp -------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_kp_starts_from_the_fa_linear_feedback_of_the_same_seed(arch):
    kp = make_rule(rule_class("kp"), arch=arch)
    fa = make_rule(rule_class("fa-linear"), arch=arch)
    assert all(torch.equal(a, b) for a, b in zip(kp.feedback, fa.feedback, strict=True))


@pytest.mark.parametrize("arch,first", [("resmlp", "w1"), ("convmixer", "dw")])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_kp_gap_between_b_and_w_shrinks_by_one_minus_lr_wd_per_adamw_step(weight_decay, arch,
                                                                          first):
    lr = 0.05
    rule = make_rule(rule_class("kp"), trainable_blocks=2, arch=arch)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=lr,
                                  weight_decay=weight_decay)
    names = [name for name, _ in rule.layers]
    gaps0 = [b - w.detach() for b, w in zip(rule.feedback, rule.weights())]
    frozen_b = rule.feedback[names.index(f"blocks.0.{first}")].clone()
    steps = 4
    for step in range(steps):
        assert rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer).finite
    factor = (1.0 - lr * weight_decay) ** steps
    for name, b, w, gap0 in zip(names, rule.feedback, rule.weights(), gaps0, strict=True):
        gap = b - w.detach()
        if name.startswith("blocks.0."):
            assert torch.equal(gap, gap0), name  # frozen block: neither W nor B moves
        else:
            assert rel_error(gap, gap0 * factor) < 1e-12, name
    assert torch.equal(rule.feedback[names.index(f"blocks.0.{first}")], frozen_b)
    trained = names.index(f"blocks.2.{first}")
    assert not torch.equal(rule.feedback[trained], gaps0[trained] + rule.weights()[trained])


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_kp_with_b_equal_w_trains_exactly_like_backprop(arch):
    kp = make_rule(rule_class("kp"), arch=arch)
    bp = make_rule(rule_class("bp"), arch=arch)
    with_feedback(kp, kp.weights())
    kp_opt = torch.optim.AdamW(kp.trainable_parameters(), lr=0.01, weight_decay=0.05)
    bp_opt = torch.optim.AdamW(bp.trainable_parameters(), lr=0.01, weight_decay=0.05)
    for step in range(3):
        batch = tiny_batch(seed=step, arch=arch)
        kp.train_step(*batch, kp_opt)
        bp.train_step(*batch, bp_opt)
    for (name, a), b in zip(kp.model.named_parameters(), bp.model.parameters()):
        assert rel_error(a.detach(), b.detach()) < 1e-12, name
    for b, w in zip(kp.feedback, kp.weights()):
        assert rel_error(b, w.detach()) < 1e-12


# --- drtp -----------------------------------------------------------------------------------
def test_drtp_credit_is_the_projected_target_whatever_the_output():
    rule = make_rule(rule_class("drtp"))
    x, y = tiny_batch()
    onehot = F.one_hot(y, CLASSES).to(F64)
    credits = rule.credits(x, y)
    for a, b in zip(credits, rule.feedback, strict=True):
        assert torch.equal(a, onehot @ b.to(F64))
    with torch.no_grad():  # another network, other outputs: the same credit
        for p in rule.model.parameters():
            p.mul_(-3.0).add_(0.1)
    assert all(torch.equal(a, b) for a, b in zip(credits, rule.credits(x, y)))


def test_drtp_is_dfa_without_the_output_part_of_the_error():
    drtp, dfa = make_rule(rule_class("drtp")), make_rule(rule_class("dfa"))
    assert all(torch.equal(a, b) for a, b in zip(drtp.feedback, dfa.feedback, strict=True))
    x, y = tiny_batch()
    probabilities = torch.softmax(dfa.model(x), dim=1)
    for a_dfa, a_drtp, b in zip(dfa.credits(x, y), drtp.credits(x, y), dfa.feedback):
        # DFA: (p − onehot)·B; DRTP: onehot·B.
        assert rel_error(a_dfa + a_drtp, probabilities @ b.to(F64)) < 1e-12


# --- normalisation switch -------------------------------------------------------------------
@pytest.mark.parametrize("method", ["dfa", "drtp", "fa"])
def test_raw_credit_without_normalisation(method):
    """With method.normalise_credit=false a block's update is that of ⟨f_l, a_{l+1}⟩/B."""
    rule = make_rule(rule_class(method), normalise_credit=False)
    x, y = tiny_batch()
    credits = rule.credits(x, y)
    got = gradients_after_step(rule, x, y)
    model = rule.model
    states, _ = model.forward_states(x)
    block = model.blocks[1]
    block.zero_grad(set_to_none=True)
    (block(states[1].detach()) * credits[2]).sum().div(x.shape[0]).backward()
    for name, p in block.named_parameters():
        assert rel_error(got[f"blocks.1.{name}"], p.grad) < 1e-12, name
        # ... and differs from the normalised update in size
    normalised = gradients_after_step(make_rule(rule_class(method)), x, y)
    assert rel_error(normalised["blocks.1.w2.weight"], got["blocks.1.w2.weight"]) > 1e-3


# --- weight alignment -----------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_weight_alignment_angles_and_norm_ratios(arch):
    rule = make_rule(rule_class("fa-linear"), arch=arch)
    with_feedback(rule, [-2.0 * w for w in rule.weights()])
    alignment = rule.weight_alignment()
    assert alignment["layers"] == [name for name, _ in rule.layers]
    assert all(abs(a - 180.0) < 1e-6 for a in alignment["angle"])
    assert all(abs(r - 2.0) < 1e-12 for r in alignment["norm_ratio"])
    with_feedback(rule, rule.weights())
    assert all(a < 1e-6 for a in rule.weight_alignment()["angle"])
    b = rule.weights()[1].detach().flatten()
    orthogonal = torch.zeros_like(b)
    orthogonal[0] = b[1]
    orthogonal[1] = -b[0]
    orthogonal = orthogonal.view_as(rule.weights()[1])
    with_feedback(rule, [orthogonal if i == 1 else w for i, w in enumerate(rule.weights())])
    assert abs(rule.weight_alignment()["angle"][1] - 90.0) < 1e-9


def test_random_feedback_is_about_orthogonal_at_init():
    torch.manual_seed(0)
    model = ResidualMLP(64, 128, 10, 2)
    angles = build_rule(model, MethodConfig(name="fa-linear"), n_classes=10,
                        seed=0).weight_alignment()["angle"]
    assert all(80.0 < a < 100.0 for a in angles)


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
@pytest.mark.parametrize("method", PER_LINEAR)
def test_epoch_record_holds_the_weight_alignment(method, arch):
    rule = make_rule(rule_class(method), arch=arch)
    x, y = tiny_batch(arch=arch)
    measures, _ = epoch_diagnostics(rule, x, y)
    n = len(rule.layers)
    assert measures.feedback_layers == [name for name, _ in rule.layers]
    assert measures.feedback_angle is not None and measures.feedback_norm_ratio is not None
    assert len(measures.feedback_angle) == len(measures.feedback_norm_ratio) == n
    assert all(math.isfinite(v) for v in measures.feedback_angle)


@pytest.mark.parametrize("method", ["bp", "fa", "dfa", "drtp"])
def test_rules_without_per_layer_feedback_record_no_alignment(method):
    measures, _ = epoch_diagnostics(make_rule(rule_class(method)), *tiny_batch())
    assert measures.feedback_angle is None and measures.feedback_layers is None
    fields = EpochEntry(measures=measures).to_dict()
    assert "feedback_angle" not in fields and "feedback_layers" not in fields


# --- convolutions ---------------------------------------------------------------------------
def convmixer(residual: bool = True) -> ConvMixer:
    """The tiny float64 ConvMixer of creditaudit.testing, with or without its skips."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ConvMixer(CLASSES, 8, 3, patch=2, kernel=3, image_shape=IMAGE, w2_std=0.1,
                          residual=residual)
    return model.to(F64)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_fa_linear_with_b_equal_w_is_backprop_on_convmixer(mode):
    """Train mode included: there BatchNorm mixes the samples of the batch."""
    model = tiny_model(arch="convmixer").train(mode == "train")
    x, y = tiny_batch(arch="convmixer")
    got, want = assert_b_equal_w_is_backprop(model, x, y)
    assert got.keys() == want.keys()


def conv_cut(rule, cut: set[str]) -> None:
    """B = 0 for the layers named in ``cut``, B = W for the others."""
    with_feedback(rule, [torch.zeros_like(w) if name in cut else w
                         for (name, _), w in zip(rule.layers, rule.weights(), strict=True)])


def test_zero_conv_feedback_without_skips_trains_only_what_sits_above_the_last_conv():
    """No skips, B = 0 in every convolution, B = W in the head: the last pointwise conv, the
    terminal LN and the head get backprop's gradients; everything below gets exactly zero."""
    model = convmixer(residual=False)
    rule = build_rule(model, MethodConfig(name="fa-linear"), n_classes=CLASSES, seed=0)
    conv_cut(rule, {name for name, layer in rule.layers if isinstance(layer, nn.Conv2d)})
    x, y = tiny_batch(arch="convmixer")
    want = bp_gradients(model, x, y)
    for name, grad in gradients_after_step(rule, x, y).items():
        if name.startswith(("out_", "blocks.2.pw.")):
            assert rel_error(grad, want[name]) < TOL, name
        else:
            assert not bool(grad.abs().max() > 0), f"{name} got a gradient through B = 0"


def test_zero_conv_feedback_leaves_only_the_skip_path():
    """With skips and B = 0 in every convolution, no branch passes a signal down: every
    credit is backprop's g_L, and nothing inside a branch below its pointwise conv learns."""
    rule = make_rule(rule_class("fa-linear"), arch="convmixer")
    conv_cut(rule, {name for name, layer in rule.layers if isinstance(layer, nn.Conv2d)})
    x, y = tiny_batch(arch="convmixer")
    g_top = bp_state_gradients(rule.model, x, y)[-1]
    for a in rule.credits(x, y):
        assert rel_error(a, g_top) < TOL
    want = bp_gradients(rule.model, x, y)
    got = gradients_after_step(rule, x, y)
    for name, grad in got.items():
        if name.startswith("blocks.") and (".dw." in name or ".bn." in name):
            assert not bool(grad.abs().max() > 0), f"{name} got a gradient through B = 0"
        elif name.startswith(("out_", "blocks.2.pw.")):
            assert rel_error(grad, want[name]) < TOL, name
        else:  # the lower pointwise convs and the embedding: reached through the skips
            assert bool(grad.abs().max() > 0), name


@pytest.mark.parametrize("cut,exact,silent", [
    ("blocks.1.pw", ("blocks.1.pw.", "blocks.2.", "out_"), ("blocks.1.bn.", "blocks.1.dw.")),
    ("blocks.1.dw", ("blocks.1.", "blocks.2.", "out_"), ()),
])
def test_fa_linear_changes_only_the_signal_passed_down_a_conv(cut, exact, silent):
    """B = 0 in one convolution, B = W elsewhere: what sits above it — its own weight and
    bias included — gets backprop's gradient, what sits below it in its branch gets nothing,
    and below its block the exact skip still carries a (no longer exact) gradient."""
    rule = make_rule(rule_class("fa-linear"), arch="convmixer")
    conv_cut(rule, {cut})
    x, y = tiny_batch(arch="convmixer")
    want = bp_gradients(rule.model, x, y)
    got = gradients_after_step(rule, x, y)
    for name, grad in got.items():
        if name.startswith(exact):
            assert rel_error(grad, want[name]) < TOL, name
        elif name.startswith(silent):
            assert not bool(grad.abs().max() > 0), f"{name} got a gradient through B = 0"
        else:
            assert name.startswith(("blocks.0.", "embed.")), name
            assert rel_error(grad, want[name]) > 1e-6, name


CONVS = {  # (layer, input side)
    "depthwise": (lambda: nn.Conv2d(4, 4, 3, groups=4, padding="same"), 8),
    "pointwise": (lambda: nn.Conv2d(4, 6, 1), 8),
    "strided, last row unread": (lambda: nn.Conv2d(4, 6, 3, stride=2), 8),
    "dilated, grouped": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2,
                                           groups=2), 9),
    "even kernel, same": (lambda: nn.Conv2d(4, 6, (4, 3), padding="same", bias=False), 7),
    "reflect padding": (lambda: nn.Conv2d(4, 4, 3, padding=(1, 2), padding_mode="reflect",
                                          groups=4), 8),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv_backward_is_the_adjoint_of_the_convolution_with_b(case):
    """⟨δy, conv(x; B)⟩ = ⟨δx, x⟩ for the input gradient δx the replaced backward returns;
    the forward pass and the weight and bias gradients stay nn.Conv2d's own."""
    make, side = CONVS[case]
    gen = torch.Generator().manual_seed(0)
    layer = make().to(F64)
    x = torch.randn(3, 4, side, side, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(layer.weight.shape, generator=gen, dtype=F64)
    params = [p for p in (layer.weight, layer.bias) if p is not None]
    with replaced_backward([("conv", layer)], [b]):
        y = layer(x)
    exact_y = layer(x)
    assert rel_error(y, exact_y) < TOL
    dy = torch.randn(y.shape, generator=gen, dtype=F64)
    dx, *grads = torch.autograd.grad(y, [x, *params], dy)
    exact_dx, *exact_grads = torch.autograd.grad(exact_y, [x, *params], dy)
    for grad, exact in zip(grads, exact_grads, strict=True):
        assert rel_error(grad, exact) < TOL
    twin = copy.deepcopy(layer)  # x ↦ conv(x; B): the layer's own padding, B, no bias
    twin.weight, twin.bias = nn.Parameter(b), None
    with torch.no_grad():
        forward = dy * twin(x)
        assert abs(float(forward.sum() - (dx * x).sum())) < 1e-13 * float(forward.abs().sum())
    assert rel_error(dx, exact_dx) > 0.1  # B is not W: the signal passed down did change


def test_feedback_is_scaled_by_the_fan_in_of_the_backward_map():
    """n = (out/groups)·kh·kw: a random or sign B passes a signal down at about its RMS,
    depthwise convolutions included (torch's fan_out, out·kh·kw, would shrink it √d-fold)."""
    d = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ConvMixer(CLASSES, d, 1, patch=1, kernel=3, image_shape=(3, 16, 16)).to(F64)
    fans = {"blocks.0.dw": 9, "blocks.0.pw": d, "out_head": CLASSES}
    assert backward_fan_in(nn.Conv2d(4, 6, (3, 2), groups=2)) == 18
    for method in ("fa-linear", "usf"):
        rule = build_rule(model, MethodConfig(name=method), n_classes=CLASSES, seed=0)
        layers = dict(rule.layers)
        assert {name: backward_fan_in(layer) for name, layer in layers.items()} == fans
        for name in ("blocks.0.dw", "blocks.0.pw"):
            h = torch.randn(4, d, 16, 16, generator=torch.Generator().manual_seed(2),
                            dtype=F64, requires_grad=True)
            b = rule.feedback_matrices()[list(layers).index(name)]
            with replaced_backward([(name, layers[name])], [b]):
                y = layers[name](h)
            dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
            (dh,) = torch.autograd.grad(y, h, dy)
            ratio = float(dh.square().mean().sqrt() / dy.square().mean().sqrt())
            # 'same' padding: border pixels sum fewer terms (k=3 on 16×16: RMS ≈ 0.94)
            assert 0.85 < ratio < 1.1, (method, name, ratio)


@pytest.mark.parametrize("arch", ["resmlp", "vit", "convmixer"])
def test_bf16_autocast_with_b_equal_w_is_backprops_bf16_step(arch):
    """Under CPU bf16 autocast the replaced backward casts as autograd's does: with B = W
    every parameter gradient (fp32) is backprop's under the same autocast, bit for bit."""
    grads = []
    for method in ("bp", "fa-linear"):
        rule = make_rule(rule_class(method), arch=arch, dtype=torch.float32)
        if method == "fa-linear":
            with_feedback(rule, rule.weights())
        rule.set_precision("bf16", "cpu")
        optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
        assert rule.train_step(*tiny_batch(arch=arch, dtype=torch.float32), optimizer).finite
        grads.append({n: p.grad for n, p in rule.model.named_parameters()})
    for name, grad in grads[0].items():
        assert grads[1][name].dtype == torch.float32, name
        assert torch.equal(grads[1][name], grad), name


# --- the model contract ---------------------------------------------------------------------
class ConvNet(ResidualNet):
    """A residual net whose blocks are ``layer`` (by default a Conv2d, which the rules patch;
    Conv1d, Conv3d and transposed convolutions they refuse)."""

    def __init__(self, layer: nn.Module | None = None) -> None:
        super().__init__()
        self.d, self.n_classes = 4, CLASSES
        self.embed = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.ModuleList([layer or nn.Conv2d(4, 4, 3, padding=1)])
        self.head = nn.Linear(4, CLASSES)

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h.mean(dim=tuple(range(2, h.dim()))))


class FunctionalBlock(nn.Module):
    """Uses its Linear's weight without calling the Linear (as nn.MultiheadAttention does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, h: Tensor) -> Tensor:
        return F.linear(h, self.lin.weight, self.lin.bias)


class FunctionalNet(ResidualNet):
    def __init__(self) -> None:
        super().__init__()
        self.d, self.n_classes = 4, CLASSES
        self.embed = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([FunctionalBlock()])
        self.head = nn.Linear(4, CLASSES)

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)


@pytest.mark.parametrize("method", PER_LINEAR)
def test_models_the_rules_cannot_handle_are_one_line_errors(method):
    for layer in (nn.Conv1d(4, 4, 3), nn.Conv3d(4, 4, 3), nn.ConvTranspose2d(4, 4, 3),
                  nn.Bilinear(4, 4, 4), nn.MultiheadAttention(4, 2), nn.LSTM(4, 4),
                  nn.GRUCell(4, 4)):
        name = type(layer).__name__
        with pytest.raises(ModelContractError, match=f"ConvNet.blocks.0 is a {name};") as err:
            build_rule(ConvNet(layer), MethodConfig(name=method), n_classes=CLASSES, seed=0)
        assert "\n" not in str(err.value)
    rule = build_rule(FunctionalNet(), MethodConfig(name=method), n_classes=CLASSES, seed=0)
    with pytest.raises(ModelContractError, match="blocks.0.lin"):
        rule.credits(torch.randn(2, 3), torch.tensor([0, 1]))


@pytest.mark.parametrize("method", PER_LINEAR)
def test_every_linear_and_every_conv2d_outside_the_embedding_gets_feedback(method):
    """The embedding's convolutions read the data and keep their exact backward (so ViT-Mini
    draws exactly the feedback it drew before convolutions were supported)."""
    names = {arch: [name for name, _ in make_rule(rule_class(method), arch=arch).layers]
             for arch in ("resmlp", "vit", "convmixer")}
    assert names["resmlp"][0] == "embed" and names["resmlp"][-1] == "out_head"
    assert "embed.proj" not in names["vit"] and "blocks.0.qkv" in names["vit"]
    assert names["convmixer"] == ["blocks.0.dw", "blocks.0.pw", "blocks.1.dw", "blocks.1.pw",
                                  "blocks.2.dw", "blocks.2.pw", "out_head"]
    rule = build_rule(ConvNet(), MethodConfig(name=method), n_classes=CLASSES, seed=0)
    assert [name for name, _ in rule.layers] == ["blocks.0", "head"]


def test_fa_linear_trains_a_convmixer_end_to_end_and_records_conv_alignment(tmp_path):
    """The CLI on image-shaped synthetic data: the run completes and every epoch's record
    holds the angle and norm ratio of each depthwise and pointwise convolution's B."""
    from creditaudit.cli import main
    from creditaudit.records.files import load_records

    assert main(["train", "--method", "fa-linear", "--arch", "convmixer", "--dataset",
                 "synthetic", "--set", "data.in_dim=3072", "--set", "model.patch=8",
                 "--set", "model.kernel=3", "--epochs", "1", "--set", "data.n_train=512",
                 "--set", "data.n_test=1280", "--set", "model.d=16", "--set",
                 "model.n_blocks=2", "--set", "diagnostics.eval_samples=64", "--set",
                 "diagnostics.rho_samples=16", "--set", "diagnostics.rho_directions=2",
                 "--set", "diagnostics.null_draws=2", "--out", str(tmp_path), "-q"]) == 0
    (_, record), = load_records(tmp_path)[0]
    assert record.status == "completed"
    entry = record.log[-1].measures
    assert entry is not None and entry.feedback_angle and entry.feedback_norm_ratio
    convs = [name for name in entry.feedback_layers or [] if name.endswith((".dw", ".pw"))]
    assert len(convs) == 2 * record.config.model.n_blocks
    for angle, ratio in zip(entry.feedback_angle, entry.feedback_norm_ratio, strict=True):
        assert 0.0 < angle < 180.0 and ratio > 0.0
