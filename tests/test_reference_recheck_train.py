"""``creditaudit train`` checks a guest's network again at every trained epoch, as a
Recorder does: a factory network whose forward switches a straight-through sign estimator
on after a few steps (an internal step counter) was checked only as it started, and its bp
run recorded as verified BP, every cosine +1.000 against the estimator's own credit. Now
the epoch whose check finds the backward no longer the gradient refuses the run in one line
(``diagnostics.allow_unverified_reference``: records ``failed`` from that epoch, every
cosine, Γ and (b) after it marked), resumed and stacked runs included; creditaudit's own
architectures, whose forwards cannot switch, are not checked again. Training is the same
with and without the check (it runs on copies, in eval mode, under a forked RNG).
"""

from __future__ import annotations

import sys

import pytest
import torch

import creditaudit.run.epoch_measurement as measurement
from creditaudit import RunConfig
from creditaudit.cli import main
from creditaudit.measures.reference_check import ReferenceGradientError
from creditaudit.records import comparable, load_record
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import train

pytestmark = pytest.mark.usefixtures("single_thread")

NETS = '''\
import torch
from torch import nn


class Sign(nn.Module):
    """A straight-through sign once the network has taken more than ``after`` training
    steps (a fake-quantiser's enable flag, as a loop switches it)."""

    def __init__(self, after):
        super().__init__()
        self.after = after
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, h):
        if self.training:
            self.steps += 1
        if int(self.steps) > self.after:
            return h + (torch.sign(h) - h).detach()
        return h


class Net(nn.Module):
    def __init__(self, after):
        super().__init__()
        self.b1, self.b2 = nn.Linear(8, 16), nn.Linear(16, 16)
        self.q = Sign(after)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.q(torch.tanh(self.b2(torch.tanh(self.b1(x.flatten(1)))))))


def make(after=3):
    return Net(after)
'''

SWITCHED = ("the model's backward was the gradient of its forward when the run started, and "
            "is no longer (a straight-through estimator or fake-quantiser switched on since?)")


@pytest.fixture
def switching(tmp_path, monkeypatch):
    """``rr_nets:make``: two steps an epoch, the sign estimator on from epoch 2's second."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "rr_nets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("rr_nets", None)


def config(out, **overrides) -> RunConfig:
    return RunConfig().replace(**{
        "data.name": "synthetic", "data.in_dim": 8, "data.n_train": 64, "data.n_test": 64,
        "model.arch": "module", "model.factory": "rr_nets:make", "model.states": ["b1", "b2"],
        "method.name": "bp", "optim.epochs": 3, "optim.batch_size": 32,
        "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(out), **overrides})


def test_train_refuses_the_epoch_a_guests_backward_switches(switching, tmp_path):
    with pytest.raises(ReferenceGradientError) as err:
        train(config(tmp_path))
    assert str(err.value).startswith(f"epoch 2: {SWITCHED}: ")
    assert "\n" not in str(err.value)
    record = load_record(next(tmp_path.glob("bp-*")))
    assert record.status == "failed" and [e.epoch for e in record.log] == [0, 1]


def test_the_command_says_so_in_one_line(switching, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(switching)
    code = main(["train", "--arch", "module:rr_nets:make", "--dataset", "synthetic",
                 "--set", 'model.states=["b1", "b2"]', "--set", "data.in_dim=8",
                 "--set", "data.n_train=64", "--set", "data.n_test=64",
                 "--set", "optim.epochs=3", "--set", "optim.batch_size=32",
                 "--set", "diagnostics.eval_samples=64", "--out", str(tmp_path / "cli"),
                 "-q", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and f"epoch 2: {SWITCHED}" in err and len(err.splitlines()) == 1


def allowed(out, **overrides) -> RunConfig:
    return config(out, **{"diagnostics.allow_unverified_reference": True, **overrides})


def test_an_allowed_run_records_failed_from_that_epoch(switching, tmp_path):
    result = train(allowed(tmp_path))
    reference = result.record.reference
    assert result.record.status == "completed"
    assert not reference.verified and reference.failed
    assert reference.detail.startswith(f"from epoch 2 ({SWITCHED}): ")


@pytest.mark.parametrize("killed", [2, 4])
def test_a_resumed_run_checks_against_its_start(switching, tmp_path, kill_run_at, killed):
    """Killed before the switch (epoch 2) the resumed run finds it; killed after (epoch 4,
    its record failed from epoch 2) it keeps that: the network as built, whose check
    passes, cannot show it. Either way the record is the whole run's."""
    whole = train(allowed(tmp_path / "whole", **{"optim.epochs": 4}))
    cut = allowed(tmp_path / "cut", **{"optim.epochs": 4})
    kill_run_at(cut, epoch=killed)
    resumed = train(cut, resume=True)
    assert resumed.record.reference == whole.record.reference
    assert resumed.record.reference.detail.startswith("from epoch 2 (")
    assert comparable(resumed.record) == comparable(whole.record)


def test_stacked_runs_check_each_epoch_too(switching, tmp_path):
    results = train_stacked([allowed(tmp_path), allowed(tmp_path, **{"run.seed": 1})])
    assert all(r.record.reference.detail.startswith("from epoch 2 (") for r in results)
    refused = train_stacked([config(tmp_path / "refused"),
                             config(tmp_path / "refused", **{"run.seed": 1})])
    assert all(r.record.status == "failed" for r in refused)  # each alone, as it fails
    assert all(r.record.error.startswith(f"ReferenceGradientError: epoch 2: {SWITCHED}")
               for r in refused)


def test_only_guests_are_checked_again_and_training_is_unchanged(switching, tmp_path,
                                                                 monkeypatch):
    calls: list[int] = []
    checking = measurement.reference_since_start

    def counted(*args, **kwargs):
        calls.append(kwargs["epoch"])
        return checking(*args, **kwargs)

    monkeypatch.setattr(measurement, "reference_since_start", counted)
    built_in = RunConfig().replace(**{
        "data.name": "synthetic", "data.n_train": 64, "data.n_test": 64, "model.d": 16,
        "model.n_blocks": 2, "method.name": "bp", "optim.epochs": 2,
        "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(tmp_path / "own")})
    train(built_in)
    assert calls == []
    never = {"model.args": {"after": 10**9}}  # the estimator never on: a healthy guest
    checked = train(config(tmp_path / "a", **never))
    assert calls == [1, 2, 3] and checked.record.reference.verified
    monkeypatch.setattr(measurement, "reference_since_start", lambda start, *a, **k: start)
    unchecked = train(config(tmp_path / "b", **never))
    for (name, p), q in zip(checked.model.state_dict().items(),
                            unchecked.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert comparable(checked.record) == comparable(unchecked.record)
