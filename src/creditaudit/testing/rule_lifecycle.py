"""The rule conformance suite's checks of a rule's life around its steps, one function each
like :mod:`creditaudit.testing.rule_properties`: its state saved and restored mid-run, moved to
a device, stepped under bf16 autocast, its feedback swapped for a fresh draw, its end-of-run
metrics, and its binding to a model.
"""

from __future__ import annotations

import io

import torch
from torch import Tensor

from creditaudit.guests.returned import metrics_problem
from creditaudit.methods.base import CreditRule
from creditaudit.testing.common import (
    flat_state,
    moved_rngs,
    tiny_batch,
    watched_global_rngs,
)
from creditaudit.testing.rule_binding import make_rule
from creditaudit.testing.rule_properties import trained_for_credits
from creditaudit.testing.rule_state import (
    assert_left_alone,
    copied_buffers,
    copied_parameters,
    rule_snapshot,
)


def state_dict_round_trips_and_resumes(cls: type[CreditRule], arch: str = "resmlp") -> None:
    def trained(rule: CreditRule, optimizer: torch.optim.Optimizer, seeds: range) -> None:
        for seed in seeds:
            assert rule.train_step(*tiny_batch(seed=seed, arch=arch), optimizer).finite

    straight = make_rule(cls, arch=arch)
    optimizer = torch.optim.AdamW(straight.trainable_parameters(), lr=1e-2)
    trained(straight, optimizer, range(2))
    weights, buffers = copied_parameters(straight), copied_buffers(straight)
    straight.end_epoch(1, 3)
    _end_epoch_leaves_the_model_alone(straight, weights, buffers)
    trained(straight, optimizer, range(2, 4))
    # The state in epoch 2, before its end_epoch, copied (state_dict() shares the live
    # tensors): both rules end epoch 2 from it, so a resumed rule must follow from the state
    # alone — what it learned in epoch 1 (an epoch count, a warm-up's switch) included.
    buffer = io.BytesIO()
    torch.save({"model": straight.model.state_dict(), "rule": straight.state_dict(),
                "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    weights, buffers = copied_parameters(straight), copied_buffers(straight)
    straight.end_epoch(2, 3)
    _end_epoch_leaves_the_model_alone(straight, weights, buffers)
    try:
        saved = torch.load(buffer, weights_only=True)
    except Exception as err:  # noqa: BLE001 - the message is the point
        raise AssertionError("the rule's state_dict does not load with weights_only=True "
                             f"(hold only tensors and plain containers): {err}") from None
    trained(straight, optimizer, range(4, 6))
    resumed = make_rule(cls, seed=1, arch=arch, draw=8)  # other init and draw: all
    # must come from the file
    resumed.model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["rule"])
    resumed.end_epoch(2, 3)
    optimizer = torch.optim.AdamW(resumed.trainable_parameters(), lr=1e-2)
    optimizer.load_state_dict(saved["optimizer"])
    trained(resumed, optimizer, range(4, 6))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), f"a rule restored from its state_dict diverges at {name}"
    for (name, a), b in zip(straight.model.named_buffers(), resumed.model.buffers()):
        assert torch.equal(a, b), f"a rule restored from its state_dict diverges at {name}"
    x, y = tiny_batch(seed=9, arch=arch)
    for layer, (a, b) in enumerate(zip(straight.credits(x, y), resumed.credits(x, y))):
        assert torch.equal(a, b), f"restored rule's credit {layer} differs"


def _end_epoch_leaves_the_model_alone(rule: CreditRule, weights: dict[str, Tensor],
                                      buffers: dict[str, Tensor]) -> None:
    """The model's parameters and buffers after ``rule.end_epoch`` equal ``weights`` and
    ``buffers``, copied before it: the optimizer alone writes the weights."""
    after = {**copied_parameters(rule), **copied_buffers(rule)}
    changed = next((name for name, before in {**weights, **buffers}.items()
                    if not torch.equal(before, after[name])), None)
    assert changed is None, (
        f"end_epoch changed the model's {'weight' if changed in weights else 'buffer'} "
        f"{changed!r}: the optimizer the run hands train_step alone writes the weights — "
        "end_epoch returns the epoch's extra fields and updates the rule's own state only")


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


def run_metrics_are_recordable(cls: type[CreditRule], arch: str = "resmlp") -> None:
    """``run_metrics()`` returns fields a record holds and leaves the rule as it was: asked
    before a run trains, not at its end, where a bad value failed the finished run."""
    rule = trained_for_credits(cls, arch)
    x, y = tiny_batch(seed=3, arch=arch)
    for p in rule.model.parameters():
        p.grad = None
    before = rule_snapshot(rule)
    problem = metrics_problem(rule.run_metrics(x, y))
    assert problem is None, problem
    assert_left_alone(rule, before, "run_metrics()")


def binding_leaves_global_rngs_untouched(cls: type[CreditRule], arch: str = "resmlp") -> None:
    """Binding the rule to a model (its ``__init__``) neither draws from nor reseeds torch's,
    numpy's or Python's global RNG: a run builds the rule after seeding them, and a reseed
    there gives every seed of a study one dropout stream (a draw, feedback that
    ``method.feedback_seed`` does not set)."""
    with watched_global_rngs() as rngs:
        make_rule(cls, arch=arch)
        moved = moved_rngs(rngs)
    assert not moved, (
        f"binding the rule (its __init__) moved or reseeded {' and '.join(moved)} global "
        "RNG: a run seeds them before it builds the rule, and a reseed there gives every run "
        "seed one dropout stream — draw from the generator the rule is given")
