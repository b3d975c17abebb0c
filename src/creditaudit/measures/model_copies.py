"""The working copy of a model the measures run on: :func:`model_copy` copies a model to
another dtype (the caller's model is never changed), and :class:`StatesNet` carries a user's
``states_fn`` and ``forward_from`` as a module's methods, so that a copy runs them on the
copied weights. The reference check (:mod:`creditaudit.measures.reference_check`) runs on a
float64 copy; the credit-quality metrics copy the same way
(:class:`~creditaudit.measures.working.WorkingCopy`).
"""

from __future__ import annotations

import copy
import types
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError
from creditaudit.measures.gradients import StatesFn
from creditaudit.measures.user_models import ForwardFrom

Module = TypeVar("Module", bound=nn.Module)


# The way out for a forward that casts to a dtype of its own, which a copy cannot run in float64.
KEEP_DTYPE = ("make the forward keep the dtype of its parameters (x.to(self.layer.weight.dtype),"
              " logits without .float())")


def model_copy(model: Module, dtype: torch.dtype) -> Module:
    """An eval-mode copy of ``model`` in ``dtype``, of its type (the caller's model stays as
    it is)."""
    clone = copy.deepcopy(model, graph_attributes_detached(model))
    clone.to(dtype=dtype)
    clone.eval()
    return clone


def graph_attributes_detached(model: Module) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo giving each tensor that a module of ``model`` keeps as a plain
    attribute and that is the output of a graph a detached copy: such a tensor — the
    ``weight`` of ``torch.nn.utils.weight_norm``/``spectral_norm``, which their pre-hook
    recomputes from the parameters before every forward — refuses deepcopy once a forward
    ran with gradients."""
    return {id(value): value.detach().clone() for module in model.modules()
            for value in vars(module).values()
            if isinstance(value, Tensor) and not value.is_leaf}


class StatesNet(nn.Module):
    """A user's module seen through the contract the metrics use: ``forward_states`` is
    ``states_fn``, ``forward_from`` is the given function.

    The reference check and the metrics work on float64 copies (:func:`model_copy`).
    A copy can re-point the functions at the copied module only when they are bound
    methods of it (``model.states``, ``model.run_from``): then :attr:`copyable` is True.
    Lambdas and other closures keep calling the original module, so for them the metrics
    run on the module as it is, in its own precision.
    """

    def __init__(self, net: nn.Module, states_fn: StatesFn, forward_from: ForwardFrom) -> None:
        super().__init__()
        self.net = net
        self._states_fn = states_fn
        self._forward_from = forward_from
        self.train(net.training)  # a new module trains; this one mirrors the net's mode

    @property
    def copyable(self) -> bool:
        return all(getattr(fn, "__self__", None) is self.net
                   for fn in (self._states_fn, self._forward_from))

    def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        states, logits = self._states_fn(x)
        return list(states), logits

    def forward_from(self, layer: int, h: Tensor) -> Tensor:
        return self._forward_from(layer, h)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_states(x)[1]

    def __deepcopy__(self, memo: dict[int, Any]) -> StatesNet:
        if not self.copyable:
            raise ModelContractError("states_fn and forward_from are not bound methods of the "
                                     "model, so a copy of it cannot run them")
        net = copy.deepcopy(self.net, memo)
        return StatesNet(net, types.MethodType(self._states_fn.__func__, net),  # type: ignore[attr-defined]
                         types.MethodType(self._forward_from.__func__, net))  # type: ignore[attr-defined]


__all__ = ["KEEP_DTYPE", "StatesNet", "graph_attributes_detached", "model_copy"]
