"""The conformance check of a rule's declared ``stacked_step``
(:func:`stacked_step_is_the_rule_step`, one of :func:`~creditaudit.testing.check_rule`'s).

A rule that declares a ``stacked_step`` says that the toolkit's stacked step of that kind
(:mod:`creditaudit.methods.stacked`) computes its training step, so ``sweep --stack`` and
CUDA-graph capture run that step instead of the rule's own ``train_step``. The declaration is
a claim about the rule's arithmetic; this check holds it to the rule's own step: two copies
of a tiny float64 network that differ in weights, batch, feedback draw and penalty λ (0 and
0.01, so a step that drops the penalty is caught) take one stacked step together, and each
must end where its own ``train_step`` takes it — every parameter's update, the step's loss,
correct count and finiteness, and the rule's own state (which a stacked step never touches,
so a rule whose step changes it cannot be stacked).

Float64 throughout: stacked and single steps differ only by rounding (vmap batches the
matmuls and layer norms; the projected rules take the dense route instead of the projected
one). Measured on the built-ins over the tiny networks that stack: at most 5e-14 relative in
an update; :data:`UPDATE_TOLERANCE` leaves three orders of magnitude for other rules' and
platforms' rounding, while a step with another credit, another objective or no penalty moves
some update by far more (1e-3 … 1 relative, tests/test_conformance_stacked.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from creditaudit.methods.base import CreditRule, StepResult
from creditaudit.methods.stacked import StackedStep, model_stack_refusal
from creditaudit.testing.common import relative_error, same_state, tiny_batch, tiny_model
from creditaudit.testing.rule_binding import make_rule

COPIES = 2
# Each copy's penalty λ: one without, one with (stacks may differ in λ).
PENALTIES = (0.0, 0.01)
LEARNING_RATE = 0.1
UPDATE_TOLERANCE = 1e-10


def stacks_on(arch: str) -> bool:
    """Whether a rule that declares a ``stacked_step`` may step the tiny ``arch`` stacked
    (adapted networks and networks with buffers always train alone)."""
    return model_stack_refusal(tiny_model(arch=arch)) is None


class _Copy:
    """One copy of the tiny run: its rule, model, plain SGD and device (what a stacked step
    needs of a run)."""

    def __init__(self, cls: type[CreditRule], index: int, arch: str) -> None:
        # Every rule's config has method.penalty, which a stacked step reads per run.
        self.rule = make_rule(cls, seed=index, arch=arch, draw=7 + index,
                              penalty=PENALTIES[index % len(PENALTIES)])
        self.model = self.rule.model
        self.optimizer = torch.optim.SGD(self.rule.trainable_parameters(), lr=LEARNING_RATE)
        self.device = torch.device("cpu")
        self.start = {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def updates(self) -> dict[str, Tensor]:
        return {name: p.detach() - self.start[name]
                for name, p in self.model.named_parameters()}


def _stacked(copies: Sequence[_Copy], batches: Sequence[tuple[Tensor, Tensor]]
             ) -> list[StepResult]:
    """One stacked step of ``copies`` on their ``batches``, as each run's StepResult."""
    step = StackedStep(copies)
    step.stack()
    try:
        out = step.forward_backward(torch.stack([x for x, _ in batches]),
                                    torch.stack([y for _, y in batches]))
        step.optimize(range(len(copies)))
    finally:
        step.unstack()
    return [StepResult(loss=float(out.loss[k]), correct=int(out.correct[k]),
                       n=int(batches[k][1].shape[0]), finite=bool(out.finite[k]))
            for k in range(len(copies))]


def stacked_step_is_the_rule_step(cls: type[CreditRule], arch: str = "resmlp") -> None:
    kind = cls.stacks_as()
    claim = f"{cls.label} declares stacked_step {kind!r}, but"
    fix = "(declare the stacked step its train_step takes, or stacked_step = None)"
    alone = [_Copy(cls, k, arch) for k in range(COPIES)]
    stacked = [_Copy(cls, k, arch) for k in range(COPIES)]
    batches = [tiny_batch(seed=1 + k, arch=arch) for k in range(COPIES)]
    own = [c.rule.train_step(x, y, c.optimizer) for c, (x, y) in zip(alone, batches)]
    assert all(r.finite for r in own), "a training step on a tiny float64 net was not finite"
    results = _stacked(stacked, batches)
    for k, (a, s, mine, theirs) in enumerate(zip(alone, stacked, own, results)):
        run = f"copy {k} (λ = {PENALTIES[k % len(PENALTIES)]})"
        assert theirs.finite, f"{claim} the stacked step of {run} was not finite {fix}"
        assert theirs.correct == mine.correct, (
            f"{claim} the stacked step of {run} counts {theirs.correct} correct, its "
            f"train_step {mine.correct} {fix}")
        loss_error = abs(theirs.loss - mine.loss) / max(abs(mine.loss), 1e-300)
        assert loss_error < UPDATE_TOLERANCE, (
            f"{claim} the stacked step of {run} reports loss {theirs.loss:.6g}, its "
            f"train_step {mine.loss:.6g} {fix}")
        errors = {name: relative_error(s_update, a_update) for (name, a_update), s_update
                  in zip(a.updates().items(), s.updates().values(), strict=True)}
        wrong = {name: error for name, error in errors.items()
                 if not error < UPDATE_TOLERANCE}
        assert not wrong, (
            f"{claim} its train_step updates {run} otherwise: "
            + ", ".join(f"{name} differs by {error:.2e} (rel.)"
                        for name, error in list(wrong.items())[:3]) + f" {fix}")
        changed = same_state(a.rule.state_dict(), s.rule.state_dict())
        assert not changed, (
            f"{claim} its train_step changes the rule's own state ({', '.join(changed[:3])}), "
            f"which a stacked step never does {fix}")


__all__ = ["stacked_step_is_the_rule_step", "stacks_on", "COPIES", "PENALTIES",
           "UPDATE_TOLERANCE"]
