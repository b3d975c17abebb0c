"""The per-Linear feedback rules (fa-linear, usf, brsf, frsf, kp) and DRTP: each rule's
defining identity on tiny float64 networks, and weight alignment in the per-epoch record."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.diagnostics.epoch import epoch_diagnostics
from creditaudit.errors import ModelContractError
from creditaudit.methods import bp_state_gradients, build_rule, rule_class
from creditaudit.models import ResidualMLP, ResidualNet, ViTMini
from creditaudit.testing import CLASSES, make_rule, tiny_batch, tiny_model

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


@pytest.mark.parametrize("arch", ["resmlp", "vit"])
def test_fa_linear_with_b_equal_w_is_backprop(arch):
    model, (x, y) = (tiny_model(), tiny_batch()) if arch == "resmlp" else (tiny_vit(),
                                                                         vit_batch())
    rule = build_rule(model, MethodConfig(name="fa-linear"), n_classes=CLASSES, seed=0)
    with_feedback(rule, rule.weights())
    for a, g in zip(rule.credits(x, y), bp_state_gradients(model, x, y), strict=True):
        assert rel_error(a, g) < TOL
    want = bp_gradients(model, x, y)
    got = gradients_after_step(rule, x, y)
    for name, grad in want.items():
        assert rel_error(got[name], grad) < TOL, name


def test_fa_linear_with_random_b_is_not_backprop():
    rule = make_rule(rule_class("fa-linear"))
    x, y = tiny_batch()
    credits = rule.credits(x, y)
    reference = bp_state_gradients(rule.model, x, y)
    assert all(rel_error(a, g) > 1e-2 for a, g in zip(credits, reference))


def test_fa_linear_with_zero_feedback_trains_only_the_head():
    rule = make_rule(rule_class("fa-linear"))
    with_feedback(rule, [torch.zeros_like(w) for w in rule.weights()])
    x, y = tiny_batch()
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
def test_usf_feedback_has_the_weights_signs_and_one_magnitude_per_layer():
    rule = make_rule(rule_class("usf"), feedback_scale=2.0)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=0.05)
    for step in range(2):
        for b, w in zip(rule.feedback_matrices(), rule.weights(), strict=True):
            assert torch.equal(torch.sign(b), torch.sign(w))
            assert torch.allclose(b.abs(), torch.full_like(b, 2.0 / w.shape[0] ** 0.5),
                                  rtol=0, atol=1e-15)
        rule.train_step(*tiny_batch(seed=step), optimizer)


def test_usf_credit_is_fa_linear_with_the_usf_matrices():
    usf = make_rule(rule_class("usf"))
    fa = make_rule(rule_class("fa-linear"))
    with_feedback(fa, usf.feedback_matrices())
    x, y = tiny_batch()
    for a, b in zip(usf.credits(x, y), fa.credits(x, y), strict=True):
        assert torch.equal(a, b)


def test_frsf_keeps_its_magnitudes_and_follows_the_signs_of_w():
    rule = make_rule(rule_class("frsf"))
    magnitudes = [m.clone() for m in rule.feedback]
    assert all(bool((m >= 0).all()) for m in magnitudes)
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=5.0)  # big: signs flip
    signs = [torch.sign(w.detach()).clone() for w in rule.weights()]
    for step in range(3):
        rule.train_step(*tiny_batch(seed=step), optimizer)
    flipped = sum(int((torch.sign(w.detach()) != s).sum()) for w, s in zip(rule.weights(), signs))
    assert flipped > 0
    for b, m, w in zip(rule.feedback_matrices(), magnitudes, rule.weights(), strict=True):
        assert torch.equal(b, m * torch.sign(w.detach()))


def test_brsf_draws_new_magnitudes_every_step_from_its_own_generator():
    rule = make_rule(rule_class("brsf"))
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.1)
    x, y = tiny_batch()
    seen = [[m.clone() for m in rule.magnitudes]]
    for step in range(2):
        rng = torch.get_rng_state()
        rule.train_step(*tiny_batch(seed=step), optimizer)
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
def test_kp_starts_from_the_fa_linear_feedback_of_the_same_seed():
    kp = make_rule(rule_class("kp"))
    fa = make_rule(rule_class("fa-linear"))
    assert all(torch.equal(a, b) for a, b in zip(kp.feedback, fa.feedback, strict=True))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_kp_gap_between_b_and_w_shrinks_by_one_minus_lr_wd_per_adamw_step(weight_decay):
    lr = 0.05
    rule = make_rule(rule_class("kp"), trainable_blocks=2)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=lr,
                                  weight_decay=weight_decay)
    names = [name for name, _ in rule.layers]
    gaps0 = [b - w.detach() for b, w in zip(rule.feedback, rule.weights())]
    frozen_b = rule.feedback[names.index("blocks.0.w1")].clone()
    steps = 4
    for step in range(steps):
        assert rule.train_step(*tiny_batch(seed=step), optimizer).finite
    factor = (1.0 - lr * weight_decay) ** steps
    for name, b, w, gap0 in zip(names, rule.feedback, rule.weights(), gaps0, strict=True):
        gap = b - w.detach()
        if name.startswith("blocks.0."):
            assert torch.equal(gap, gap0), name  # frozen block: neither W nor B moves
        else:
            assert rel_error(gap, gap0 * factor) < 1e-12, name
    assert torch.equal(rule.feedback[names.index("blocks.0.w1")], frozen_b)
    trained = names.index("blocks.2.w1")
    assert not torch.equal(rule.feedback[trained], gaps0[trained] + rule.weights()[trained])


def test_kp_with_b_equal_w_trains_exactly_like_backprop():
    kp = make_rule(rule_class("kp"))
    bp = make_rule(rule_class("bp"))
    with_feedback(kp, kp.weights())
    kp_opt = torch.optim.AdamW(kp.trainable_parameters(), lr=0.01, weight_decay=0.05)
    bp_opt = torch.optim.AdamW(bp.trainable_parameters(), lr=0.01, weight_decay=0.05)
    for step in range(3):
        batch = tiny_batch(seed=step)
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
def test_weight_alignment_angles_and_norm_ratios():
    rule = make_rule(rule_class("fa-linear"))
    with_feedback(rule, [-2.0 * w for w in rule.weights()])
    alignment = rule.weight_alignment()
    assert alignment["layers"] == [name for name, _ in rule.layers]
    assert all(abs(a - 180.0) < 1e-6 for a in alignment["angle"])
    assert all(abs(r - 2.0) < 1e-12 for r in alignment["norm_ratio"])
    with_feedback(rule, rule.weights())
    assert all(a < 1e-6 for a in rule.weight_alignment()["angle"])
    b = rule.weights()[1].detach()
    orthogonal = torch.zeros_like(b)
    orthogonal[0, 0] = b[0, 1]
    orthogonal[0, 1] = -b[0, 0]
    with_feedback(rule, [orthogonal if i == 1 else w for i, w in enumerate(rule.weights())])
    assert abs(rule.weight_alignment()["angle"][1] - 90.0) < 1e-9


def test_random_feedback_is_about_orthogonal_at_init():
    torch.manual_seed(0)
    model = ResidualMLP(64, 128, 10, 2)
    angles = build_rule(model, MethodConfig(name="fa-linear"), n_classes=10,
                        seed=0).weight_alignment()["angle"]
    assert all(80.0 < a < 100.0 for a in angles)


@pytest.mark.parametrize("method", PER_LINEAR)
def test_epoch_record_holds_the_weight_alignment(method):
    rule = make_rule(rule_class(method))
    x, y = tiny_batch()
    fields, _ = epoch_diagnostics(rule, x, y)
    n = len(rule.layers)
    assert fields["feedback_layers"] == [name for name, _ in rule.layers]
    assert len(fields["feedback_angle"]) == len(fields["feedback_norm_ratio"]) == n
    assert all(math.isfinite(v) for v in fields["feedback_angle"])


@pytest.mark.parametrize("method", ["bp", "fa", "dfa", "drtp"])
def test_rules_without_per_layer_feedback_record_no_alignment(method):
    fields, _ = epoch_diagnostics(make_rule(rule_class(method)), *tiny_batch())
    assert "feedback_angle" not in fields and "feedback_layers" not in fields


# --- the model contract ---------------------------------------------------------------------
class ConvNet(ResidualNet):
    """A residual net whose blocks are convolutions (not supported by per-Linear rules)."""

    def __init__(self) -> None:
        super().__init__()
        self.d, self.n_classes = 4, CLASSES
        self.embed = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.ModuleList([nn.Conv2d(4, 4, 3, padding=1)])
        self.head = nn.Linear(4, CLASSES)

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h.mean(dim=(2, 3)))


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
    with pytest.raises(ModelContractError, match="Conv2d"):
        build_rule(ConvNet(), MethodConfig(name=method), n_classes=CLASSES, seed=0)
    rule = build_rule(FunctionalNet(), MethodConfig(name=method), n_classes=CLASSES, seed=0)
    with pytest.raises(ModelContractError, match="blocks.0.lin"):
        rule.credits(torch.randn(2, 3), torch.tensor([0, 1]))
