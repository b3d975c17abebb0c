"""The conformance suite of credit rules — ``check_rule(RuleClass)``.

Like scikit-learn's ``check_estimator``: it runs every check that does not depend on what the
rule computes, on tiny float64 networks of every architecture family in
:data:`~creditaudit.testing.common.TINY_ARCHS` — a ResidualMLP (states (B, d)), a ViT-Mini
(token states (B, T, d)) and a ConvMixer (feature maps (B, d, H, W), with BatchNorm), plus,
for rules that declare ``adapted_models``, two networks of :mod:`creditaudit.zoo` adapted
with :func:`creditaudit.adapt` (PyTorch's TransformerEncoder layers; a CIFAR ResNet with
BatchNorm and a strided 1×1 shortcut) — and
raises one AssertionError listing every check that failed. Use it in a rule's own tests::

    from creditaudit.testing import check_rule
    check_rule(MyRule)                         # raises AssertionError naming what failed

    @pytest.mark.parametrize("check", rule_checks(MyRule), ids=lambda c: c.id)
    def test_conformance(check):               # one test per check and architecture
        check()

A check the rule fails by design is declared, with the reason, in the class attribute
``expected_failures`` (``{check name: reason}``, or ``"name[arch]"`` for one architecture)
or the ``expected_failures`` argument: it is reported as an expected failure, and an error
once it passes.

The checks:

- ``credits_are_detached_and_shaped_like_the_states``: L + 1 finite credits, no graph, each
  shaped like its state — every diagnostic compares them with the states' gradients;
- ``credits_have_no_side_effects``: computing credits in eval mode, as every diagnostic does,
  changes no parameter, no buffer (BatchNorm statistics), no ``.grad``, no global RNG state
  and not the rule's own state, and gives the same credits twice — diagnostics must never
  change training;
- ``local_update_is_the_surrogate_gradient`` (rules with ``local = True``): after one step
  every trainable parameter's gradient equals the analytic gradient of the local surrogate —
  Σ_l ⟨f_l(h_l), â_{l+1}⟩ with h_l detached, ⟨embed(x), â_0⟩ and the readout's exact
  cross-entropy on the detached h_L, with â = a / (RMS(a) + 1e-6) of the credits the rule
  reports — so the credit the audit scores is the credit that trained the network;
- ``blocks_train_on_the_reported_credit`` (rules with ``local = False``, on architectures
  with a block whose branch ends in one ``nn.Linear``:
  :func:`~creditaudit.models.contract.split_branch`): after one zero-learning-rate step,
  that last layer's weight gradient equals Σ_b a_{l+1,b} ⊗ u_b and its bias gradient
  Σ_b a_{l+1,b} (u = the block's hidden activation ``hidden(h_l)``, a the reported credit,
  batch-mean scale, read after the step so a rule that draws its feedback per step reports
  the step's draw). This is the gradient the rule's own credit implies for that layer,
  exact for backprop and every per-layer feedback rule (their weight gradients are exact).
  A rule that reports one credit and trains its blocks with another — or not at all —
  fails it; without it the audit would score a credit that never trained anything. (EP
  declares it an expected failure: it trains at its nudged states, O(β) away);
- ``frozen_blocks_stay_untouched``: with ``trainable_blocks=1`` the other blocks keep their
  initial weights and get no gradient over several steps (the depth ladder and the (d)
  baseline rely on it);
- ``state_dict_round_trips_and_resumes``: the rule's state loads with
  ``torch.load(weights_only=True)`` (tensors and plain containers only) and a rule restored
  from it continues bit-identically, parameters and buffers — resumed runs must equal
  uninterrupted ones;
- ``moves_to_a_device``: ``rule.to(device)`` moves the model and everything the rule owns;
- ``bf16_step_is_finite``: a training step under bf16 autocast is finite and keeps fp32
  parameters;
- ``fresh_feedback_is_swappable`` (``feedback_kind == "fixed_random"``): a redraw has the
  training feedback's structure, changes the credits inside ``using_feedback`` and leaves
  them exactly as before afterwards; ``credits_under`` gives, draw by draw, the credits
  ``using_feedback`` gives (to 1e-12 in float64: an override may batch differently) — the
  fresh-feedback null swaps feedback this way.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.config import bind
from creditaudit.methods.adapted import set_trainable
from creditaudit.methods.base import CreditRule
from creditaudit.methods.registry import validate_rule_class
from creditaudit.methods.surrogate import rms_normalise
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import block_is_trainable, split_branch
from creditaudit.testing.common import (
    BLOCKS,
    CLASSES,
    F64,
    TINY_ARCHS,
    TOLERANCE,
    Check,
    Report,
    declared_failures,
    flat_state,
    reason_for,
    relative_error,
    run_checks,
    same,
    tiny_arch,
    tiny_batch,
    tiny_model,
)


def make_rule(cls: type[CreditRule], *, seed: int = 0, dtype: torch.dtype = F64,
              arch: str = "resmlp", **options: Any) -> CreditRule:
    """``cls`` bound to a fresh tiny model of ``arch`` (``options``: MethodConfig fields)."""
    model = tiny_model(seed, dtype, arch)
    config = bind(cls, "method", **options)
    set_trainable(model, config.trainable_blocks)
    return cls(model, config, n_classes=CLASSES, generator=torch.Generator().manual_seed(7))


def _zero_lr_step(rule: CreditRule, x: Tensor, y: Tensor) -> None:
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    result = rule.train_step(x, y, optimizer)
    assert result.finite, "a training step on a tiny float64 net was not finite"


def _parameters(rule: CreditRule) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in rule.model.named_parameters()}


def _buffers(rule: CreditRule) -> dict[str, Tensor]:
    return {name: b.detach().clone() for name, b in rule.model.named_buffers()}


# --- the checks ---------------------------------------------------------------------------
def credits_are_detached_and_shaped_like_the_states(cls: type[CreditRule],
                                                    arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    credits = rule.credits(x, y)
    states, _ = rule.model.forward_states(x)
    assert len(credits) == len(states) == BLOCKS + 1, \
        f"credits() returned {len(credits)} credits for {len(states)} states"
    for layer, (a, h) in enumerate(zip(credits, states)):
        assert isinstance(a, Tensor), f"credit {layer} is a {type(a).__name__}"
        assert tuple(a.shape) == tuple(h.shape), \
            f"credit {layer} has shape {tuple(a.shape)}, its state {tuple(h.shape)}"
        assert not a.requires_grad, f"credit {layer} carries an autograd graph (detach it)"
        assert bool(torch.isfinite(a).all()), f"credit {layer} is not finite"


def credits_have_no_side_effects(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    _zero_lr_step(rule, x, y)  # a rule with auxiliary nets has trained state from here on
    for p in rule.model.parameters():
        p.grad = None
    rule.model.eval()  # as every diagnostic calls credits()
    before_params, before_buffers = _parameters(rule), _buffers(rule)
    before_state = flat_state(copy.deepcopy(rule.state_dict()))
    rng = torch.get_rng_state()
    first = rule.credits(x, y)
    second = rule.credits(x, y)
    assert torch.equal(torch.get_rng_state(), rng), \
        "credits() moved the global torch RNG (use a generator of the rule's own)"
    assert not rule.model.training, "credits() put the model in training mode"
    for name, p in rule.model.named_parameters():
        assert torch.equal(p.detach(), before_params[name]), f"credits() changed {name}"
        assert p.grad is None, f"credits() left a .grad on {name}"
    for name, b in rule.model.named_buffers():
        assert torch.equal(b, before_buffers[name]), f"credits() changed the buffer {name}"
    after_state = flat_state(rule.state_dict())
    changed = [k for k in before_state if not same(before_state[k], after_state.get(k))]
    assert not changed, f"credits() changed the rule's state: {', '.join(changed[:3])}"
    for layer, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), f"two calls of credits() differ at state {layer}"


def _surrogate_gradients(rule: CreditRule, x: Tensor, y: Tensor, credits: list[Tensor]
                         ) -> dict[str, Tensor | None]:
    """The parameter gradients of the local surrogate for ``credits`` (see the module doc)."""
    model = copy.deepcopy(rule.model)
    for p in model.parameters():
        p.grad = None
    normalise = rms_normalise if rule.config.normalise_credit else (lambda a: a)
    if isinstance(model, AdaptedModel):
        return _adapted_surrogate_gradients(model, x, y, [normalise(a) for a in credits])
    h0 = model.embed(x)
    states, _ = model.forward_states(x)
    objective = (h0 * normalise(credits[0])).flatten(1).sum(1).mean()
    for layer, block in enumerate(model.blocks):
        if any(p.requires_grad for p in block.parameters()):
            f = block(states[layer].detach())
            objective = objective + (f * normalise(credits[layer + 1])).flatten(1).sum(
                1).mean()
    objective = objective + F.cross_entropy(model.readout(states[-1].detach()), y)
    objective.backward()
    return {name: None if p.grad is None else p.grad.detach().clone()
            for name, p in model.named_parameters()}


def _adapted_surrogate_gradients(model: AdaptedModel, x: Tensor, y: Tensor,
                                 directions: list[Tensor]) -> dict[str, Tensor | None]:
    """The same on an adapted model: segment l's parameters act on h_l only through
    segment l, so ⟨h_l, â_l⟩ of the plain forward gives theirs; CE the readout's."""
    states, logits = model.forward_states(x)
    names = {id(p): name for name, p in model.named_parameters()}
    out: dict[str, Tensor | None] = dict.fromkeys(names.values())
    targets = [((h * a).flatten(1).sum(1).mean(), model.segment_parameters(layer))
               for layer, (h, a) in enumerate(zip(states, directions))]
    for objective, params in [*targets, (F.cross_entropy(logits, y),
                                         model.readout_parameters())]:
        params = [p for p in params if p.requires_grad]
        grads = torch.autograd.grad(objective, params, retain_graph=True) if params else ()
        for p, g in zip(params, grads):
            total = out[names[id(p)]]
            out[names[id(p)]] = g if total is None else total + g
    return out


def local_update_is_the_surrogate_gradient(cls: type[CreditRule], arch: str = "resmlp"
                                           ) -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    credits = rule.credits(x, y)
    expected = _surrogate_gradients(rule, x, y, credits)
    _zero_lr_step(rule, x, y)
    for name, p in rule.model.named_parameters():
        want = expected[name]
        if want is None:
            assert p.grad is None or not bool(p.grad.abs().max() > 0), \
                f"{name} got a gradient the surrogate does not give it"
            continue
        assert p.grad is not None, f"{name} got no gradient from the training step"
        error = relative_error(p.grad, want)
        assert error < TOLERANCE, \
            f"{name}: the step's gradient differs from the surrogate's by {error:.2e} (rel.)"


def frozen_blocks_stay_untouched(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, trainable_blocks=1, arch=arch)
    model = rule.model
    blocks = ({id(p) for b in (1, 2) for p in model.segment_parameters(b)}
              if isinstance(model, AdaptedModel) else set())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()
              if n.startswith(("blocks.0.", "blocks.1.")) or id(p) in blocks}
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-2)
    for step in range(3):
        assert rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer).finite
    for name, p in rule.model.named_parameters():
        if name in frozen:
            assert torch.equal(p.detach(), frozen[name]), f"frozen parameter {name} changed"
            assert p.grad is None, f"frozen parameter {name} got a gradient"


def state_dict_round_trips_and_resumes(cls: type[CreditRule], arch: str = "resmlp") -> None:
    def trained(rule: CreditRule, optimizer: torch.optim.Optimizer, seeds: range) -> None:
        for seed in seeds:
            assert rule.train_step(*tiny_batch(seed=seed, arch=arch), optimizer).finite

    straight = make_rule(cls, arch=arch)
    optimizer = torch.optim.AdamW(straight.trainable_parameters(), lr=1e-2)
    trained(straight, optimizer, range(2))
    buffer = io.BytesIO()
    torch.save({"model": straight.model.state_dict(), "rule": straight.state_dict(),
                "optimizer": optimizer.state_dict(), "end_epoch": straight.end_epoch(1, 3)},
               buffer)
    buffer.seek(0)
    try:
        saved = torch.load(buffer, weights_only=True)
    except Exception as err:  # noqa: BLE001 - the message is the point
        raise AssertionError("the rule's state_dict does not load with weights_only=True "
                             f"(hold only tensors and plain containers): {err}") from None
    trained(straight, optimizer, range(2, 4))
    resumed = make_rule(cls, seed=1, arch=arch)  # other init: all must come from the file
    resumed.model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["rule"])
    resumed.end_epoch(1, 3)
    optimizer = torch.optim.AdamW(resumed.trainable_parameters(), lr=1e-2)
    optimizer.load_state_dict(saved["optimizer"])
    trained(resumed, optimizer, range(2, 4))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), f"a rule restored from its state_dict diverges at {name}"
    for (name, a), b in zip(straight.model.named_buffers(), resumed.model.buffers()):
        assert torch.equal(a, b), f"a rule restored from its state_dict diverges at {name}"
    x, y = tiny_batch(seed=9, arch=arch)
    for layer, (a, b) in enumerate(zip(straight.credits(x, y), resumed.credits(x, y))):
        assert torch.equal(a, b), f"restored rule's credit {layer} differs"


def moves_to_a_device(cls: type[CreditRule], arch: str = "resmlp") -> None:
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    for device in devices:
        assert rule.to(device) is rule, "rule.to(device) must return the rule"
        assert all(p.device.type == device.type for p in rule.model.parameters()), \
            f"rule.to({device}) left model parameters elsewhere"
        credits = rule.credits(x.to(device), y.to(device))
        assert all(a.device.type == device.type for a in credits), \
            f"credits on the wrong device after .to({device})"
    rule.to(torch.device("cpu"))


def bf16_step_is_finite(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, dtype=torch.float32, arch=arch)
    rule.set_precision("bf16", "cpu")
    x, y = tiny_batch(dtype=torch.float32, arch=arch)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    assert rule.train_step(x, y, optimizer).finite, "a bf16 training step was not finite"
    for name, p in rule.model.named_parameters():
        assert p.dtype == torch.float32, f"{name} left fp32 under bf16 autocast"
        assert bool(torch.isfinite(p).all()), f"{name} is not finite after a bf16 step"


def fresh_feedback_is_swappable(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    before = rule.credits(x, y)
    fresh = rule.draw_feedback(torch.Generator().manual_seed(123))
    trained_structure = {k: tuple(v.shape) for k, v in flat_state(
        rule.state_dict().get("feedback", {})).items() if isinstance(v, Tensor)}
    fresh_structure = {k: tuple(v.shape) for k, v in flat_state(fresh).items()
                       if isinstance(v, Tensor)}
    if trained_structure:
        assert trained_structure == fresh_structure, \
            "draw_feedback() returns another structure than the training feedback"
    with rule.using_feedback(fresh):
        swapped = rule.credits(x, y)
    assert any(not torch.equal(a, b) for a, b in zip(before, swapped)), \
        "credits inside using_feedback(fresh draw) equal the training credits"
    for layer, (a, b) in enumerate(zip(before, rule.credits(x, y))):
        assert torch.equal(a, b), f"credit {layer} changed after using_feedback returned"
    generator = torch.Generator().manual_seed(7)
    draws = [rule.draw_feedback(generator) for _ in range(3)]
    under = list(rule.credits_under(x, y, iter(draws)))
    assert len(under) == len(draws), "credits_under() yields one credit list per draw"
    for draw, credits in zip(draws, under):
        with rule.using_feedback(draw):
            want = rule.credits(x, y)
        for layer, (a, b) in enumerate(zip(credits, want)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12,
                                       msg=f"credits_under() differs at credit {layer}")
    for layer, (a, b) in enumerate(zip(before, rule.credits(x, y))):
        assert torch.equal(a, b), f"credit {layer} changed after credits_under() returned"


def output_layer_errors(rule: CreditRule, x: Tensor, y: Tensor) -> dict[str, float]:
    """After one zero-lr step on ``(x, y)``: for each trainable block whose branch ends in one
    ``nn.Linear``, the relative error of that layer's weight and bias gradients against
    Σ_b a_{l+1,b} ⊗ u_b and Σ_b a_{l+1,b} (see ``blocks_train_on_the_reported_credit``),
    by parameter name; 1.0 for a gradient the step left out."""
    _zero_lr_step(rule, x, y)
    # After the step: a rule that draws per step (brSF) reports the draw that step used.
    credits = rule.credits(x, y)
    names = {id(p): name for name, p in rule.model.named_parameters()}
    errors: dict[str, float] = {}
    with torch.no_grad():
        states, _ = rule.model.forward_states(x)
        for index, block in enumerate(rule.model.blocks):
            split = split_branch(block)
            if split is None or not block_is_trainable(block):
                continue
            hidden, last = split
            u = hidden(states[index])
            u = u[0] if isinstance(u, tuple) else u
            a = credits[index + 1].to(u.dtype)
            wants = [(last.weight, torch.einsum("...o,...i->oi", a, u))]
            if last.bias is not None:
                wants.append((last.bias, a.reshape(-1, a.shape[-1]).sum(0)))
            for param, want in wants:
                if param.requires_grad:
                    errors[names[id(param)]] = (1.0 if param.grad is None
                                                else relative_error(param.grad, want))
    return errors


def blocks_train_on_the_reported_credit(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    errors = output_layer_errors(rule, *tiny_batch(arch=arch))
    wrong = {name: error for name, error in errors.items() if not error < TOLERANCE}
    assert not wrong, (
        "the training step does not train the blocks with the credit the rule reports: "
        + ", ".join(f"{name} differs from Σ_b a ⊗ u by {error:.2e} (rel.)"
                    for name, error in list(wrong.items())[:3]))


CHECKS: tuple[Callable[..., None], ...] = (
    credits_are_detached_and_shaped_like_the_states, credits_have_no_side_effects,
    local_update_is_the_surrogate_gradient, blocks_train_on_the_reported_credit,
    frozen_blocks_stay_untouched, state_dict_round_trips_and_resumes, moves_to_a_device,
    bf16_step_is_finite, fresh_feedback_is_swappable)


def _has_split_block(arch: str) -> bool:
    model = tiny_model(arch=arch)
    if isinstance(model, AdaptedModel):  # no residual blocks to split
        return False
    return any(split_branch(block) is not None for block in model.blocks)


# When a check applies (absent: always), from what the rule declares and the architecture.
def _runs_on(cls: type[CreditRule], arch: str) -> bool:
    """Adapted networks only for rules that declare ``adapted_models``."""
    return cls.adapted_models or not tiny_arch(arch).adapted


CONDITIONS: dict[Callable[..., None], Callable[[type[CreditRule], str], bool]] = {
    local_update_is_the_surrogate_gradient: lambda cls, arch: cls.local,
    blocks_train_on_the_reported_credit:
        lambda cls, arch: not cls.local and _has_split_block(arch),
    fresh_feedback_is_swappable: lambda cls, arch: cls.feedback_kind == "fixed_random",
}


def rule_checks(cls: type[CreditRule], archs: Sequence[str] = TINY_ARCHS,
                expected_failures: Mapping[str, str] | None = None) -> list[Check]:
    """The checks that apply to ``cls``, once per tiny architecture in ``archs``: each a
    no-argument callable named like its check (``.arch`` and ``.id`` say which run it is,
    ``.expected_failure`` the reason a declared one fails). ``expected_failures``
    (``{check name: reason}``) adds to the class's own."""
    validate_rule_class(cls, cls.__qualname__)
    failures = declared_failures(cls, expected_failures, (c.__name__ for c in CHECKS))
    for arch in archs:
        tiny_arch(arch)  # ValueError naming the tiny architectures
    return [Check(check, cls, arch, variant=arch,
                  expected_failure=reason_for(failures, check, arch))
            for arch in archs for check in CHECKS
            if _runs_on(cls, arch) and CONDITIONS.get(check, lambda c, a: True)(cls, arch)]


def check_rule(cls: type[CreditRule], archs: Sequence[str] = TINY_ARCHS,
               expected_failures: Mapping[str, str] | None = None) -> Report:
    """Run every check that applies to ``cls`` on each tiny architecture in ``archs``;
    AssertionError listing every check that failed (and every declared failure that
    passed), else the :class:`~creditaudit.testing.common.Report`.

    ``expected_failures``: ``{check name: reason}`` (or ``"name[arch]"``) of checks the rule
    fails by design, merged with the class attribute ``expected_failures``; each needs a
    reason (ConfigError otherwise).
    """
    return run_checks(rule_checks(cls, archs, expected_failures), f"{cls.__name__} "
                      f"({cls.name})")


__all__ = ["check_rule", "rule_checks", "make_rule", "CHECKS", "CONDITIONS",
           "output_layer_errors"]
