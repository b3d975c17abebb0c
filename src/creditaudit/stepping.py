"""Training steps without host reads: K runs of one shape stepped as one stacked model.

Runs that share every shape — rule class, architecture and its options, data shapes, batch
size, precision — but differ in seeds, learning rates, λ or feedback draws train together:
each parameter of the K models is one (K, …) tensor, the forward pass is the model's own
code under ``torch.vmap`` (one kernel serves K runs), one backward pass fills every run's
gradient, and each run keeps its own AdamW, schedule, data order and record. Run k's
parameters are views of slice k while an epoch trains (:meth:`StackedStep.stack`) and its
own tensors again between epochs (:meth:`StackedStep.unstack`), so evaluation, checkpoints
and resume are those of a run trained alone.

What each rule computes is written here for (K, B, …) tensors (:data:`STACKED_RULES`): BP and
the frozen baseline (end-to-end CE + λΣ‖f_l‖²), DFA and DRTP (the dense local surrogate:
the same updates as their projected step, to rounding), block FA. Other rules, models with
buffers (BatchNorm's running statistics) and adapted models train alone
(:func:`stack_refusal` says why). A step reads nothing back to the host: per-run loss sums,
correct counts and the first non-finite step stay on the device; :class:`StackedEpochs`
reads them once per epoch, or checks every step (``check="step"``, the CPU default, where a
read costs nothing). An epoch in which a run turned non-finite is trained again from its
start with a check every step — the steps are deterministic, so the replay reproduces
every run bit for bit up to that step and then stops the diverged run where training it
alone stops it (before its update).

Stacked and single runs agree to rounding, not bit for bit: vmap batches the matmuls and
the layer norms, and the local rules take the dense route instead of the projected one
(tests/test_stacked.py measures it).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.data.loader import InMemoryLoader
from creditaudit.methods import CreditRule
from creditaudit.methods.base import loss_precision, state_credit_shape
from creditaudit.methods.bp import BP, forward_with_branches
from creditaudit.methods.dfa import DFA
from creditaudit.methods.drtp import DRTP
from creditaudit.methods.fa import FA
from creditaudit.methods.frozen import Frozen
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.fused import plain_autograd

# How each rule class steps when stacked (exact classes: a subclass may step otherwise).
STACKED_RULES: dict[type[CreditRule], str] = {BP: "end_to_end", Frozen: "end_to_end",
                                              DFA: "projected", DRTP: "projected", FA: "fa"}


def stack_refusal(rule: CreditRule) -> str | None:
    """Why ``rule`` (bound to its model) cannot step stacked or captured; None if it can."""
    if type(rule) not in STACKED_RULES:
        names = ", ".join(cls.name for cls in STACKED_RULES)
        return (f"the {rule.label} step is not written for stacked or captured steps "
                f"(those rules: {names})")
    if isinstance(rule.model, AdaptedModel):
        return "an adapted model steps alone"
    if next(rule.model.buffers(), None) is not None:
        return ("the model has buffers (e.g. BatchNorm's running statistics), which a "
                "stacked step cannot update per run")
    return None


def uses_device_data(setting: str, device: torch.device) -> bool:
    """``run.device_data`` resolved: ``auto`` is on for CUDA devices."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


@dataclass(frozen=True)
class GraphDecision:
    """``run.cuda_graphs`` resolved for one run: ``on``, and ``text`` for its record."""

    on: bool
    text: str


def cuda_graphs_decision(setting: str, device: torch.device, rule: CreditRule
                         ) -> GraphDecision:
    """Whether the run's training step is captured in a CUDA graph (``auto``: on for CUDA
    runs whose step can be captured), with the reason when it is not."""
    if setting == "off":
        return GraphDecision(False, "off (run.cuda_graphs = off)")
    if device.type != "cuda" or not torch.cuda.is_available():
        return GraphDecision(False, "off (not a CUDA run)")
    refusal = stack_refusal(rule)
    if refusal is not None:
        return GraphDecision(False, f"off ({refusal})")
    return GraphDecision(True, "on")


class StackMember(Protocol):
    """What a stacked step needs of each run (a :class:`~creditaudit.training.Trainer`)."""

    rule: CreditRule
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_loader: InMemoryLoader
    data_generator: torch.Generator
    device: torch.device
    config: Any
    record: Any
    loggers: Any


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

    def __init__(self, members: Sequence[StackMember]) -> None:
        self.members = list(members)
        rule = self.members[0].rule
        self.rule = rule
        self.kind = STACKED_RULES[type(rule)]
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
        self.penalties = [m.rule.config.penalty for m in self.members]
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

    def schedule(self, runs: Sequence[int]) -> None:
        """The learning-rate schedule's step of the runs ``runs`` (host side)."""
        for k in runs:
            self.members[k].scheduler.step()

    def _ce(self, logits: Tensor, y: Tensor) -> Tensor:
        """(K,) batch-mean cross-entropy of each run."""
        k, b = y.shape
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
            model = self.template
            if embed_trains:
                h0 = model.embed(x)
            else:
                with torch.no_grad():
                    h0 = model.embed(x)
            h = h0.detach()
            states, branches = [h], []
            for block, trains_block in zip(model.blocks, trains):
                if trains_block:
                    f = block(h)
                    branches.append(f)
                    h = model.next_state(h, f.detach())
                else:
                    with torch.no_grad():
                        h = model.next_state(h, block(h))
                states.append(h)
            if with_readout:
                return h0, branches, states, model.readout(h)
            return h0, branches, states

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


# --- epochs -------------------------------------------------------------------------------
@dataclass
class _Snapshot:
    """One run's training state at an epoch's start, to train the epoch again."""

    params: list[Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    generator: Tensor


class StackedEpochs:
    """Epochs of K runs through one :class:`StackedStep`.

    ``check``: ``"step"`` reads every step's finiteness (K booleans; a diverged run stops
    before its update, as alone); ``"epoch"`` reads the device sums once per epoch and trains
    an epoch in which a run turned non-finite again with ``"step"`` checks.
    """

    def __init__(self, members: Sequence[StackMember], *, check: str = "step") -> None:
        if check not in ("step", "epoch"):
            raise ValueError(f"check must be 'step' or 'epoch', got {check!r}")
        self.members = list(members)
        sizes = {len(m.train_loader) for m in self.members}
        if len(sizes) != 1:
            raise ValueError(f"stacked runs need equal batches per epoch, got {sorted(sizes)}")
        self.check = check
        self.step = self._make_step()

    def _make_step(self) -> StackedStep:
        return StackedStep(self.members)

    def train_epoch(self, epoch: int) -> list[dict[str, Any] | None]:
        """Train every run one epoch; per run its training stats, or None when it diverged
        (its record's ``divergence`` then says where)."""
        if self.check == "step":
            return self._epoch(epoch, check_steps=True)
        snapshots = [self._snapshot(m) for m in self.members]
        stats = self._epoch(epoch, check_steps=False)
        if all(s is not None for s in stats):
            return stats
        for member, snapshot in zip(self.members, snapshots):
            self._restore(member, snapshot)
        return self._epoch(epoch, check_steps=True)

    def _batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every run's batch, stacked: (K, B, …) inputs and (K, B) labels on the device."""
        device = self.step.device
        for batches in zip(*(iter(m.train_loader) for m in self.members)):
            xs, ys = zip(*batches)
            yield torch.stack(xs).to(device), torch.stack(ys).to(device)

    def _unchecked_step(self, x: Tensor, y: Tensor) -> StepTensors:
        """A step of every run with nothing read back (the captured subclass replays a CUDA
        graph of it)."""
        out = self.step.forward_backward(x, y)
        self.step.optimize(range(self.step.size))
        return out

    def _epoch(self, epoch: int, *, check_steps: bool) -> list[dict[str, Any] | None]:
        size = len(self.members)
        device = self.step.device
        loss_sum = torch.zeros(size, dtype=torch.float64, device=device)
        correct = torch.zeros(size, dtype=torch.int64, device=device)
        first_bad = torch.full((size,), -1, dtype=torch.int64, device=device)
        live = list(range(size))
        n = 0
        for member in self.members:
            member.model.train()
        self.step.stack()
        try:
            for index, (x, y) in enumerate(self._batches()):
                if check_steps:
                    out = self.step.forward_backward(x, y)
                    finite, losses = out.finite.tolist(), out.loss.tolist()
                    for k in [k for k in live if not finite[k]]:
                        self.members[k].record.divergence = {
                            "epoch": epoch, "step": index, "reason": "non-finite loss or state"}
                        live.remove(k)
                    self.step.optimize(live)
                else:
                    out = self._unchecked_step(x, y)
                    first_bad = torch.where(~out.finite & (first_bad < 0), index, first_bad)
                    losses = [math.nan] * size  # not read: progress bars count steps only
                if not live:
                    break
                self.step.schedule(live)
                batch = int(y.shape[1])
                loss_sum += out.loss.double() * batch
                correct += out.correct
                n += batch
                for k in live:
                    self.members[k].loggers.log_step(losses[k])
        finally:
            self.step.unstack()
        if not check_steps and bool((first_bad >= 0).any()):
            return [None] * size  # trained again with checks (train_epoch)
        sums, hits = loss_sum.tolist(), correct.tolist()
        epochs = self.members[0].config.optim.epochs
        return [{"train_loss": sums[k] / max(n, 1), "train_acc": hits[k] / max(n, 1),
                 "extras": self.members[k].rule.end_epoch(epoch, epochs)} if k in live
                else None for k in range(size)]

    @staticmethod
    def _snapshot(member: StackMember) -> _Snapshot:
        return _Snapshot(params=[p.detach().clone() for p in member.model.parameters()],
                         optimizer=copy.deepcopy(member.optimizer.state_dict()),
                         scheduler=copy.deepcopy(member.scheduler.state_dict()),
                         generator=member.data_generator.get_state())

    @staticmethod
    @torch.no_grad()
    def _restore(member: StackMember, snapshot: _Snapshot) -> None:
        for p, saved in zip(member.model.parameters(), snapshot.params, strict=True):
            p.copy_(saved)
        member.optimizer.load_state_dict(snapshot.optimizer)
        member.scheduler.load_state_dict(snapshot.scheduler)
        member.data_generator.set_state(snapshot.generator)
        member.record.divergence = None


__all__ = ["STACKED_RULES", "StackedStep", "StackedEpochs", "StepTensors", "StackMember",
           "GraphDecision", "stack_refusal", "uses_device_data", "cuda_graphs_decision"]
