"""What :func:`~creditaudit.models.adapted.adapt` is given, checked before its probe runs:
a model that runs forward hooks (eager: not TorchScript, not compiled) and whose lazy
layers have their shapes, state and readout names of its submodules, and an example batch
or one input's shape. Each refusal is a one-line :class:`~creditaudit.errors.ModelContractError`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError


def check_shapes_taken(net: nn.Module) -> None:
    """One-line ModelContractError naming the modules of ``net`` whose parameters or buffers
    are still uninitialized (``nn.LazyLinear``, ``nn.LazyConv2d``, … before their first
    forward): the probe and every rule need each parameter's shape."""
    lazy = [f"{type(module).__name__} {name!r}" for name, module in net.named_modules()
            if any(nn.parameter.is_lazy(t) for t in (*module.parameters(recurse=False),
                                                     *module.buffers(recurse=False)))]
    if lazy:
        names = lazy[0] if len(lazy) == 1 else f"{', '.join(lazy[:-1])} and {lazy[-1]}"
        verb, their = ("has", "its") if len(lazy) == 1 else ("have", "their")
        raise ModelContractError(
            f"{names} {verb} not taken {their} shapes yet: run one forward pass on a batch "
            "(net(x)) before adapt(), so the lazy layers take their shapes")


def check_eager(net: nn.Module) -> None:
    """One-line ModelContractError naming the first TorchScript module of ``net``
    (``torch.jit.script`` or ``torch.jit.trace``) or the first module compiled with
    ``torch.compile`` (its wrapper, or ``module.compile()`` in place): adapt() reads states
    and checks the network with forward hooks, which TorchScript modules refuse or never
    call and a compiled graph runs as they were when it was compiled (hooks added later —
    the probe's, a rule's — are not guarded on)."""
    scripted = next(((name, module) for name, module in net.named_modules()
                     if isinstance(module, torch.jit.ScriptModule)), None)
    if scripted is not None:
        name, module = scripted
        where = f"{type(net).__name__}'s submodule {name!r}" if name else "the model"
        raise ModelContractError(
            f"{where} is a TorchScript module ({type(module).__name__}), whose forward runs "
            "no forward hooks, and adapt() reads the states with them: adapt the eager "
            "nn.Module (before torch.jit.script or torch.jit.trace)")
    compiled = next(((name, module) for name, module in net.named_modules()
                     if is_compiled(module)), None)
    if compiled is not None:
        name, module = compiled
        where = f"{type(net).__name__}'s submodule {name!r}" if name else "the model"
        eager = ("the module torch.compile wraps (its ._orig_mod)"
                 if hasattr(module, "_orig_mod") else "one built without .compile()")
        raise ModelContractError(
            f"{where} is compiled with torch.compile ({type(module).__name__}), whose "
            "compiled graph may keep running the forward hooks it was compiled with and "
            "skip those adapt() and the rules add to read and train the states: adapt the "
            f"eager network ({eager})")


def is_compiled(module: nn.Module) -> bool:
    """Whether ``module`` is torch.compile's wrapper or was compiled in place."""
    return (hasattr(module, "_orig_mod") and hasattr(module, "dynamo_ctx")
            or getattr(module, "_compiled_call_impl", None) is not None)


def input_shape_of(input_shape: Any) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints (one-line refusal otherwise)."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = None
    if shape is None or not shape or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise ModelContractError(f"input_shape must be one input's shape, positive integers "
                                 f"such as (3, 32, 32), got {input_shape!r}")
    return shape


def check_example(example: Any, reference: Tensor | None, name: str) -> None:
    """A batch of finite inputs in the dtype of the model's parameters (floating ones)."""
    if not isinstance(example, Tensor) or example.dim() < 1:
        raise ModelContractError(f"example must be a batch of inputs (B, …), got "
                                 f"{describe_value(example)}")
    if not example.is_floating_point():
        return  # token ids and other integer inputs: the forward decides
    if reference is not None and example.dtype != reference.dtype and not example.is_meta:
        have, want = (str(t).removeprefix("torch.") for t in (example.dtype, reference.dtype))
        raise ModelContractError(f"example is {have} but {name}'s parameters are {want}: pass "
                                 f"example.to(torch.{want}), or convert the model first")
    if not example.is_meta and not bool(torch.isfinite(example).all()):
        raise ModelContractError("example holds NaN/Inf: adapt() probes the model on finite "
                                 "inputs")


def check_names(net: nn.Module, names: Sequence[str], argument: str) -> None:
    """One-line ModelContractError for the first of ``names`` (given as ``argument``) that is
    not a submodule of ``net``, with the closest names it has."""
    known = [name for name, _ in net.named_modules() if name]
    canonical = {id(module): name for name, module in net.named_modules()}
    for name in names:
        first = _registered_first(net, name, canonical)
        if first is not None:
            raise ModelContractError(
                f"{argument}: {name!r} is the module {first!r} registered a second time (the "
                f"same object under both names), and adapt() reads a module by the name "
                f"model.named_modules() gives it: name it {first!r}")
        if not isinstance(name, str) or name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else (
                "; names are those of model.named_modules()")
            raise ModelContractError(f"{argument}: {name!r} is not a submodule of "
                                     f"{type(net).__name__}{hint}")


def _registered_first(net: nn.Module, name: Any, canonical: dict[int, str]) -> str | None:
    """The name ``named_modules()`` lists for the submodule at path ``name`` when that is
    another path — the module is registered under both (``self.alias = self.enc``, one block
    in a ModuleList twice) and named_modules() gives each module once — else None."""
    if not isinstance(name, str) or not name:
        return None
    try:
        module = net.get_submodule(name)
    except AttributeError:
        return None
    first = canonical.get(id(module))
    return first if first is not None and first != name else None


def describe_value(value: Any) -> str:
    """What ``value`` is, for messages: ``a float32 tensor of shape (4, 8)``, ``a tuple of 2``."""
    if isinstance(value, Tensor):
        return _a(f"{str(value.dtype).removeprefix('torch.')} tensor of shape "
                  f"{tuple(value.shape)}")
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return _a(type(value).__name__)


def _a(words: str) -> str:
    """``words`` after its indefinite article: ``an int64 tensor``, ``a float32 tensor``."""
    return f"an {words}" if words[:1].lower() in "aeio" else f"a {words}"


def checkpoint_cause(name: str, err: BaseException) -> str | None:
    """Why activation checkpointing in network ``name`` failed under adapt()'s probe (the
    error ``err`` it raised), and the fix (None: another error). The reentrant variant
    refuses ``torch.autograd.grad``, which the probe and every rule take at the states; the
    non-reentrant one recomputes its region in the backward pass without the hooks that read
    a state inside it, and finds other tensors."""
    from torch.utils.checkpoint import CheckpointError

    if isinstance(err, CheckpointError):
        return (f"{name} computes a state inside a torch.utils.checkpoint region rather than "
                "at its end, and the region's recomputation in the backward pass runs without "
                "the hooks that read and replace the states: checkpoint each block on its own "
                "(checkpoint(block, h), the state module ending the region)")
    if "use_reentrant=True" in str(err):
        return (f"{name} runs torch.utils.checkpoint with use_reentrant=True, which refuses "
                "torch.autograd.grad, and adapt() and the rules take the states' gradients "
                "with it: pass use_reentrant=False")
    return None


def backward_hook_cause(net: nn.Module, err: BaseException, error: str) -> str | None:
    """The line for ``err`` (its text ``error``) when a backward hook of a module of
    ``net`` (``register_full_backward_hook`` or ``register_full_backward_pre_hook``) raised
    it, else None. adapt()'s probe reads each state detached to find the segments, as the
    local rules (dfa, drtp, local-ce) read them in training, so a hook on a module reading a
    state is given ``None`` for its input's gradient there, though end-to-end training
    never gives it one: the line says so, and how to make the hook safe."""
    hooks = {}
    for name, module in net.named_modules():
        for hook in [*module._backward_hooks.values(), *module._backward_pre_hooks.values()]:
            code = getattr(getattr(hook, "__func__", hook), "__code__", None)
            if code is not None:
                hooks.setdefault(code, name)
    frame = err.__traceback__
    while frame is not None and frame.tb_frame.f_code not in hooks:
        frame = frame.tb_next
    if frame is None:
        return None
    module = hooks[frame.tb_frame.f_code]
    return (f"the backward hook {frame.tb_frame.f_code.co_name!r} on {module!r} of "
            f"{type(net).__name__} raised {type(err).__name__} while adapt() probed it "
            f"({error}): the probe reads each state detached, as the local rules (dfa, "
            "drtp, local-ce) do in training, so a hook on a module reading a state may be "
            "given None for its input's gradient (end-to-end training never gives it one); "
            "make the hook pass None through (if grad_input[0] is None: return None)")


class NotLogitsError(ModelContractError):
    """A network's output is not (batch, classes) logits (:func:`not_logits_line`);
    ``net_name`` and ``got`` (what it returned, in words) let a caller that knows where the
    network came from say how to fix it there."""

    def __init__(self, net_name: str, got: str, origin: str | None = None) -> None:
        self.net_name, self.got = net_name, got
        super().__init__(not_logits_line(net_name, got, origin))


def not_logits_line(net_name: str, got: str, origin: str | None = None) -> str:
    """The line for a network ``net_name`` whose output was ``got``, not (batch, classes)
    logits: adapt a module of one's own that returns them or, for a network built by
    ``origin`` (the command line's ``model factory '…'``), make the factory return one."""
    head = f"{net_name}'s output must be (batch, classes) logits, got {got}: "
    if origin is None:
        return head + ("adapt a module of your own whose forward returns them (e.g. "
                       "`return self.net(x)[0]` or `self.net(x).logits`)")
    return head + (f"make the {origin} return a module that wraps the network and whose "
                   "forward returns them (forward(self, x): return self.net(x)[0], or "
                   "self.net(x).logits)")


def several_inputs_cause(net: nn.Module, err: BaseException) -> str | None:
    """The line for ``err`` when ``net``'s forward needs more than one argument (a mask, a
    second modality), else None: adapt()'s probe, the rules and the diagnostics call the
    network on one batch tensor, so torch's "missing 1 required positional argument" was
    answered with "pass inputs its forward takes", which no caller can."""
    if not isinstance(err, TypeError) or "required" not in str(err):
        return None
    try:
        signature = inspect.signature(net.forward)
    except (TypeError, ValueError):
        return None
    needed = [name for name, p in signature.parameters.items()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                     p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if len(needed) < 2:
        return None
    name = type(net).__name__
    return (f"{name}'s forward takes {len(needed)} inputs ({', '.join(needed)}), but the "
            "rules and the diagnostics call a network on one batch tensor: wrap it in a "
            "module whose forward takes one (forward(self, x): return self.net(x, …) with "
            "the other inputs made or kept inside) and adapt that, or return that from your "
            "model.factory")


__all__ = ["check_eager", "is_compiled", "check_shapes_taken", "check_names", "check_example",
           "input_shape_of", "describe_value", "checkpoint_cause", "backward_hook_cause",
           "several_inputs_cause", "NotLogitsError", "not_logits_line"]
