"""Credit rules on adapted models (:func:`creditaudit.adapt`): the parts that differ from the
residual contract.

A rule says it trains adapted models with the class attribute ``adapted_models = True``
(:class:`~creditaudit.methods.base.CreditRule`); :func:`~creditaudit.methods.build_rule`
refuses the others in one line. The built-in ones:

- **End to end** (``bp``, ``frozen`` and the per-layer feedback rules ``fa-linear``, ``usf``,
  ``brsf``, ``frsf``, ``kp``): one backward pass of CE + λ·P through the model as it is
  (:func:`end_to_end_objective`); the feedback rules replace the weight layers' backward
  (:mod:`~creditaudit.methods.adapted_feedback`).
- **Local** (``dfa``, ``drtp``, ``local-ce``; :func:`local_state_step`): each state's
  output takes the rule's (normalised) credit â_l/B as its gradient instead of the one coming
  down from the layers above (the network reads every state detached, so nothing else flows
  between segments); the parameters between h_{l−1} and h_l are trained by it, those before
  h_0 by â_0, the readout by its exact cross-entropy. DFA's and DRTP's credits e·B_l
  (:func:`projected_local_step`) have B_l of shape (C, d_l), d_l the state's feature width,
  and are broadcast over tokens and positions as for the contract's models.

The penalty λ (``method.penalty``) acts on the *state increments*
Δ_l = h_l − h_{l−1} (l = 1 … L) where the two states have the same shape, and on h_l itself
where a block changes the shape (a strided stage): P = Σ_l mean_b ‖Δ_l‖². For a residual
network whose states are its residual stream, Δ_l is block l − 1's branch, so P is the
contract's branch penalty; blocks without trainable parameters are left out, as there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.base import LocalOptions, StepResult, loss_precision, step_result
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.surrogate import state_credit_shape
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import set_trainable_blocks


class LocalStateRule(Protocol):
    """What :func:`local_state_step` reads of a rule."""

    model: AdaptedModel

    @property
    def options(self) -> LocalOptions: ...

    def credit_gradient(self, credit: Tensor, batch: int) -> Tensor: ...

    def autocast(self): ...  # noqa: ANN201 - a context manager


class ProjectingRule(LocalStateRule, Protocol):
    """What :func:`projected_local_step` reads of a rule (DFA and DRTP have it)."""

    feedback: list[Tensor]

    def projected_signal(self, logits: Tensor, y: Tensor) -> Tensor: ...


# (the step's state outputs [out_0 … out_L] (with their graphs), logits) -> the credit a_l of
# state l, called for the states whose segment trains (after the step's finiteness check).
CreditsOf = Callable[[list[Tensor], Tensor], Callable[[int], Tensor]]


def set_trainable(model: nn.Module, trainable: int | None) -> None:
    """Freeze all but the last ``trainable`` blocks of a contract or adapted model
    (:func:`~creditaudit.models.contract.set_trainable_blocks`,
    :meth:`AdaptedModel.set_trainable_blocks`)."""
    if isinstance(model, AdaptedModel):
        model.set_trainable_blocks(trainable)
    else:
        set_trainable_blocks(model, trainable)  # type: ignore[arg-type]


def state_increments(states: Sequence[Tensor]) -> list[Tensor]:
    """[Δ_1 … Δ_L]: h_l − h_{l−1} where the shapes agree, else h_l (module docstring)."""
    return [h - before if h.shape == before.shape else h
            for before, h in zip(states, states[1:])]


def block_is_trainable(model: AdaptedModel, block: int) -> bool:
    return any(p.requires_grad for p in model.segment_parameters(block + 1))


def state_penalty(model: AdaptedModel, states: Sequence[Tensor]) -> Tensor | float:
    """P = Σ_l mean_b ‖Δ_l‖² over the blocks with trainable parameters."""
    total: Tensor | float = 0.0
    for block, delta in enumerate(state_increments(states)):
        if block_is_trainable(model, block):
            total = total + delta.flatten(1).pow(2).sum(dim=1).mean()
    return total


def end_to_end_objective(model: AdaptedModel, x: Tensor, y: Tensor, penalty: float
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(CE + λ·P, batch-mean CE, logits, h_L) with the whole graph kept: the objective of
    :func:`creditaudit.methods.bp.end_to_end_objective` for an adapted model."""
    if penalty == 0:  # h_L alone is read: one hook instead of L + 1
        h_last, logits = model.run_last_state(x)
        ce = F.cross_entropy(loss_precision(checked_logits(model, logits, y)), y)
        return ce, ce, logits, h_last
    states, logits = model.run_states(x)
    ce = F.cross_entropy(loss_precision(checked_logits(model, logits, y)), y)
    return ce + penalty * state_penalty(model, states), ce, logits, states[-1]


def state_feedback_shapes(model: AdaptedModel, n_classes: int) -> list[tuple[int, ...]]:
    """(C, d_l) for every state: DFA's and DRTP's B_l."""
    return [(n_classes, width) for width in model.state_widths]


def projected_credits(signal: Tensor, feedback: Sequence[Tensor], states: Sequence[Tensor]
                      ) -> list[Tensor]:
    """[a_0 … a_L], a_l = signal·B_l (signal (B, C), B_l (C, d_l)) broadcast like h_l."""
    return [state_credit_shape(signal @ b.to(device=signal.device, dtype=signal.dtype), h)
            for b, h in zip(feedback, states)]


def local_state_step(rule: LocalStateRule, x: Tensor, y: Tensor,
                     optimizer: torch.optim.Optimizer, credits_of: CreditsOf) -> StepResult:
    """One step of a local rule on an adapted model (module docstring): one forward pass,
    one backward pass from the cross-entropy and every state output at once.

    ``credits_of(outputs, logits)`` runs inside the step's autocast and returns the function
    giving a_l (shaped like h_l, or (B, d_l) to broadcast) for state l. State l's output gets
    â_l/B (+ 2λ·Δ_l/B for l ≥ 1 with a penalty), â_l from the rule's :meth:`credit_gradient`;
    outputs without a graph (frozen segments) are skipped. The parameter gradients are those
    of the local surrogate Σ_l ⟨out_l, â_l⟩ + λ·P + CE(readout(h_L detached)), h_{l−1}
    detached in out_l.
    """
    optimizer.zero_grad(set_to_none=True)
    model, penalty, batch = rule.model, rule.options.penalty, y.shape[0]
    with rule.autocast():
        outputs, logits = model.local_states(x)
        ce = F.cross_entropy(loss_precision(checked_logits(model, logits, y)), y)
        credit_of = credits_of(outputs, logits)
    result = step_result(ce, logits, y, outputs[-1])
    if not result.finite:
        return result
    increments = [None, *state_increments([out.detach() for out in outputs])]
    roots, grads = [ce], [torch.ones_like(ce)]
    for index, (out, delta) in enumerate(zip(outputs, increments)):
        if not out.requires_grad:
            continue
        grad = state_credit_shape(rule.credit_gradient(credit_of(index), batch), out)
        if delta is not None and penalty > 0:
            grad = torch.add(grad, delta, alpha=2.0 * penalty / batch)
        roots.append(out)
        grads.append(grad.to(out.dtype))
    torch.autograd.backward(roots, grads)
    optimizer.step()
    return result


def projected_local_step(rule: ProjectingRule, x: Tensor, y: Tensor,
                         optimizer: torch.optim.Optimizer) -> StepResult:
    """One step of DFA or DRTP on an adapted model (:func:`local_state_step`) with
    a_l = signal·B_l, the signal the rule's :meth:`projected_signal` of the logits."""

    def credits_of(outputs: list[Tensor], logits: Tensor) -> Callable[[int], Tensor]:
        signal = rule.projected_signal(logits, y)
        return lambda index: signal @ rule.feedback[index].to(device=signal.device,
                                                              dtype=signal.dtype)

    return local_state_step(rule, x, y, optimizer, credits_of)


__all__ = ["set_trainable", "state_increments", "state_penalty", "end_to_end_objective",
           "state_feedback_shapes", "projected_credits", "local_state_step",
           "projected_local_step"]
