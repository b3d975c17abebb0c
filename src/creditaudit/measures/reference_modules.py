"""The reference check module by module: which module's backward is not the gradient of
its forward?

Each module whose input carries a gradient is recorded on its first call in a forward pass
(:func:`_recorded`) and replayed on its own, in float64: on the inputs it received it
compares ⟨Jᵀu, w⟩ (its backward) with ⟨u, J·w⟩ (a central difference of its output, judged
by :mod:`creditaudit.measures.central_differences`) for the output direction
u = J·w / ‖J·w‖; a module whose backward raises is at fault too. :func:`_scan` finds the
innermost module at fault and :func:`_module_message` names it in a one-line
:class:`ReferenceGradientError`; where the state-by-state check placed a disagreement
between two states, :func:`_raise_for_segment` names the module in that segment. Used by
:mod:`creditaudit.measures.reference_check`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError
from creditaudit.measures.central_differences import F64, ROUNDING_ULPS, STEPS, _as64, _compared
from creditaudit.measures.directions import unit_directions

FIX = "pass verify_reference=False to audit it unverified"  # the way out every refusal names
# A module's recorded inputs are moved off ties by this much of their RMS (:func:`off_ties`).
MODULE_JITTER = 1e-3
Key = int | str  # a positional argument's index or a keyword argument's name


class _Working(Protocol):
    """The float64 working copy the state-by-state check runs
    (:class:`~creditaudit.measures.model_copies.StatesNet`): the user's module ``net``
    and the network run on from a state."""

    net: nn.Module

    def forward_from(self, layer: int, h: Tensor) -> Tensor: ...

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...


class ReferenceGradientError(ModelContractError):
    """The model's backward is not the gradient of its forward, so the protocol's reference
    gradient would be the model's own credit. ``where``: the module (``blocks.1.w2``) or
    the segment (``between h_2 and h_3``) whose backward differs, when it was placed. The
    message ends in the way out (:data:`FIX`, ``diagnose``'s; :meth:`with_fix` gives
    another caller's)."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message)
        self.where = where

    @property
    def finding(self) -> str:
        """The message without its way out: what was found (for a record)."""
        text = str(self).removesuffix(FIX)
        for tail in (", or ", "; ", " or "):
            if text.endswith(tail):
                return text[:-len(tail)]
        return text

    def with_fix(self, fix: str) -> ReferenceGradientError:
        """The same refusal with ``fix`` as its way out instead of ``diagnose``'s."""
        text = str(self)
        return ReferenceGradientError(text.removesuffix(FIX) + fix if text.endswith(FIX)
                                      else f"{text}; {fix}", where=self.where)


@dataclass
class _Call:
    """A module's first call in a forward pass: its name, its arguments (detached copies)
    and which of them are float tensors that carried a gradient."""

    name: str
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: list[Key]

    def value(self, key: Key) -> Any:
        return self.args[key] if isinstance(key, int) else self.kwargs[key]

    def run(self, module: nn.Module, values: dict[Key, Tensor]) -> list[Tensor]:
        """The module's float outputs with the ``values`` put in for those arguments (every
        other float tensor argument in float64 too)."""
        args = [values.get(i, _as64(a) if isinstance(a, Tensor) else a)
                for i, a in enumerate(self.args)]
        kwargs = {k: values.get(k, _as64(a) if isinstance(a, Tensor) else a)
                  for k, a in self.kwargs.items()}
        out = module(*args, **kwargs)
        outs = out if isinstance(out, tuple | list) else [out]
        return [t for t in outs if isinstance(t, Tensor) and t.is_floating_point()]


def _detached(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else value


@contextlib.contextmanager
def _recorded(root: nn.Module) -> Iterator[list[_Call]]:
    """Record the first call of every module of ``root`` made inside the block (forward
    pre-hooks, removed on the way out: the inputs before an in-place module changes them)."""
    calls: list[_Call] = []
    seen: set[str] = set()

    def hook(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if name in seen:
                return
            seen.add(name)
            inputs: list[Key] = [key for key, a in [*enumerate(args), *kwargs.items()]
                                 if isinstance(a, Tensor) and a.is_floating_point()
                                 and a.requires_grad]
            calls.append(_Call(name, module, tuple(_detached(a) for a in args),
                               {k: _detached(a) for k, a in kwargs.items()}, inputs))
        return record

    handles = [module.register_forward_pre_hook(hook(name), with_kwargs=True)
               for name, module in root.named_modules()]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


class _BackwardRaised(Exception):
    """A module's backward raised: ``text`` says what."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def off_ties(xs: Tensor, jitter: float) -> Tensor:
    """``xs`` moved by ``jitter`` of its RMS along a fixed random direction (integer or
    empty tensors as they are): a point beside ``xs`` where no two entries are tied and none
    sits at a ReLU's 0 (:func:`~creditaudit.measures.reference_check._off_ties`)."""
    if not xs.is_floating_point() or xs.numel() == 0:
        return xs
    generator = torch.Generator(device=xs.device).manual_seed(0)
    noise = torch.randn(xs.shape, generator=generator, device=xs.device, dtype=xs.dtype)
    scale = xs.detach().float().pow(2).mean().sqrt().clamp_min(1e-12).to(xs.dtype)
    return xs + jitter * scale * noise


def _module_verdict(module: nn.Module, call: _Call, generator: torch.Generator) -> int:
    """+1, −1 or 0 (as :func:`~creditaudit.measures.central_differences._verdicts`)
    for the module's backward on the call's inputs moved off ties (:func:`off_ties`: a
    ReLU's zeros into a max-pool tie its windows, whatever the network's input): two random
    input directions w, each with u = J·w / ‖J·w‖; it disagrees only if both do (a ReLU
    kink crossed at every step is one direction's bad luck, not a wrong backward)."""
    inputs = {key: off_ties(_as64(call.value(key)), MODULE_JITTER) for key in call.inputs}
    verdicts = []
    for _ in range(2):
        verdicts.append(_module_direction(module, call, inputs, generator))
        if verdicts[-1] > 0:
            return 1
    return -1 if verdicts == [-1, -1] else 0


def _module_direction(module: nn.Module, call: _Call, inputs: dict[Key, Tensor],
                      generator: torch.Generator) -> int:
    # w = (‖t‖·ŵ_t) over the inputs t: a step δ moves each input by δ of its own norm.
    w = {}
    for key, t in inputs.items():
        direction = unit_directions(1, 1, tuple(t.shape), generator=generator, dtype=F64,
                                    device=t.device).view(t.shape)
        norm = float(torch.linalg.vector_norm(t))
        w[key] = direction * (norm if norm > 0 else 1.0)

    def output_difference(delta: float) -> list[Tensor]:
        """(f(t + δw) − f(t − δw)) / 2δ ≈ J·w, output by output."""
        with torch.no_grad():
            plus = call.run(module, {k: t + delta * w[k] for k, t in inputs.items()})
            minus = call.run(module, {k: t - delta * w[k] for k, t in inputs.items()})
        return [(p - m) / (2 * delta) for p, m in zip(plus, minus)]

    try:
        with torch.no_grad():
            base = call.run(module, inputs)
        if not base:
            return 0  # no float tensor output (a dict, other things): nothing to compare
        cache = {STEPS[1]: output_difference(STEPS[1])}
    except Exception:  # noqa: BLE001 — a module that cannot be called on its own: no verdict
        return 0
    size = torch.sqrt(sum((d * d).sum() for d in cache[STEPS[1]]))  # type: ignore[arg-type]
    if not (torch.isfinite(size) and size > 0):
        return 0  # the output does not move with the input
    u = [d / size for d in cache[STEPS[1]]]
    leaves = {k: t.clone().requires_grad_(True) for k, t in inputs.items()}
    with torch.enable_grad():
        try:
            outs = call.run(module, {k: leaf.clone() for k, leaf in leaves.items()})
        except Exception:  # noqa: BLE001 — as above
            return 0
        pairs = [(o, c) for o, c in zip(outs, u) if o.requires_grad]
        if not pairs:
            return 0
        try:
            vjp = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()),
                                      grad_outputs=[c for _, c in pairs], allow_unused=True)
        except Exception as err:  # noqa: BLE001 — the module's own backward
            raise _BackwardRaised(_error_text(err)) from None
    backward = sum(float((g * w[k]).sum()) for k, g in zip(leaves, vjp) if g is not None)
    rounding = ROUNDING_ULPS * torch.finfo(F64).eps * float(
        torch.sqrt(sum((b * b).sum() for b in base)))  # type: ignore[arg-type]

    def difference(delta: float, which: Tensor) -> tuple[Tensor, Tensor]:
        change = cache.pop(delta) if delta in cache else output_difference(delta)
        value = float(sum((c * d).sum() for c, d in zip(u, change)))
        return (torch.tensor([value], dtype=F64, device="cpu"),
                torch.tensor([rounding / delta], dtype=F64, device="cpu"))

    try:
        return int(_compared(torch.tensor([backward], dtype=F64, device="cpu"), difference)[0])
    except Exception:  # noqa: BLE001 — as above
        return 0


def _scan(calls: list[_Call], modules: dict[str, nn.Module]
          ) -> tuple[tuple[_Call, str] | None, int, int]:
    """(the innermost module, in call order, whose backward disagrees with its forward and
    what its backward raised, if it did — or None; how many modules agreed; how many were
    compared) over the ``calls`` whose inputs carry a gradient, each replayed on the
    module of ``modules`` of the same name."""
    generator = torch.Generator().manual_seed(1)
    failing: list[tuple[_Call, str]] = []
    agreed = compared = 0
    for call in calls:
        if not call.inputs or call.name not in modules:
            continue
        compared += 1
        try:
            verdict = _module_verdict(modules[call.name], call, generator)
        except _BackwardRaised as raised:
            failing.append((call, raised.text))
            continue
        agreed += verdict > 0
        if verdict < 0:
            failing.append((call, ""))
    names = [call.name for call, _ in failing]
    for call, text in failing:
        prefix = f"{call.name}." if call.name else ""
        if not any(other != call.name and other.startswith(prefix) for other in names):
            return (call, text), agreed, compared
    return None, agreed, compared


def _module_name(found: tuple[_Call, str], prefix: str) -> str | None:
    """The dotted name of the module at fault in the user's model (None: the model
    itself)."""
    call = found[0]
    name = "" if f"{call.name}." == prefix else call.name.removeprefix(prefix)
    return name or None


def _module_message(model: nn.Module, found: tuple[_Call, str], prefix: str) -> str:
    call, raised = found
    name = _module_name(found, prefix) or ""
    module = call.module
    did = f"raised {raised}" if raised else "is not the gradient of its forward"
    if type(module).__module__.split(".")[0] == "biotorch":
        mode = getattr(module, "layer_config", {}).get("type", "feedback")
        raised_text = f" (its backward raised {raised})" if raised else ""
        return (f"BioTorch {mode} layer `{name}` replaces the backward{raised_text}, so "
                "∂CE/∂h_l would be its own credit, not the gradient: audit a plain copy (the "
                "model built without BioModule, then load_state_dict(bio.module.state_dict(), "
                "strict=False)) and pass the BioTorch credit as credit=, or " + FIX)
    label = f"module `{name}` ({type(module).__name__})" if name else (
        f"the forward of {type(model).__name__}")
    hooked = _hook_cause(module)
    if hooked is not None and not raised:
        return (f"the backward of {label} is not the gradient of its forward: {hooked}, "
                "which may change the gradient it passes on, so ∂CE/∂h_l would be that "
                f"backward's credit, not the reference: remove the hook, or {FIX}")
    return (f"the backward of {label} {did}, so ∂CE/∂h_l would be that backward's credit, "
            f"not the reference: audit a copy with plain autograd modules, or {FIX}")


def _hook_cause(module: nn.Module) -> str | None:
    """Which module backward hook may change ``module``'s backward, said for a message: one
    registered for every module, or its own; None when it has none."""
    module_hooks = torch.nn.modules.module
    if module_hooks._global_backward_hooks or module_hooks._global_backward_pre_hooks:
        return ("a backward hook is registered for every module "
                "(torch.nn.modules.module.register_module_full_backward_hook or _pre_hook)")
    if module._backward_hooks or module._backward_pre_hooks:
        return ("it has a backward hook (register_full_backward_hook or "
                "register_full_backward_pre_hook)")
    return None


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


# --- naming the module -------------------------------------------------------------------------
def _reached(work: _Working, layer: int, state: Tensor) -> set[str]:
    """The modules whose input depends on h_layer when the network runs on from it
    (``forward_from(layer, h)``), by autograd; a module whose dependence cannot be asked
    (its graph's backward raises) counts as reached."""
    h = state.detach().requires_grad_(True)
    reached: set[str] = set()

    def hook(name: str) -> Callable[..., None]:
        def ask(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            inputs = [a for a in [*args, *kwargs.values()]
                      if isinstance(a, Tensor) and a.is_floating_point() and a.requires_grad]
            if name in reached or not inputs:
                return
            try:
                grads = torch.autograd.grad([t.sum() for t in inputs], h, retain_graph=True,
                                            allow_unused=True)
            except Exception:  # noqa: BLE001 — the model's own backward: count it in
                reached.add(name)
                return
            if grads[0] is not None:
                reached.add(name)
        return ask

    handles = [module.register_forward_pre_hook(hook(name), with_kwargs=True)
               for name, module in work.named_modules()]
    try:
        with torch.enable_grad():
            work.forward_from(layer, h)
    finally:
        for handle in handles:
            handle.remove()
    return reached


def _raise_for_segment(work: _Working, states: list[Tensor], layer: int, last: int
                       ) -> NoReturn:
    """The reference disagrees at state ``layer`` but not above it: the backward at fault
    runs between h_layer and h_layer+1 (or the logits). Raise naming its module."""
    place = (f"between h_{layer} and the logits" if layer == last
             else f"between h_{layer} and h_{layer + 1}")
    h = states[layer].detach().requires_grad_(True)
    with torch.enable_grad(), _recorded(work) as calls:
        work.forward_from(layer, h)
    # The modules a gradient from h_layer reaches and one from h_layer+1 does not (an
    # adapted model reruns every module from a zero input, those before the state too).
    inside = _reached(work, layer, states[layer])
    if layer < last:
        inside -= _reached(work, layer + 1, states[layer + 1])
    segment = [call for call in calls if call.name in inside]
    found = _scan(segment, dict(work.named_modules()))[0]
    if found is not None:
        raise ReferenceGradientError(_module_message(work.net, found, "net."),
                                     where=_module_name(found, "net."))
    hooked = _backward_hooked(work, inside)
    if hooked is not None:
        raise ReferenceGradientError(
            f"the backward {place} is not the gradient of the forward: {hooked}, which may "
            "change the gradient it passes on, so ∂CE/∂h_l would be that backward's credit, "
            f"not the reference: remove the hook, or {FIX}", where=place)
    raise ReferenceGradientError(
        f"the backward {place} is not the gradient of the forward (no single module's "
        "backward differs: a torch.autograd.Function with its own backward, or a tensor "
        "hook (Tensor.register_hook) that changes a gradient?), so ∂CE/∂h_l would be that "
        f"backward's credit, not the reference: make it plain autograd, or {FIX}",
        where=place)


def _backward_hooked(work: _Working, inside: set[str]) -> str | None:
    """What holds a module backward hook — every module (a global hook), or the first
    module of the segment ``inside`` (else of the network) with one of its own — said for a
    message; None when nothing does. Such a hook may return a gradient in place of the one
    autograd computed."""
    hooked = [(name, module) for name, module in work.named_modules()
              if _hook_cause(module) is not None]
    first = next(((n, m) for n, m in hooked if n in inside), hooked[0] if hooked else None)
    if first is None:
        return None
    name, module = first
    cause = _hook_cause(module)
    if not (module._backward_hooks or module._backward_pre_hooks):
        return cause  # the global hook
    name = name.removeprefix("net.") if name != "net" else type(module).__name__
    return (f"module `{name}` ({type(module).__name__}) has a backward hook "
            "(register_full_backward_hook or register_full_backward_pre_hook)")
