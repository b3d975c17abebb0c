"""What a rule's training step reports, checked before the run records it.

The training loss and accuracy a record keeps are the sums of what each
:meth:`~creditaudit.methods.CreditRule.train_step` returns, and a step that says it is
finite is trained on. A rule — a plugin's above all — is taken at its word only where its
word can be true: a :class:`~creditaudit.methods.base.StepResult` counting the batch it was
given, at most that many correct, and "finite" only with a finite loss. (What the numbers
are is the conformance suite's check ``step_reports_its_batch``.)
"""

from __future__ import annotations

import math
from dataclasses import replace
from numbers import Integral, Real

from creditaudit.errors import GuestError
from creditaudit.guests.blame import VALUE_ADVICE
from creditaudit.methods import CreditRule
from creditaudit.methods.base import StepResult
from creditaudit.registry import RULES


def checked_step(result: object, batch: int, rule: CreditRule) -> StepResult:
    """``result``, returned by ``rule.train_step`` on a batch of ``batch`` samples, once it
    can be true: marked not finite when its loss is NaN/Inf (the run records a divergence,
    never a NaN training loss). A result that cannot be true — not a StepResult, another
    batch size, a correct count outside 0 … ``batch`` — raises one line naming the rule: a
    GuestError for a plugin's, RuntimeError (creditaudit's own fault) for a built-in's."""
    problem = _problem(result, batch)
    if problem is not None:
        guest = RULES.guest(rule.name)
        if guest is None:
            raise RuntimeError(f"credit rule {rule.name!r}: train_step() {problem}")
        raise GuestError(f"{guest.what}: train_step() {problem}; {VALUE_ADVICE}")
    assert isinstance(result, StepResult)
    loss = float(result.loss)
    return replace(result, loss=loss, correct=int(result.correct), n=batch,
                   finite=bool(result.finite) and math.isfinite(loss))


def _problem(result: object, batch: int) -> str | None:
    """Why ``result`` cannot be a step's true report on ``batch`` samples (None: it can)."""
    if not isinstance(result, StepResult):
        return f"returned a {type(result).__name__}, not a StepResult"
    if not isinstance(result.n, Integral) or result.n != batch:
        return f"reported n={result.n!r} for a batch of {batch} samples"
    if not (isinstance(result.correct, Integral) and 0 <= result.correct <= batch):
        return f"reported {result.correct!r} correct of a batch of {batch} samples"
    if not isinstance(result.loss, Real):
        return f"reported a loss of type {type(result.loss).__name__}, not a number"
    return None


__all__ = ["checked_step"]
