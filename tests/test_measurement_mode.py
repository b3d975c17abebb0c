"""Measuring leaves a user's network as it found it, and measures in the model's own dtype.

``diagnose``, ``Recorder.epoch`` and the end-of-run metrics put the network in eval mode and
close an autocast the caller opened (:func:`creditaudit.models.contract.measurement_mode`):
afterwards every submodule has its own training flag back — a BatchNorm held in eval mode
inside a training network stays held — and the numbers are those measured without autocast.
A Recorder run that was not told its seed shows "not recorded" in the report, and the
feedback seed a rule drew from is in its options.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from creditaudit import Recorder, adapt, diagnose, rule
from creditaudit.cli import main
from creditaudit.models.contract import measurement_mode


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16),
                         nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Tanh()),
                         nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(64, 8, generator=generator),
            torch.randint(0, 3, (64,), generator=generator))


def _flags(module: nn.Module) -> list[bool]:
    return [m.training for m in module.modules()]


def test_measurement_mode_restores_each_submodules_flag():
    net = _net()
    net[1][1].eval()  # a BatchNorm the user holds
    before = _flags(net)
    with measurement_mode(net):
        assert not any(_flags(net))
    assert _flags(net) == before


def test_diagnose_and_recorder_keep_a_held_batchnorm_held(tmp_path):
    net = _net()
    x, y = _data()
    model = adapt(net, states=["0", "1", "2"], example=x[:8])
    credit = rule("dfa", model)
    net[1][1].eval()
    before = _flags(model)
    diagnose(model, x, y, credit=credit)
    assert _flags(model) == before
    recorder = Recorder(credit, x, y, out=tmp_path, name="held", progress=False,
                        config={"diagnostics.end_of_run": False})
    recorder.epoch(0)
    assert _flags(model) == before
    # a training step then leaves the held BatchNorm's statistics alone
    mean = net[1][1].running_mean.clone()
    credit.train_step(x[:32], y[:32], torch.optim.SGD(credit.trainable_parameters(), lr=0.1))
    assert torch.equal(mean, net[1][1].running_mean)


def test_a_network_in_eval_mode_under_adapt_stays_in_eval_mode():
    net = _net()
    x, y = _data()
    model = adapt(net, states=["0", "1", "2"], example=x[:8])
    net.eval()  # the user's network; the adapt wrapper's own flag is still True
    diagnose(model, x, y, credit=rule("fa-linear", model))
    assert not any(_flags(net))


def test_diagnostics_under_a_callers_autocast_are_the_fp32_numbers():
    net = _net()
    x, y = _data()
    model = adapt(net, states=["0", "1", "2"], example=x[:8])
    credit = rule("dfa", model)
    plain = diagnose(model, x, y, credit=credit)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = diagnose(model, x, y, credit=credit)
    assert under.layer_cosines == plain.layer_cosines and under.gamma == plain.gamma
    assert under.grad_norms == plain.grad_norms


def test_a_recorder_run_without_its_seed_reports_not_recorded(tmp_path, capsys):
    net = _net()
    x, y = _data()
    credit = rule("dfa", adapt(net, states=["0", "1", "2"], example=x[:8]), seed=7)
    assert credit.options.feedback_seed == 7  # the seed the feedback was drawn from
    recorder = Recorder(credit, x, y, out=tmp_path / "runs", name="noseed", progress=False,
                        config={"diagnostics.end_of_run": False})
    recorder.epoch(0)
    recorder.epoch(1, test_acc=0.4)
    recorder.finish()
    record = json.loads((tmp_path / "runs" / "noseed" / "record.json").read_text())
    assert record["config"]["method"]["feedback_seed"] == 7
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    text = (tmp_path / "report" / "report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| noseed", "| DFA", "| dfa"))]
    assert rows and all("| not recorded |" in row for row in rows), rows
    assert all("| 42 |" not in row for row in rows), rows
    per_run = next(row for row in rows if row.startswith("| dfa"))
    assert "| not recorded | 7 |" in per_run  # seeds, then the feedback seed
