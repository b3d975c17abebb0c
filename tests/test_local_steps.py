"""The local rules' cheaper training steps equal the surrogate written out (float64).

A train step feeds the surrogate's gradients straight into one backward pass
(``local_backward``) through blocks whose LayerNorm → Linear skips the input gradient. The
reference here is the previous formulation: every block input a fresh leaf (so autograd
takes the plain, unfused path), the scalar ``local_objective`` built and backpropagated.
Every parameter's ``.grad`` after one step must match it to ~1e-12.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from creditaudit.config import MethodConfig
from creditaudit.methods import build_rule
from creditaudit.methods.base import output_error
from creditaudit.methods.surrogate import LocalPass, local_objective
from creditaudit.models import ResidualMLP, ViTMini
from creditaudit.models.contract import ResidualNet, block_is_trainable

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C = 4
LOCAL_RULES = ["fa", "dfa", "state-bridge", "credit-bridge"]


def mlp(seed: int = 0, *, n_blocks: int = 3, dtype=F64) -> ResidualMLP:
    torch.manual_seed(seed)
    model = ResidualMLP(in_dim=6, d=10, n_classes=C, n_blocks=n_blocks, w2_std=0.3)
    with torch.no_grad():  # γ, β away from (1, 0): a wrong LN gradient would show
        for block in model.blocks:
            block.ln.weight.normal_(1.0, 0.5)
            block.ln.bias.normal_(0.0, 0.5)
    return model.to(dtype)


def tiny_vit(seed: int = 0) -> ViTMini:
    torch.manual_seed(seed)
    return ViTMini(n_classes=C, d=16, n_blocks=2, heads=2, mlp_ratio=2, w2_std=0.1).double()


def batch(n: int = 9, shape: tuple[int, ...] = (6,), dtype=F64, seed: int = 1
          ) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *shape, generator=gen, dtype=dtype),
            torch.randint(0, C, (n,), generator=gen))


def rule_for(model: nn.Module, name: str, **kw):
    extra = dict(bridge_hidden=16) if "bridge" in name else {}
    if name == "credit-bridge":
        extra["warmup_fraction"] = 0.0
    return build_rule(model, MethodConfig(name=name, **{**extra, **kw}), n_classes=C, seed=7)


def step_grads(rule, x: Tensor, y: Tensor) -> dict[str, Tensor | None]:
    """Every model parameter's .grad after one train_step (SGD lr 0 keeps the weights)."""
    result = rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0))
    assert result.finite
    return {n: None if p.grad is None else p.grad.clone()
            for n, p in rule.model.named_parameters()}


def unfused_local_pass(model: ResidualNet, x: Tensor) -> LocalPass:
    """local_forward as it was: each block input is a fresh leaf that requires grad, so the
    block runs plain autograd (no fused LayerNorm → Linear); the leaves are never read."""
    h0 = model.embed(x)
    h = h0.detach()
    states, branches = [h], []
    for block in model.blocks:
        if block_is_trainable(block):
            f = block(h.detach().requires_grad_(True))
            branches.append(f)
            h = model.next_state(h, f.detach())
        else:
            with torch.no_grad():
                h = model.next_state(h, block(h))
            branches.append(None)
        states.append(h)
    return LocalPass(h0=h0, branches=branches, states=states, logits=model.readout(h))


def reference_grads(model: ResidualNet, credits: list[Tensor], x: Tensor, y: Tensor,
                    penalty: float) -> dict[str, Tensor | None]:
    """.grad of every parameter from backward of the scalar surrogate (previous step)."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    objective, _ = local_objective(model, unfused_local_pass(model, x), credits, y, penalty)
    objective.backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def assert_grads_equal(got: dict, want: dict, tol: float = 1e-12) -> None:
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        if w is None:
            assert g is None, name
            continue
        assert g is not None, name
        scale = max(float(w.abs().max()), 1e-3)
        torch.testing.assert_close(g, w, rtol=0, atol=tol * scale, msg=name)


@pytest.mark.parametrize("name", LOCAL_RULES)
@pytest.mark.parametrize("penalty", [0.0, 0.2])
def test_step_gradients_equal_the_scalar_surrogate(name, penalty):
    model = mlp()
    rule = rule_for(model, name, penalty=penalty)
    x, y = batch()
    credits = rule.credits(x, y)  # the step's own credits (nothing has moved yet)
    want = reference_grads(model, credits, x, y, penalty)
    got = step_grads(rule, x, y)
    assert_grads_equal(got, want)
    for key in ("blocks.0.ln.weight", "blocks.0.ln.bias", "blocks.0.w1.weight", "embed.weight"):
        assert float(got[key].abs().max()) > 1e-4, key


@pytest.mark.parametrize("name", LOCAL_RULES)
def test_penalty_enters_only_the_block_updates(name):
    """λ changes the block updates by exactly λ∇‖f‖² and nothing else (not the embedding)."""
    x, y = batch()
    grads = {}
    for penalty in (0.0, 0.5):
        model = mlp()
        grads[penalty] = step_grads(rule_for(model, name, penalty=penalty), x, y)
    for key, g0 in grads[0.0].items():
        if key.startswith("blocks."):
            assert float((grads[0.5][key] - g0).abs().max()) > 1e-3, key
        else:
            assert torch.equal(grads[0.5][key], g0), key


@pytest.mark.parametrize("name", LOCAL_RULES)
@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_frozen_blocks_get_nothing_and_their_penalty_never_reaches_the_embedding(name, penalty):
    model = mlp(n_blocks=4)
    rule = rule_for(model, name, penalty=penalty, trainable_blocks=2)
    x, y = batch()
    want = reference_grads(model, rule.credits(x, y), x, y, penalty)
    got = step_grads(rule, x, y)
    assert_grads_equal(got, want)
    for key, g in got.items():
        if key.startswith(("blocks.0.", "blocks.1.")):
            assert g is None, key
    # the embedding's update is its credit's alone, whatever λ
    unpenalised = step_grads(rule_for(mlp(n_blocks=4), name, trainable_blocks=2), x, y)
    assert torch.equal(got["embed.weight"], unpenalised["embed.weight"])
    assert torch.equal(got["embed.bias"], unpenalised["embed.bias"])


@pytest.mark.parametrize("name", LOCAL_RULES)
@pytest.mark.parametrize("penalty", [0.0, 0.2])
def test_vit_token_states(name, penalty):
    """Token states (B, 65, d): DFA/bridge credits per token, DFA's broadcast over tokens."""
    model = tiny_vit()
    rule = rule_for(model, name, penalty=penalty)
    x, y = batch(n=3, shape=(3, 32, 32))
    credits = rule.credits(x, y)
    assert all(a.shape == (3, 65, 16) for a in credits)
    want = reference_grads(model, credits, x, y, penalty)
    got = step_grads(rule, x, y)
    assert_grads_equal(got, want, tol=1e-11)
    assert float(got["blocks.0.qkv.weight"].abs().max()) > 0
    assert float(got["blocks.0.ln1.weight"].abs().max()) > 0


@pytest.mark.parametrize("name", LOCAL_RULES)
def test_bf16_autocast_step(name):
    """Under bf16 autocast: finite, parameters stay fp32, updates point where fp32's do."""
    x, y = batch(n=32, dtype=torch.float32)
    grads = {}
    for precision in ("fp32", "bf16"):
        model = mlp(dtype=torch.float32)
        rule = rule_for(model, name, penalty=0.1)
        rule.set_precision(precision, "cpu")
        grads[precision] = step_grads(rule, x, y)
        assert all(p.dtype == torch.float32 for p in model.parameters())
    for key, g in grads["bf16"].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), key
        cos = torch.nn.functional.cosine_similarity(g.flatten(), grads["fp32"][key].flatten(),
                                                    dim=0)
        assert float(cos) > 0.95, key


# --- State Bridge: one predictor forward per step ----------------------------------------
class CountingPredictor(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, h: Tensor, layer, e: Tensor) -> Tensor:
        self.calls += 1
        return self.inner(h, layer, e)


def test_state_bridge_runs_its_predictor_once_and_fits_it_as_before():
    """The shared forward gives the predictor the same AdamW step (and logged error) as
    a second forward on the same inputs would."""
    x, y = batch()
    shared = rule_for(mlp(), "state-bridge")
    separate = rule_for(mlp(), "state-bridge")
    for rule in (shared, separate):
        rule.set_predictor(CountingPredictor(rule.predictor))
    states, logits = separate.model.forward_states(x)
    e = output_error(logits, y)
    states = [h.detach() for h in states]
    separate.bridge_credits(states, e, y)
    separate.error_sum += separate.fit_predictor(states, e)  # its own second forward
    assert separate.predictor.calls == 2
    step_grads(shared, x, y)
    assert shared.predictor.calls == 1
    assert shared.kept_prediction is None  # the graph is not kept past the step
    assert shared.error_sum == pytest.approx(separate.error_sum, rel=1e-12)
    for (n, p), q in zip(shared.predictor.named_parameters(), separate.predictor.parameters()):
        assert p.grad is not None and float(p.grad.abs().max()) > 0, n
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-14, msg=n)
        torch.testing.assert_close(p, q, rtol=0, atol=1e-14, msg=n)
