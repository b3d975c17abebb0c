"""Any ``nn.Module`` seen through the model contract: ``creditaudit.adapt(model, states=[…])``.

The states h_0 … h_L are the outputs of named submodules (dotted as in ``named_modules()``),
captured by forward hooks while the model runs its own ``forward`` — nothing of the model is
rewritten. What the rules and diagnostics need then follows from running it:

- ``forward_states(x)``: the captured outputs and the model's logits;
- ``forward_from(l, h)``: the model rerun with the output of ``states[l]`` replaced by ``h``.
  The input is not given (the diagnostics move a state and ask for the logits), so the
  model runs on a zero input of batch ``h.shape[0]``; that is exact when the state is a
  *cut* of the network — everything after it depends on the input only through it — which
  :func:`adapt` verifies on a probe batch;
- the *segments*: which parameters write which state (segment l: every parameter h_l depends
  on once h_{l−1} is fixed; segment 0 everything before h_0) and which form the readout
  (every parameter the logits depend on once h_L is fixed). Found by autograd on the probe,
  so parameters used outside submodules (a CLS token, a position embedding) land where they
  act. Block l of the contract is segment l + 1.

:func:`adapt` checks the states on a probe batch before any training, and learns their
shapes, the segments and whether the readout ends in a LayerNorm
(:mod:`creditaudit.models.adapt_probe`), after checking what it was given
(:mod:`creditaudit.models.adapt_arguments`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.descriptions import ModelDescription
from creditaudit.errors import ModelContractError
from creditaudit.formatting import counted
from creditaudit.guests.blame import mark_network_failure
from creditaudit.models.adapt_arguments import (
    NotLogitsError,
    check_eager,
    check_example,
    check_names,
    check_shapes_taken,
    describe_value,
    input_shape_of,
)
from creditaudit.models.adapt_probe import AdaptProbe
from creditaudit.models.contract import LAYOUTS, restored_buffers
from creditaudit.models.packages import network_packages
from creditaudit.models.structure import parameter_dtype

PROBE_SAMPLES = 4  # the probe batch (at least 2: sample independence compares samples)

OnOutput = Callable[[int, Any], Any]


class AdaptedModel(AdaptProbe, nn.Module):
    """A user's module with named states (build it with :func:`adapt`).

    ``net`` is the wrapped module; ``forward(x)`` is ``net(x)``, unchanged. Attributes learnt
    from the probe: ``state_names`` (L + 1 names), ``state_shapes`` (each state's shape
    without the batch), ``state_widths`` (feature width d_l: last axis of ``(B, d)`` and
    ``(B, T, d)`` states, channel axis of ``(B, C, H, W)`` maps), ``n_classes``,
    ``input_shape`` and ``input_dtype``. ``n_blocks`` is L. ``terminal_ln``: whether the
    readout normalises h_L with a LayerNorm, as declared to :func:`adapt` or probed (None
    when neither: built on the meta device). :meth:`describe` says what the model is.
    """

    state_shapes: tuple[tuple[int, ...], ...]
    state_widths: tuple[int, ...]
    n_classes: int
    terminal_ln: bool | None
    # Set by creditaudit.models.build_model when a registered architecture built it.
    architecture: Any = None
    # The guest that built ``net`` (``model factory 'pkg.mod:fn'``), named when it raises.
    origin: str | None = None

    def __init__(self, net: nn.Module, states: Sequence[str], readout: Sequence[str] | None,
                 probe: Tensor, terminal_ln: bool | None = None, *,
                 n_classes: int | None = None, probe_source: str = "example") -> None:
        super().__init__()
        self.net = net
        self.state_names = tuple(states)
        check_names(net, self.state_names, "states")
        if len(self.state_names) < 2:
            raise ModelContractError(
                f"states={list(self.state_names)} names "
                f"{counted(len(self.state_names), 'module')}: name at least two (h_0 … h_L, "
                "L ≥ 1), in the order the forward computes them")
        repeated = sorted({n for n in self.state_names if self.state_names.count(n) > 1})
        if repeated:
            raise ModelContractError(f"states names {repeated[0]!r} twice: each state is one "
                                     "module's output")
        self.readout_names = None if readout is None else tuple(readout)
        if self.readout_names is not None:
            check_names(net, self.readout_names, "readout")
        self.input_shape: tuple[int, ...] = tuple(probe.shape[1:])
        self.input_dtype = probe.dtype
        self.terminal_ln = terminal_ln
        if probe.is_meta:
            self._learn_shapes(probe, n_classes)
        else:
            self._probe(probe, probe_source, n_classes)

    def describe(self) -> ModelDescription:
        """What this model is, for records and reports: the wrapped class as its label, with
        the distributions its modules' classes come from (``BertLogits (transformers)``:
        :func:`~creditaudit.models.packages.network_packages`), the state width d (one
        width, or the range ``d=16–64``) and the states it was given,
        ``4 states h_0…h_3`` — L counts the segments between the named states, which is the
        network's depth only when every block's output is named (a depth-4 ViT read at its
        four blocks is L=3, ResNet-18 at its eight blocks L=7); the state
        layout (vectors, tokens or maps, when every state has one); ``terminal_ln`` as
        declared or probed; ``residual`` is unknown (None): an adapted model's blocks are
        whatever lies between its states; ``dtype`` the parameters' own."""
        low, high = min(self.state_widths), max(self.state_widths)
        width = f"{low}" if low == high else f"{low}–{high}"
        layouts = self.state_layouts
        layout = layouts[0] if len(layouts) == 1 else None
        arch = self.architecture.name if self.architecture is not None else "adapted"
        packages = network_packages(self.net)
        origin = f" ({', '.join(packages)})" if packages else ""
        return ModelDescription(
            arch=arch, label=(f"{type(self.net).__name__}{origin} d={width}, "
                              f"{self.n_blocks + 1} states h_0…h_{self.n_blocks}"),
            terminal_ln=self.terminal_ln, d=low if low == high else None,
            n_blocks=self.n_blocks, residual=None, input_shape=list(self.input_shape),
            layout=layout, parameters=sum(p.numel() for p in self.net.parameters()),
            dtype=parameter_dtype(self.net))

    # --- the contract ---------------------------------------------------------------------
    @property
    def state_layouts(self) -> tuple[str, ...]:
        """The layouts of its states, each once, from h_0 on: ``("maps", "vectors")`` for
        feature maps pooled into a vector state."""
        # (d,), (T, d) or (C, H, W)
        return tuple(dict.fromkeys(LAYOUTS[len(shape) - 1] for shape in self.state_shapes))

    @property
    def n_blocks(self) -> int:
        return len(self.state_names) - 1

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)

    def _run(self, x: Tensor) -> Tensor:
        """``net(x)``; an exception out of the network's code marks ``origin`` as its cause
        (:func:`~creditaudit.guests.blame.mark_network_failure`)."""
        try:
            return self.net(x)
        except Exception as err:
            if self.origin is not None:
                mark_network_failure(err, self.origin, self.net)
            raise

    def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """([h_0 … h_L], logits) of ``net(x)``, every state in the autograd graph.

        With gradients enabled, a state that has no graph (everything before it frozen)
        continues as a leaf that requires grad, so gradients with respect to the states
        exist whatever is frozen; the values are the model's own.
        """
        return self._trace(x, detach=False, leaf=True)

    def run_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """:meth:`forward_states` as a training forward: a state without a graph stays
        without one (no gradient is computed below what nothing trains)."""
        return self._trace(x, detach=False, leaf=False)

    def run_last_state(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(h_L, logits) of :meth:`run_states` with h_L's module alone hooked: what an
        end-to-end step without a penalty reads (each hook costs ~15 µs a step)."""
        (h_last,), logits = self._trace(x, detach=False, leaf=False, only=self.n_blocks)
        return h_last, logits

    def local_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """([out_0 … out_L], logits) with no gradient flowing between segments: the rest of
        the network reads each state detached, so ``out_l`` has a graph to segment l's
        parameters only and the logits to the readout's only (the local rules' forward)."""
        return self._trace(x, detach=True, leaf=False)

    def forward_from(self, layer: int, h: Tensor) -> Tensor:
        """Logits of the network run on from state ``h`` (shape of h_layer, any batch) at
        index ``layer``: ``net`` on a zero input whose state ``layer`` is replaced by ``h``.
        Exact because every state is a cut (checked by :func:`adapt`). In training mode the
        buffers (BatchNorm statistics) are left as they were."""
        if not 0 <= layer <= self.n_blocks:
            raise ModelContractError(f"forward_from(layer={layer}): the layer must be 0 … "
                                     f"{self.n_blocks}")
        if tuple(h.shape[1:]) != self.state_shapes[layer]:
            shape = ", ".join(map(str, self.state_shapes[layer]))
            raise ModelContractError(
                f"forward_from({layer}, h): h has shape {tuple(h.shape)} but state "
                f"{self.state_names[layer]!r} is (batch, {shape})")
        dtype = h.dtype if self.input_dtype.is_floating_point else self.input_dtype
        zeros = torch.zeros((h.shape[0], *self.input_shape), dtype=dtype, device=h.device)

        def replace(index: int, output: Any) -> Any:
            return h if index == layer else None

        buffers = restored_buffers(self.net) if self.net.training else contextlib.nullcontext()
        with buffers, self._hooked(replace), self._skipped(self._prefixes[layer], h):
            return self._run(zeros)

    # --- segments -------------------------------------------------------------------------
    def segment_parameters(self, segment: int) -> list[nn.Parameter]:
        """The parameters that write state ``segment`` (0: everything before h_0; l ≥ 1:
        block l − 1, between h_{l−1} and h_l)."""
        named = dict(self.net.named_parameters())
        return [named[name] for name in self._segments[segment]]

    def readout_parameters(self) -> list[nn.Parameter]:
        """The parameters between h_L and the logits."""
        named = dict(self.net.named_parameters())
        return [named[name] for name in self._readout]

    def set_trainable_blocks(self, trainable: int | None) -> None:
        """Freeze all but the last ``trainable`` blocks (``requires_grad`` off), unfreeze
        those; None leaves every flag as it is. A parameter shared with the part before h_0
        or with the readout stays trainable."""
        if trainable is None:
            return
        if not 0 <= trainable <= self.n_blocks:
            raise ModelContractError(f"trainable_blocks={trainable} is outside "
                                     f"0…{self.n_blocks}")
        first = self.n_blocks - trainable  # blocks first … L−1 train: segments first+1 … L
        keep = {id(p) for p in self.segment_parameters(0) + self.readout_parameters()}
        for segment in range(first + 1, self.n_blocks + 1):
            keep |= {id(p) for p in self.segment_parameters(segment)}
        for segment in range(1, self.n_blocks + 1):
            for p in self.segment_parameters(segment):
                p.requires_grad_(segment > first or id(p) in keep)

    def freeze_all_but_readout(self) -> None:
        """``requires_grad`` off for every parameter outside the readout."""
        readout = {id(p) for p in self.readout_parameters()}
        for p in self.net.parameters():
            if id(p) not in readout:
                p.requires_grad_(False)

    # --- hooks ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _skipped(self, prefix: Sequence[tuple[str, tuple[int, ...]]], h: Tensor
                 ) -> Iterator[None]:
        """Inside the block the modules of ``prefix`` (name, per-sample output shape) return
        zeros instead of running: they finish before the state forward_from replaces, which
        is a cut, so nothing they compute reaches the logits (:meth:`_find_prefixes`)."""
        patched = []
        for name, shape in prefix:
            module = self.net.get_submodule(name)
            patched.append((module, module.__dict__.get("forward")))
            module.forward = functools.partial(_zeros, (h.shape[0], *shape), h)
        try:
            yield
        finally:
            for module, previous in patched:
                del module.forward
                if previous is not None:
                    module.forward = previous

    @contextlib.contextmanager
    def _hooked(self, on_output: OnOutput, only: int | None = None) -> Iterator[None]:
        """Inside the block, state module i's output goes through ``on_output(i, output)``
        (its return value replaces the output unless it is None); ``only``: state i alone."""
        handles = [self.net.get_submodule(name).register_forward_hook(
            functools.partial(_hook, index, on_output))
            for index, name in enumerate(self.state_names) if only in (None, index)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _trace(self, x: Tensor, *, detach: bool, leaf: bool, order: list[int] | None = None,
               only: int | None = None) -> tuple[list[Tensor], Tensor]:
        """(states, logits) of ``net(x)``; ``only``: [state ``only``] alone is captured."""
        outputs: list[Any] = [None] * len(self.state_names)
        versions = [0] * len(self.state_names)

        def capture(index: int, output: Any) -> Any:
            name = self.state_names[index]
            if outputs[index] is not None:
                raise ModelContractError(
                    f"state {name!r} is called more than once in one forward pass: a state "
                    "must be one module call (name a module that runs once, e.g. the block "
                    "that contains it)")
            if not (isinstance(output, Tensor) and output.is_floating_point()):
                raise ModelContractError(
                    f"state {name!r} returns {describe_value(output)}, not one floating tensor: "
                    "name a submodule whose output is the state itself")
            if leaf and not output.requires_grad and torch.is_grad_enabled():
                output = output.detach().requires_grad_(True)
            outputs[index], versions[index] = output, output._version
            if order is not None:
                order.append(index)
            return output.detach() if detach else output

        with self._hooked(capture, only):
            logits = self._run(x)
        if only is not None:
            outputs, versions = outputs[only:only + 1], versions[only:only + 1]
        names = self.state_names if only is None else self.state_names[only:only + 1]
        missing = [name for name, out in zip(names, outputs) if out is None]
        changed = [name for name, out, version in zip(names, outputs, versions)
                   if out is not None and out._version != version]
        if missing or changed:  # a graph compiled since adapt() runs hooks of its own
            check_eager(self.net)
        if missing:
            raise ModelContractError(f"state {missing[0]!r} was not called in the forward "
                                     "pass: name submodules that the model's forward runs")
        if changed:
            raise ModelContractError(
                f"state {changed[0]!r} is modified in place after its module returns it (e.g. "
                "by nn.ReLU(inplace=True)): name the module after the in-place operation, or "
                "make it not in place")
        if not (isinstance(logits, Tensor) and logits.dim() == 2
                and logits.shape[0] == x.shape[0]):
            raise NotLogitsError(type(self.net).__name__, _output_in_words(logits, x),
                                 self.origin)
        return outputs, logits


def _output_in_words(logits: object, x: Tensor) -> str:
    """What a forward returned for the batch ``x``, not (batch, classes) logits: a batch of
    one sample whose batch dimension a ``squeeze()`` dropped is named as such (the
    diagnostics run one-sample batches: a chunk's last, a float64 copy's check)."""
    got = f"{describe_value(logits)} for a batch of {x.shape[0]}"
    if x.shape[0] == 1 and isinstance(logits, Tensor) and logits.dim() == 1:
        got += (" (a squeeze() that drops the batch dimension of a one-sample batch? "
                "squeeze only the dimension you mean, e.g. .squeeze(-1))")
    return got


def adapt(model: nn.Module, states: Sequence[str], readout: str | Sequence[str] | None = None,
          *, example: Tensor | None = None, input_shape: Sequence[int] | None = None,
          terminal_ln: bool | None = None, n_classes: int | None = None) -> AdaptedModel:
    """``model`` (any ``nn.Module`` whose forward maps a batch to (B, C) logits) with the
    outputs of the submodules ``states`` as its states h_0 … h_L.

    ``states``: names as in ``model.named_modules()``, in the order the forward pass
    computes them; each must be a *cut* (the rest of the network reads the input only
    through it — block outputs, not modules inside a residual block). ``readout``: the
    submodule(s) forming the head; by default everything between the last state and the
    logits, and when given it must be exactly that. One of ``example`` (a batch of ≥ 2
    inputs, (B, …)) or ``input_shape`` (one input's shape; probed with random normal inputs)
    is needed: ``adapt`` runs the model on it in eval mode to learn the shapes and check the
    states, and raises a one-line ModelContractError when they cannot work. The probe
    changes nothing (parameters, buffers, ``.grad``, training flags, RNG). ``terminal_ln``
    (whether the readout normalises h_L with a LayerNorm) and ``n_classes`` (the number of
    logits) are probed; when declared, the probe must agree (a contradiction is refused —
    on the meta device, where nothing runs, a declared ``terminal_ln`` is taken as it is).
    """
    if not isinstance(model, nn.Module):
        raise ModelContractError(f"adapt() takes an nn.Module, got {type(model).__name__}")
    check_eager(model)
    check_shapes_taken(model)
    if isinstance(states, str):
        states = [states]
    if isinstance(readout, str):
        readout = [readout]
    if example is None and input_shape is None:
        raise ModelContractError("adapt() needs example= (a batch of inputs) or input_shape= "
                                 "(one input's shape, e.g. (3, 32, 32)) to probe the model")
    reference = next((p for p in model.parameters() if p.is_floating_point()), None)
    if example is None:
        shape = input_shape_of(input_shape)
        dtype = reference.dtype if reference is not None else torch.float32
        device = reference.device if reference is not None else torch.device("cpu")
        generator = torch.Generator().manual_seed(0)
        example = torch.randn((PROBE_SAMPLES, *shape), generator=generator,
                              dtype=dtype).to(device)
        source = f"input_shape={shape}"
    else:
        check_example(example, reference, type(model).__name__)
        source = "example"
    if terminal_ln is not None and not isinstance(terminal_ln, bool):
        raise ModelContractError(f"terminal_ln must be True, False or None (probed), got "
                                 f"{terminal_ln!r}")
    if n_classes is not None and (isinstance(n_classes, bool) or not isinstance(n_classes, int)
                                  or n_classes < 1):
        raise ModelContractError(f"n_classes must be a positive integer (the number of "
                                 f"logits) or None (probed), got {n_classes!r}")
    return AdaptedModel(model, list(states), readout, example[:PROBE_SAMPLES].detach(),
                        terminal_ln, n_classes=n_classes, probe_source=source)


def _hook(index: int, on_output: OnOutput, module: nn.Module, args: Any, output: Any) -> Any:
    return on_output(index, output)


def _zeros(shape: tuple[int, ...], like: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """A skipped module's output: zeros of ``shape`` in ``like``'s dtype and device."""
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


__all__ = ["AdaptedModel", "adapt"]
