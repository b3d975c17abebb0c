"""The checks of the rule conformance suite (:func:`~creditaudit.testing.check_rule`), one
function each: ``check(RuleClass, arch)`` returns when the rule conforms on the tiny
architecture ``arch`` and raises AssertionError saying what is wrong otherwise.
:mod:`creditaudit.testing.rules` says what each check asserts and why, when it applies, and
runs them; :func:`~creditaudit.testing.rule_binding.make_rule` binds a rule to a tiny model,
as every check does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from creditaudit.methods.base import CreditRule
from creditaudit.methods.surrogate import rms_normalise
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import block_is_trainable, split_branch
from creditaudit.testing.common import (
    BLOCKS,
    CLASSES,
    TOLERANCE,
    relative_error,
    tiny_batch,
)
from creditaudit.testing.rule_binding import checked_section, make_rule
from creditaudit.testing.rule_state import (
    assert_left_alone,
    rule_snapshot,
)


def _zero_lr_step(rule: CreditRule, x: Tensor, y: Tensor) -> None:
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    result = rule.train_step(x, y, optimizer)
    assert result.finite, "a training step on a tiny float64 net was not finite"


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
    # A batch of one sample, in eval mode as the diagnostics call credits(): an evaluation
    # set's last chunk may hold one sample, and a squeeze() that drops its batch dimension
    # gives credits no measure can compare with the states.
    rule.model.eval()
    one = rule.credits(x[:1], y[:1])
    states, _ = rule.model.forward_states(x[:1])
    assert len(one) == len(states), \
        f"credits() returned {len(one)} credits for {len(states)} states of a batch of one"
    for layer, (a, h) in enumerate(zip(one, states)):
        assert isinstance(a, Tensor) and tuple(a.shape) == tuple(h.shape), (
            f"for a batch of one sample credit {layer} has shape "
            f"{tuple(a.shape) if isinstance(a, Tensor) else type(a).__name__}, its state "
            f"{tuple(h.shape)} (a squeeze() or a reshape by the batch size drops its batch "
            "dimension): keep every credit shaped like its state whatever the batch size")


def credits_have_no_side_effects(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    _zero_lr_step(rule, x, y)  # a rule with auxiliary nets has trained state from here on
    for p in rule.model.parameters():
        p.grad = None
    rule.model.eval()  # as every diagnostic calls credits()
    before = rule_snapshot(rule)
    rng = torch.get_rng_state()
    first = rule.credits(x, y)
    second = rule.credits(x, y)
    assert torch.equal(torch.get_rng_state(), rng), \
        "credits() moved the global torch RNG (use a generator of the rule's own)"
    assert not rule.model.training, "credits() put the model in training mode"
    assert_left_alone(rule, before, "credits()")
    for layer, (a, b) in enumerate(zip(first, second)):
        assert torch.equal(a, b), f"two calls of credits() differ at state {layer}"


def _surrogate_gradients(rule: CreditRule, x: Tensor, y: Tensor, credits: list[Tensor]
                         ) -> dict[str, Tensor | None]:
    """The parameter gradients of the local surrogate for ``credits`` (see :mod:`.rules`)."""
    model = copy.deepcopy(rule.model)
    for p in model.parameters():
        p.grad = None
    normalise = rms_normalise if rule.options.normalise_credit else (lambda a: a)
    if isinstance(model, AdaptedModel):
        return _adapted_surrogate_gradients(model, x, y, [normalise(a) for a in credits])
    penalty = rule.options.penalty  # λ·batch-mean ‖f_l‖² per trained block
    h0 = model.embed(x)
    states, _ = model.forward_states(x)
    objective = (h0 * normalise(credits[0])).flatten(1).sum(1).mean()
    for layer, block in enumerate(model.blocks):
        if any(p.requires_grad for p in block.parameters()):
            f = block(states[layer].detach())
            objective = objective + (f * normalise(credits[layer + 1])).flatten(1).sum(
                1).mean() + penalty * f.flatten(1).pow(2).sum(1).mean()
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


# The batches (tiny_batch seeds) a rule trains on before the checks of what its step trains
# on, whose step is on tiny_batch(): other batches than the checked one.
WARM_UP_BATCHES = (2, 3)


def warmed_up(cls: type[CreditRule], arch: str = "resmlp", **options: Any) -> CreditRule:
    """A fresh rule of ``cls`` after two AdamW steps on other batches than ``tiny_batch()``.

    Learned feedback may start degenerate (local-ce's zero classifiers give zero credits,
    which any step matches), and a step that trains on a credit it kept from an earlier step
    or batch, or that trains on its reported credit only on its first step (a step count
    that flips or rescales an update from the second on), matches only on its first step.
    """
    rule = make_rule(cls, arch=arch, **options)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-2)
    for seed in WARM_UP_BATCHES:
        assert rule.train_step(*tiny_batch(seed=seed, arch=arch), optimizer).finite
    # The checked step's gradients alone: one the optimizer is not handed (credited_parts_are_
    # trained names that) would otherwise hold the warm-up's too.
    rule.model.zero_grad(set_to_none=True)
    return rule


def local_update_is_the_surrogate_gradient(cls: type[CreditRule], arch: str = "resmlp",
                                           **options: Any) -> None:
    rule = warmed_up(cls, arch, **options)
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


# The settings local_update_follows_its_options checks the step under: a penalty λ, the
# other normalisation than the one under check, and the first block frozen (the depth ladder's
# and (d)'s partly trainable networks).
OPTIONS_PENALTY = 0.01
OPTIONS_TRAINABLE_BLOCKS = BLOCKS - 1


def local_update_follows_its_options(cls: type[CreditRule], arch: str = "resmlp") -> None:
    checked = checked_section(cls)
    options: dict[str, Any] = {"penalty": OPTIONS_PENALTY,
                               "normalise_credit": not checked.normalise_credit,
                               "trainable_blocks": OPTIONS_TRAINABLE_BLOCKS}
    ignored = cls.ignored_options(checked_section(cls, **options))
    options = {key: value for key, value in options.items() if key not in ignored}
    try:
        local_update_is_the_surrogate_gradient(cls, arch, **options)
    except AssertionError as err:
        shown = ", ".join(f"method.{key}={value}" for key, value in options.items())
        raise AssertionError(
            f"with {shown}: {err} — the step must follow the options its run records "
            "(the residual-branch penalty λ·mean_b‖f_l‖² on every trained block, the credit "
            "normalised or not as normalise_credit says, each trained block on its own "
            "state's credit when blocks before it are frozen)") from None


def trained_for_credits(cls: type[CreditRule], arch: str = "resmlp") -> CreditRule:
    """A fresh rule of ``cls`` after two training steps (learned feedback may start at zero
    credits), in eval mode as every diagnostic calls ``credits()``: the rule whose credits
    of ``tiny_batch(seed=3)`` the per-sample checks compare."""
    rule = make_rule(cls, arch=arch)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-2)
    for seed in (1, 2):
        assert rule.train_step(*tiny_batch(seed=seed, arch=arch), optimizer).finite
    rule.model.eval()
    return rule


def credits_are_per_sample(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = trained_for_credits(cls, arch)
    x, y = tiny_batch(seed=3, arch=arch)
    credits = rule.credits(x, y)
    # The first sample replaced by another input with another label: the others' credits
    # (each an estimate of its own sample's gradient) must not move.
    other_x, other_y = x.clone(), y.clone()
    other_x[0] = tiny_batch(seed=4, arch=arch)[0][0]
    other_y[0] = (y[0] + 1) % CLASSES
    for layer, (a, b) in enumerate(zip(credits, rule.credits(other_x, other_y))):
        error = relative_error(b[1:], a[1:])
        assert error < TOLERANCE, (
            f"replacing the batch's first sample changes the other samples' credit {layer} "
            f"(by {error:.2e} rel.): a sample's credit mixes in another sample's input or "
            "label, so the audit would compare it with a gradient it is not an estimate of "
            "(index every per-sample signal by the sample it belongs to)")


def credits_are_seeded(cls: type[CreditRule], arch: str = "resmlp") -> None:
    def trained(draw: int) -> list[Tensor]:
        rule = make_rule(cls, arch=arch, draw=draw)
        x, y = tiny_batch(arch=arch)
        optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=REAL_STEP_LR)
        assert rule.train_step(x, y, optimizer).finite, \
            "a training step on a tiny float64 net was not finite"
        return rule.credits(x, y)

    first, again = trained(7), trained(7)
    for layer, (a, b) in enumerate(zip(first, again)):
        assert torch.equal(a, b), (
            f"two rules made with one seed and stepped alike give other credits at state "
            f"{layer}: the rule draws from something other than the generator it is given "
            "(the same seed must give the same record)")
    if cls.draws_feedback():
        other = trained(8)
        assert any(not torch.equal(a, b) for a, b in zip(first, other)), (
            "the rule declares method.feedback_seed, but another seed gives the same credits "
            "after a step: it does not draw its feedback from the generator it is given, so "
            "runs of different feedback seeds would repeat one draw")


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


def output_layer_errors(rule: CreditRule, x: Tensor, y: Tensor, *, weights: bool = True
                        ) -> dict[str, float]:
    """After one zero-lr step on ``(x, y)``: for each trainable block whose branch ends in one
    ``nn.Linear``, the relative error of that layer's weight and bias gradients against
    Σ_b a_{l+1,b} ⊗ u_b and Σ_b a_{l+1,b} (see ``blocks_train_on_the_reported_credit``),
    by parameter name; 1.0 for a gradient the step left out. ``weights=False``: the biases
    only."""
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
            wants = [(last.weight, torch.einsum("...o,...i->oi", a, u))] if weights else []
            if last.bias is not None:
                wants.append((last.bias, a.reshape(-1, a.shape[-1]).sum(0)))
            for param, want in wants:
                if param.requires_grad:
                    errors[names[id(param)]] = (1.0 if param.grad is None
                                                else relative_error(param.grad, want))
    return errors


def blocks_train_on_the_reported_credit(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = warmed_up(cls, arch)
    errors = output_layer_errors(rule, *tiny_batch(arch=arch))
    wrong = {name: error for name, error in errors.items() if not error < TOLERANCE}
    assert not wrong, (
        "the training step does not train the blocks with the credit the rule reports: "
        + ", ".join(f"{name} differs from Σ_b a ⊗ u by {error:.2e} (rel.)"
                    for name, error in list(wrong.items())[:3]))


def block_biases_train_on_the_reported_credit(cls: type[CreditRule], arch: str = "resmlp"
                                              ) -> None:
    rule = warmed_up(cls, arch)
    errors = output_layer_errors(rule, *tiny_batch(arch=arch), weights=False)
    wrong = {name: error for name, error in errors.items() if not error < TOLERANCE}
    assert not wrong, (
        "the training step does not train the blocks with the credit the rule reports: "
        + ", ".join(f"{name} differs from Σ_b a by {error:.2e} (rel.)"
                    for name, error in list(wrong.items())[:3])
        + " (a bias gradient is the credit summed over the batch, whatever the states the "
        "step reads)")


def _parts(model: Any) -> list[tuple[str, list[Tensor], int]]:
    """(name, parameters, index of the state it writes) of each part a rule trains with a
    credit: the embedding and every block (an adapted model's segments)."""
    if isinstance(model, AdaptedModel):
        return [(f"segment {layer}", model.segment_parameters(layer), layer)
                for layer in range(model.n_blocks + 1)]
    return [("the embedding", list(model.embed.parameters()), 0),
            *((f"blocks[{i}]", list(block.parameters()), i + 1)
              for i, block in enumerate(model.blocks))]


# A real step's learning rate: on the tiny float64 networks SGD with it changes every weight
# tensor whose gradient is not zero (a tensor stays put only if |lr·g| < 1e-16·|w| everywhere).
REAL_STEP_LR = 0.1


def credited_parts_are_trained(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    _zero_lr_step(rule, x, y)
    credits = rule.credits(x, y)  # after the step, as output_layer_errors reads them
    credited = []
    for name, params, state in _parts(rule.model):
        trainable = [p for p in params if p.requires_grad]
        if not trainable or not bool(credits[state].abs().max() > 0):
            continue
        assert any(_has_gradient(p) for p in trainable), (
            f"the rule reports a non-zero credit for state {state}, but its training step "
            f"gives {name}, which writes that state, no gradient: the audit would score a "
            "credit that trains nothing (freeze the part, or train it with its credit)")
        credited.append((name, trainable, state))
    _real_step_moves(rule, x, y, credited)


def _has_gradient(p: Tensor) -> bool:
    return p.grad is not None and bool(p.grad.abs().max() > 0)


def _real_step_moves(rule: CreditRule, x: Tensor, y: Tensor,
                     credited: list[tuple[str, list[Tensor], int]]) -> None:
    """One step with a fresh ``SGD(rule.trainable_parameters(), lr=REAL_STEP_LR)``: every
    parameter of a credited part the step gives a non-zero gradient must move. Gradients
    alone do not show training: an optimizer never handed the parameter, a step that is
    skipped or whose update is undone, leave ``.grad`` as backprop's and the weights at init."""
    names = {id(p): name for name, p in rule.model.named_parameters()}
    before = {id(p): p.detach().clone() for _, params, _ in credited for p in params}
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=REAL_STEP_LR)
    assert rule.train_step(x, y, optimizer).finite, \
        "a training step on a tiny float64 net was not finite"
    handed = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for part, params, state in credited:
        still = [p for p in params if _has_gradient(p) and torch.equal(p.detach(), before[id(p)])]
        if not still:
            continue
        left_out = [names[id(p)] for p in still if id(p) not in handed]
        listed = left_out or [names[id(p)] for p in still]
        shown = ", ".join(listed[:3]) + (", …" if len(listed) > 3 else "")
        why = ("trainable_parameters() leaves them out, so no optimizer updates them (return "
               "every parameter the step trains)" if left_out else
               "the step gives them a gradient but does not apply its update (call "
               "optimizer.step() after backward, and keep the weights it writes)")
        raise AssertionError(
            f"a real training step (SGD, lr {REAL_STEP_LR}) leaves {shown} of {part} "
            f"unchanged although the rule reports a non-zero credit for state {state}: {why}; "
            "the audit would score a credit that trains nothing")
