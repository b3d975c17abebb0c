"""Copies of what a credit rule holds — its model's parameters and buffers, its own state —
and the assertion that a call of the rule (``credits()``, ``run_metrics()``) left them as
they were: what the rule conformance suite's checks compare."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from creditaudit.methods.base import CreditRule
from creditaudit.testing.common import flat_state, same

RuleSnapshot = tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Any]]


def copied_parameters(rule: CreditRule) -> dict[str, Tensor]:
    """A copy of each of the rule's model parameters, by name."""
    return {name: p.detach().clone() for name, p in rule.model.named_parameters()}


def copied_buffers(rule: CreditRule) -> dict[str, Tensor]:
    """A copy of each of the rule's model buffers, by name."""
    return {name: b.detach().clone() for name, b in rule.model.named_buffers()}


def rule_snapshot(rule: CreditRule) -> RuleSnapshot:
    """Copies of the rule's model parameters and buffers and of its own state, for
    :func:`assert_left_alone`."""
    return (copied_parameters(rule), copied_buffers(rule),
            flat_state(copy.deepcopy(rule.state_dict())))


def assert_left_alone(rule: CreditRule, before: RuleSnapshot, call: str) -> None:
    """AssertionError naming ``call`` (``"credits()"``) when a parameter, a buffer or the
    rule's state differs from ``before`` (:func:`rule_snapshot`), or a parameter holds a
    ``.grad`` (the caller cleared them before ``call``)."""
    weights, buffers, state = before
    for name, p in rule.model.named_parameters():
        assert torch.equal(p.detach(), weights[name]), f"{call} changed {name}"
        assert p.grad is None, f"{call} left a .grad on {name}"
    for name, b in rule.model.named_buffers():
        assert torch.equal(b, buffers[name]), f"{call} changed the buffer {name}"
    after = flat_state(rule.state_dict())
    changed = [k for k in state if not same(state[k], after.get(k))]
    assert not changed, f"{call} changed the rule's state: {', '.join(changed[:3])}"
