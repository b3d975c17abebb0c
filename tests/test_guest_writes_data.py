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


@pytest.mark.slow  # the door and a tiny run: about 7 s
def test_a_forward_that_writes_the_evaluation_data_stops_the_run(tmp_path):
    with guests(tmp_path / "site", "door-mixture", "p57-halves-its-input"):
        config = tiny_config(tmp_path / "runs", **{"model.arch": "p57-halves-its-input",
                                                   "optim.epochs": 2})
        with pytest.raises(GuestError) as err:
            train(config)
    assert str(err.value).startswith(
        "the run's data changed in place while epoch 0 was measured: the network "
        "(model.arch='p57-halves-its-input') or the credit rule (method.name='bp') "
        f"(architecture plugin 'p57-halves-its-input' ({ORIGIN})) wrote its input"), err.value


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
