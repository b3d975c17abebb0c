"""The training step captured once in a CUDA graph and replayed (``run.cuda_graphs``).

A step of the study's small models is bound by kernel launches, not arithmetic: replaying
the step's kernels from a CUDA graph took BP's step from 3.3 to 0.55 ms on an H200
(docs/benchmarks.md). The captured step is the stacked step of
:mod:`creditaudit.methods.stacked` (one run or several): forward under vmap, backward,
and every run's fused AdamW with ``capturable=True`` and its learning rate in a device tensor
(:class:`CapturableAdamW`), so the schedule, stepped on the host, changes the rate the graph
reads. Nothing is read back
per step; the per-run sums and the first non-finite step are read once per epoch, and an
epoch in which a run turned non-finite is trained again eagerly with a check every step
(:class:`~creditaudit.run.steps.epochs.StackedEpochs`). The last, smaller batch of an epoch runs
eagerly (same kernels, another shape).

Run on an H200 (torch 2.11) by ``scripts/gpu_checks.sh``: ``tests/test_cuda.py`` holds the
captured step to the eager stacked step there, and a captured run's record agreed with the
eager run's to 4.3e-6 relative (docs/benchmarks.md, "GPU"). Float64 runs are not captured
(the fused kernel reads the rate in float32).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from creditaudit.methods.stacked import StepTensors
from creditaudit.run.setup import make_schedule
from creditaudit.run.steps.epochs import StackedEpochs
from creditaudit.run.steps.stepping import StackMember

# Eager steps (real training steps, on a side stream) before the capture, as the CUDA-graph
# documentation asks: autograd and the libraries allocate their workspaces there.
WARMUP_STEPS = 3


class CapturableAdamW(torch.optim.AdamW):
    """Fused AdamW whose step can be captured: ``capturable=True`` and the learning rate a
    float32 device tensor that the schedule fills (the fused kernel reads no other, so
    float64 runs are not captured: ``cuda_graphs_decision``). Its state dict is the eager
    optimiser's (a float learning rate, ``capturable`` false), so checkpoints resume with or
    without graphs."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float,
                 weight_decay: float, device: torch.device) -> None:
        super().__init__(params, lr=torch.tensor(lr, dtype=torch.float32, device=device),
                         weight_decay=weight_decay, fused=True, capturable=True)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for group in state["param_groups"]:
            group["lr"] = float(group["lr"])
            group["capturable"] = False
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rates = [group["lr"] for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, rate in zip(self.param_groups, rates, strict=True):
            rate.fill_(float(group["lr"]))
            group["lr"], group["capturable"] = rate, True


def make_capturable(member: StackMember) -> None:
    """Replace the run's optimiser and schedule by capturable ones in the same state."""
    old = member.optimizer
    params = [p for group in old.param_groups for p in group["params"]]
    group = old.param_groups[0]
    new = CapturableAdamW(params, lr=float(group["lr"]), weight_decay=group["weight_decay"],
                          device=member.device)
    new.load_state_dict(old.state_dict())
    rates = [float(g["lr"]) for g in new.param_groups]
    schedule = member.scheduler.state_dict()
    optim = member.config.optim
    member.optimizer = new
    member.scheduler = make_schedule(new, optim.schedule,
                                     optim.epochs * len(member.train_loader))
    member.scheduler.load_state_dict(schedule)
    # A new schedule starts at the base rate; the run may be part way through its decay.
    for g, rate in zip(new.param_groups, rates, strict=True):
        g["lr"].fill_(rate)


class CapturedEpochs(StackedEpochs):
    """:class:`StackedEpochs` whose full-size steps replay one captured CUDA graph."""

    def __init__(self, members: Sequence[StackMember]) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        for member in members:
            make_capturable(member)
        super().__init__(members, check="epoch")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warmed = 0
        self.static: tuple[Tensor, Tensor, StepTensors] | None = None
        self.full_shape: torch.Size | None = None

    def train_epoch(self, epoch: int) -> list[dict[str, Any] | Exception | None]:
        stats = super().train_epoch(epoch)
        if self.trained_again:
            # Trained again after a restore: the optimisers' state tensors are new ones.
            self.graph, self.static, self.warmed = None, None, 0
        return stats

    def _unchecked_step(self, x: Tensor, y: Tensor) -> StepTensors:
        if self.full_shape is None:
            self.full_shape = x.shape
        if x.shape != self.full_shape:  # the epoch's last, smaller batch
            return super()._unchecked_step(x, y)
        if self.graph is None:
            if self.warmed < WARMUP_STEPS:
                self.warmed += 1
                return self._side_stream_step(x, y)
            self._capture(x, y)
        assert self.graph is not None and self.static is not None
        static_x, static_y, out = self.static
        static_x.copy_(x)
        static_y.copy_(y)
        self.graph.replay()
        return out

    def _side_stream_step(self, x: Tensor, y: Tensor) -> StepTensors:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = super()._unchecked_step(x, y)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def _capture(self, x: Tensor, y: Tensor) -> None:
        """Record one step on static copies of the batch (recording runs nothing: the
        caller replays the graph for this batch)."""
        static_x, static_y = x.clone(), y.clone()
        for member in self.members:
            member.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = super()._unchecked_step(static_x, static_y)
        self.graph, self.static = graph, (static_x, static_y, out)


__all__ = ["CapturableAdamW", "CapturedEpochs", "make_capturable", "WARMUP_STEPS"]
