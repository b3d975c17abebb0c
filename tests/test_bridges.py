"""State Bridge and Credit Bridge: credits against independent autograd, identities with BP,
locality of the block updates, state_dict round trips and exact resume (issue #5)."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit import Recorder
from creditaudit.config import MethodConfig, RunConfig
from creditaudit.errors import ConfigError
from creditaudit.methods import DFA, build_rule, rms_normalise, rule_names
from creditaudit.methods.base import output_error
from creditaudit.methods.bp import bp_state_gradients
from creditaudit.methods.credit_bridge import CreditBridge, soft_min
from creditaudit.methods.state_bridge import StateBridge
from creditaudit.models import ResidualMLP
from creditaudit.records import CHECKPOINT_FILE, comparable, load_record
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import train

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
C = 4
HIDDEN = 16  # small auxiliary nets keep every test fast


def mlp(seed: int = 0, *, n_blocks: int = 3, d: int = 10, **kw) -> ResidualMLP:
    torch.manual_seed(seed)
    # w2_std = 0.3: blocks far from the identity, so a wrong chain rule would show.
    return ResidualMLP(in_dim=6, d=d, n_classes=C, n_blocks=n_blocks, w2_std=0.3, **kw).double()


def batch(n: int = 9, seed: int = 1) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen, dtype=F64), torch.randint(0, C, (n,), generator=gen)


def rule_for(model: nn.Module, name: str, seed: int = 7, **kw):
    if name != "credit-bridge":  # the warm-up is the Credit Bridge's own option
        kw.pop("warmup_fraction", None)
    if name.endswith("bridge"):
        kw["bridge_hidden"] = HIDDEN
    return build_rule(model, MethodConfig(name=name, **kw), n_classes=C, seed=seed)


def randomise(module: nn.Module, seed: int = 3, std: float = 0.3) -> None:
    """Non-zero weights everywhere (the predictor's last layer starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)


def error_of(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        return output_error(model(x), y)


class TrueMap(nn.Module):
    """G(h_l, l, e) = h_L: runs blocks l … L−1 of the model (ignores e)."""

    def __init__(self, model: ResidualMLP) -> None:
        super().__init__()
        self.model = model

    def run_from(self, h: Tensor, layer: int) -> Tensor:
        for block in self.model.blocks[layer:]:
            h = self.model.next_state(h, block(h))
        return h

    def forward(self, h: Tensor, layer: int | Tensor, e: Tensor) -> Tensor:
        if not isinstance(layer, Tensor):
            return self.run_from(h, layer)
        out = torch.empty_like(h)
        for value in layer.unique().tolist():
            rows = layer == value
            out[rows] = self.run_from(h[rows], value)
        return out


def block_grads_after_step(rule, x: Tensor, y: Tensor) -> dict[str, Tensor | None]:
    """Model parameter gradients left by one train_step (SGD lr 0 keeps weights and .grad)."""
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    result = rule.train_step(x, y, optimizer)
    assert result.finite
    return {name: None if p.grad is None else p.grad.clone()
            for name, p in rule.model.named_parameters()}


# --- registration -------------------------------------------------------------------------
def test_rules_are_registered_and_validated():
    assert {"state-bridge", "credit-bridge", "ep"} <= set(rule_names())
    model = mlp()
    assert isinstance(rule_for(model, "state-bridge"), StateBridge)
    assert isinstance(rule_for(model, "credit-bridge"), CreditBridge)
    config = RunConfig().replace(**{"method.name": "credit-bridge"})
    assert config.method.warmup_fraction == 0.2 and config.method.bridge_copies == 8
    with pytest.raises(ConfigError, match="warmup_fraction"):
        config.replace(**{"method.warmup_fraction": 1.5})


# --- State Bridge credits -----------------------------------------------------------------
@pytest.mark.parametrize("out_ln", [True, False])
def test_state_bridge_credit_is_autograd_through_predictor(out_ln):
    model = mlp(out_ln=out_ln)
    rule = rule_for(model, "state-bridge")
    randomise(rule.predictor)
    x, y = batch()
    credits = rule.credits(x, y)
    states, logits = model.forward_states(x)
    e = output_error(logits.detach(), y)
    L = model.n_blocks
    assert len(credits) == L + 1
    for layer in range(L):
        h = states[layer].detach().requires_grad_(True)
        ce = F.cross_entropy(model.readout(rule.predictor(h, layer, e.double())), y)
        (want,) = torch.autograd.grad(ce, h)
        assert torch.allclose(credits[layer], want, rtol=1e-10, atol=1e-14), layer
        # the predictor matters: not just the readout gradient at h_l itself
        h2 = states[layer].detach().requires_grad_(True)
        (plain,) = torch.autograd.grad(F.cross_entropy(model.readout(h2), y), h2)
        assert not torch.allclose(credits[layer], plain, rtol=1e-3)
    h = states[L].detach().requires_grad_(True)
    (top,) = torch.autograd.grad(F.cross_entropy(model.readout(h), y), h)
    assert torch.allclose(credits[L], top, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("out_ln", [True, False])
def test_state_bridge_with_true_map_equals_bp(out_ln):
    model = mlp(out_ln=out_ln)
    rule = rule_for(model, "state-bridge")
    rule.set_predictor(TrueMap(model), train=False)
    x, y = batch()
    credits = rule.credits(x, y)
    for a, g in zip(credits, bp_state_gradients(model, x, y), strict=True):
        assert torch.allclose(a, g, rtol=1e-10, atol=1e-15)


def test_state_bridge_skip_predictor_starts_as_identity():
    """bridge_skip: G = h + RMS(h)·MLP, last layer zero → credit = readout gradient at h_l."""
    model = mlp()
    rule = rule_for(model, "state-bridge", bridge_skip=True)
    plain = rule_for(model, "state-bridge")
    assert rule.predictor.skip and not plain.predictor.skip
    x, y = batch()
    states, _ = model.forward_states(x)
    credits = rule.credits(x, y)
    for layer in range(model.n_blocks):
        h = states[layer].detach().requires_grad_(True)
        (want,) = torch.autograd.grad(F.cross_entropy(model.readout(h), y), h)
        assert torch.allclose(credits[layer], want, rtol=1e-12, atol=1e-16)
    randomise(rule.predictor)
    e = error_of(model, x, y)
    h = states[1].detach()
    rms = h.pow(2).mean(1, keepdim=True).sqrt()
    with torch.no_grad():
        want = h + rms * rule.predictor.net(rule.predictor.inputs(h, 1, e))
        assert torch.allclose(rule.predictor(h, 1, e), want, rtol=1e-12)


def test_state_bridge_true_map_has_zero_prediction_error():
    model = mlp()
    rule = rule_for(model, "state-bridge")
    rule.set_predictor(TrueMap(model), train=False)
    x, y = batch()
    states, _ = model.forward_states(x)
    with torch.no_grad():
        error = rule.prediction_error([h.detach() for h in states], error_of(model, x, y))
    assert float(error) < 1e-28


def test_bridge_credits_leave_parameters_grads_and_rng_alone():
    model = mlp()
    x, y = batch()
    for name in ("state-bridge", "credit-bridge"):
        rule = rule_for(model, name, warmup_fraction=0.0)
        aux = rule.predictor if name == "state-bridge" else rule.value
        randomise(aux)
        params = [*model.parameters(), *aux.parameters()]
        before = [p.detach().clone() for p in params]
        rng = torch.get_rng_state()
        gen = rule.generator.get_state()
        rule.credits(x, y)
        assert all(p.grad is None for p in params)
        assert all(torch.equal(p, b) for p, b in zip(params, before))
        assert torch.equal(torch.get_rng_state(), rng)
        assert torch.equal(rule.generator.get_state(), gen)


def test_building_a_bridge_does_not_touch_the_global_rng():
    model = mlp()
    rng = torch.get_rng_state()
    rule_for(model, "state-bridge")
    rule_for(model, "credit-bridge")
    assert torch.equal(torch.get_rng_state(), rng)


def test_state_bridge_prediction_error_is_normalised_mse():
    model = mlp()
    rule = rule_for(model, "state-bridge")
    randomise(rule.predictor)
    x, y = batch()
    states, _ = model.forward_states(x)
    states = [h.detach() for h in states]
    e = error_of(model, x, y)
    want = []
    for layer in range(model.n_blocks):
        with torch.no_grad():
            diff = rule.predictor(states[layer], layer, e) - states[-1]
        want.append(diff.pow(2).sum(1) / (states[-1].pow(2).sum(1) + 1e-6))
    with torch.no_grad():
        got = float(rule.prediction_error(states, e))
    assert got == pytest.approx(float(torch.cat(want).mean()), rel=1e-12)


def test_state_bridge_fits_its_predictor_and_logs_the_error():
    model = mlp()
    rule = rule_for(model, "state-bridge", bridge_lr=1e-2)
    x, y = batch(n=32)
    states, _ = model.forward_states(x)
    states = [h.detach() for h in states]
    e = error_of(model, x, y)
    with torch.no_grad():
        first = float(rule.prediction_error(states, e))
    errors = [rule.fit_predictor(states, e) for _ in range(60)]
    assert errors[0] == pytest.approx(first)
    assert errors[-1] < 0.5 * first
    # train_step accumulates the pre-step error; end_epoch reports its mean and resets
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    with torch.no_grad():
        expected = [float(rule.prediction_error(states, e))]
    rule.train_step(x, y, optimizer)
    with torch.no_grad():
        expected.append(float(rule.prediction_error(states, e)))
    rule.train_step(x, y, optimizer)
    fields = rule.end_epoch(1, 3)
    assert fields["state_pred_error"] == pytest.approx(sum(expected) / 2, rel=1e-9)
    assert math.isnan(rule.end_epoch(2, 3)["state_pred_error"])  # reset: no steps since


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_a_network_held_below_float32_trains_with_its_readout_in_its_own_dtype(name, dtype):
    """A network cast with .to(torch.bfloat16) (which a Recorder records as such): the
    bridges fed its readout their float32 states and predictions, and the first step failed
    with PyTorch's "mixed dtype (CPU): expect parameter to have scalar type of Float". The
    readout now runs in its parameters' dtype; credits and auxiliary nets stay float32."""
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=6, d=10, n_classes=C, n_blocks=3, w2_std=0.3).to(dtype)
    rule = rule_for(model, name, warmup_fraction=0.0)  # the value net's credit at once
    x, y = batch()
    x = x.to(dtype)
    grads = block_grads_after_step(rule, x, y)
    assert all(g is not None and g.dtype == dtype and bool(torch.isfinite(g).all())
               for g in grads.values())
    (optimizer,) = rule.optimizers().values()
    assert {float(state["step"]) for state in optimizer.state.values()} == {1.0}
    fields = rule.end_epoch(1, 1)
    assert all(math.isfinite(value) for value in fields.values()), fields
    credits = rule.credits(x, y)
    assert [a.dtype for a in credits] == [torch.float32] * 4
    assert all(bool(torch.isfinite(a).all()) and a.abs().sum() > 0 for a in credits)
    if name == "state-bridge":  # a_L: the readout's own gradient, in its dtype
        h = model.forward_states(x)[0][-1].detach().requires_grad_(True)
        (top,) = torch.autograd.grad(F.cross_entropy(model.readout(h), y), h)
        assert torch.equal(credits[-1], top.float())


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_auxiliary_nets_train_with_the_fused_adamw(name):
    """The predictor / value net steps with the fused kernel, like the model: torch's
    default on the CPU is a per-tensor Python loop."""
    rule = rule_for(mlp(), name)
    optimizer = rule.predictor_optimizer if name == "state-bridge" else rule.value_optimizer
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"]


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_an_epoch_ended_twice_keeps_its_fields_and_its_warmup(tmp_path, name):
    """A loop that ends each epoch itself (rule.end_epoch, as it must without a Recorder)
    and then records it with rec.epoch, which ends it again: the second call returned the
    fields of an empty epoch, so the record held NaN errors and bridge_warmup 0 for the
    warm-up epoch. The same epoch ended again with no step since now gives its fields again
    and counts nothing more for the warm-up."""
    torch.manual_seed(0)
    model = ResidualMLP(in_dim=6, d=10, n_classes=C, n_blocks=2).double()
    rule = rule_for(model, name, warmup_fraction=0.5)
    x, y = batch(n=32)
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    rec = Recorder(rule, x, y, out=tmp_path, name="twice", data="mine",
                   config={"optim.epochs": 4, "diagnostics.end_of_run": False})
    rec.epoch(0)
    ended = []
    for epoch in (1, 2, 3):
        assert rule.train_step(x, y, optimizer).finite
        ended.append(rule.end_epoch(epoch, 4))
        assert rule.end_epoch(epoch, 4) == ended[-1]  # again: the same fields
        rec.epoch(epoch, test_acc=0.5, test_loss=1.0)
    assert all(math.isfinite(value) for fields in ended for value in fields.values())
    assert [entry.extras for entry in rec.record.log[1:]] == ended
    if name == "credit-bridge":  # ceil(0.5 × 4) = 2 warm-up epochs, whoever ends them
        assert [fields["bridge_warmup"] for fields in ended] == [1.0, 1.0, 0.0]


# --- Credit Bridge credits ----------------------------------------------------------------
def test_credit_bridge_credit_is_value_gradient():
    model = mlp()
    rule = rule_for(model, "credit-bridge", warmup_fraction=0.0)
    randomise(rule.value, std=0.5)
    x, y = batch()
    credits = rule.credits(x, y)
    states, logits = model.forward_states(x)
    e = output_error(logits.detach(), y).double()
    assert len(credits) == model.n_blocks + 1
    for layer, h_l in enumerate(states):
        h = h_l.detach().requires_grad_(True)
        v = rule.value(h, layer, e)
        assert v.shape == (x.shape[0],)
        (want,) = torch.autograd.grad(v.mean(), h)
        assert torch.allclose(credits[layer], want, rtol=1e-10, atol=1e-15), layer
        assert want.abs().max() > 0


def test_credit_bridge_warmup_uses_dfa_credit_then_value_gradient():
    model = mlp()
    rule = rule_for(model, "credit-bridge", warmup_fraction=0.4)
    dfa = rule_for(model, "dfa")
    assert isinstance(dfa, DFA)
    x, y = batch()
    # same seed → the warm-up feedback is DFA's own
    assert all(torch.equal(a, b) for a, b in zip(rule.warmup_feedback, dfa.feedback))
    assert rule.in_warmup()
    for a, b in zip(rule.credits(x, y), dfa.credits(x, y)):
        assert torch.allclose(a, b.double(), rtol=1e-6)
    assert rule.end_epoch(1, 5)["bridge_warmup"] == 0.0  # nothing trained this epoch
    assert rule.in_warmup()  # ceil(0.4 × 5) = 2 warm-up epochs
    rule.end_epoch(2, 5)
    assert not rule.in_warmup()
    states, logits = model.forward_states(x)
    e = output_error(logits.detach(), y).double()
    h = states[1].detach().requires_grad_(True)
    (want,) = torch.autograd.grad(rule.value(h, 1, e).mean(), h)
    assert torch.allclose(rule.credits(x, y)[1], want, rtol=1e-10)
    never = rule_for(model, "credit-bridge", warmup_fraction=0.0)
    assert not never.in_warmup()


def test_soft_min_between_min_and_mean():
    v = torch.tensor([[0.3], [1.0], [2.5]], dtype=F64)
    assert float(soft_min(v, 1e-4)) == pytest.approx(0.3, abs=1e-3)
    assert float(soft_min(v, 1e4)) == pytest.approx(float(v.mean()), abs=1e-3)
    mid = float(soft_min(v, 0.5))
    assert 0.3 < mid < float(v.mean())
    want = -0.5 * float(torch.log(torch.exp(-v / 0.5).mean()))
    assert mid == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("temperature", [2.0, 1e3, 1e5, 1e8, 1e30])
def test_soft_min_at_a_large_temperature_is_the_mean_in_float32(temperature):
    """τ → ∞ gives the mean, and the float32 targets must say so: written directly, the
    log of the mean cancels against log K and leaves rounding × τ (0.03 at τ = 1e5, 2.5 at
    1e8 on values ≈ 2). |softmin − mean| ≤ spread²/(2τ) bounds how far the exact value is."""
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(8, 256, generator=generator) * 0.5 + 2.0
    got = soft_min(v, temperature)
    exact = soft_min(v.double(), temperature)
    mean = v.double().mean(dim=0)
    spread = float((v.amax(dim=0) - v.amin(dim=0)).max())
    assert got.dtype == torch.float32
    assert float((got - exact).abs().max()) < 1e-6
    assert float((exact - mean).abs().max()) <= spread ** 2 / (2 * temperature) + 1e-12


@pytest.mark.parametrize("copies,temperature", [(1, 1e-3), (1, 0.1), (3, 0.1), (3, 5.0)])
def test_noiseless_or_single_copy_targets_are_the_target_value_whatever_k_and_tau(
        copies, temperature):
    """With bridge_noise=0 every copy is h_{l+1}, and one copy is one value: the soft-min
    target is V̄(h_{l+1}) itself (to rounding) whatever K and τ, so a K or τ set there
    changes nothing and is refused, naming why (a sweep leaves it out of those runs)."""
    model = mlp()
    noiseless = rule_for(model, "credit-bridge", bridge_noise=0.0)
    noiseless.options = dataclasses.replace(noiseless.options, bridge_copies=copies,
                                            bridge_temperature=temperature)
    randomise(noiseless.target)
    x, y = batch()
    states = [h.detach() for h in model.forward_states(x)[0]]
    e = error_of(model, x, y).double()
    layers = torch.arange(1, model.n_blocks + 1).repeat_interleave(x.shape[0])
    with torch.no_grad():
        value = noiseless.target(torch.cat(states[1:]), layers, e.repeat(model.n_blocks, 1))
    targets = noiseless.consistency_targets(states, e)
    assert torch.allclose(targets, value, rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="method.bridge_copies=3 has no effect .* with "
                                          r"method.bridge_noise=0 every copy is h_\{l\+1\}"):
        rule_for(model, "credit-bridge", bridge_noise=0.0, bridge_copies=3)
    with pytest.raises(ConfigError, match="method.bridge_temperature=5.0 has no effect .* "
                                          "with method.bridge_copies=1 the soft-min target is "
                                          "over one value"):
        rule_for(model, "credit-bridge", bridge_copies=1, bridge_temperature=5.0)
    rule_for(model, "credit-bridge", bridge_copies=3, bridge_temperature=5.0)  # both read


def test_credit_bridge_consistency_targets_use_rule_noise():
    model = mlp()
    rule = rule_for(model, "credit-bridge", bridge_copies=5, bridge_noise=0.2)
    randomise(rule.target)
    x, y = batch()
    states, _ = model.forward_states(x)
    states = [h.detach() for h in states]
    e = error_of(model, x, y).double()
    rng = torch.get_rng_state()
    replay = torch.Generator().set_state(rule.generator.get_state())
    targets = rule.consistency_targets(states, e)
    assert torch.equal(torch.get_rng_state(), rng)  # never the global stream
    nxt = torch.cat(states[1:])
    noise = torch.randn((5, *nxt.shape), generator=replay, dtype=F64)
    sigma = 0.2 * nxt.pow(2).mean(1).sqrt()
    layers = torch.arange(1, model.n_blocks + 1).repeat_interleave(x.shape[0])
    values = torch.stack([rule.target(nxt + sigma[:, None] * noise[k], layers,
                                      e.repeat(model.n_blocks, 1)) for k in range(5)])
    assert torch.allclose(targets, soft_min(values, rule.options.bridge_temperature),
                          rtol=1e-10)
    assert torch.equal(rule.generator.get_state(), replay.get_state())


def test_credit_bridge_fit_updates_ema_target():
    model = mlp()
    rule = rule_for(model, "credit-bridge", ema_decay=0.9)
    x, y = batch(n=16)
    states, logits = model.forward_states(x)
    states = [h.detach() for h in states]
    target_before = [p.clone() for p in rule.target.parameters()]
    rule.fit_value(states, error_of(model, x, y), y, logits.detach())
    for p_bar, before, p in zip(rule.target.parameters(), target_before,
                                rule.value.parameters()):
        assert torch.allclose(p_bar, 0.9 * before + 0.1 * p, rtol=1e-12, atol=1e-15)
    assert all(p.grad is None for p in model.parameters())


def test_credit_bridge_learns_terminal_gradient_direction():
    """Terminal matching: cos(∇_{h_L}V, ∂CE/∂h_L) rises from ~0 on a fixed batch."""
    model = mlp(d=8)
    rule = rule_for(model, "credit-bridge", bridge_lr=3e-3)
    x, y = batch(n=32)
    states, logits = model.forward_states(x)
    states = [h.detach() for h in states]
    e = error_of(model, x, y).double()
    for _ in range(150):
        rule.fit_value(states, e, y, logits.detach())
    cos = rule.value_losses(states, e, y, logits.detach())["terminal_cos"]
    assert float(cos) > 0.8


# --- locality of the block updates --------------------------------------------------------
@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_block_update_depends_only_on_its_own_credit(name, layer):
    x, y = batch()

    def grads(scale_others: float, zero_own: bool) -> dict[str, Tensor | None]:
        model = mlp()
        rule = rule_for(model, name, warmup_fraction=0.0)
        original = rule.step_credits

        def patched(states, e, y_):
            credits = [a * scale_others for a in original(states, e, y_)]
            if zero_own:
                credits[layer + 1] = torch.zeros_like(credits[layer + 1])
            return credits

        rule.step_credits = patched
        return block_grads_after_step(rule, x, y)

    base, flipped, zeroed = grads(1.0, False), grads(-1.0, False), grads(1.0, True)
    prefix = f"blocks.{layer}."
    for key, g in zeroed.items():
        if key.startswith(prefix):
            assert g is not None and torch.count_nonzero(g) == 0, key
        elif key.startswith("blocks.") or key.startswith("out_"):
            assert g is not None and torch.equal(g, base[key]), key
    for key, g in flipped.items():
        if key.startswith("blocks.") or key.startswith("embed."):  # credit sign → update sign
            assert torch.allclose(g, -base[key], rtol=1e-12, atol=1e-15), key


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
@pytest.mark.parametrize("penalty", [0.0, 0.05])
def test_block_gradient_is_the_local_surrogate(name, penalty):
    """Block l's gradient = ∇⟨f_l(h_l), â_{l+1}⟩ + λ∇‖f_l‖² with the rule's own credit."""
    model = mlp()
    rule = rule_for(model, name, warmup_fraction=0.0, penalty=penalty)
    x, y = batch()
    reference = copy.deepcopy(model)
    states, _ = reference.forward_states(x)
    credits = rule.credits(x, y)
    got = block_grads_after_step(rule, x, y)
    for index, block in enumerate(reference.blocks):
        f = block(states[index].detach())
        local = (f * rms_normalise(credits[index + 1])).sum(1).mean()
        local = local + penalty * f.pow(2).sum(1).mean()
        names = [n for n, _ in block.named_parameters()]
        for n, g in zip(names, torch.autograd.grad(local, list(block.parameters()))):
            assert torch.allclose(got[f"blocks.{index}.{n}"], g, rtol=1e-9, atol=1e-15), n
    # the readout: its exact local CE only (the bridge credit's graph never reaches it)
    readout = [reference.out_ln.weight, reference.out_ln.bias, reference.out_head.weight,
               reference.out_head.bias]
    ce = F.cross_entropy(reference.readout(states[-1].detach()), y)
    for n, g in zip(["out_ln.weight", "out_ln.bias", "out_head.weight", "out_head.bias"],
                    torch.autograd.grad(ce, readout)):
        assert torch.allclose(got[n], g, rtol=1e-12, atol=1e-16), n


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_zero_credit_leaves_only_the_penalty(name):
    model = mlp()
    rule = rule_for(model, name, warmup_fraction=0.0, penalty=0.1)
    rule.step_credits = lambda states, e, y: [torch.zeros_like(h) for h in states]
    x, y = batch()
    reference = copy.deepcopy(model)
    states, _ = reference.forward_states(x)
    got = block_grads_after_step(rule, x, y)
    for index, block in enumerate(reference.blocks):
        penalty = 0.1 * block(states[index].detach()).pow(2).sum(1).mean()
        for (n, _), g in zip(block.named_parameters(),
                             torch.autograd.grad(penalty, list(block.parameters()))):
            assert torch.allclose(got[f"blocks.{index}.{n}"], g, rtol=1e-9, atol=1e-15)
    assert torch.count_nonzero(got["embed.weight"]) == 0
    assert torch.count_nonzero(got["out_head.weight"]) > 0  # readout: exact local CE


# --- persistence --------------------------------------------------------------------------
def roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def assert_nested_equal(a, b, path: str = "") -> None:
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_nested_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            assert_nested_equal(u, v, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_state_dict_round_trip_restores_aux_nets_optimisers_and_generator(name):
    x, y = batch(n=16)
    model = mlp()
    rule = rule_for(model, name, warmup_fraction=0.2)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    for _ in range(3):
        rule.train_step(x, y, optimizer)
    rule.end_epoch(1, 10)
    rule.train_step(x, y, optimizer)
    saved = roundtrip(rule.state_dict())
    # a fresh rule with another seed, on a copy of the model, then restored
    twin_model = copy.deepcopy(model)
    twin = rule_for(twin_model, name, seed=99, warmup_fraction=0.2)
    twin.load_state_dict(saved)
    assert_nested_equal(twin.state_dict(), rule.state_dict())
    twin_optimizer = torch.optim.AdamW(twin.trainable_parameters(), lr=1e-3)
    twin_optimizer.load_state_dict(roundtrip(optimizer.state_dict()))  # no shared moments
    # both continue identically: aux nets, their optimisers and the noise stream agree
    for _ in range(2):
        rule.train_step(x, y, optimizer)
        twin.train_step(x, y, twin_optimizer)
    assert_nested_equal(twin.state_dict(), rule.state_dict())
    for p, q in zip(model.parameters(), twin_model.parameters()):
        assert torch.equal(p, q)
    aux = "predictor" if name == "state-bridge" else "value"
    assert saved[aux].keys() == getattr(rule, aux).state_dict().keys()
    assert saved["optimizer"]["state"], "optimiser moments are saved"
    if name == "credit-bridge":
        assert {"target", "warmup_feedback", "generator", "epochs_done"} <= saved.keys()
        assert twin.epochs_done == 1 and twin.n_epochs == 10


# --- resume in the real training loop -----------------------------------------------------
TINY_RUN = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "model.d": 16,
    "model.n_blocks": 2, "optim.epochs": 3, "optim.batch_size": 64,
    "diagnostics.eval_samples": 128, "run.progress": False, "method.bridge_hidden": HIDDEN,
}  # credit bridge: default warm-up ceil(0.2 × 3) = epoch 1, so the resume crosses the switch


def tiny_run(out_dir: Path, method: str) -> RunConfig:
    return RunConfig().replace(**{**TINY_RUN, "method.name": method, "run.out_dir": str(out_dir)})


def killed_and_resumed(config: RunConfig, kill_run_at) -> dict:
    kill_run_at(config)
    run_dir = Path(config.run.out_dir) / run_id(config)
    assert load_record(run_dir).status == "interrupted"
    return train(config, resume=True).record.to_dict()


@pytest.mark.parametrize("method", ["state-bridge", "credit-bridge"])
def test_killed_and_resumed_run_equals_uninterrupted(tmp_path, kill_run_at, method):
    straight = train(tiny_run(tmp_path / "a", method))
    resumed = killed_and_resumed(tiny_run(tmp_path / "b", method), kill_run_at)
    assert straight.status == resumed["status"] == "completed"

    def semantic(record):
        out = copy.deepcopy(comparable(record))
        out["config"]["run"].pop("out_dir", None)
        return out

    assert semantic(resumed) == semantic(straight.record)
    key = "state_pred_error" if method == "state-bridge" else "bridge_consistency_error"
    assert all(entry.value(key) is not None for entry in straight.record.log[1:])
    if method == "credit-bridge":
        assert [e.value("bridge_warmup") for e in straight.record.log[1:]] == [1.0, 0.0, 0.0]
    a = torch.load(straight.run_dir / CHECKPOINT_FILE, weights_only=False)
    b = torch.load(tmp_path / "b" / straight.record.run_id / CHECKPOINT_FILE,
                   weights_only=False)
    assert_nested_equal(a["model"], b["model"])
    assert_nested_equal(a["rule"], b["rule"])


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_a_training_step_is_one_step_of_the_auxiliary_net(name):
    """One AdamW step of ψ / φ per batch and, for the Credit Bridge, one EMA update of V̄:
    a step that fitted twice would train the bridge at another rate than the recorded
    bridge_lr / ema_decay, with its credits still the ones it trains on, so no conformance
    check can tell."""
    options = {"ema_decay": 0.9} if name == "credit-bridge" else {}
    rule = rule_for(mlp(), name, **options)
    (optimizer,) = rule.optimizers().values()
    target = [p.clone() for p in rule.target.parameters()] if name == "credit-bridge" else []
    x, y = batch()
    assert rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0)).finite
    assert {float(state["step"]) for state in optimizer.state.values()} == {1.0}
    if target:
        for p_bar, before, p in zip(rule.target.parameters(), target, rule.value.parameters()):
            assert torch.allclose(p_bar, 0.9 * before + 0.1 * p, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", ["state-bridge", "credit-bridge"])
def test_building_a_bridge_leaves_the_cuda_random_streams_alone(method, monkeypatch):
    """Its auxiliary nets are initialised under a fork of the CPU stream only; reseeding with
    torch.manual_seed inside it also reseeded every CUDA stream, which no fork put back (a
    GPU run's CUDA draws then followed the bridge's seed). Without a GPU: no CUDA seeding is
    asked for at all, and the CPU stream is left as it was."""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: seeded.append(seed))
    torch.manual_seed(0)
    model = ResidualMLP(8, 16, 4, 2)
    seeded.clear()
    before = torch.get_rng_state()
    build_rule(model, MethodConfig(name=method), n_classes=4, seed=1)
    assert seeded == []
    assert torch.equal(torch.get_rng_state(), before)
