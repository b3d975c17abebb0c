"""PlainMLP: a feed-forward MLP without skips or LayerNorm, as a contract model.

The network the field's feedback-alignment papers and BioTorch train, written as a
non-residual :class:`ResidualNet` so every credit rule runs on it and can be compared with
an outside implementation layer for layer (tests/test_biotorch_oracle.py).
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from creditaudit.models.contract import ResidualNet


class PlainMLP(ResidualNet):
    """x (B, in_dim) → ReLU(Linear) → [ReLU(Linear(d, d))] × n_blocks → Linear(d, C).

    States are the post-activation hidden vectors h_0 … h_L, each (B, d): the embedding is
    the first Linear and its ReLU, block l maps h_l to h_{l+1} = ReLU(W h_l + b) (no skip,
    ``residual=False``), the readout is the last Linear. So the input of every Linear after
    the first is a state: a rule's credit at h_l is what a per-layer method injects at the
    input of the Linear that reads h_l.
    """

    residual = False
    terminal_ln = False

    def __init__(self, in_dim: int, d: int, n_classes: int, n_blocks: int) -> None:
        super().__init__()
        self.in_dim, self.d, self.n_classes = in_dim, d, n_classes
        self.embed = nn.Sequential(nn.Linear(in_dim, d), nn.ReLU())
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.ReLU())
                                    for _ in range(n_blocks))
        self.head = nn.Linear(d, n_classes)

    def readout(self, h: Tensor) -> Tensor:
        """(B, d) → (B, n_classes) logits."""
        return self.head(h)

    def as_sequential(self) -> nn.Sequential:
        """A copy of the same layers, in order, as one ``nn.Sequential``."""
        layers: list[nn.Module] = [*self.embed]
        for block in self.blocks:
            layers += list(block)
        layers.append(self.head)
        return copy.deepcopy(nn.Sequential(*layers))
