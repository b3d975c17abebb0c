"""The optimiser a rule's ``train_step`` is handed must step the rule's parameters.

A loop of the user's own calls ``rule.train_step(x, y, optimizer)`` itself. Handed an
optimiser over another model's parameters (or over only some of the rule's), the step would
compute its credit, step nothing it reaches, and still report the batch's loss and accuracy
as if it had trained — and a :class:`~creditaudit.run.recorder.Recorder` would record the run
as trained by the rule. Every ``train_step`` a rule class defines is wrapped
(:func:`checks_optimizer`, from :meth:`CreditRule.__init_subclass__
<creditaudit.methods.base.CreditRule>`): the first step of each rule with each optimiser
checks that the optimiser holds every parameter of ``rule.trainable_parameters()``; later
steps pay one dictionary look-up. Extra parameters in the optimiser are the caller's.

The wrapper also refuses a step taken where autograd is off — inside the loop's
``torch.no_grad()`` or ``torch.inference_mode()`` evaluation block (:func:`autograd_off`)
— in one line, where torch's own error from deep inside the step ("element 0 of tensors does
not require grad", "Inference tensors do not track version counter") said nothing of why:
inside ``inference_mode()`` before it runs; inside ``no_grad()`` when it fails there (every
built-in rule's step does, before its optimiser steps), since a rule computing its update
by hand, without autograd, trains there as anywhere.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch

from creditaudit.errors import ConfigError

# The rules each optimiser has been checked against; an entry goes with its optimiser or rule.
_checked: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.WeakSet[Any]] = (
    weakref.WeakKeyDictionary())


def check_optimizer(rule: Any, optimizer: torch.optim.Optimizer) -> None:
    """ConfigError (one line) when ``optimizer`` does not hold every parameter ``rule``
    trains (:meth:`~creditaudit.methods.base.CreditRule.trainable_parameters`)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [p for p in rule.trainable_parameters() if id(p) not in held]
    if not missing:
        return
    names = {id(p): name for name, p in rule.model.named_parameters()}
    first = names.get(id(missing[0]), f"a parameter of shape {tuple(missing[0].shape)}")
    total = len(rule.trainable_parameters())
    raise ConfigError(
        f"{rule.name}: the optimizer handed to train_step does not hold {len(missing)} of the "
        f"{total} parameters the rule trains (e.g. {first!r}), so the step would train "
        "nothing there: build it over rule.trainable_parameters(), e.g. "
        "torch.optim.AdamW(rule.trainable_parameters(), lr=…); to leave parameters "
        "untrained, set requires_grad_(False) on them before binding the rule")


INFERENCE = "torch.inference_mode()"


def autograd_off() -> str | None:
    """The block turning autograd off where a step is called, as the loop wrote it —
    ``torch.inference_mode()`` (also under a ``torch.enable_grad()`` opened within it,
    which turns grad mode on but leaves inference mode, and so autograd, off) or
    ``torch.no_grad()`` — or None where autograd is on."""
    if torch.is_inference_mode_enabled():
        return INFERENCE
    return None if torch.is_grad_enabled() else "torch.no_grad()"


def grad_mode_error(rule: Any, block: str) -> ConfigError:
    """The one-line refusal of ``rule``'s step, which failed inside ``block``."""
    return ConfigError(
        f"{rule.name}: train_step was called inside {block}, which turns off the gradients "
        f"the step trains with: take training steps outside the evaluation block (only the "
        f"evaluation goes under {block})")


def checks_optimizer(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` (a rule's ``train_step(self, x, y, optimizer)``) checking its optimiser the
    first time this rule is stepped with it (:func:`check_optimizer`), and refusing in one
    line (:func:`grad_mode_error`) a step where autograd is off (:func:`autograd_off`):
    inside ``torch.inference_mode()`` up front (the tensors a step makes there, a rule's
    buffers kept between steps, fail every step after it: KP's), inside
    ``torch.no_grad()`` when it fails there (a rule computing its update by hand, without
    autograd, trains there as anywhere)."""

    @functools.wraps(step)
    def checked(self: Any, x: Any, y: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(optimizer, torch.optim.Optimizer):
            rules = _checked.setdefault(optimizer, weakref.WeakSet())
            if self not in rules:
                check_optimizer(self, optimizer)
                rules.add(self)
        block = autograd_off()
        if block is None:
            return step(self, x, y, optimizer, *args, **kwargs)
        if block == INFERENCE:  # what a step makes there, kept, fails every later step
            raise grad_mode_error(self, block)
        try:
            return step(self, x, y, optimizer, *args, **kwargs)
        except RuntimeError as err:  # torch's, from deep inside the step: say why
            raise grad_mode_error(self, block) from err

    checked.checks_optimizer = True  # type: ignore[attr-defined]
    return checked


__all__ = ["autograd_off", "check_optimizer", "checks_optimizer", "grad_mode_error"]
