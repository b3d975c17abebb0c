"""Gradient-correctness suite for the credit rules (SPEC §4).

Every test checks an identity that a wrong rule would break: credits against autograd or a
closed form, exact zeros where nothing may leak through the residual stream, parameter
gradients against the prescribed local surrogate.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.methods import BP, DFA, FA, BackpropRule, Frozen, build_rule, rms_normalise
from creditaudit.methods.base import output_error
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.methods.surrogate import local_forward, local_objective
from creditaudit.models import ResidualMLP, ViTMini
from creditaudit.models.contract import ResidualNet, readout_parameters

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C = 4


class LinearResNet(ResidualNet):
    """h_0 = E x + c; h_{l+1} = h_l + W_l h_l; logits = head(h_L). Block Jacobian: I + W_l."""

    def __init__(self, in_dim: int, d: int, n_classes: int, n_blocks: int) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = d, n_classes, True
        self.embed = nn.Linear(in_dim, d)
        self.blocks = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(n_blocks))
        self.head = nn.Linear(d, n_classes)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


def linear_net(seed: int = 0) -> LinearResNet:
    torch.manual_seed(seed)
    model = LinearResNet(6, 8, C, 3).double()
    with torch.no_grad():
        for block in model.blocks:
            block.weight.mul_(0.5)
    return model


def mlp(seed: int = 0, *, n_blocks: int = 3, d: int = 10, double: bool = True, **kw
        ) -> ResidualMLP:
    torch.manual_seed(seed)
    model = ResidualMLP(in_dim=6, d=d, n_classes=C, n_blocks=n_blocks, **kw)
    return model.double() if double else model


def batch(n: int = 9, in_dim: int = 6, dtype=F64, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=gen, dtype=dtype)
    y = torch.randint(0, C, (n,), generator=gen)
    return x, y


def rule_for(model, name: str, **kw):
    return build_rule(model, MethodConfig(name=name, **kw), n_classes=C, seed=7)


def grads_after_step(rule, x, y) -> dict[str, torch.Tensor | None]:
    """Parameter gradients left by one train_step (SGD with lr 0 keeps weights and .grad)."""
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    before = {k: v.clone() for k, v in rule.model.state_dict().items()}
    result = rule.train_step(x, y, optimizer)
    assert result.finite
    for k, v in rule.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    return {name: (None if p.grad is None else p.grad.clone())
            for name, p in rule.model.named_parameters()}


def jacobian_feedback(model: LinearResNet) -> list[torch.Tensor]:
    """FA feedback equal to BP's: row form a_l = a_{l+1} @ B_lᵀ must equal g_{l+1} @ (I + W_l)."""
    eye = torch.eye(model.d, dtype=F64)
    return [(eye + block.weight.detach()).T.clone() for block in model.blocks]


def normalised(a: torch.Tensor) -> torch.Tensor:
    """â = a / (RMS(a) + 1e-6) per sample, written out in float64 for the references."""
    a = a.double()
    rms = a.flatten(1).pow(2).mean(dim=1).sqrt()
    return a / (rms + 1e-6).view(-1, *([1] * (a.dim() - 1)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_output_error_is_softmax_minus_one_hot_exactly(dtype):
    """The error e = softmax − onehot(y) that DFA, DRTP and the bridges project, built
    without F.one_hot (which syncs with the host to check labels), is bit for bit the same."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=gen).to(dtype) * 5
    y = torch.randint(0, 10, (64,), generator=gen)
    precise = logits.to(torch.promote_types(dtype, torch.float32))
    expected = torch.softmax(precise, dim=1) - F.one_hot(y, 10).to(precise.dtype)
    assert torch.equal(output_error(logits, y), expected)
    drtp = build_rule(ResidualMLP(16, 8, 10, 2), MethodConfig(name="drtp"), n_classes=10,
                      seed=0)
    assert torch.equal(drtp.projected_signal(precise, y), F.one_hot(y, 10).to(precise.dtype))


# --- BP -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_ln", [True, False])
def test_bp_credits_equal_autograd(out_ln):
    model = mlp(out_ln=out_ln, w2_std=0.3)
    x, y = batch()
    rule = rule_for(model, "bp")
    credits = rule.credits(x, y)
    states, logits = model.forward_states(x)
    ref = torch.autograd.grad(F.cross_entropy(logits, y), states)
    assert len(credits) == model.n_blocks + 1
    for a, g in zip(credits, ref):
        assert a.dtype == F64 and not a.requires_grad
        torch.testing.assert_close(a, g, rtol=0, atol=1e-12)
    if not out_ln:
        # closed form at the top: ∂CE/∂h_L = (softmax − onehot)/B @ W_head
        e = torch.softmax(logits.detach(), 1) - F.one_hot(y, C).double()
        top = e @ model.out_head.weight.detach() / x.shape[0]
        torch.testing.assert_close(credits[-1], top, rtol=0, atol=1e-12)
    assert all(p.grad is None for p in model.parameters())


def test_bp_credits_on_linear_net_follow_the_jacobian_chain():
    model = linear_net()
    x, y = batch()
    g = bp_state_gradients(model, x, y)
    for l, block in enumerate(model.blocks):
        jac = torch.eye(model.d, dtype=F64) + block.weight.detach()
        torch.testing.assert_close(g[l], g[l + 1] @ jac, rtol=0, atol=1e-12)


# --- FA -----------------------------------------------------------------------------------------
def test_fa_runs_on_float64_model_with_drawn_feedback():
    model = mlp()
    rule = build_rule(model, MethodConfig(name="fa"), n_classes=C, seed=7)
    x, y = batch()
    credits = rule.credits(x, y)
    assert all(a.dtype == F64 for a in credits)
    assert rule.train_step(x, y, torch.optim.SGD(model.parameters(), lr=0.0)).finite


def test_fa_feedback_shapes_and_propagation():
    model = mlp()
    rule = rule_for(model, "fa")
    assert len(rule.feedback) == model.n_blocks
    assert all(b.shape == (model.d, model.d) for b in rule.feedback)
    x, y = batch()
    credits = rule.credits(x, y)
    for l in range(model.n_blocks):
        torch.testing.assert_close(credits[l], credits[l + 1] @ rule.feedback[l].T.to(F64))


def test_fa_with_jacobian_feedback_matches_bp_credits():
    """FA with B_l = (I + W_l)ᵀ is BP on a linear residual net."""
    model = linear_net()
    x, y = batch()
    rule = rule_for(model, "fa")
    rule.feedback = jacobian_feedback(model)
    credits, g = rule.credits(x, y), bp_state_gradients(model, x, y)
    for a, ref in zip(credits, g):
        torch.testing.assert_close(a, ref, rtol=0, atol=1e-12 * float(ref.abs().max()))
    # contrast: random feedback is not BP at the deep layers
    random_rule = rule_for(model, "fa")
    random_credits = random_rule.credits(x, y)
    assert (random_credits[0] - g[0]).abs().max() > 100 * 1e-6 * g[0].abs().max()


def test_fa_with_jacobian_feedback_matches_bp_credits_exactly_in_float64():
    model = linear_net()
    x, y = batch()
    rule = rule_for(model, "fa")
    rule.feedback = jacobian_feedback(model)
    for a, ref in zip(rule.credits(x, y), bp_state_gradients(model, x, y)):
        torch.testing.assert_close(a, ref, rtol=0, atol=1e-12)


def local_bp_reference(model: ResidualNet, x, y, penalty: float = 0.0) -> dict[str, torch.Tensor]:
    """Parameter gradients of the local surrogate driven by the *true* gradients g_l."""
    g = bp_state_gradients(model, x, y)
    model.zero_grad(set_to_none=True)
    h0 = model.embed(x)
    objective = (h0 * normalised(g[0])).sum(1).mean()
    h = h0.detach()
    for l, block in enumerate(model.blocks):
        f = block(h)
        objective = objective + (f * normalised(g[l + 1])).sum(1).mean()
        objective = objective + penalty * f.pow(2).sum(1).mean()
        h = (h + f).detach()
    objective = objective + F.cross_entropy(model.readout(h), y)
    objective.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_fa_train_step_with_jacobian_feedback_is_local_bp(penalty):
    model = linear_net()
    x, y = batch()
    expected = local_bp_reference(model, x, y, penalty)
    rule = rule_for(model, "fa", penalty=penalty)
    rule.feedback = jacobian_feedback(model)
    got = grads_after_step(rule, x, y)
    assert set(got) == set(expected)
    for name, ref in expected.items():
        assert ref.abs().max() > 1e-3, name
        torch.testing.assert_close(got[name], ref, rtol=1e-10, atol=1e-12, msg=name)
    # contrast: with random feedback the deep blocks get different updates
    random_got = grads_after_step(rule_for(model, "fa", penalty=penalty), x, y)
    assert (random_got["blocks.0.weight"] - expected["blocks.0.weight"]).abs().max() > 1e-2


# --- zero feedback: nothing leaks through the residual stream --------------------------------
@pytest.mark.parametrize("out_ln", [True, False])
def test_dfa_zero_feedback_trains_only_the_readout(out_ln):
    model = mlp(double=False, out_ln=out_ln, w2_std=0.3)
    x, y = batch(dtype=torch.float32)
    rule = rule_for(model, "dfa")
    rule.feedback = [torch.zeros_like(b) for b in rule.feedback]
    grads = grads_after_step(rule, x, y)
    readout = {n for n, p in model.named_parameters()
               if any(p is q for q in readout_parameters(model))}
    for name, grad in grads.items():
        if name in readout:
            assert grad is not None and grad.abs().max() > 0, name
        else:
            assert grad is None or torch.count_nonzero(grad) == 0, name


def test_fa_zero_feedback_trains_only_last_block_and_readout():
    model = mlp(double=False, w2_std=0.3)
    x, y = batch(dtype=torch.float32)
    rule = rule_for(model, "fa")
    rule.feedback = [torch.zeros_like(b) for b in rule.feedback]
    grads = grads_after_step(rule, x, y)
    last = model.n_blocks - 1
    for name, grad in grads.items():
        if name.startswith("embed.") or (name.startswith("blocks.")
                                         and not name.startswith(f"blocks.{last}.")):
            assert grad is None or torch.count_nonzero(grad) == 0, name
        else:  # the last block (driven by the exact a_L) and the readout
            assert grad is not None and grad.abs().max() > 0, name


def test_readout_trained_by_exact_local_ce():
    model = mlp(w2_std=0.3)
    x, y = batch()
    for name in ("dfa", "fa"):
        states, logits = model.forward_states(x)
        h_last = states[-1].detach()
        params = readout_parameters(model)
        ref = torch.autograd.grad(F.cross_entropy(model.readout(h_last), y), params)
        rule = rule_for(model, name)
        grads_after_step(rule, x, y)
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.grad, r, rtol=1e-10, atol=1e-12)
        model.zero_grad(set_to_none=True)


# --- DFA ----------------------------------------------------------------------------------------
def test_dfa_feedback_shapes_and_seed():
    model = mlp()
    rule = rule_for(model, "dfa")
    assert len(rule.feedback) == model.n_blocks + 1
    assert all(b.shape == (C, model.d) for b in rule.feedback)
    again = rule_for(mlp(), "dfa")
    assert all(torch.equal(a, b) for a, b in zip(rule.feedback, again.feedback))
    other = build_rule(mlp(), MethodConfig(name="dfa", feedback_seed=8), n_classes=C, seed=7)
    assert not torch.equal(rule.feedback[0], other.feedback[0])


def test_feedback_scale_and_global_rng_untouched():
    torch.manual_seed(3)
    expected = torch.rand(4)
    model = mlp(d=64)
    torch.manual_seed(3)
    rule = build_rule(model, MethodConfig(name="fa", feedback_scale=2.0), n_classes=C, seed=1)
    assert torch.equal(torch.rand(4), expected)
    std = torch.cat([b.flatten() for b in rule.feedback]).std()
    assert abs(float(std) / (2.0 / 64 ** 0.5) - 1) < 0.05


def test_dfa_credit_is_error_times_feedback():
    model = mlp(double=False, w2_std=0.3)
    x, y = batch(dtype=torch.float32)
    rule = rule_for(model, "dfa")
    credits = rule.credits(x, y)
    with torch.no_grad():
        logits = model(x)
    e = torch.softmax(logits, dim=1) - F.one_hot(y, C).float()
    torch.testing.assert_close(e.sum(1), torch.zeros(x.shape[0]), rtol=0, atol=1e-6)
    assert len(credits) == model.n_blocks + 1
    for a, b in zip(credits, rule.feedback):
        torch.testing.assert_close(a, e @ b)


def test_dfa_credit_is_error_times_feedback_exactly_in_float64():
    model = mlp(w2_std=0.3)
    x, y = batch()
    rule = rule_for(model, "dfa")
    credits = rule.credits(x, y)
    with torch.no_grad():
        logits = model(x)
    e = torch.softmax(logits, dim=1) - F.one_hot(y, C).double()
    for a, b in zip(credits, rule.feedback):
        torch.testing.assert_close(a, e @ b.double(), rtol=0, atol=1e-12)


def test_credits_leave_parameters_grads_and_rng_alone():
    for name in ("bp", "fa", "dfa"):
        model = mlp(w2_std=0.3)
        x, y = batch()
        rule = rule_for(model, name)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        torch.manual_seed(5)
        rule.credits(x, y)
        after_rng = torch.rand(3)
        torch.manual_seed(5)
        assert torch.equal(torch.rand(3), after_rng), name
        assert all(p.grad is None for p in model.parameters()), name
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), name


def _perturb_downstream(model: ResidualNet, layer: int) -> None:
    """Change blocks[layer+1:] in place *behind autograd's back* (shared storage via .data)."""
    gen = torch.Generator().manual_seed(99)
    for p in model.blocks[layer + 1:].parameters():
        p.data.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _dfa_local_grads(model: ResidualNet, rule: DFA, x, y, layer: int, perturb: bool):
    local = local_forward(model, x)
    credits = rule.credits_from_error(output_error(local.logits, y), local.states)
    objective, _ = local_objective(model, local, credits, y, 0.01)
    if perturb:
        _perturb_downstream(model, layer)
    objective.backward()
    grads = [p.grad.clone() for p in model.blocks[layer].parameters()]
    grads += [p.grad.clone() for p in model.embed.parameters()]
    return grads


def _bp_grads(model: ResidualNet, x, y, layer: int, perturb: bool):
    _, logits = model.forward_states(x)
    loss = F.cross_entropy(logits, y)
    if perturb:
        _perturb_downstream(model, layer)
    loss.backward()
    return [p.grad.clone() for p in model.blocks[layer].parameters()]


@pytest.mark.parametrize("layer", [0, 1])
def test_dfa_block_update_depends_only_on_its_input_and_credit(layer):
    """Block l's DFA gradient is a function of (h_l, â_{l+1}) only: changing the downstream
    weights that a backward pass through the stream would use leaves it bit-identical."""
    base = mlp(w2_std=0.3)
    x, y = batch()
    clean_model = copy.deepcopy(base)
    clean = _dfa_local_grads(clean_model, rule_for(clean_model, "dfa"), x, y, layer, False)
    dirty_model = copy.deepcopy(base)
    dirty = _dfa_local_grads(dirty_model, rule_for(dirty_model, "dfa"), x, y, layer, True)
    for a, b in zip(clean, dirty):
        assert a.abs().max() > 0
        assert torch.equal(a, b)
    # contrast: BP's gradient for the same block does change
    bp_clean = _bp_grads(copy.deepcopy(base), x, y, layer, False)
    bp_dirty = _bp_grads(copy.deepcopy(base), x, y, layer, True)
    assert max(float((a - b).abs().max()) for a, b in zip(bp_clean, bp_dirty)) > 1e-4


# --- penalty ------------------------------------------------------------------------------------
@pytest.mark.parametrize("penalty", [0.0, 0.3])
def test_penalty_gradient_closed_form_dfa_zero_feedback(penalty):
    model = mlp(n_blocks=2, w2_std=0.3)
    x, y = batch()
    rule = rule_for(model, "dfa", penalty=penalty)
    rule.feedback = [torch.zeros_like(b) for b in rule.feedback]
    states, _ = model.forward_states(x)
    grads = grads_after_step(rule, x, y)
    for l, block in enumerate(model.blocks):
        h = states[l].detach()
        u = F.gelu(block.w1(block.ln(h))).detach()
        f = block.w2(u).detach()
        # ∂(λ·mean_b ‖f_b‖²)/∂b2 = 2λ·mean_b f_b ; ∂/∂W2 = 2λ·mean_b f_b u_bᵀ
        torch.testing.assert_close(grads[f"blocks.{l}.w2.bias"], 2 * penalty * f.mean(0),
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(grads[f"blocks.{l}.w2.weight"],
                                   2 * penalty * f.T @ u / x.shape[0], rtol=0, atol=1e-12)
        if penalty > 0:
            assert grads[f"blocks.{l}.w2.bias"].abs().max() > 1e-3


def test_dfa_bias_gradient_closed_form_with_feedback_and_penalty():
    """w2.bias of block l gets mean_b â_{l+1} + 2λ mean_b f_l; embed.bias gets mean_b â_0."""
    penalty = 0.05
    model = mlp(n_blocks=3, w2_std=0.3)
    x, y = batch()
    rule = rule_for(model, "dfa", penalty=penalty)
    states, logits = model.forward_states(x)
    e = torch.softmax(logits.detach(), 1) - F.one_hot(y, C).double()
    a_hat = [normalised(e @ b.double()) for b in rule.feedback]
    grads = grads_after_step(rule, x, y)
    torch.testing.assert_close(grads["embed.bias"], a_hat[0].mean(0), rtol=1e-10, atol=1e-12)
    for l, block in enumerate(model.blocks):
        f = block(states[l].detach()).detach()
        expected = a_hat[l + 1].mean(0) + 2 * penalty * f.mean(0)
        torch.testing.assert_close(grads[f"blocks.{l}.w2.bias"], expected, rtol=1e-10, atol=1e-12)


def _bp_reference_grads(model: ResidualNet, x, y, penalty: float):
    params = list(model.parameters())
    states, logits = model.forward_states(x)
    branches = [block(states[l]) for l, block in enumerate(model.blocks)]
    ce_grads = torch.autograd.grad(F.cross_entropy(logits, y), params, retain_graph=True)
    pen = sum(f.pow(2).sum(1).mean() for f in branches)
    pen_grads = torch.autograd.grad(pen, params, allow_unused=True)
    pen_grads = [torch.zeros_like(p) if g is None else g for g, p in zip(pen_grads, params)]
    return ce_grads, pen_grads


def test_bp_penalty_gradient_is_ce_plus_lambda_penalty():
    penalty = 0.5
    model = mlp(w2_std=0.3)
    x, y = batch()
    ce_grads, pen_grads = _bp_reference_grads(model, x, y, penalty)
    grads = grads_after_step(rule_for(model, "bp", penalty=penalty), x, y)
    for (name, _), gc, gp in zip(model.named_parameters(), ce_grads, pen_grads):
        expected = gc + penalty * gp
        torch.testing.assert_close(grads[name], expected, rtol=1e-10, atol=1e-12, msg=name)
    # the penalty term is far above the tolerance, so a missing or wrong λ would fail
    assert max(float((penalty * gp).abs().max()) for gp in pen_grads) > 0.1


def test_bp_penalty_gradient_exact_in_float64():
    penalty = 0.5
    model = mlp(w2_std=0.3)
    x, y = batch()
    ce_grads, pen_grads = _bp_reference_grads(model, x, y, penalty)
    grads = grads_after_step(rule_for(model, "bp", penalty=penalty), x, y)
    for (name, _), gc, gp in zip(model.named_parameters(), ce_grads, pen_grads):
        torch.testing.assert_close(grads[name], gc + penalty * gp, rtol=0, atol=1e-12)


# --- frozen blocks and the depth ladder ---------------------------------------------------------
@pytest.mark.parametrize("method", ["bp", "fa", "dfa"])
def test_penalty_of_frozen_blocks_stays_out_of_training(method):
    """With the first two of three blocks frozen (a depth-ladder step) and λ > 0, only the
    trainable block's ‖f‖² is penalised: the embedding's gradient is the one a model without
    the frozen blocks' terms gets (for BP: CE + λ‖f_2‖², not + λ Σ_l ‖f_l‖²)."""
    penalty = 0.5
    model = mlp(w2_std=0.3)
    x, y = batch()
    rule = rule_for(model, method, penalty=penalty, trainable_blocks=1)
    grads = grads_after_step(rule, x, y)
    assert grads["blocks.0.w1.weight"] is None and grads["blocks.1.w1.weight"] is None
    if method == "bp":
        states, logits = model.forward_states(x)
        trainable = model.blocks[2](states[2]).pow(2).sum(1).mean()
        objective = F.cross_entropy(logits, y) + penalty * trainable
        (expected,) = torch.autograd.grad(objective, [model.embed.weight], retain_graph=True)
        frozen_terms = sum(model.blocks[l](states[l]).pow(2).sum(1).mean() for l in (0, 1))
        (leak,) = torch.autograd.grad(penalty * frozen_terms, [model.embed.weight])
        assert float(leak.abs().max()) > 1e-3  # the frozen terms would be visible
        torch.testing.assert_close(grads["embed.weight"], expected, rtol=1e-10, atol=1e-12)
    else:  # local rules: the embedding sees only its own credit, whatever λ is
        unpenalised = grads_after_step(rule_for(model, method, penalty=0.0,
                                                trainable_blocks=1), x, y)
        torch.testing.assert_close(grads["embed.weight"], unpenalised["embed.weight"],
                                   rtol=1e-10, atol=1e-12)


def _train_steps(rule, model, steps: int = 5, all_params: bool = False):
    params = model.parameters() if all_params else rule.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    gen = torch.Generator().manual_seed(4)
    for _ in range(steps):
        x = torch.randn(16, 6, generator=gen)
        y = torch.randint(0, C, (16,), generator=gen)
        assert rule.train_step(x, y, optimizer).finite


@pytest.mark.parametrize("all_params", [False, True])
def test_frozen_blocks_never_change(all_params):
    model = mlp(double=False)
    rule = rule_for(model, "frozen")
    assert isinstance(rule, Frozen) and isinstance(rule, BackpropRule)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert all(not p.requires_grad for p in model.blocks.parameters())
    trainable_ids = {id(p) for p in rule.trainable_parameters()}
    assert not trainable_ids & {id(p) for p in model.blocks.parameters()}
    _train_steps(rule, model, all_params=all_params)
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            assert torch.equal(p, before[name]), name
            assert not p.requires_grad
        elif name.endswith("weight"):
            assert not torch.equal(p, before[name]), name


@pytest.mark.parametrize("method", ["bp", "fa", "dfa"])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_depth_ladder_freezes_first_blocks(method, k):
    model = mlp(double=False)
    rule = rule_for(model, method, trainable_blocks=k)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train_steps(rule, model)
    n_frozen = model.n_blocks - k
    for l in range(model.n_blocks):
        for name, p in model.blocks[l].named_parameters():
            key = f"blocks.{l}.{name}"
            if l < n_frozen:
                assert not p.requires_grad and torch.equal(p, before[key]), key
            elif name.endswith("weight"):
                assert p.requires_grad and not torch.equal(p, before[key]), key
    assert not torch.equal(model.embed.weight, before["embed.weight"])
    assert not torch.equal(model.out_head.weight, before["out_head.weight"])


# --- RMS normalisation --------------------------------------------------------------------------
def test_rms_normalise():
    a = torch.randn(5, 7, dtype=F64) * torch.tensor([1e-6, 1e-3, 1.0, 1e3, 0.0],
                                                    dtype=F64)[:, None]
    out = rms_normalise(a)
    rms = out.pow(2).mean(1).sqrt()
    in_rms = a.pow(2).mean(1).sqrt()
    torch.testing.assert_close(rms[:4], in_rms[:4] / (in_rms[:4] + 1e-6), rtol=1e-12, atol=0)
    torch.testing.assert_close(rms[2:4], torch.ones(2, dtype=F64), rtol=0, atol=1e-5)
    assert torch.equal(out[4], torch.zeros(7, dtype=F64))
    # direction kept, scale removed
    torch.testing.assert_close(rms_normalise(3.0 * a[2:4]), out[2:4], rtol=1e-5, atol=0)
    tokens = torch.randn(3, 5, 4, dtype=F64)
    tok = rms_normalise(tokens)
    torch.testing.assert_close(tok.flatten(1).pow(2).mean(1).sqrt(), torch.ones(3, dtype=F64),
                               rtol=0, atol=1e-5)
    assert tok.shape == tokens.shape


# --- ViT ----------------------------------------------------------------------------------------
def tiny_vit() -> ViTMini:
    torch.manual_seed(0)
    return ViTMini(n_classes=C, d=32, n_blocks=2, heads=2, mlp_ratio=2, w2_std=0.1)


def vit_batch():
    gen = torch.Generator().manual_seed(2)
    return torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, C, (4,), generator=gen)


@pytest.mark.parametrize("method", ["dfa", "fa", "bp"])
def test_vit_train_step_updates_every_module(method):
    model = tiny_vit()
    rule = rule_for(model, method)
    x, y = vit_batch()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        ref_loss = float(F.cross_entropy(model(x), y))
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    result = rule.train_step(x, y, optimizer)
    assert result.finite and result.n == 4 and 0 <= result.correct <= 4
    assert abs(result.loss - ref_loss) < 1e-5
    params = dict(model.named_parameters())
    for name in ("embed.proj.weight", "blocks.0.w2.weight", "blocks.1.qkv.weight",
                 "out_head.weight"):
        assert not torch.equal(params[name], before[name]), name


def test_vit_dfa_credit_broadcast_over_tokens():
    model = tiny_vit()
    rule = rule_for(model, "dfa")
    x, y = vit_batch()
    credits = rule.credits(x, y)
    with torch.no_grad():
        e = torch.softmax(model(x), 1) - F.one_hot(y, C).float()
    for a, b in zip(credits, rule.feedback):
        assert a.shape == (4, 65, 32)
        assert torch.equal(a, a[:, :1].expand_as(a))
        torch.testing.assert_close(a[:, 0], e @ b)


def test_vit_fa_credit_lives_on_the_cls_token():
    model = tiny_vit()
    rule = rule_for(model, "fa")
    x, y = vit_batch()
    credits = rule.credits(x, y)
    g = bp_state_gradients(model, x, y)
    torch.testing.assert_close(credits[-1], g[-1], rtol=1e-5, atol=1e-8)
    for a in credits:
        assert a.shape == (4, 65, 32)
        assert torch.count_nonzero(a[:, 1:]) == 0
        assert a[:, 0].abs().max() > 0


def test_rule_registry_types():
    model = mlp()
    assert isinstance(rule_for(model, "fa"), FA)
    assert isinstance(rule_for(model, "dfa"), DFA)
    assert isinstance(rule_for(model, "bp"), BP)
