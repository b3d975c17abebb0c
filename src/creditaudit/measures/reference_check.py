"""Is the reference gradient the model's gradient? The check ``diagnose()`` runs first, and
the working copy of the model it runs on.

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

Finite differences are judged by their own accuracy
(:mod:`creditaudit.measures.central_differences`); the module-by-module comparison is
:mod:`creditaudit.measures.reference_modules`. On healthy models
(tests: tiny ResidualMLP, ViT-Mini and ConvMixer, a stream at 1e7 with a saturated softmax)
the best step agrees to 1e-9 or better; a wrong backward disagrees by far more: BioTorch's
FA by 0.4–0.6 along the gradient's own direction. The probes are the samples with the
largest loss (the least saturated) among the first :data:`PROBE_POOL`, moved off the ties of
real data (:func:`_off_ties`); a state that disagrees is checked again just beside it where
it sits on a kink itself (states at a ReLU's zeros), through ``forward_from``, when that
backward at the state is the one ``states_fn`` gives (:func:`same_backward`), and on the
state along its zeros against the slope of each side (:func:`zeros_verdicts`).

The state-by-state check runs on a float64 copy of the model
(:mod:`creditaudit.measures.model_copies`; :func:`_float64_contract`); the credit-quality
metrics copy the same way (:class:`~creditaudit.measures.working.WorkingCopy`).

Cost: a few forward passes of four samples per state (or per module), against the
diagnostics' passes over the whole evaluation set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.errors import CreditAuditError, ModelContractError
from creditaudit.guests.blame import out_of_memory
from creditaudit.measures.central_differences import (
    F64,
    ROUNDING_ULPS,
    _as64,
    _compared,
    _disagree,
)
from creditaudit.measures.directions import unit_directions
from creditaudit.measures.gradients import StatesFn
from creditaudit.measures.model_copies import KEEP_DTYPE, StatesNet, model_copy
from creditaudit.measures.reference_as_used import check_as_used
from creditaudit.measures.reference_kinks import (
    gradient_from,
    same_backward,
    step_scale,
    zeros_verdicts,
)
from creditaudit.measures.reference_modules import (
    FIX,
    ReferenceGradientError,
    _Call,
    _error_text,
    _module_message,
    _module_name,
    _raise_for_segment,
    _recorded,
    _scan,
    off_ties,
)
from creditaudit.measures.reference_training import check_in_training
from creditaudit.measures.user_models import ForwardFrom, check_forward_from

PROBE_POOL = 32  # samples whose loss picks the probes
PROBE_SAMPLES = 4  # the probes: the largest-loss samples of the pool
RANDOM_DIRECTIONS = 3  # per probe and state, beside the claimed gradient's direction
PROBE_JITTER = 1e-3  # the probes' move off ties, relative to their RMS (:func:`_off_ties`)



@dataclass(frozen=True)
class ReferenceCheck:
    """What :func:`check_reference` found: ``verified``; ``how`` ("states", "modules",
    "skipped" — nothing compared — or "failed", a refusal allowed to go on:
    :func:`checked_reference`); ``detail``, one line saying what was compared, why nothing
    was, or what was found; ``where``, for "failed", the module or segment at fault."""

    verified: bool
    how: str
    detail: str
    where: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SKIPPED = ReferenceCheck(False, "skipped", "not verified (verify_reference=False)")


def checked_reference(model: nn.Module, states_fn: StatesFn, x: Tensor, y: Tensor, *,
                      forward_from: ForwardFrom | None = None, allow: bool = False,
                      fix: str = FIX) -> ReferenceCheck:
    """:func:`check_reference`, whose refusal names ``fix`` as the way out; with ``allow``
    the refusal is returned instead (``how="failed"``, ``where``, ``detail`` = what was
    found), for a caller that goes on and marks every number the reference touches."""
    try:
        return check_reference(model, states_fn, x, y, forward_from=forward_from)
    except ReferenceGradientError as err:
        if not allow:
            raise err.with_fix(fix) from None
        return ReferenceCheck(False, "failed", err.finding, where=err.where)


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
    keep, xs, ys, dtype = _probes(states_fn, x, y)
    x64 = _as64(xs)
    work = (_float64_contract(model, states_fn, forward_from, x64, dtype)
            if forward_from is not None else None)
    if work is None:
        return _check_modules(model, states_fn, xs)
    check = _check_states(work, x64, ys)
    if check.how == "states":  # verified state by state: is that the backward in use?
        detail = check_as_used(states_fn, work, x, y, keep, xs, x64)
        detail += check_in_training(lambda: model_copy(work, F64), x64, ys,
                                    before_first_state=lambda: _before_first_state(work, x64))
        check = dataclasses.replace(check, detail=check.detail + detail)
    return check


def _probes(states_fn: StatesFn, x: Tensor, y: Tensor
            ) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """(indices, inputs, labels) of the :data:`PROBE_SAMPLES` samples of largest loss among
    the first :data:`PROBE_POOL` (a confidently right sample's loss may be flat at float64
    resolution), the inputs moved off ties, and the dtype of the model's logits."""
    pool_x, pool_y = x[:PROBE_POOL], y[:PROBE_POOL]
    with torch.no_grad():
        logits = states_fn(pool_x)[1]
    losses = F.cross_entropy(logits.double(), pool_y, reduction="none")
    keep = losses.topk(min(PROBE_SAMPLES, losses.shape[0])).indices.sort().values
    return keep, _off_ties(pool_x[keep]), pool_y[keep], logits.dtype


def _off_ties(xs: Tensor) -> Tensor:
    """``xs`` moved by :data:`PROBE_JITTER` of its RMS along a fixed random direction.

    Real inputs sit on kinks: a constant image background gives every max-pool window over
    it tied inputs, and a ReLU many inputs exactly at 0. There the forward has no gradient —
    its central difference is the mean of two one-sided slopes, autograd's value one
    subgradient — so the comparison would refuse a correct backward. Whether a backward is
    the gradient of its forward is a property of the code, checked as well at a point just
    beside the data where every tie is broken (:func:`~creditaudit.measures.
    reference_modules.off_ties`; each module's own inputs are moved alike, as ties a ReLU
    makes inside the network — its zeros into a max-pool — do not move with the input).
    """
    return off_ties(xs, PROBE_JITTER)


def _float64_contract(model: nn.Module, states_fn: StatesFn, forward_from: ForwardFrom,
                      x64: Tensor, dtype: torch.dtype) -> StatesNet | None:
    """The model with its two functions in float64 (a copy unless it already is), or None
    when they cannot be copied (closures) or ``forward_from`` does not reproduce the logits
    on the probes ``x64`` (float64 when floating, as the copy takes them).
    ReferenceGradientError (cannot verify) when the copy does not compute in float64: its
    forward casts to a dtype of its own (``x.float()`` at its input fails on float64
    weights; ``.float()`` on its logits leaves float32 roundings, which the central
    differences would read as a backward that disagrees, and the module-by-module check
    does not see a ``torch.autograd.Function`` the forward applies between modules)."""
    net = StatesNet(model, states_fn, forward_from)
    if dtype != F64:
        if not net.copyable:
            return None
        try:
            net = model_copy(net, F64)
        except Exception:  # noqa: BLE001 — any module may refuse deepcopy: check modules then
            return None
    try:
        with torch.enable_grad():
            states, logits = net.forward_states(x64)
    except Exception as err:  # it ran in its own dtype (_probes): the copy's dtype failed
        if dtype == F64 or isinstance(err, CreditAuditError) or out_of_memory(err):
            raise
        raise _not_float64(model, f"fails there ({_error_text(err)})") from None
    kept = [str(t.dtype).removeprefix("torch.") for t in (*states, logits) if t.dtype != F64]
    if kept:
        raise _not_float64(model, f"computes {'its logits' if logits.dtype != F64 else 'a state'}"
                           f" in {kept[-1]}")
    try:
        check_forward_from(net.forward_from, states, logits)
    except ModelContractError:  # it was not asked for (metrics=False): check modules instead
        return None
    return net


def _not_float64(model: nn.Module, what: str) -> ReferenceGradientError:
    """The refusal of a model whose float64 copy ``what`` (fails, computes in float32)."""
    name = type(getattr(model, "net", model)).__name__
    return ReferenceGradientError(
        f"cannot verify the reference gradient: the check runs a float64 copy of {name}, "
        f"whose forward {what}, as a forward that casts to a dtype of its own does "
        f"(x.float()): {KEEP_DTYPE}, or {FIX}")


# --- state by state ----------------------------------------------------------------------------
def _check_states(work: StatesNet, x64: Tensor, ys: Tensor) -> ReferenceCheck:
    """The state-by-state check on the float64 ``work`` model at the probes ``x64`` (float64
    when floating), labels ``ys``; the module-by-module one where a state's loss is flat at
    float64 resolution on every probe.

    First h_0 and h_L only: a backward that is wrong anywhere above h_0 makes g_0 wrong,
    and h_L tells the head apart; every state is compared only to place a disagreement.
    """
    generator = torch.Generator().manual_seed(0)
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

    def verdict(layer: int) -> tuple[bool, bool]:
        """(whether the backward at h_layer disagrees, whether any comparison there said
        something)."""
        g = grads[layer]
        h = states[layer].detach()
        g = torch.zeros_like(h) if g is None else g
        own, random = _state_verdicts(work, layer, h, g, ys, floor, generator)
        disagrees = _disagree(own) or _disagree(random)
        if disagrees and same_backward(g, gradient_from(work, layer, h, ys)):
            # A state may sit on a kink of what follows it (a ReLU's zeros into a max-pool
            # or another ReLU), as real inputs do: check just beside it too.
            moved = off_ties(h, PROBE_JITTER)
            own_, random_ = _state_verdicts(work, layer, moved,
                                            gradient_from(work, layer, moved, ys), ys,
                                            floor, generator)
            # beside it the backward is the gradient; on the kink it must be one of its
            # sides' (a hand-written max-pool giving every tied zero its window's gradient
            # is the gradient beside the zeros, not on them)
            disagrees = (_disagree(own_) or _disagree(random_)
                         or _disagree(zeros_verdicts(work, layer, h, g, ys, floor)))
        return disagrees, bool((own != 0).any()) or bool((random != 0).any())

    ends = {layer: verdict(layer) for layer in sorted({0, last})}
    if any(disagrees for disagrees, _ in ends.values()):
        failing = [layer for layer in range(last, -1, -1)
                   if (ends.get(layer) or verdict(layer))[0]]
        _raise_for_segment(work, states, failing[0], last)
    if not all(compared for _, compared in ends.values()):
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
    random = unit_directions(k, RANDOM_DIRECTIONS, shape, generator=generator,
                             dtype=h.dtype, device=h.device)
    v = torch.cat([own, random], dim=1)  # (k, 1 + m, D), unit rows (ĝ = 0 when g = 0)
    m = v.shape[1]
    backward = torch.einsum("kd,kmd->km", flat_g, v).flatten()
    sample = torch.arange(k, device=h.device).repeat_interleave(m)  # each comparison's probe
    directions = v.flatten(0, 1)
    h_norm = step_scale(flat_h)

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
def _module_check(model: nn.Module, calls: list[_Call], modules: dict[str, nn.Module],
                  prefix: str) -> ReferenceCheck:
    """The module-by-module check as the verdict: raises naming the module at fault."""
    found, agreed, compared = _scan(calls, modules)
    if found is not None:
        raise ReferenceGradientError(_module_message(model, found, prefix),
                                     where=_module_name(found, prefix))
    if agreed == 0:
        return ReferenceCheck(False, "skipped", "not verified: no module between the states "
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


def _before_first_state(work: StatesNet, x64: Tensor) -> NoReturn:
    """Raise for a backward that disagrees at the inputs in eval mode as in training while
    ∂CE/∂h_l agrees at the states: it is wrong before h_0. Names the module at fault when
    the module-by-module check finds one (a straight-through estimator's)."""
    _scan_or_raise(work, lambda: work.forward_states(x64),
                   "the model's backward before h_0 is not the gradient of its forward (at the "
                   "probes' inputs it disagrees with float64 central differences of the loss, "
                   "in eval mode as in training, though ∂CE/∂h_l agrees at the states): a "
                   "torch.autograd.Function with its own backward or a tensor hook "
                   "(Tensor.register_hook) in the layers before the first state? bp and every "
                   f"rule would train them with another gradient; make it plain autograd, or "
                   f"{FIX}", where="before h_0")
    raise AssertionError("unreachable")  # _scan_or_raise raises when given a failure


def _scan_or_raise(work: StatesNet, run: Callable[[], Any], failure: str, *,
                   where: str | None = None) -> ReferenceCheck:
    """The module-by-module check of the float64 ``work`` model over the modules ``run``
    calls. ``failure``: the line to raise when no module is at fault ("" to return the
    check instead), with ``where`` as its place."""
    with torch.enable_grad(), _recorded(work) as calls:
        run()
    if not failure:
        return _module_check(work.net, calls, dict(work.named_modules()), "net.")
    found = _scan(calls, dict(work.named_modules()))[0]
    if found is not None:
        raise ReferenceGradientError(_module_message(work.net, found, "net."),
                                     where=_module_name(found, "net."))
    raise ReferenceGradientError(failure, where=where)


