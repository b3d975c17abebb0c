"""A network that passes the door on its tiny batch but returns logits of another shape for
the run's batches — a class too many, half the rows — fails the run in one line naming the
plugin, in every training path (before: a class too many trained silently on a class the
data do not have, half the rows ended in torch's own error, reported as creditaudit's)."""

from __future__ import annotations

import re

import pytest

from creditaudit.errors import GuestError
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import train
from door_support import ORIGIN, guests, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

# Batches of 128 in training; every evaluation batch of at most 64 samples (the door's size).
RUN = {"optim.batch_size": 128, "data.n_test": 64, "diagnostics.eval_samples": 64,
       "diagnostics.end_of_run": False}
SHAPES = {"door-wide-logits": r"\((2, )?128, 5\) for a batch of 128 samples of 4 classes, "
                              r"not \((2, )?128, 4\)",
          "door-half-logits": r"\((2, )?64, 4\) for a batch of 128 samples of 4 classes, "
                              r"not \((2, )?128, 4\)"}


def refusal(arch: str) -> str:
    return (rf"^architecture plugin '{arch}' \({re.escape(ORIGIN)}\): its network returned "
            rf"logits of shape {SHAPES[arch]}; an error in its code, not in creditaudit")


@pytest.mark.parametrize("arch", sorted(SHAPES))
@pytest.mark.parametrize("method", ["bp", "fa", "dfa", "fa-linear", "state-bridge",
                                    "credit-bridge", "ep"])
def test_a_wrong_logits_shape_in_training_names_the_plugin(tmp_path, arch, method):
    with guests(tmp_path / "site", arch, "door-mixture"):
        config = tiny_config(tmp_path / "runs", **RUN, **{"model.arch": arch,
                                                          "method.name": method})
        with pytest.raises(GuestError, match=refusal(arch)):
            train(config)


@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_a_stack_names_the_plugin_too(tmp_path, arch):
    with guests(tmp_path / "site", arch, "door-mixture"):
        runs = [tiny_config(tmp_path / "runs", **RUN, **{"model.arch": arch, "run.seed": s,
                                                         "method.name": "dfa"})
                for s in (1, 2)]
        with pytest.raises(GuestError, match=refusal(arch)):
            train_stacked(runs)
