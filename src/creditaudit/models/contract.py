"""The model contract every credit rule and the protocol rely on.

A *residual network* in this project maps an input ``x`` to states ``h_0 … h_L`` and logits:

    h_0 = embed(x);  h_{l+1} = h_l + blocks[l](h_l)   (or blocks[l](h_l) without skips);
    logits = readout(h_L).

Each block returns only its *branch* ``f_l(h_l)``; the network adds the skip. States are
``(B, d)`` feature vectors (ResidualMLP), ``(B, T, d)`` token tensors (ViT) or
``(B, d, H, W)`` feature maps (ConvMixer); per-sample diagnostics read the CLS token
(index 0) of token tensors and the spatial average of feature maps.

Diagnostics run a model in eval mode (:func:`measurement_mode`): a BatchNorm then applies its
running statistics instead of the batch's, so no operation mixes samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from creditaudit.descriptions import ModelDescription
from creditaudit.errors import ModelContractError
from creditaudit.models.structure import parameter_dtype

LAYOUTS = ("vectors", "tokens", "maps")


class ResidualNet(nn.Module):
    """Base class implementing the contract on top of ``embed``, ``blocks`` and ``readout``.

    Subclasses set ``self.embed`` (module: input → h_0), ``self.blocks`` (``nn.ModuleList``
    of branch modules), ``self.residual``, ``self.d`` (the state width) and
    ``self.n_classes``, define ``readout(h_L) -> logits``, and declare what they are:
    ``terminal_ln`` (whether the readout normalises h_L with a LayerNorm — a fact the
    protocol's diagnosis of (b) rests on) and ``state_layout`` (``"vectors"`` (B, d),
    ``"tokens"`` (B, T, d) or ``"maps"`` (B, d, H, W)). Every parameter outside ``embed``
    and ``blocks`` belongs to the readout. :func:`creditaudit.testing.check_model` checks
    each declaration against the module's behaviour.
    """

    embed: nn.Module
    blocks: nn.ModuleList
    residual: bool = True
    n_classes: int
    d: int
    state_layout: ClassVar[str] = "vectors"
    # Set by creditaudit.models.build_model: the architecture that built it (an instance
    # holding its options) and the shape of one input as the model receives it.
    architecture: Any = None
    input_shape: tuple[int, ...] = ()

    @property
    def state_layouts(self) -> tuple[str, ...]:
        """The layouts of its states (one: :attr:`state_layout`)."""
        return (self.state_layout,)

    @property
    def terminal_ln(self) -> bool:
        """Whether the readout applies a LayerNorm to h_L (declare it in a subclass)."""
        raise ModelContractError(f"{type(self).__name__} must declare `terminal_ln`: whether "
                                 "its readout applies a LayerNorm to h_L")

    def describe(self) -> ModelDescription:
        """What this model is, for records and reports (asked of the model, not a config)."""
        arch = self.architecture
        name = arch.name if arch is not None else type(self).__name__
        label = arch.label if arch is not None else type(self).__name__
        label = f"{label} d={self.d} L={self.n_blocks}"
        if not self.terminal_ln:
            label += " no out_LN"
        if not self.residual:
            label += " no residual"
        return ModelDescription(
            arch=name, label=label, terminal_ln=bool(self.terminal_ln), d=int(self.d),
            n_blocks=self.n_blocks, residual=bool(self.residual),
            input_shape=list(self.input_shape) or None, layout=self.state_layout,
            parameters=sum(p.numel() for p in self.parameters()),
            dtype=parameter_dtype(self))

    def readout(self, h: Tensor) -> Tensor:
        raise NotImplementedError

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def next_state(self, h: Tensor, branch: Tensor) -> Tensor:
        """h_{l+1} from h_l and the branch output f_l(h_l)."""
        return h + branch if self.residual else branch

    def forward_states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """Return ([h_0, …, h_L], logits); every state stays in the autograd graph."""
        h = self.embed(x)
        states = [h]
        for block in self.blocks:
            h = self.next_state(h, block(h))
            states.append(h)
        return states, self.readout(h)

    def forward_from(self, layer: int, h: Tensor) -> Tensor:
        """Logits from state ``h_layer`` (runs blocks ``layer … L-1`` and the readout)."""
        for block in self.blocks[layer:]:
            h = self.next_state(h, block(h))
        return self.readout(h)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_states(x)[1]


def summary_vectors(state: Tensor) -> Tensor:
    """Per-sample feature vectors used by every diagnostic.

    ``(B, d)`` → unchanged; ``(B, T, d)`` token tensors → the CLS token ``[:, 0]``;
    ``(B, C, H, W)`` feature maps → average-pooled over H and W.
    """
    if state.dim() == 2:
        return state
    if state.dim() == 3:
        return state[:, 0]
    if state.dim() == 4:
        return state.mean(dim=(2, 3))
    raise ModelContractError(
        f"a state of shape {tuple(state.shape)} is not supported: states must be (B, d) "
        "vectors, (B, T, d) token tensors or (B, C, H, W) feature maps"
    )


def without_zero_samples(h: Tensor) -> Tensor:
    """``h`` ``(B, …)`` with each sample whose values are all exactly zero replaced by a fixed
    standard-normal draw (its own generator: no random stream moves). A zero state scales to
    itself, so a probe of what the readout does with a scaled h_L learns nothing from it: a
    network whose h_L starts at exactly zero (a zero-initialised last layer, no skip) would
    read as one whose readout normalises h_L."""
    zero = h.flatten(1).eq(0).all(dim=1)
    if not bool(zero.any()):
        return h
    generator = torch.Generator(device=h.device).manual_seed(0)
    drawn = torch.randn(h.shape, generator=generator, dtype=h.dtype, device=h.device)
    return torch.where(zero.view(-1, *([1] * (h.dim() - 1))), drawn, h)


def feature_rows(state: Tensor) -> Tensor:
    """The state with its feature axis last: ``(B, d)`` and ``(B, T, d)`` unchanged,
    ``(B, d, H, W)`` maps → ``(B, H·W, d)`` (one row of d features per position)."""
    return state.flatten(2).transpose(1, 2) if state.dim() == 4 else state


def from_feature_rows(rows: Tensor, like: Tensor) -> Tensor:
    """Undo :func:`feature_rows`: ``rows`` back to the layout of the state ``like``."""
    if like.dim() != 4:
        return rows
    return rows.transpose(1, 2).reshape(rows.shape[0], rows.shape[2], *like.shape[2:])


@contextlib.contextmanager
def measurement_mode(model: nn.Module) -> Iterator[None]:
    """Run the block as every measurement runs: ``model`` in eval mode, in fp32 (no
    autocast from the caller) and outside inference mode (the measures take gradients of the
    loss), then restore each submodule's own training flag.

    In eval mode BatchNorm applies its running statistics (no op mixes samples, nothing is
    updated); the other layers of the contract models act the same in both modes. Each
    module's flag is put back as it was — a BatchNorm the user holds in eval mode inside a
    training network stays held, and a network the user put in eval mode under an
    :func:`~creditaudit.adapt` wrapper stays there. An autocast the caller opened (a user's
    bf16 loop) is closed inside: diagnostics are always computed in the model's own dtype;
    so is a ``torch.inference_mode()`` (a user's evaluation block), under which no
    gradient could be taken. Grad mode itself is each measure's own (``torch.enable_grad``
    where it takes gradients).
    """
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode(False))
            for device_type in ("cpu", "cuda"):
                if torch.is_autocast_enabled(device_type):
                    stack.enter_context(torch.autocast(device_type, enabled=False))
            yield
    finally:
        for module, training in flags:
            module.training = training


@contextlib.contextmanager
def restored_buffers(model: nn.Module) -> Iterator[None]:
    """Inside the block every buffer of ``model`` (BatchNorm running statistics and counts)
    is a throwaway copy; on exit the originals, untouched, are back in place.

    For extra train-mode passes that must not count as a training forward (EP's relaxation
    calls the blocks many times per step). Swapping the tensors rather than copying values
    back leaves any autograd graph built inside valid for a later backward.
    """
    saved = [(module, name, buffer) for module in model.modules()
             for name, buffer in module.named_buffers(recurse=False)]
    for module, name, buffer in saved:
        setattr(module, name, buffer.clone())
    try:
        yield
    finally:
        for module, name, buffer in saved:
            setattr(module, name, buffer)


@contextlib.contextmanager
def held_batch_statistics(model: nn.Module) -> Iterator[None]:
    """Inside the block, every BatchNorm of ``model`` in training mode normalises with the
    batch statistics of its *first* call: that call runs as usual (batch statistics, running
    statistics updated — the step's training forward), every later call normalises with
    that batch's mean and (biased) variance held as constants and updates nothing.

    So later passes are per-sample functions (no operation mixes the samples of the batch)
    that agree with the first pass on its inputs. EP needs this: its relaxation treats the
    energy as a sum of per-sample energies, which batch statistics recomputed at every
    relaxation step would couple (on ConvMixer its train-mode relaxation diverged). Gradients
    through later calls do not flow into the held statistics. Modules in eval mode, and
    models without BatchNorm, are left as they are.
    """
    patched = [module for module in model.modules()
               if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training]
    for module in patched:
        module.forward = _held_statistics_forward(module)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for module in patched:
            del module.forward  # back to the class's forward


def _held_statistics_forward(module: nn.modules.batchnorm._BatchNorm):  # noqa: ANN202
    """A forward for ``module`` whose first call records the batch statistics it normalises
    with and whose later calls reuse them (:func:`held_batch_statistics`)."""
    original = type(module).forward.__get__(module)
    held: list[Tensor] = []

    def forward(inputs: Tensor) -> Tensor:
        if not held:
            dims = [0, *range(2, inputs.dim())]
            with torch.no_grad():
                wide = inputs if inputs.dtype in (torch.float32, torch.float64) else inputs.float()
                held.extend((wide.mean(dims), wide.var(dims, unbiased=False)))
            return original(inputs)
        mean, var = held
        dtype = torch.promote_types(mean.dtype, inputs.dtype)
        return torch.nn.functional.batch_norm(
            inputs, mean.to(dtype), var.to(dtype), module.weight, module.bias,
            training=False, momentum=0.0, eps=module.eps)

    return forward


def check_contract(model: nn.Module) -> ResidualNet:
    """Return ``model`` if it meets the contract, else raise a one-line ModelContractError."""
    missing = [
        name for name in ("embed", "blocks", "readout", "forward_states", "forward_from")
        if not hasattr(model, name)
    ]
    if missing:
        raise ModelContractError(
            f"{type(model).__name__} lacks {', '.join(missing)}: credit rules need `embed`, an "
            "ordered `blocks` list returning branch outputs and `readout` (subclass "
            "creditaudit.models.ResidualNet); to audit other models pass a states function "
            "to diagnose()"
        )
    if not isinstance(model.blocks, nn.ModuleList | Sequence):
        raise ModelContractError(
            f"{type(model).__name__}.blocks must be an nn.ModuleList of branch modules"
        )
    return model  # type: ignore[return-value]


def set_trainable_blocks(model: ResidualNet, trainable: int | None) -> None:
    """Freeze all but the last ``trainable`` blocks (None = all trainable).

    Frozen blocks keep their random init: ``requires_grad`` is turned off so no rule and no
    optimiser can change them.
    """
    n = model.n_blocks
    if trainable is None:
        trainable = n
    if not 0 <= trainable <= n:
        raise ModelContractError(f"trainable_blocks={trainable} is outside 0…{n}")
    for index, block in enumerate(model.blocks):
        requires = index >= n - trainable
        for param in block.parameters():
            param.requires_grad_(requires)


def readout_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters outside ``embed`` and ``blocks`` (terminal LN, head, …)."""
    inner = {id(p) for p in model.embed.parameters()}
    inner |= {id(p) for p in model.blocks.parameters()}
    return [p for p in model.parameters() if id(p) not in inner]


def split_branch(block: nn.Module) -> tuple[Callable[[Tensor], Any], nn.Linear] | None:
    """``(hidden, last)`` when the block's branch ends in one ``nn.Linear``, else None.

    Optional part of the contract. ``hidden(h)`` returns either u, with
    ``block(h) == last(hidden(h))``, or a pair (u, skip), with ``block(h) == skip +
    last(u)`` (a branch that adds an inner skip, like a transformer block's attention
    output). It is met by an ``nn.Sequential`` whose last module is an ``nn.Linear``, and by
    a block with a method ``hidden`` and an attribute ``output_layer`` (an ``nn.Linear``).
    Rules whose credits have rank C (DFA, DRTP) then train ``last`` without d-wide
    products (:mod:`creditaudit.methods.projected`); blocks without it train as before.
    """
    if isinstance(block, nn.Sequential) and len(block) and isinstance(block[-1], nn.Linear):
        return block[:-1], block[-1]
    layer, hidden = getattr(block, "output_layer", None), getattr(block, "hidden", None)
    if isinstance(layer, nn.Linear) and callable(hidden):
        return hidden, layer
    return None


def block_is_trainable(block: nn.Module) -> bool:
    return any(p.requires_grad for p in block.parameters())


@torch.no_grad()
def parameter_snapshot(model: nn.Module) -> dict[str, Tensor]:
    """A detached copy of every parameter, keyed by name (for drift and tests)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}
