"""Epochs of K runs through one stacked step, with nothing read back to the host per step.

:class:`StackedEpochs` draws every run's batch from its own loader (its own generator: the
batches it gets alone), steps the K runs as one
:class:`~creditaudit.methods.stacked.StackedStep`,
and keeps each run's loss sum, correct count and first non-finite step in device tensors,
read once per epoch (``check="epoch"``) or every step (``check="step"``, the CPU default,
where a read costs nothing). An epoch in which a run turned non-finite is trained again from
its start with a check every step: the steps are deterministic, so the replay reproduces
every run bit for bit up to that step and then stops the diverged run where training it
alone stops it (before its update).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from creditaudit.methods.stacked import StackedStep, StepTensors
from creditaudit.run.results import rule_extras
from creditaudit.run.steps.stepping import StackMember


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
        self._failed: dict[int, Exception] = {}  # the last pass's loggers' errors, by run
        self.trained_again = False  # the last epoch was trained again from its start

    def _make_step(self) -> StackedStep:
        return StackedStep(self.members)

    def train_epoch(self, epoch: int) -> list[dict[str, Any] | Exception | None]:
        """Train every run one epoch; per run its training stats, None when it diverged
        (its record's ``divergence`` then says where), or the exception its loggers raised
        in ``log_step`` (that run fails, alone)."""
        if self.check == "step":
            return self._epoch(epoch, check_steps=True)
        self.trained_again = False  # set when the epoch is trained again (restored first)
        snapshots = [self._snapshot(m) for m in self.members]
        stats = self._epoch(epoch, check_steps=False)
        if all(s is not None for s in stats):
            return stats
        failed = self._failed  # the first pass's: its loggers heard every step once
        self.trained_again = True
        for member, snapshot in zip(self.members, snapshots):
            self._restore(member, snapshot)
        retried = self._epoch(epoch, check_steps=True, log_steps=False)
        return [failed.get(k, run_stats) for k, run_stats in enumerate(retried)]

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

    def _epoch(self, epoch: int, *, check_steps: bool, log_steps: bool = True
               ) -> list[dict[str, Any] | Exception | None]:
        """One pass over the epoch's batches; ``log_steps`` false: the loggers hear none of
        its steps (an epoch trained again, whose steps they heard). The loggers' errors are
        kept in ``self._failed`` too (run index → error)."""
        size = len(self.members)
        device = self.step.device
        loss_sum = torch.zeros(size, dtype=torch.float64, device=device)
        correct = torch.zeros(size, dtype=torch.int64, device=device)
        first_bad = torch.full((size,), -1, dtype=torch.int64, device=device)
        live = list(range(size))
        failed: dict[int, Exception] = {}  # a run whose loggers raised in log_step
        self._failed = failed
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
                for k in live:  # the schedules step on the host
                    self.members[k].scheduler.step()
                batch = int(y.shape[1])
                loss_sum += out.loss.double() * batch
                correct += out.correct
                n += batch
                for k in live if log_steps else ():
                    if k not in failed:
                        failed.update(self._log_step(k, losses[k]))
        finally:
            self.step.unstack()
        if not check_steps and bool((first_bad >= 0).any()):
            return [None] * size  # trained again with checks (train_epoch)
        sums, hits = loss_sum.tolist(), correct.tolist()
        epochs = self.members[0].config.optim.epochs
        return [failed[k] if k in failed else
                {"train_loss": sums[k] / max(n, 1), "train_acc": hits[k] / max(n, 1),
                 "extras": rule_extras(self.members[k].rule,
                                       self.members[k].rule.end_epoch(epoch, epochs))}
                if k in live
                else None for k in range(size)]

    def _log_step(self, k: int, loss: float) -> dict[int, Exception]:
        """Hand run ``k``'s step loss to its loggers; ``{k: error}`` when one of them raised
        (the run fails alone after the epoch; its loggers hear no more of it), else ``{}``.
        The step itself is the stack's: every run trains on as before."""
        try:
            self.members[k].loggers.log_step(loss)
        except Exception as err:  # noqa: BLE001 — the run's own failure, returned
            return {k: err}
        return {}

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


__all__ = ["StackedEpochs"]
