"""Which weight layers the per-layer feedback rules can replace, and why a layer is refused.

Inside :func:`~creditaudit.methods.replaced_backward.replaced_backward` a layer's forward
becomes ``F.linear``/``F.conv2d`` of its ``weight`` and ``bias`` with B in the backward. That
is the layer's own computation only when its forward is ``nn.Linear``'s or ``nn.Conv2d``'s: a
subclass with a forward of its own (a weight-standardised ``StdConv2d``, a masked Linear,
BioTorch's converted layers) would train and be measured as another network, so it is refused
when the rule is bound (:func:`check_own_forward`). A subclass that keeps the forward
(PyTorch's ``NonDynamicallyQuantizableLinear``, ``nn.MultiheadAttention``'s ``out_proj``) is
the layer itself.

A layer the forward pass does not call as a module keeps its exact backward, which nothing
would notice, so it is refused too, with its cause. An adapted model's probe
(:func:`creditaudit.adapt`) ran the eval-mode forward the diagnostics' credits run, so there
the cause is known when the rule is bound
(:func:`~creditaudit.methods.adapted_feedback.check_called`): the forward uses the layer's
weight directly, or the layer did not run there (an auxiliary head that runs only in
training, a left-over layer). Elsewhere the first pass that misses a layer refuses it
(:class:`LayersNotCalled`, :func:`not_called_cause`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError
from creditaudit.models.contract import restored_buffers

# The fix every refusal below offers besides its own: a rule that keeps the layers as they are.
OTHER_RULES = "or use a rule that does not replace layers (dfa, bp)"


class LayersNotCalled(ModelContractError):
    """Layers a replaced backward was set up for were not called as modules in a forward
    pass; ``names`` and ``layers`` say which (the message states both possible causes)."""

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module], mode: str) -> None:
        self.names, self.layers, self.mode = list(names), list(layers), mode
        super().__init__(
            f"the layer(s) {', '.join(self.names[:3])} were not called as modules in the "
            f"{mode}-mode forward pass (the forward skips them or uses their weights "
            "directly), so their backward cannot be replaced; call every nn.Linear and "
            f"nn.Conv2d as a module and remove layers that do not run, {OTHER_RULES}")


def check_own_forward(where: str, layer: nn.Module, rule: str) -> None:
    """ModelContractError (one line) unless ``layer`` (an nn.Linear or nn.Conv2d, named
    ``where`` in messages) computes what nn.Linear's or nn.Conv2d's own forward computes:
    no override of ``forward`` (nor of nn.Conv2d's ``_conv_forward``, which its forward
    calls), on the class or on the instance."""
    base: type[nn.Module] = nn.Conv2d if isinstance(layer, nn.Conv2d) else nn.Linear
    methods = ("forward", "_conv_forward") if base is nn.Conv2d else ("forward",)
    own = [m for m in methods if getattr(type(layer), m) is not getattr(base, m)]
    if "forward" in layer.__dict__:  # set on this instance only
        own.append("forward")
    if own:
        function = "F.conv2d" if base is nn.Conv2d else "F.linear"
        cls = type(layer)
        # BioTorch's converted layers are also called Linear and Conv2d: say whose they are
        name = (f"{cls.__module__}.{cls.__qualname__}" if cls.__name__ == base.__name__
                and cls is not base else cls.__name__)
        raise ModelContractError(
            f"--method {rule} cannot train {where} ({name}): its "
            f"{own[0]} is its own, not nn.{base.__name__}'s, and the rule replaces only "
            f"nn.{base.__name__}'s own forward (it would run {function} on its weight "
            f"instead); use a plain nn.{base.__name__} there, {OTHER_RULES}")


def used_directly(rule: str, name: str, cls: str) -> ModelContractError:
    """The refusal of layer ``name`` (class ``cls``) whose weight the forward uses directly."""
    return ModelContractError(
        f"--method {rule} cannot replace the backward of {name!r} ({cls}): the model's "
        "forward uses its weight directly instead of calling it as a module, so its backward "
        "would stay exact; call every nn.Linear and nn.Conv2d as a module (layer(x)), "
        f"{OTHER_RULES}")


def did_not_run(rule: str, name: str, cls: str, mode: str, *, probe: bool = False
                ) -> ModelContractError:
    """The refusal of layer ``name`` (class ``cls``) that was not called in a forward pass
    in ``mode`` ("eval", the pass the diagnostics' credits run; "training") on one batch:
    adapt()'s example batch when ``probe``, else the batch of the pass that missed it. Its
    cause may be the batch (a routed expert skipped on it) as well as the mode (an
    auxiliary head run only in training) or the network (a left-over layer): the message
    says only what is known, and why either way the backward cannot be replaced."""
    batch = "adapt()'s example batch" if probe else "the batch it was given"
    where = (f"{mode} mode, the pass where the diagnostics measure credits" if mode == "eval"
             else f"{mode} mode")
    training = ", only in training (an auxiliary head)" if mode == "eval" else ""
    return ModelContractError(
        f"--method {rule} cannot replace the backward of {name!r} ({cls}): it was not called "
        f"on {batch} in {where}; a layer called only for some batches (a routed expert)"
        f"{training} or never cannot have its backward replaced reliably: call it on every "
        f"batch in both modes or remove it, {OTHER_RULES}")


def not_called_cause(model: nn.Module, x: Tensor, error: LayersNotCalled, rule: str
                     ) -> ModelContractError:
    """The cause of ``error`` for its first layer, found by running ``model`` on ``x`` once
    more in the same mode, with gradients: whether the logits read the layer's weight (used
    directly) or not (the layer did not run). Runs only on this failure path, under a forked
    RNG and with the buffers restored, so the diagnosis changes nothing."""
    name, layer = error.names[0], error.layers[0]
    if not any(module is layer for module in model.modules()):
        raise ModelContractError(
            f"--method {rule} was bound to the layer {name!r} ({type(layer).__name__}), which "
            "is no longer in the network: it was replaced or removed after the rule was "
            "bound; change the network before binding the rule, or bind it again (and build "
            "the optimiser again) on the network as it is now")
    weight, requires = layer.weight, layer.weight.requires_grad
    devices = [x.device] if x.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), restored_buffers(model), \
                torch.enable_grad():
            weight.requires_grad_(True)  # a frozen weight read directly must show in the graph
            logits = model(x)
            read = logits.requires_grad and torch.autograd.grad(
                logits.sum(), weight, allow_unused=True)[0] is not None
    finally:
        weight.requires_grad_(requires)
    cls = type(layer).__name__
    return used_directly(rule, name, cls) if read else did_not_run(rule, name, cls, error.mode)


__all__ = ["LayersNotCalled", "check_own_forward", "used_directly", "did_not_run",
           "not_called_cause"]
