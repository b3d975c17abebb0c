"""A loop may change what its network's backward computes after the Recorder was created
without changing a module: quantisation-aware training switches its fake-quantiser (a
straight-through estimator) on after a few epochs by an attribute the forward reads. The
Recorder checked the reference gradient only when it was created, so from then on every
epoch recorded BP's cosines as +1.000, verified, against the estimator's "gradient" (the
true one through a rounding is zero almost everywhere). Each ``epoch()`` now checks a
verified reference again: refused in one line naming the epoch, or with
``allow_unverified_reference`` recorded as failed from that epoch, every cosine marked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.measures.reference_check import ReferenceGradientError

pytestmark = pytest.mark.usefixtures("single_thread")


class FakeQuantised(nn.Module):
    """Two tanh layers; with ``quantise`` on, the first one's output is rounded to steps of
    1/2 through a straight-through estimator (forward: the rounding; backward: identity)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 3)
        self.quantise = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.quantise:
            h = h + (torch.round(h * 2) / 2 - h).detach()
        return self.head(self.b(h))


def recorder(tmp_path, **options) -> tuple[Recorder, FakeQuantised]:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 6, generator=generator), torch.randint(0, 3, (64,),
                                                                  generator=generator)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = FakeQuantised()
    bound = rule("bp", adapt(net, states=["a", "b"], example=x[:4]))
    return Recorder(bound, x, y, out=tmp_path, name="qat", data="mine", progress=False,
                    config={"diagnostics.end_of_run": False}, **options), net


def test_an_estimator_switched_on_after_the_recorder_is_refused_at_the_next_epoch(tmp_path):
    rec, net = recorder(tmp_path)
    rec.epoch(0)
    rec.epoch(1)  # unchanged: checked again, still verified
    assert rec.record.reference.verified
    net.quantise = True
    with pytest.raises(ReferenceGradientError, match=r"^epoch 2: the model's backward was the "
                       r"gradient of its forward when the Recorder was created, and is no "
                       r"longer .*between h_0 and h_1.*allow_unverified_reference=True"):
        rec.epoch(2)
    assert [entry.epoch for entry in rec.record.log] == [0, 1]


def test_allowed_it_is_recorded_failed_from_that_epoch(tmp_path):
    rec, net = recorder(tmp_path, allow_unverified_reference=True)
    rec.epoch(0)
    net.quantise = True
    rec.epoch(1)
    record = rec.finish()
    assert not record.reference.verified and record.reference.how == "failed"
    assert record.reference.where == "between h_0 and h_1"
    assert record.reference.detail.startswith("from epoch 1 (")
    assert record.protocol.verdict.startswith("unverified")
