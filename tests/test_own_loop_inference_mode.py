"""A loop of your own that opens ``torch.inference_mode()`` around its evaluation may set up
there too: ``adapt``, ``rule`` and a ``Recorder`` created inside the block work as outside it.

Before: ``adapt`` blamed the network ("Net raised RuntimeError while adapt() probed it …:
Inference tensors do not track version counter"), a rule bound there drew its feedback as
inference tensors and its first step failed in torch's RuntimeError ("Inference tensors
cannot be saved for backward"), and a ``Recorder`` created there refused the network as one
whose forward casts to a dtype of its own (its end-of-run check ran a float64 copy made
inside the block)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from creditaudit import Recorder, adapt, rule

pytestmark = pytest.mark.usefixtures("single_thread")

STATES = ["0", "2"]


def data() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(48, 6, generator=generator), torch.randint(0, 3, (48,),
                                                                  generator=generator)


def network() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                             nn.Linear(8, 3))


def trained_and_recorded(folder: Path, setup: Callable[[], Any]) -> tuple[Any, list[Tensor]]:
    """adapt, rule and Recorder made inside ``setup``; two fa-linear steps outside it."""
    x, y = data()
    net = network()
    with setup():
        model = adapt(net, states=STATES, example=x[:4])
        bound = rule("fa-linear", model)
        rec = Recorder(bound, x, y, out=folder, name="r", data="mine", progress=False,
                       config={"diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
                               "diagnostics.null_draws": 2})
        rec.epoch(0)
    optimizer = torch.optim.SGD(bound.trainable_parameters(), lr=0.1)
    for batch in torch.arange(len(y)).split(16)[:2]:
        assert bound.train_step(x[batch], y[batch], optimizer).finite
    with setup():
        rec.epoch(1, test_acc=0.5)
        record = rec.finish()
    return record, [p.detach().clone() for p in net.parameters()]


def test_adapt_rule_and_recorder_made_in_inference_mode_record_the_same_run(tmp_path):
    plain, plain_weights = trained_and_recorded(tmp_path / "plain", contextlib.nullcontext)
    inside, inside_weights = trained_and_recorded(tmp_path / "inside", torch.inference_mode)
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, inside_weights, strict=True))
    assert plain.status == inside.status == "completed"
    assert plain.log[-1].measures == inside.log[-1].measures
    assert plain.diagnostics.perturbation_rho == inside.diagnostics.perturbation_rho
    assert plain.reference == inside.reference
