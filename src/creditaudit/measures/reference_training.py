"""Is the backward of training mode the gradient too?

The reference check (:mod:`creditaudit.measures.reference_check`) verifies the backward in
eval mode, where the diagnostics run. Training runs in training mode, and a model may change
its backward there only (``if self.training: h.register_hook(lambda g: 3 * g)``): bp, and
every rule's step, would then train with another gradient while the record says bp. So the
check goes on in training mode, on a float64 copy: the directional derivative of the summed
loss at the probes' inputs, ⟨∂ΣCE/∂x, v⟩, against its central differences, along the
gradient's own direction and :data:`RANDOM_DIRECTIONS` random ones over the whole batch
(BatchNorm mixes the samples in training mode, so the batch moves as one point).

Dropout and other randomness in the forward would make two passes two functions: every
forward runs from the same RNG state (:data:`TRAINING_SEED`, the caller's RNG untouched) and
the same buffers (a training-mode forward may update them: BatchNorm's running statistics, a
scale that grows each step), so each draws the same masks and the passes compute one
function, whose gradient autograd's backward must be. Judged as the eval-mode check is
(:mod:`creditaudit.measures.central_differences`). Integer inputs (token ids) cannot be
moved: training mode is then not checked, and the detail does not claim it.

The eval-mode check compares gradients at the states, so a backward that is wrong below h_0
in both modes (a straight-through estimator or another ``torch.autograd.Function`` in the
layers before the first state) first shows here, at the inputs. Such a disagreement is
compared in eval mode too before training mode is blamed: wrong there as well, it is the
caller's ``before_first_state`` to name (the module at fault, when one is). A loss that
does not reach the inputs through autograd leaves nothing to compare there: refused as
training mode's where eval mode's does; where it does not either, refused as the layers
before h_0's when a trainable parameter gets no gradient (a stem under ``torch.no_grad()``),
else compared at h_0 instead (a parameterless normalisation of the inputs under
``torch.no_grad()``): the same comparison, through ``forward_from(0, h_0)`` in training mode,
so a training-only hook above h_0 is still found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol, TypeVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.measures.central_differences import F64, ROUNDING_ULPS, _compared, _disagree
from creditaudit.measures.directions import unit_directions
from creditaudit.measures.reference_modules import (
    FIX,
    ReferenceGradientError,
    _error_text,
    _recorded,
)

TRAINING_SEED = 0  # the RNG state every training-mode forward of the check starts from
RANDOM_DIRECTIONS = 3  # beside the gradient's own direction


class _StatesModule(Protocol):
    def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]: ...

    def train(self, mode: bool = True) -> nn.Module: ...

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]: ...

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def forward_from(self, layer: int, h: Tensor) -> Tensor: ...


_Out = TypeVar("_Out")


class _Twin:
    """A copy of the model, ``copy_of()`` put in training mode or not (``training``), whose
    every forward (:meth:`run`) starts from one RNG state (:data:`TRAINING_SEED`, the
    caller's RNG untouched) and the buffers the copy was made with: a training-mode forward
    may update them (BatchNorm's running statistics, a scale that grows with every step), and
    dropout draws its masks, so this makes every pass compute one function.

    The buffers are snapshot once, here, and restored before each forward, never after: a
    forward's graph may have saved a buffer (``x * self.gain``), and restoring it in place
    then would break the backward."""

    def __init__(self, copy_of: Callable[[], _StatesModule], *, training: bool) -> None:
        self.model = copy_of()
        self.model.train(training)
        self._buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}

    def run(self, forward: Callable[[Tensor], _Out], inputs: Tensor) -> _Out:
        """``forward(inputs)`` from the copy's first buffers, under a fork of the RNG seeded
        with :data:`TRAINING_SEED` (of ``inputs``' CUDA device too, when they are on one)."""
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                buffer.copy_(self._buffers[name])
        with torch.random.fork_rng(
                devices=[inputs.device] if inputs.device.type == "cuda" else []):
            torch.manual_seed(TRAINING_SEED)
            return forward(inputs)

    def logits(self, inputs: Tensor) -> Tensor:
        """The copy's logits on ``inputs`` (a plain forward: :meth:`run` it)."""
        return self.model.forward_states(inputs)[1]


def check_in_training(copy_of: Callable[[], _StatesModule], x64: Tensor, y: Tensor, *,
                      before_first_state: Callable[[], NoReturn]) -> str:
    """Check the training-mode backward (module docstring) on ``copy_of()``, a float64 copy
    of the model (put in training mode here), at the probes ``x64`` ``(k, …)``, labels ``y``
    ``(k,)``. Returns what was compared, to end the check's detail ("" when nothing was:
    integer inputs, a model that cannot be copied or whose training-mode forward fails —
    those are training's to report). Raises :class:`ReferenceGradientError` when the
    backward disagrees with the forward: ``before_first_state()`` raises it when the
    eval-mode backward disagrees at the inputs too (module docstring)."""
    if not x64.is_floating_point():
        return ""
    try:
        backward, difference = _comparisons(_Twin(copy_of, training=True), x64, y)
    except ReferenceGradientError:
        raise
    except _InputsUnused:
        return _unused_inputs(copy_of, x64, y)
    except Exception:  # noqa: BLE001 — the model's training-mode forward: training reports it
        return ""
    verdicts = _compared(backward, difference)
    if _disagree(verdicts):
        if _disagrees_in_eval(copy_of, x64, y):
            before_first_state()
        raise _training_mode_differs("the probes' inputs")
    if not bool((verdicts > 0).any()):
        return ""
    return ("; in training mode (dropout masks held fixed) ∂CE/∂x agrees with them at the "
            "probes' inputs")


class _InputsUnused(Exception):
    """The loss does not reach the inputs through autograd (no gradient there to check)."""


def _unused_inputs(copy_of: Callable[[], _StatesModule], x: Tensor, y: Tensor) -> str:
    """What the check says of a model whose training-mode loss does not reach the inputs
    ``x`` through autograd: refused as training mode's where the eval-mode loss does; else
    nothing is compared ("": a parameterless step under ``torch.no_grad()`` before h_0,
    such as a normalisation of the inputs, leaves every parameter its gradient), unless a
    parameter counted as trained gets no gradient (a stem under ``torch.no_grad()``): refused
    as the layers before h_0's, naming it — adapt refuses a state computed so, with the same
    fix."""
    try:
        _comparisons(_Twin(copy_of, training=False), x, y)
    except _InputsUnused:
        ungraded = _ungraded_parameters(copy_of, x, y)
        if not ungraded:
            return _at_first_state(copy_of, x, y)
        raise ReferenceGradientError(
            f"the loss does not reach the model's inputs through autograd, in eval mode as in "
            f"training, and parameter {ungraded[0].removeprefix('net.')!r} gets no gradient "
            "though it counts as "
            "trained (torch.no_grad() or .detach() before h_0, or a backward that returns "
            "None): to keep it from training, remove the torch.no_grad() and freeze its "
            "parameters (p.requires_grad_(False)) instead, which the record then lists, or "
            f"{FIX}", where="before h_0") from None
    except Exception:  # noqa: BLE001 — eval mode was checked already; training's is refused
        pass
    raise ReferenceGradientError(
        "in training mode the loss does not reach the model's inputs through autograd, though "
        "in eval mode it does: a .detach() or torch.no_grad() active only in training (if "
        "self.training: x = x.detach())? bp and every rule would train the layers before h_0 "
        f"with another gradient; make the backward the same in both modes, or {FIX}",
        where="training mode")


def _at_first_state(copy_of: Callable[[], _StatesModule], x: Tensor, y: Tensor) -> str:
    """The training-mode comparison at h_0 rather than at the inputs ``x`` (which the loss
    does not reach, every parameter getting its gradient): h_0 of a training-mode forward of
    ``copy_of()`` on ``x``, moved through ``forward_from(0, ·)``. "" where nothing could be
    compared; ReferenceGradientError (training mode's) where the backward disagrees — the
    eval-mode check found it right at h_0."""
    try:
        twin = _Twin(copy_of, training=True)
        with torch.no_grad():
            h0 = twin.run(lambda inputs: twin.model.forward_states(inputs)[0][0], x).detach()
        backward, difference = _comparisons(twin, h0, y,
                                            forward=lambda h: twin.model.forward_from(0, h))
    except ReferenceGradientError:
        raise
    except Exception:  # noqa: BLE001 — the model's training-mode forward: training reports it
        return ""
    verdicts = _compared(backward, difference)
    if _disagree(verdicts):
        raise _training_mode_differs("h_0")
    if not bool((verdicts > 0).any()):
        return ""
    return ("; in training mode (dropout masks held fixed) ∂CE/∂h_0 agrees with them at the "
            "probes' h_0 (the loss reaches no input)")


def _training_mode_differs(where: str) -> ReferenceGradientError:
    """The refusal of a training-mode backward that disagrees with the forward along
    ``where`` ("the probes' inputs", "h_0") though the eval-mode one agrees."""
    return ReferenceGradientError(
        "the model's backward in training mode is not the gradient of its forward "
        f"(along {where} it disagrees with float64 central differences of the "
        "loss, dropout masks held fixed), though in eval mode it is: a gradient hook or "
        "a hand-written backward active only in training (if self.training: "
        "h.register_hook(…))? bp and every rule would train with another gradient; "
        f"make the backward the same in both modes, or {FIX}", where="training mode")


def _ungraded_parameters(copy_of: Callable[[], _StatesModule], x: Tensor, y: Tensor
                         ) -> list[str]:
    """The names of the trainable parameters of a training-mode ``copy_of()`` that the loss
    on ``x``, ``y`` gives no gradient, of the modules its forward calls (a spare head the
    forward never calls gets none wherever the inputs are, which is no stem's doing)."""
    twin = _Twin(copy_of, training=True)
    with torch.enable_grad(), _recorded(twin.model) as calls:  # type: ignore[arg-type]
        total = F.cross_entropy(twin.run(twin.logits, x), y, reduction="sum")
    called = {call.name for call in calls}
    named = [(name, p) for name, p in twin.model.named_parameters()
             if p.requires_grad and name.rpartition(".")[0] in called]
    if not named or not total.requires_grad:
        return [name for name, _ in named]
    with torch.enable_grad():
        grads = torch.autograd.grad(total, [p for _, p in named], allow_unused=True)
    return [name for (name, _), g in zip(named, grads) if g is None]


def _disagrees_in_eval(copy_of: Callable[[], _StatesModule], x: Tensor, y: Tensor) -> bool:
    """Whether the eval-mode backward of a fresh ``copy_of()`` disagrees at the inputs ``x``
    too (False where that cannot be said: the copy or its forward fails)."""
    try:
        return _disagree(_compared(*_comparisons(_Twin(copy_of, training=False), x, y)))
    except Exception:  # noqa: BLE001 — the training-mode refusal stands as it was
        return False


def _comparisons(twin: _Twin, x: Tensor, y: Tensor,
                 forward: Callable[[Tensor], Tensor] | None = None
                 ) -> tuple[Tensor, Callable[[float, Tensor], tuple[Tensor, Tensor]]]:
    """(⟨∂ΣCE/∂x, v_j⟩ per direction ``(M,)``, the central difference of direction j at a
    relative step δ) for :func:`~creditaudit.measures.central_differences._compared`; ``x``
    goes through ``forward`` (:meth:`_Twin.logits` unless given), every pass a
    :meth:`_Twin.run`, so that all compute one function."""
    run = forward if forward is not None else twin.logits

    def loss(inputs: Tensor) -> tuple[Tensor, Tensor]:
        logits = twin.run(run, inputs)
        return F.cross_entropy(logits, y, reduction="sum"), logits

    with torch.enable_grad():
        moved = x.detach().clone().requires_grad_(True)
        total, logits = loss(moved)
        if not total.requires_grad:
            raise _InputsUnused
        try:
            (g,) = torch.autograd.grad(total, moved, allow_unused=True)
        except Exception as err:  # noqa: BLE001 — the model's own backward
            raise ReferenceGradientError(
                f"the reference gradient cannot be computed in training mode: the backward "
                f"raised {_error_text(err)}; {FIX}", where="training mode") from None
        if g is None:
            raise _InputsUnused
    flat_g = g.flatten().to(F64)
    own = (flat_g / flat_g.norm().clamp_min(torch.finfo(F64).tiny)).view(1, 1, -1)
    generator = torch.Generator().manual_seed(TRAINING_SEED)
    random = unit_directions(1, RANDOM_DIRECTIONS, tuple(x.shape), generator=generator,
                             dtype=F64, device=x.device)
    directions = torch.cat([own, random], dim=1)[0]  # (M, k·D), unit rows
    backward = (directions @ flat_g).cpu()
    floor = ROUNDING_ULPS * torch.finfo(F64).eps * float(
        total.detach().abs() + logits.detach().abs().amax(dim=1).sum())
    x_norm = float(x.norm()) or 1.0

    def difference(delta: float, which: Tensor) -> tuple[Tensor, Tensor]:
        step = delta * x_norm
        values = []
        with torch.no_grad():
            for j in which.tolist():
                v = directions[j].view_as(x).to(x.dtype)
                values.append(float(loss(x + step * v)[0] - loss(x - step * v)[0]) / (2 * step))
        return (torch.tensor(values, dtype=F64, device="cpu"),
                torch.full((len(values),), floor / step, dtype=F64, device="cpu"))

    return backward, difference


__all__ = ["check_in_training", "TRAINING_SEED"]
