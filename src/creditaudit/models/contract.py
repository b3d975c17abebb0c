"""The model contract every credit rule and the protocol rely on.

A *residual network* in this project maps an input ``x`` to states ``h_0 … h_L`` and logits:

    h_0 = embed(x);  h_{l+1} = h_l + blocks[l](h_l)   (or blocks[l](h_l) without skips);
    logits = readout(h_L).

Each block returns only its *branch* ``f_l(h_l)``; the network adds the skip. States are
either ``(B, d)`` feature vectors or ``(B, T, d)`` token tensors (ViT); per-sample
diagnostics read the CLS token (index 0) of token tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from creditaudit.errors import ModelContractError


class ResidualNet(nn.Module):
    """Base class implementing the contract on top of ``embed``, ``blocks`` and ``readout``.

    Subclasses set ``self.embed`` (module: input → h_0), ``self.blocks`` (``nn.ModuleList``
    of branch modules) and ``self.residual``, and define ``readout(h_L) -> logits``. Every
    parameter outside ``embed`` and ``blocks`` belongs to the readout.
    """

    embed: nn.Module
    blocks: nn.ModuleList
    residual: bool = True
    n_classes: int

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


def block_is_trainable(block: nn.Module) -> bool:
    return any(p.requires_grad for p in block.parameters())


@torch.no_grad()
def parameter_snapshot(model: nn.Module) -> dict[str, Tensor]:
    """A detached copy of every parameter, keyed by name (for drift and tests)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}
