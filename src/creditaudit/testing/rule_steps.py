"""The conformance checks of what a rule's training step does beside computing its update:
what it reports of the batch, how it applies the optimizer, and whether the feedback it
calls fixed stays fixed. One function each, like :mod:`creditaudit.testing.rule_properties`:
``check(RuleClass, arch)`` returns when the rule conforms on the tiny architecture ``arch``
and raises AssertionError saying what is wrong otherwise.

A run records the training loss and accuracy the step reports, trains with the optimizer
(and the schedule) it hands the step, and re-draws "fixed" feedback for the fresh-feedback
null of (b): a rule that misreports the batch, steps twice, changes the optimizer's settings
or learns (or re-draws) its fixed feedback would leave every number recorded and still pass
the checks of the credit itself.

The readout trains on its exact cross-entropy in every rule (science.md; EP, the feedback
rules and the local ones alike); the checks of the blocks' updates leave it out, and the
surrogate check covers it for local rules only. :func:`readout_trains_on_its_cross_entropy`
holds the output layer — the ``nn.Linear`` whose output is the logits — of every rule to it:
its weight gradient is ∂CE/∂logits ⊗ its input whatever feedback the rule sends further
down, so it is exact for every built-in (a terminal LayerNorm below it is not: a
linear-feedback rule sends it the error through a feedback matrix).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.base import CreditRule, StepResult
from creditaudit.testing.common import (
    TOLERANCE,
    flat_state,
    moved_rngs,
    relative_error,
    same,
    tiny_batch,
    watched_global_rngs,
)
from creditaudit.testing.rule_binding import make_rule
from creditaudit.testing.rule_properties import REAL_STEP_LR, warmed_up

# Relative tolerance of the reported loss against the cross-entropy of the step's own
# forward pass, in float64 (a rule may order the forward's sums its own way).
LOSS_TOLERANCE = 1e-9
# Relative tolerance of an SGD step's change against −lr·grad, in float64.
STEP_TOLERANCE = 1e-12


def _modes(model: nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


def step_reports_its_batch(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    rule.model.train()  # as the trainer steps
    with torch.no_grad():  # the forward the step makes, on a copy (BatchNorm statistics)
        logits = copy.deepcopy(rule.model).forward_states(x)[1].to(torch.float64)
    want_loss = float(F.cross_entropy(logits, y))
    want_correct = int((logits.argmax(dim=1) == y).sum())
    x_before, y_before, modes = x.clone(), y.clone(), _modes(rule.model)
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=0.0)
    with watched_global_rngs() as rngs:
        result = rule.train_step(x, y, optimizer)
        moved = moved_rngs(rngs)
    assert not moved, (
        f"train_step() moved or reseeded {' and '.join(moved)} global RNG: a user's network "
        "draws its dropout from it, so the rule's draws or seeds would change them (a "
        "reseed repeats one mask every step) — draw from the generator the rule is given")
    assert isinstance(result, StepResult), \
        f"train_step() returned a {type(result).__name__}, not a StepResult"
    assert torch.equal(x, x_before), \
        "train_step() changed its input batch in place (the run's data would change with it)"
    assert torch.equal(y, y_before), "train_step() changed the batch's labels in place"
    changed = [name or "the model" for name, training in _modes(rule.model).items()
               if modes.get(name) != training]
    assert not changed, (f"train_step() left {', '.join(changed[:3])} in another "
                         "train/eval mode than it found (the rest of the epoch would train "
                         "in that mode)")
    assert result.n == y.shape[0], \
        f"train_step() reports n={result.n} for a batch of {y.shape[0]}"
    assert result.correct == want_correct, (
        f"train_step() reports {result.correct} correct where the model's logits classify "
        f"{want_correct} of {y.shape[0]} correctly (the run records it as training accuracy)")
    assert math.isfinite(result.loss) and result.finite, \
        f"train_step() reports loss {result.loss} (finite={result.finite}) on a tiny net"
    error = abs(result.loss - want_loss) / max(abs(want_loss), 1e-300)
    assert error < LOSS_TOLERANCE, (
        f"train_step() reports loss {result.loss:.12g} where the cross-entropy of the "
        f"model's logits is {want_loss:.12g} (the run records it as training loss)")


def _settings(optimizer: torch.optim.Optimizer) -> list[dict[str, object]]:
    """Each param group's hyperparameters (lr, weight decay, momentum, …) and the ids of
    its parameters, in order."""
    return [{key: ([id(p) for p in value] if key == "params" else copy.deepcopy(value))
             for key, value in group.items()} for group in optimizer.param_groups]


def step_is_one_optimizer_step(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    before = {name: p.detach().clone() for name, p in rule.model.named_parameters()}
    optimizer = torch.optim.SGD(rule.trainable_parameters(), lr=REAL_STEP_LR)
    settings = _settings(optimizer)
    assert rule.train_step(x, y, optimizer).finite, \
        "a training step on a tiny float64 net was not finite"
    _same_settings(settings, _settings(optimizer))
    for name, p in rule.model.named_parameters():
        moved = p.detach() - before[name]
        if p.grad is None:
            assert torch.equal(moved, torch.zeros_like(moved)), (
                f"train_step() changed {name}, which has no gradient: it writes weights "
                "beside the optimizer step (train them through the optimizer it is handed)")
            continue
        want = -REAL_STEP_LR * p.grad
        error = float((moved - want).abs().max()) / max(float(want.abs().max()), 1e-300)
        assert error < STEP_TOLERANCE, (
            f"one training step with SGD (lr {REAL_STEP_LR}) moves {name} by "
            f"{_ratio(moved, want)} its −lr·gradient: the step must apply the optimizer it "
            "is handed once, to the gradients it leaves (no second step, no own update)")
    _keeps_optimizer_state(cls, arch)


def _keeps_optimizer_state(cls: type[CreditRule], arch: str) -> None:
    """AssertionError when a second step with AdamW moves a parameter whose optimizer
    state did not carry over from the first (its step count not one more): a step that
    clears or replaces the optimizer's state trains with moments restarted every batch while
    the record says AdamW."""
    rule = make_rule(cls, arch=arch)
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3)
    assert rule.train_step(*tiny_batch(seed=0, arch=arch), optimizer).finite
    counts = {id(p): _step_count(optimizer, p) for p in rule.trainable_parameters()}
    before = {id(p): p.detach().clone() for p in rule.trainable_parameters()}
    assert rule.train_step(*tiny_batch(seed=1, arch=arch), optimizer).finite
    names = {id(p): name for name, p in rule.model.named_parameters()}
    for p in rule.trainable_parameters():
        if torch.equal(p.detach(), before[id(p)]):
            continue  # not stepped this time (no gradient)
        was, now = counts[id(p)], _step_count(optimizer, p)
        assert now == was + 1, (
            f"a second training step with AdamW moved "
            f"{names.get(id(p), f'a parameter of shape {tuple(p.shape)}')} with the "
            f"optimizer's step count going from {was} to {now}: train_step() cleared or "
            "replaced the optimizer's state, so its moments restart every batch while the "
            "run records the optimizer of its config (leave optimizer.state alone)")


def _step_count(optimizer: torch.optim.Optimizer, p: Tensor) -> int:
    """How many steps ``optimizer`` has taken on ``p`` (its state's ``step``; 0 for none)."""
    step = optimizer.state.get(p, {}).get("step", 0)
    return int(step.item() if isinstance(step, Tensor) else step)


def _same_settings(before: list[dict[str, object]], after: list[dict[str, object]]) -> None:
    """AssertionError naming the first optimizer setting a training step changed."""
    assert len(after) == len(before), (
        f"train_step() changed the optimizer's param groups ({len(before)} before, "
        f"{len(after)} after): the run's optimizer and schedule own them; train the rule's "
        "own parts with an optimizer of its own (optimizers())")
    for index, (was, now) in enumerate(zip(before, after)):
        for key in dict.fromkeys([*was, *now]):
            if key not in was or key not in now or not same(was[key], now[key]):
                change = ("the parameters" if key == "params" else
                          f"{key!r} ({was.get(key, 'absent')!r} -> {now.get(key, 'absent')!r})")
                raise AssertionError(
                    f"train_step() changed {change} of the optimizer's param group {index}: "
                    "the run records the optimizer settings of its config and its schedule "
                    "sets them, so leave the optimizer's settings as the step is handed them")


def _ratio(moved: Tensor, want: Tensor) -> str:
    """How far ``moved`` is from ``want``, in words (``2.000×``, or ``not a multiple of``)."""
    scale = float((moved * want).sum() / (want * want).sum())
    if torch.allclose(moved, scale * want, rtol=1e-9, atol=0.0):
        return f"{scale:.3f}×"
    return "something other than a multiple of"


def _feedback_state(rule: CreditRule) -> dict[str, object]:
    """The rule's feedback as its state holds it, by dotted path: the state's ``feedback``
    entry, else the whole state."""
    state = rule.state_dict()
    return flat_state({"feedback": state["feedback"]} if "feedback" in state else state)


def fixed_feedback_stays_fixed(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    before = copy.deepcopy(_feedback_state(rule))
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-2)
    for step in range(3):  # three epochs of one step each, as the trainer ends them
        assert rule.train_step(*tiny_batch(seed=step, arch=arch), optimizer).finite
        rule.end_epoch(step + 1, 3)
    after = _feedback_state(rule)
    changed = [key for key in before if not same(before[key], after.get(key))]
    assert not changed, (
        f"the rule declares feedback_kind 'fixed_random' but training changed "
        f"{', '.join(changed[:3])} (in train_step or end_epoch): the fresh-feedback null "
        "would compare it with draws of its initial distribution (keep it fixed, or declare "
        "'learned')")


def _output_layer(model: nn.Module, x: Tensor) -> str | None:
    """The name of the last ``nn.Linear`` of ``model`` whose output is its logits for ``x``
    (a forward without grad; buffers may move: call it on a copy), or None."""
    outputs: dict[str, Tensor] = {}
    hooks = [module.register_forward_hook(
        lambda module, args, out, name=name: outputs.__setitem__(name, out))
        for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    try:
        with torch.no_grad():
            _, logits = model.forward_states(x)  # type: ignore[operator]
    finally:
        for hook in hooks:
            hook.remove()
    found = [name for name, out in outputs.items()
             if isinstance(out, Tensor) and out.shape == logits.shape and torch.equal(out, logits)]
    return found[-1] if found else None


def readout_trains_on_its_cross_entropy(cls: type[CreditRule], arch: str = "resmlp") -> None:
    rule = make_rule(cls, arch=arch)
    x, y = tiny_batch(arch=arch)
    rule.model.train()  # as the trainer steps
    twin = copy.deepcopy(rule.model)  # the step's forward, BatchNorm statistics kept apart
    name = _output_layer(copy.deepcopy(twin), x)
    if name is None:
        return
    params = [(key, p) for key, p in twin.get_submodule(name).named_parameters()
              if p.requires_grad]
    if not params:
        return
    with torch.enable_grad():
        _, logits = twin.forward_states(x)
        wants = torch.autograd.grad(F.cross_entropy(logits, y), [p for _, p in params])
    assert rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0)).finite, \
        "a training step on a tiny float64 net was not finite"
    layer = rule.model.get_submodule(name)
    for (key, _), want in zip(params, wants):
        grad = getattr(layer, key).grad
        error = 1.0 if grad is None else relative_error(grad, want)
        assert error < TOLERANCE, (
            f"the training step gives the output layer's {name}.{key} "
            + ("no gradient" if grad is None else f"another gradient than the batch-mean "
               f"cross-entropy's (by {error:.2e} rel.)") + ": "
            "the readout trains on its exact cross-entropy in every rule, so a head left "
            "untrained, detached or scaled would record the rule's accuracy for a network "
            "trained otherwise (train the readout on CE(readout(h_L), y))")


def embedding_trains_on_the_reported_credit(cls: type[CreditRule], arch: str = "resmlp"
                                            ) -> None:
    rule = warmed_up(cls, arch)
    x, y = tiny_batch(arch=arch)
    params = [(name, p) for name, p in rule.model.embed.named_parameters() if p.requires_grad]
    if not params or any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                         for m in rule.model.embed.modules()):
        return  # a BatchNorm's batch statistics: differentiated through (BP) or held (EP)
    twin = copy.deepcopy(rule.model)  # the step's forward, BatchNorm statistics kept apart
    assert rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0)).finite, \
        "a training step on a tiny float64 net was not finite"
    # After the step, as the blocks' check reads them: a rule that draws per step reports
    # the draw that step used.
    credit = rule.credits(x, y)[0]
    with torch.enable_grad():
        h0 = twin.forward_states(x)[0][0]  # type: ignore[operator]
        wants = torch.autograd.grad(h0, [p for _, p in twin.embed.named_parameters()
                                         if p.requires_grad], grad_outputs=credit.to(h0.dtype))
    for (name, p), want in zip(params, wants):
        # No gradient is a zero one: right where the reported a_0 implies none (a rule that
        # leaves the embedding untrained and reports a_0 = 0 says so).
        error = relative_error(torch.zeros_like(want) if p.grad is None else p.grad, want)
        assert error < TOLERANCE, (
            f"the training step gives the embedding's embed.{name} "
            + ("no gradient" if p.grad is None else
               f"another gradient than the credit it reports for h_0 implies (by {error:.2e} "
               "rel.)") + ": the audit would score a credit of state 0 the embedding does not "
            "train on (train the embedding on ∂⟨h_0, a_0⟩/∂θ, the credit credits() reports)")


__all__ = ["step_reports_its_batch", "step_is_one_optimizer_step",
           "readout_trains_on_its_cross_entropy", "embedding_trains_on_the_reported_credit",
           "fixed_feedback_stays_fixed"]
