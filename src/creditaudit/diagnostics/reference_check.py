"""Is the reference gradient the model's gradient? The check ``diagnose()`` runs first.

Every cosine, Γ, diagnostics (b) and (c), and ρ's BP control compare with
g_l = ∂CE/∂h_l as autograd computes it through ``states_fn``. A model whose backward is not
autograd's — a BioTorch layer, any ``torch.autograd.Function`` with a hand-written backward —
turns that "reference" into its own credit: cos = +1 at every layer, and nothing downstream
can tell. :func:`check_reference` compares the backward with the forward function itself,
in float64, on a few samples:

- **state by state** (when ``forward_from`` runs the network on from a state and the model
  can be copied to float64 with it): per sample, the directional derivative ⟨g_l, v⟩
  against the central difference [CE(h_l + s·v) − CE(h_l − s·v)] / 2s, along the claimed
  gradient's own direction and along random unit directions;
- **module by module** (to name the module at fault, and as the check itself where the
  states cannot be checked: no float64 ``forward_from``, or a loss flat at float64
  resolution — a saturated softmax — on every probe): each module whose input carries a
  gradient, on the inputs it received in a forward pass, compares ⟨Jᵀu, w⟩ (its backward)
  with ⟨u, J·w⟩ (a central difference of its output) for the output direction
  u = J·w / ‖J·w‖; a module whose backward raises is at fault too.

Finite differences are judged by their own accuracy. Steps are relative to the state
(s = δ·‖h‖ per sample, so a stream grown to 1e7 is probed like one of norm 1), at five sizes
δ ∈ :data:`STEPS`: large steps lose to curvature, small ones to rounding. The uncertainty of
the difference at one step is its distance from the next larger step's plus the float64
rounding of the losses it subtracts (:data:`ROUNDING_ULPS` ulps of the largest logit).
Where that is below :data:`PRECISION` of the compared values, the backward *agrees* when it
is within ten uncertainties (and at most :data:`TOLERANCE`, relative, when the difference is
more precise than that) and *disagrees* otherwise; where no step is that precise — the loss
of a saturated softmax is flat in float64 — the comparison says nothing. On healthy models
(tests: tiny ResidualMLP, ViT-Mini and ConvMixer, a stream at 1e7 with a saturated softmax)
the best step agrees to 1e-9 or better; a wrong backward disagrees by far more: BioTorch's
FA by 0.4–0.6 along the gradient's own direction. The probes are the samples with the
largest loss (the least saturated) among the first :data:`PROBE_POOL`.

Cost: a few forward passes of four samples per state (or per module), against the
diagnostics' passes over the whole evaluation set.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.diagnostics.perturbation import _unit_directions
from creditaudit.diagnostics.user_models import (
    ForwardFrom,
    StatesFn,
    StatesNet,
    check_forward_from,
)
from creditaudit.diagnostics.working import model_copy
from creditaudit.errors import ModelContractError

PROBE_POOL = 32  # samples whose loss picks the probes
PROBE_SAMPLES = 4  # the probes: the largest-loss samples of the pool
RANDOM_DIRECTIONS = 3  # per probe and state, beside the claimed gradient's direction
STEPS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)  # relative central-difference steps, largest first
TOLERANCE = 1e-6  # relative disagreement that refuses, where differences resolve it
PRECISION = 1e-3  # a difference less certain than this (relative) says nothing
ROUNDING_ULPS = 64  # the rounding of one loss value: ulps of its largest logit
F64 = torch.float64
FIX = "pass verify_reference=False to audit it unverified"


class ReferenceGradientError(ModelContractError):
    """The model's backward is not the gradient of its forward, so the protocol's reference
    gradient would be the model's own credit."""


@dataclass(frozen=True)
class ReferenceCheck:
    """What :func:`check_reference` found: ``verified``; ``how`` ("states", "modules" or
    "skipped"); ``detail``, one line saying what was compared or why nothing was."""

    verified: bool
    how: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SKIPPED = ReferenceCheck(False, "skipped", "not verified (verify_reference=False)")


def check_reference(model: nn.Module, states_fn: StatesFn, x: Tensor, y: Tensor, *,
                     forward_from: ForwardFrom | None = None) -> ReferenceCheck:
    """Check that autograd's ∂CE/∂h_l through ``states_fn`` is the gradient of the forward.

    ``model`` is the module ``states_fn(x) -> ([h_0 … h_L], logits)`` runs (in eval mode;
    the caller forks the RNG); ``forward_from(l, h) -> logits``, when given and reproducing
    the logits, allows the state-by-state check. ``x`` ``(N, …)``, ``y`` ``(N,)``: only the
    first :data:`PROBE_POOL` samples are used. Raises :class:`ReferenceGradientError` (one
    line, naming the module whose backward differs when it can be found) when the backward
    disagrees with the forward; returns how the reference was verified, or why it could not
    be (``verified=False``). Leaves parameters, buffers and ``.grad`` unchanged: it works on
    a float64 copy or on detached inputs, and takes gradients w.r.t. states and inputs only.
    """
    xs, ys, dtype = _probes(states_fn, x, y)
    work = (_float64_contract(model, states_fn, forward_from, xs, dtype)
            if forward_from is not None else None)
    if work is not None:
        return _check_states(work, xs, ys)
    return _check_modules(model, states_fn, xs)


def _probes(states_fn: StatesFn, x: Tensor, y: Tensor
            ) -> tuple[Tensor, Tensor, torch.dtype]:
    """(inputs, labels) of the :data:`PROBE_SAMPLES` samples of largest loss among the
    first :data:`PROBE_POOL` (a confidently right sample's loss may be flat at float64
    resolution), and the dtype of the model's logits."""
    pool_x, pool_y = x[:PROBE_POOL], y[:PROBE_POOL]
    with torch.no_grad():
        logits = states_fn(pool_x)[1]
    losses = F.cross_entropy(logits.double(), pool_y, reduction="none")
    keep = losses.topk(min(PROBE_SAMPLES, losses.shape[0])).indices.sort().values
    return pool_x[keep], pool_y[keep], logits.dtype


def _as64(x: Tensor) -> Tensor:
    return x.to(F64) if x.is_floating_point() else x


def _float64_contract(model: nn.Module, states_fn: StatesFn, forward_from: ForwardFrom,
                      xs: Tensor, dtype: torch.dtype) -> StatesNet | None:
    """The model with its two functions in float64 (a copy unless it already is), or None
    when they cannot be copied (closures) or ``forward_from`` does not reproduce the logits."""
    net = StatesNet(model, states_fn, forward_from)
    if dtype != F64:
        if not net.copyable:
            return None
        try:
            net = model_copy(net, F64)  # type: ignore[assignment]
        except Exception:  # noqa: BLE001 — any module may refuse deepcopy: check modules then
            return None
    with torch.enable_grad():
        states, logits = net.forward_states(_as64(xs))
    try:
        check_forward_from(net.forward_from, states, logits)
    except ModelContractError:  # it was not asked for (metrics=False): check modules instead
        return None
    return net


# --- the verdict of one comparison ------------------------------------------------------------
Difference = Callable[[float, Tensor], tuple[Tensor, Tensor]]


def _verdicts(backward: Tensor, forward: Tensor, noise: Tensor) -> Tensor:
    """+1 (agrees), −1 (disagrees) or 0 (says nothing) per comparison.

    ``backward`` ``(P,)``: ⟨autograd's gradient, direction⟩; ``forward`` ``(2, P)``: the
    central differences at two adjacent :data:`STEPS` (larger first); ``noise`` ``(2, P)``:
    their rounding error; all in the same units.
    """
    estimate = forward[1]
    uncertainty = (estimate - forward[0]).abs() + noise[1] + noise[0]
    size = backward.abs() + estimate.abs()
    precise = (size > 0) & (uncertainty <= PRECISION * size)
    off = (backward - estimate).abs() > torch.maximum(TOLERANCE * size, 10 * uncertainty)
    return torch.where(precise, torch.where(off, -1, 1), 0)


def _compared(backward: Tensor, difference: Difference) -> Tensor:
    """+1, −1 or 0 per comparison of ``backward`` ``(P,)`` with the central differences
    ``difference(δ, which) -> (values, rounding)`` of the comparisons ``which`` (indices),
    taken at the :data:`STEPS` from the largest down. A comparison that agrees at one pair
    of adjacent steps agrees, and leaves the running (so a healthy model costs two or three
    steps); one that disagrees at every precise pair disagrees: a kink of ReLU or max
    crossed by the larger steps spoils those, not the smaller ones."""
    agreed = torch.zeros(backward.shape, dtype=torch.bool)
    disagreed = torch.zeros(backward.shape, dtype=torch.bool)
    running = torch.arange(backward.shape[0])
    previous = difference(STEPS[0], running)
    for delta in STEPS[1:]:
        current = difference(delta, running)
        verdicts = _verdicts(backward[running], torch.stack([previous[0], current[0]]),
                             torch.stack([previous[1], current[1]]))
        agreed[running[verdicts > 0]] = True
        disagreed[running[verdicts < 0]] = True
        going_on = verdicts <= 0
        running = running[going_on]
        if running.numel() == 0:
            break
        previous = (current[0][going_on], current[1][going_on])
    return torch.where(agreed, 1, torch.where(disagreed, -1, 0))


def _disagree(verdicts: Tensor) -> bool:
    """A group of comparisons disagrees when at least as many disagree as agree (the odd
    comparison may cross a kink at every step; a wrong backward makes most of them)."""
    bad, good = int((verdicts < 0).sum()), int((verdicts > 0).sum())
    return bad > 0 and bad >= good


# --- state by state ----------------------------------------------------------------------------
def _check_states(work: StatesNet, xs: Tensor, ys: Tensor) -> ReferenceCheck:
    """The state-by-state check on the float64 ``work`` model; the module-by-module one
    where a state's loss is flat at float64 resolution on every probe.

    First h_0 and h_L only: a backward that is wrong anywhere above h_0 makes g_0 wrong,
    and h_L tells the head apart; every state is compared only to place a disagreement.
    """
    generator = torch.Generator().manual_seed(0)
    x64 = _as64(xs)
    with torch.enable_grad():
        states, logits = work.forward_states(x64)
        losses = F.cross_entropy(logits, ys, reduction="none")
        try:
            grads = torch.autograd.grad(losses.sum(), states, allow_unused=True)
        except Exception as err:  # noqa: BLE001 — the model's own backward: name the module
            _scan_or_raise(work, lambda: work.forward_states(x64),
                           f"the reference gradient cannot be computed: the backward raised "
                           f"{_error_text(err)}; {FIX}")
    floor = ROUNDING_ULPS * torch.finfo(F64).eps * (
        losses.detach().abs() + logits.detach().abs().amax(dim=1))  # (k,) loss units
    last = len(states) - 1

    def verdicts(layer: int) -> tuple[Tensor, Tensor]:
        g = grads[layer]
        g = torch.zeros_like(states[layer]) if g is None else g
        return _state_verdicts(work, layer, states[layer].detach(), g, ys, floor, generator)

    ends = {layer: verdicts(layer) for layer in sorted({0, last})}
    if any(_disagree(v) for pair in ends.values() for v in pair):
        failing = [layer for layer in range(last, -1, -1)
                   if any(_disagree(v) for v in ends.get(layer) or verdicts(layer))]
        _raise_for_segment(work, states, failing[0], last)
    if any(not any(bool((v != 0).any()) for v in pair) for pair in ends.values()):
        return _scan_or_raise(work, lambda: work.forward_states(x64), "")
    return ReferenceCheck(True, "states", "∂CE/∂h_l agrees with float64 central differences "
                          "of the loss at h_0 and h_L")


def _state_verdicts(work: StatesNet, layer: int, h: Tensor, g: Tensor, y: Tensor,
                    floor: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Verdicts at one state: along each probe's own ĝ ``(k,)`` and along random directions
    ``(k·m,)``. ``h``, ``g`` ``(k, …)``; ``floor`` ``(k,)``: the rounding of each loss."""
    k, shape = h.shape[0], tuple(h.shape[1:])
    flat_h, flat_g = h.flatten(1), g.flatten(1)
    g_norm = torch.linalg.vector_norm(flat_g, dim=1, keepdim=True)
    own = (flat_g / g_norm.clamp_min(torch.finfo(F64).tiny)).unsqueeze(1)
    random = _unit_directions(k, RANDOM_DIRECTIONS, shape, generator=generator,
                              dtype=h.dtype, device=h.device)
    v = torch.cat([own, random], dim=1)  # (k, 1 + m, D), unit rows (ĝ = 0 when g = 0)
    m = v.shape[1]
    backward = torch.einsum("kd,kmd->km", flat_g, v).flatten()
    sample = torch.arange(k, device=h.device).repeat_interleave(m)  # each comparison's probe
    directions = v.flatten(0, 1)
    h_norm = torch.linalg.vector_norm(flat_h, dim=1)
    h_norm = torch.where(h_norm > 0, h_norm, torch.ones_like(h_norm))  # a zero state: absolute

    def difference(delta: float, which: Tensor) -> tuple[Tensor, Tensor]:
        probe = sample[which.to(h.device)]
        step = delta * h_norm[probe]
        moved = (step.unsqueeze(1) * directions[which.to(h.device)]).view(-1, *shape)
        rows = torch.cat([h[probe] + moved, h[probe] - moved])
        with torch.no_grad():
            logits = work.forward_from(layer, rows)
        ce = F.cross_entropy(logits, y[probe].repeat(2), reduction="none")
        n = probe.shape[0]
        return ((ce[:n] - ce[n:]) / (2 * step)).cpu(), (floor[probe] / step).cpu()

    compared = _compared(backward.cpu(), difference).view(k, m)
    return compared[:, 0], compared[:, 1:].flatten()


# --- module by module --------------------------------------------------------------------------
Key = int | str  # a positional argument's index or a keyword argument's name


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


def _module_verdict(module: nn.Module, call: _Call, generator: torch.Generator) -> int:
    """+1, −1 or 0 (as :func:`_verdicts`) for the module's backward on the call's inputs:
    two random input directions w, each with u = J·w / ‖J·w‖; it disagrees only if both do
    (a ReLU kink crossed at every step is one direction's bad luck, not a wrong backward)."""
    inputs = {key: _as64(call.value(key)) for key in call.inputs}
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
        direction = _unit_directions(1, 1, tuple(t.shape), generator=generator, dtype=F64,
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
        return (torch.tensor([value], dtype=F64),
                torch.tensor([rounding / delta], dtype=F64))

    try:
        return int(_compared(torch.tensor([backward], dtype=F64), difference)[0])
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


def _module_check(model: nn.Module, calls: list[_Call], modules: dict[str, nn.Module],
                  prefix: str) -> ReferenceCheck:
    """The module-by-module check as the verdict: raises naming the module at fault."""
    found, agreed, compared = _scan(calls, modules)
    if found is not None:
        raise ReferenceGradientError(_module_message(model, found, prefix))
    if agreed == 0:
        return ReferenceCheck(False, "modules", "not verified: no module between the states "
                              "could be compared, and the states could not be (pass "
                              "forward_from=(layer, h) -> logits as a bound method of the "
                              "model)")
    silent = compared - agreed
    return ReferenceCheck(True, "modules", f"the backward of {agreed} modules between the "
                          "states agrees with float64 central differences of its forward"
                          + (f" ({silent} more could not be compared)" if silent else ""))


def _check_modules(model: nn.Module, states_fn: StatesFn, xs: Tensor) -> ReferenceCheck:
    """The module-by-module check on its own: the calls are recorded on ``model`` itself and
    replayed on a float64 copy."""
    with torch.enable_grad(), _recorded(model) as calls:
        states_fn(xs)
    twin = model
    if any(t.is_floating_point() and t.dtype != F64
           for t in [*model.parameters(), *model.buffers()]):
        try:
            twin = model_copy(model, F64)
        except Exception as err:  # noqa: BLE001 — any module may refuse deepcopy
            raise ReferenceGradientError(
                f"cannot verify the reference gradient: {type(model).__name__} cannot be "
                f"copied to float64 ({_error_text(err)}); {FIX}") from None
    return _module_check(model, calls, dict(twin.named_modules()), "")


def _scan_or_raise(work: StatesNet, run: Callable[[], Any], failure: str) -> ReferenceCheck:
    """The module-by-module check of the float64 ``work`` model over the modules ``run``
    calls. ``failure``: the line to raise when no module is at fault ("" to return the
    check instead)."""
    with torch.enable_grad(), _recorded(work) as calls:
        run()
    if not failure:
        return _module_check(work.net, calls, dict(work.named_modules()), "net.")
    found = _scan(calls, dict(work.named_modules()))[0]
    raise ReferenceGradientError(_module_message(work.net, found, "net.") if found else failure)


# --- naming the module -------------------------------------------------------------------------
def _raise_for_segment(work: StatesNet, states: list[Tensor], layer: int, last: int
                       ) -> NoReturn:
    """The reference disagrees at state ``layer`` but not above it: the backward at fault
    runs between h_layer and h_layer+1 (or the logits). Raise naming its module."""
    place = (f"between h_{layer} and the logits" if layer == last
             else f"between h_{layer} and h_{layer + 1}")
    h = states[layer].detach().requires_grad_(True)
    with torch.enable_grad(), _recorded(work) as calls:
        work.forward_from(layer, h)
    above: set[str] = set()
    if layer < last:
        h_next = states[layer + 1].detach().requires_grad_(True)
        with torch.enable_grad(), _recorded(work) as later:
            work.forward_from(layer + 1, h_next)
        above = {call.name for call in later}
    segment = [call for call in calls if call.name not in above]
    found = _scan(segment, dict(work.named_modules()))[0]
    if found is not None:
        raise ReferenceGradientError(_module_message(work.net, found, "net."))
    raise ReferenceGradientError(
        f"the backward {place} is not the gradient of the forward (no single module's "
        "backward differs: a torch.autograd.Function with its own backward?), so ∂CE/∂h_l "
        f"would be that backward's credit, not the reference: make it plain autograd, or {FIX}")


def _module_message(model: nn.Module, found: tuple[_Call, str], prefix: str) -> str:
    call, raised = found
    name = "" if f"{call.name}." == prefix else call.name.removeprefix(prefix)
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
    return (f"the backward of {label} {did}, so ∂CE/∂h_l would be that backward's credit, "
            f"not the reference: audit a copy with plain autograd modules, or {FIX}")


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"
