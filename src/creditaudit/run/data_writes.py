"""A run's data is read, never written: a network's forward (or a rule's ``credits``) that
writes its input in place, on a batch that is a view of the data (an unshuffled split's
slice: every evaluation), would change the data itself, and every later accuracy and
diagnostic would be of other data than the record names. The conformance suite checks
a guest's forward on its tiny inputs only; this catches the run's own, at no cost: an
in-place write bumps the version counter torch keeps per tensor storage, which its views
share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor

from creditaudit.errors import GuestError
from creditaudit.registry import ARCHITECTURES, RULES
from creditaudit.run.recorder_config import user_network
from creditaudit.run.recorder_inputs import tensor_versions

RUN_STOPS = "the numbers would be of other data than the record names and the run stops"


@contextlib.contextmanager
def data_left_alone(tensors: Sequence[Tensor], suspects: str, when: str, *,
                    data: str = "the run's data", stops: str = RUN_STOPS) -> Iterator[None]:
    """Run the block; GuestError (one line naming ``data``, ``suspects``, the code that ran
    on it, ``when`` and what that ``stops``) when it wrote any of ``tensors`` in place."""
    versions = tensor_versions(*tensors)  # None for an inference tensor: not watched
    yield
    if tensor_versions(*tensors) != versions:
        raise GuestError(
            f"{data} changed in place while {when}: {suspects} wrote its input, so {stops}; "
            "a forward (and credits()) must not write the batch it is given — fix that code "
            "or report it to its authors")


def measured_data(trainer: Any) -> tuple[Tensor, ...]:
    """The tensors a :class:`~creditaudit.run.trainer.Trainer`'s measurement reads: the
    dataset's four, the evaluation subset and the test loaders' own copies."""
    data = trainer.dataset
    loaders = (trainer.test_evaluation.rest, trainer.full_evaluation.rest)
    return (data.train_x, data.train_y, data.test_x, data.test_y, trainer.eval_x,
            *(loader.x for loader in loaders))


def run_suspects(plan: Any) -> str:
    """How :func:`data_left_alone` names the code that ran on a run's data (``plan``: its
    :class:`~creditaudit.run.plan.RunPlan`): the network and the credit rule, with the
    guests among them."""
    arch, method = plan.architecture, plan.rule
    guests = [g.what for g in (RULES.guest(method.name),
                                arch.guest_code() or ARCHITECTURES.guest(arch.name))
              if g is not None]
    code = f" ({'; '.join(guests)})" if guests else ""
    return (f"the network (model.arch={arch.name!r}) or the credit rule "
            f"(method.name={method.name!r}){code}")


def own_loop_suspects(rule: Any) -> str:
    """How :func:`data_left_alone` names the code a :class:`~creditaudit.run.recorder.Recorder`
    runs on the user's evaluation data (``rule``: its credit rule, bound to the user's
    network): the network as the record's ``model.module`` names it, and the rule as its
    ``method.name`` does, a plugin rule's guest code with it."""
    net = user_network(rule.model)
    module = f"{type(net).__module__}:{type(net).__qualname__}"
    guest = RULES.guest(rule.name)
    code = f" ({guest.what})" if guest is not None else ""
    return (f"the network (model.module={module!r}) or the credit rule "
            f"(method.name={rule.name!r}){code}")


__all__ = ["data_left_alone", "measured_data", "own_loop_suspects", "run_suspects"]
