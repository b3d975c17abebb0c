"""A network whose forward writes its input in place — on a run's evaluation batches, past
the conformance suite's tiny ones — would change the evaluation split itself (its batches are
views of it): every later accuracy and diagnostic of other data than the record names. The
run stops in one line naming the network and the rule instead."""

from __future__ import annotations

import pytest

from creditaudit.errors import GuestError
from creditaudit.run.trainer import train
from door_support import ORIGIN, guests, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

SUSPECTS = ("the network (model.arch='late-halves-its-input') or the credit rule "
            f"(method.name='bp') (architecture plugin 'late-halves-its-input' ({ORIGIN})) "
            "wrote its input")


def watch_off(monkeypatch, *modules):
    """Switch the watch off where ``modules`` (of creditaudit.run) use it, to reach the
    next place the guest writes its input (as before the watch was there)."""
    import contextlib
    import importlib

    for name in modules:
        monkeypatch.setattr(importlib.import_module(f"creditaudit.run.{name}"),
                            "data_left_alone", lambda *args: contextlib.nullcontext(),
                            raising=False)


@pytest.mark.slow  # the door and a tiny run: about 7 s
def test_a_forward_that_writes_the_evaluation_data_is_refused_before_the_run_starts(
        tmp_path):
    """The reference check, as the trainer is built, runs the network on the evaluation
    set's first 32 samples: the first place the guest writes them (before, its epoch 0 was
    of data already halved there), and nothing of the run is written."""
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        config = tiny_config(tmp_path / "runs", **{"model.arch": "late-halves-its-input"})
        with pytest.raises(GuestError) as err:
            train(config)
    assert str(err.value).startswith(
        "the run's data changed in place while the reference gradient was checked: "
        + SUSPECTS), err.value
    assert not list((tmp_path / "runs").glob("*/record.json"))


@pytest.mark.slow  # the door and a tiny run: about 7 s
def test_a_forward_that_writes_the_evaluation_data_stops_the_run(tmp_path, monkeypatch):
    watch_off(monkeypatch, "results")  # the reference check's
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        config = tiny_config(tmp_path / "runs", **{"model.arch": "late-halves-its-input",
                                                   "optim.epochs": 2})
        with pytest.raises(GuestError) as err:
            train(config)
    assert str(err.value).startswith(
        "the run's data changed in place while epoch 0 was measured: " + SUSPECTS), err.value


@pytest.mark.slow  # the door and a tiny run: about 7 s
def test_a_forward_that_writes_the_evaluation_data_at_the_end_of_the_run_stops_it(
        tmp_path, monkeypatch):
    """The end-of-run block (ρ, nudging, Γ on the evaluation set) is watched as the epochs
    are; the run is recorded failed, naming the guest."""
    from creditaudit.records import load_record

    watch_off(monkeypatch, "results", "epoch_measurement")  # the reference check's, the epochs'
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        config = tiny_config(tmp_path / "runs", **{"model.arch": "late-halves-its-input"})
        with pytest.raises(GuestError) as err:
            train(config)
    assert str(err.value).startswith(
        "the run's data changed in place while the end-of-run metrics were measured: "
        + SUSPECTS), err.value
    record = load_record(next((tmp_path / "runs").glob("*/record.json")).parent)
    assert record.status == "failed" and "end-of-run" in record.error, record.error


@pytest.mark.slow  # the door, a tiny run and its audit: about 9 s
def test_a_forward_that_writes_the_evaluation_data_stops_its_audit(tmp_path, monkeypatch):
    """audit re-evaluates the checkpointed network on the evaluation set (a view of the
    test split): a forward that writes it stops the audit instead of a report of other
    data. The run is trained with the watch switched off, as before the watch existed."""
    from creditaudit.audit import audit_run

    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        config = tiny_config(tmp_path / "runs", **{"model.arch": "late-halves-its-input",
                                                   "diagnostics.end_of_run": False})
        with monkeypatch.context() as patch:
            watch_off(patch, "results", "epoch_measurement", "record_keeping")
            result = train(config)
        assert result.status == "completed"
        with pytest.raises(GuestError) as err:
            audit_run(result.run_dir, metrics=False)
    assert str(err.value).startswith(
        "the run's data changed in place while audit measured epoch 1: " + SUSPECTS), err.value


def test_tensors_made_in_inference_mode_are_left_out_of_the_watch():
    """A dataset loaded under torch.inference_mode() keeps no version counter (reading it
    raises): the watch skips it rather than fail the run, and still sees the others."""
    import torch

    from creditaudit.run.data_writes import data_left_alone

    with torch.inference_mode():
        frozen = torch.ones(4)
    watched = torch.ones(4)
    with data_left_alone([frozen, watched], "the network", "epoch 0 was measured"):
        pass
    with pytest.raises(GuestError, match="the network wrote its input"), \
            data_left_alone([frozen, watched], "the network", "epoch 0 was measured"):
        watched[0:2].mul_(0.5)



def recorder_of(tmp_path, net, **config):
    """A Recorder of backprop on ``net`` (8 features, 4 classes) and 64 evaluation samples."""
    import torch

    from creditaudit import Recorder, rule

    eval_x, eval_y = torch.randn(64, 8), torch.arange(64) % 4
    return Recorder(rule("bp", net), eval_x, eval_y, out=tmp_path / "runs", name="halves",
                    progress=False, config=config)


def halving_network(armed: bool):
    """The network that halves its input (in eval mode, on batches larger than 16), armed
    from the start or only once ``net.armed = True``."""
    import torch
    from creditaudit_guests.late_guests import HalvingMLP

    from creditaudit.models import ResidualMLP

    class LaterHalvingMLP(HalvingMLP):
        def forward_states(self, x):
            if self.armed:
                return super().forward_states(x)
            return ResidualMLP.forward_states(self, x)

    torch.manual_seed(0)
    net = LaterHalvingMLP(8, 16, 4, 2)
    net.armed = armed
    return net


RECORDER_SUSPECTS = ("the network (model.module='test_guest_writes_data:halving_network."
                     "<locals>.LaterHalvingMLP') or the credit rule (method.name='bp') wrote "
                     "its input")


def test_a_network_that_writes_the_evaluation_data_is_refused_by_a_recorder(tmp_path):
    """The Recorder's reference check, as it is created, runs the network on eval_x's first
    32 samples: one that writes them is refused there, before the record is written (it
    was accepted, and the next epoch() blamed the caller's loop for changing eval_x)."""
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"), \
            pytest.raises(GuestError) as err:
        recorder_of(tmp_path, halving_network(armed=True))
    assert str(err.value).startswith(
        "the run's data changed in place while the reference gradient was checked: "
        + RECORDER_SUSPECTS), err.value
    assert not (tmp_path / "runs" / "halves").exists()


def test_a_network_that_writes_the_evaluation_data_stops_a_recorders_epoch(tmp_path):
    """A Recorder measures each epoch on the user's eval_x: a network writing it there stops
    the epoch in one line naming the network as the record's model.module does, and the
    rule, instead of recording numbers of other data (the epoch's check of the reference
    gradient is the first to run the network on it)."""
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        net = halving_network(armed=False)
        recorder = recorder_of(tmp_path, net, **{"diagnostics.end_of_run": False})
        net.armed = True
        with pytest.raises(GuestError) as err:
            recorder.epoch(0)
    assert str(err.value).startswith(
        "the run's data changed in place while epoch 0's reference gradient was checked: "
        + RECORDER_SUSPECTS
    ), err.value
    assert recorder.record.log == []


def test_a_network_that_writes_the_evaluation_data_stops_a_recorders_finish(tmp_path):
    with guests(tmp_path / "site", "door-mixture", "late-halves-its-input"):
        net = halving_network(armed=False)
        recorder = recorder_of(tmp_path, net, **{
            "diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
            "diagnostics.null_draws": 2})
        recorder.epoch(0)
        net.armed = True
        with pytest.raises(GuestError) as err:
            recorder.finish()
    assert str(err.value).startswith(
        "the run's data changed in place while the end-of-run metrics were measured: "
        + RECORDER_SUSPECTS), err.value


def test_a_network_that_writes_the_evaluation_data_stops_diagnose():
    """diagnose() from Python was not watched: a model whose forward writes its input
    returned numbers of other data, silently. It raises one line naming the model's class
    and the credit rule now (audit keeps its own words: the test above)."""
    import torch

    from creditaudit import diagnose, rule
    from creditaudit.models import ResidualMLP

    class WritesItsInput(ResidualMLP):
        def forward_states(self, x):
            return super().forward_states(x.mul_(1.0))  # same values, but a write

    torch.manual_seed(0)
    net = WritesItsInput(8, 16, 4, 2)
    eval_x, eval_y = torch.randn(64, 8), torch.arange(64) % 4
    with pytest.raises(GuestError) as err:
        diagnose(net, eval_x, eval_y, credit=rule("dfa", net), verify_reference=False)
    assert str(err.value).startswith(
        "eval_x or eval_y changed in place while diagnose() measured them: the model "
        "(test_guest_writes_data:test_a_network_that_writes_the_evaluation_data_stops_"
        "diagnose.<locals>.WritesItsInput) or the credit rule ('dfa') wrote its input, so "
        "its numbers would be of other data than those given and diagnose() stops;"), err.value
    assert "\n" not in str(err.value)
