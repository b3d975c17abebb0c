"""The stacked form of the rules' training steps: K runs of one shape stepped as one model.

Runs that share every shape — rule class, architecture and its options, data shapes, batch
size, precision — but differ in seeds, learning rates, λ or feedback draws train together:
each parameter of the K models is one (K, …) tensor, the forward pass is the model's own
code under ``torch.vmap`` (one kernel serves K runs), one backward pass fills every run's
gradient, and each run keeps its own optimiser. Run k's parameters are views of slice k
while the stack trains (:meth:`StackedStep.stack`) and its own tensors again afterwards
(:meth:`StackedStep.unstack`), so everything else sees a model trained alone.

What each rule computes is written here for (K, B, …) tensors, one step per kind of
:data:`~creditaudit.methods.base.STACKED_STEPS`; a rule class says which is its own
(``stacked_step``, :meth:`~creditaudit.methods.base.CreditRule.stacks_as`): BP and the
frozen baseline step end to end (CE + λΣ‖f_l‖²), DFA and DRTP projected (the dense local
surrogate: the same updates as their projected step, to rounding), FA as block FA. The
declaration is a capability of the rule, checked like its others: the conformance check
``stacked_step_is_the_rule_step`` (:func:`creditaudit.testing.check_rule`) holds the stacked
step of two tiny runs to each run's own ``train_step``, and the door runs it on every plugin
rule before its run is planned, so a plugin rule stacks like a built-in (unless it declares
that check a failure by design). Other rules, models with buffers
(BatchNorm's running statistics) and adapted models train alone (:func:`stack_refusal`
says why). A step reads nothing back to the host: its per-run losses, correct counts and
finiteness stay on the device (:class:`StepTensors`).

It lives beside the rules, not with the training loop (:mod:`creditaudit.run.steps`, which
drives it epoch by epoch, on a side stream or in a CUDA graph), because the conformance
suite checks it and the training loop uses it: both import it from here.

Stacked and single runs agree to rounding, not bit for bit: vmap batches the matmuls and
the layer norms, and the local rules take the dense route instead of the projected one
(tests/test_stacked.py measures it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.methods.base import CreditRule, loss_precision
from creditaudit.methods.bp import forward_with_branches
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.registry import RULES
from creditaudit.methods.surrogate import local_forward, state_credit_shape
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.fused import plain_autograd

# The conformance check that holds a rule's declared stacked step to its own train_step
# (creditaudit.testing.rule_stacking, which the conformance suite runs and the door runs on
# every plugin rule).
STACKED_CHECK = "stacked_step_is_the_rule_step"


def stacked_rule_names() -> list[str]:
    """The built-in rules whose class declares a ``stacked_step``, in listing order (for
    messages; a plugin rule may declare one too)."""
    return [cls.name for cls in RULES.builtin_classes() if cls.stacks_as() is not None]


def stack_refusal(rule: CreditRule) -> str | None:
    """Why ``rule`` (bound to its model) cannot step stacked or captured; None if it can."""
    if type(rule).stacks_as() is None:
        names = ", ".join(stacked_rule_names())
        return (f"the {rule.label} step is not written for stacked or captured steps "
                f"(built-in rules that are: {names}; a rule declares it with stacked_step)")
    # A plugin rule is stacked like a built-in: the door ran its conformance checks, this
    # one among them, before the run was planned. One that declares this check a failure
    # by design says its stacked step is not its own.
    failing = [key for key in type(rule).expected_failures
               if key.split("[", 1)[0] == STACKED_CHECK]
    if failing:
        return (f"{rule.label} declares that its stacked step fails the conformance check "
                f"{failing[0]}: it steps alone with its own train_step")
    return model_stack_refusal(rule.model)


def model_stack_refusal(model: nn.Module) -> str | None:
    """Why no rule can step ``model`` stacked or captured; None if a rule that declares a
    ``stacked_step`` can."""
    if isinstance(model, AdaptedModel):
        return "an adapted model steps alone"
    if next(model.buffers(), None) is not None:
        return ("the model has buffers (e.g. BatchNorm's running statistics), which a "
                "stacked step cannot update per run")
    return None


class StackedRun(Protocol):
    """What a stacked step needs of each run: its rule (bound to its model), its optimiser
    and the device its stack lives on (a :class:`~creditaudit.run.trainer.Trainer` is one)."""

    rule: CreditRule
    optimizer: torch.optim.Optimizer
    device: torch.device


class StepTensors(NamedTuple):
    """One stacked step's per-run results, on the device: batch-mean CE (K,), correct
    predictions (K,) int64, and whether the loss and the last state were finite (K,)."""

    loss: Tensor
    correct: Tensor
    finite: Tensor


class _Parts(NamedTuple):
    """A stacked step before its backward: ``outputs`` to backpropagate ``grads`` from, the
    per-run CE (K,), the logits (K, B, C) and the last state (K, B, …)."""

    outputs: list[Tensor]
    grads: list[Tensor]
    ce: Tensor
    logits: Tensor
    last: Tensor


class _Bound(nn.Module):
    """Runs a function of the model with the model's parameters swapped for run k's."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class StackedStep:
    """One training step of K runs at once (module docstring).

    ``members``: K runs of one rule class on models of one architecture (same parameter
    names and shapes) with equal batch sizes; :func:`stack_refusal` of each is None.
    """

    def __init__(self, members: Sequence[StackedRun]) -> None:
        self.members = list(members)
        rule = self.members[0].rule
        self.rule = rule
        kind = type(rule).stacks_as()
        assert kind is not None, stack_refusal(rule)
        self.kind = kind
        self.device = self.members[0].device
        models = [m.rule.model for m in self.members]
        self.names = [name for name, _ in models[0].named_parameters()]
        # Run k's parameters, by name, in the optimizer's order.
        self.params = [dict(model.named_parameters()) for model in models]
        self.stacks = {name: torch.stack([p[name].detach() for p in self.params])
                       .requires_grad_(self.params[0][name].requires_grad)
                       for name in self.names}
        # The model's code with no weights of its own: run k's are swapped in under vmap.
        template = copy.deepcopy(models[0]).to("meta")
        self.template = template
        self.bound = _Bound(template)
        self.embed_trains = any(p.requires_grad for p in template.embed.parameters())
        self.block_trains = [any(p.requires_grad for p in block.parameters())
                             for block in template.blocks]
        self.penalties = [m.rule.options.penalty for m in self.members]
        self.penalty = torch.tensor(self.penalties, dtype=torch.float64, device=self.device)
        feedback = getattr(rule, "feedback", None)
        self.feedback = None if feedback is None else [
            torch.stack([m.rule.feedback[i] for m in self.members])  # type: ignore[attr-defined]
            for i in range(len(feedback))]
        self.stacked = False

    @property
    def size(self) -> int:
        return len(self.members)

    # --- parameters ---------------------------------------------------------------------
    @torch.no_grad()
    def stack(self) -> None:
        """Copy every run's parameters into the stacks and make them views of their slice
        (their optimisers then update the stacks in place)."""
        for k, params in enumerate(self.params):
            for name, p in params.items():
                self.stacks[name].data[k].copy_(p)
                p.data = self.stacks[name].data[k]
        self.stacked = True

    @torch.no_grad()
    def unstack(self) -> None:
        """Give every run its own parameter tensors again (for evaluation, checkpoints)."""
        for k, params in enumerate(self.params):
            for name, p in params.items():
                p.data = self.stacks[name].data[k].clone()
        self.stacked = False

    def _vmap(self, fn: Callable[..., Any], *args: Tensor) -> Any:
        """``fn(*args)`` once per run, with run k's parameters in the template's place and
        the k-th slice of every argument; outputs stacked along dim 0."""
        prefixed = {f"model.{name}": stack for name, stack in self.stacks.items()}

        def one(params: dict[str, Tensor], *a: Tensor) -> Any:
            return torch.func.functional_call(self.bound, params, (fn, *a))

        return torch.vmap(one)(prefixed, *args)

    # --- the step -----------------------------------------------------------------------
    def forward_backward(self, x: Tensor, y: Tensor) -> StepTensors:
        """Every run's update into its parameters' ``.grad`` for its batch: ``x`` (K, B, …),
        ``y`` (K, B) int64 on the device. Nothing is read back to the host."""
        for stack in self.stacks.values():
            stack.grad = None
        # Plain autograd: the fused LayerNorm → Linear is not written for vmap.
        with plain_autograd(), self.rule.autocast():
            parts: _Parts = getattr(self, f"_{self.kind}")(x, y)
        torch.autograd.backward(parts.outputs, parts.grads)
        ce, last = parts.ce.detach(), parts.last.detach()
        correct = (parts.logits.detach().argmax(dim=-1) == y).sum(dim=1)
        finite = torch.isfinite(ce) & torch.isfinite(last).flatten(1).all(dim=1)
        return StepTensors(ce, correct, finite)

    def optimize(self, runs: Sequence[int]) -> None:
        """The optimiser step of the runs ``runs`` (indices into the stack), each with its
        slice of the stacked gradients."""
        for k in runs:
            for name, p in self.params[k].items():
                grad = self.stacks[name].grad
                p.grad = None if grad is None else grad[k]
            self.members[k].optimizer.step()

    def _ce(self, logits: Tensor, y: Tensor) -> Tensor:
        """(K,) batch-mean cross-entropy of each run."""
        k, b = y.shape
        logits = checked_logits(self.members[0].rule.model, logits, y)  # (K, B, C)
        return F.cross_entropy(loss_precision(logits).flatten(0, 1), y.flatten(),
                               reduction="none").view(k, b).mean(dim=1)

    def _end_to_end(self, x: Tensor, y: Tensor) -> _Parts:
        """BP and the frozen baseline: Σ_k (CE_k + λ_k Σ_l mean_b ‖f_l‖²) over trainable
        blocks, backpropagated end to end."""
        trains = self.block_trains

        def forward(x: Tensor) -> tuple[list[Tensor], Tensor, Tensor]:
            states, branches, logits = forward_with_branches(self.template, x)
            return [f for f, t in zip(branches, trains) if t], logits, states[-1]

        branches, logits, last = self._vmap(forward, x)
        ce = self._ce(logits, y)
        objective = ce.sum()
        if any(self.penalties) and branches:
            squares = sum(f.flatten(2).pow(2).sum(dim=2).mean(dim=1) for f in branches)
            objective = objective + (self.penalty.to(ce.dtype) * squares).sum()
        return _Parts([objective], [torch.ones_like(objective)], ce, logits, last)

    def _local_forward(self, x: Tensor, *, with_readout: bool) -> tuple[Any, ...]:
        """The local rules' forward pass (``local_forward``'s values): (h0 with its graph,
        trainable blocks' branches with theirs, the detached states, logits on the detached
        h_L or nothing)."""
        trains, embed_trains = self.block_trains, self.embed_trains

        def forward(x: Tensor) -> tuple[Any, ...]:
            local = local_forward(self.template, x, with_readout=with_readout, trains=trains,
                                  embed_grad=embed_trains)
            branches = [f for f in local.branches if f is not None]  # vmap returns tensors
            if with_readout:
                return local.h0, branches, local.states, local.logits
            return local.h0, branches, local.states

        return self._vmap(forward, x)

    def _surrogate(self, h0: Tensor, branches: list[Tensor], credits: list[Tensor],
                   ce: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The local surrogate's (outputs, gradients) of ``local_backward``: â_0/B into h_0,
        â_{l+1}/B + 2λ·f_l/B into each trainable block's branch, 1 into Σ_k CE_k."""
        batch = h0.shape[1]
        outputs, grads = [ce.sum()], [torch.ones((), dtype=ce.dtype, device=ce.device)]

        def gradient(credit: Tensor, out: Tensor) -> Tensor:
            rows = self.rule.credit_gradient(credit.flatten(0, 1), batch)
            return state_credit_shape(rows, out.flatten(0, 1)).reshape(out.shape)

        if self.embed_trains:
            outputs.append(h0)
            grads.append(gradient(credits[0], h0).to(h0.dtype))
        trained = [c for c, t in zip(credits[1:], self.block_trains) if t]
        for f, credit in zip(branches, trained, strict=True):
            grad = gradient(credit, f)
            if any(self.penalties):
                scale = (2.0 * self.penalty / batch).to(f.dtype).view(-1, *[1] * (f.dim() - 1))
                grad = grad + f.detach() * scale
            outputs.append(f)
            grads.append(grad.to(f.dtype))
        return outputs, grads

    def _projected(self, x: Tensor, y: Tensor) -> _Parts:
        """DFA and DRTP: a_l = s·B_l for the rule's projected signal s (the output error;
        DRTP's one-hot target), every module on the local surrogate."""
        h0, branches, states, logits = self._local_forward(x, with_readout=True)
        ce = self._ce(logits, y)
        k, b = y.shape
        signal = self.rule.projected_signal(logits.flatten(0, 1), y.flatten()).view(k, b, -1)

        def credits(signal: Tensor, *feedback: Tensor) -> list[Tensor]:
            return self._with_feedback(feedback, lambda: self.rule.stacked_credits(signal)
                                       .unbind(1))

        assert self.feedback is not None
        per_state = torch.vmap(credits)(signal, *self.feedback)
        return _Parts(*self._surrogate(h0, branches, list(per_state), ce), ce, logits,
                      states[-1])

    def _fa(self, x: Tensor, y: Tensor) -> _Parts:
        """Block FA: a_L = ∂CE/∂h_L through the readout, a_l = B_l a_{l+1} below."""
        h0, branches, states = self._local_forward(x, with_readout=False)
        top = states[-1].detach().requires_grad_(True)
        logits = self._vmap(lambda h: self.template.readout(h), top)
        ce = self._ce(logits, y)
        (a_top,) = torch.autograd.grad(ce.sum(), top, retain_graph=True)

        def credits(top: Tensor, *feedback: Tensor) -> list[Tensor]:
            return self._with_feedback(feedback, lambda: self.rule.propagate(top))

        assert self.feedback is not None
        per_state = torch.vmap(credits)(a_top.detach(), *self.feedback)
        return _Parts(*self._surrogate(h0, branches, list(per_state), ce), ce, logits,
                      states[-1])

    def _with_feedback(self, feedback: Sequence[Tensor], fn: Callable[[], Any]) -> Any:
        """``fn()`` with the template rule's feedback replaced by run k's (inside vmap)."""
        rule: Any = self.rule
        saved, rule.feedback = rule.feedback, list(feedback)
        try:
            return fn()
        finally:
            rule.feedback = saved


__all__ = ["STACKED_CHECK", "stacked_rule_names", "stack_refusal", "model_stack_refusal",
           "StackedStep", "StackedRun", "StepTensors"]
