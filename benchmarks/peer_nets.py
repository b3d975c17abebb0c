"""The networks bench_peers.py times: each built once, then trained from the same weights by
plain autograd, BioTorch's conversions and creditaudit's rules.

- ``mlp``: x (3072) → Linear(3072, d) → [ReLU → Linear(d, d)] × L → ReLU → Linear(d, 10), no
  skips, no LayerNorm (default d = 512, L = 4); states: the Linears' outputs (the
  pre-activations). Also creditaudit's own form of it, a non-residual ``ResidualNet``
  (:class:`PlainMLP`), on which the block-level ``fa`` and ``dfa`` run too.
- ``lenet``: BioTorch's LeNet-MNIST (``biotorch.models.le_net.LeNetMNIST``: three 5×5
  convolutions, two Linears) on 1×32×32 inputs; states: the two pooled maps, conv3's and
  fc1's activations.
- ``resnet20``: creditaudit's ResNet-20 (``creditaudit.testing.zoo.resnet20``, option-A shortcuts,
  BatchNorm in training mode) on 3×32×32 inputs; states: the stem and every block's output.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from creditaudit.models.contract import ResidualNet
from creditaudit.testing.zoo import resnet20

N_CLASSES = 10


class PlainMLP(ResidualNet):
    """The benchmark's MLP as a non-residual ResidualNet (states: pre-activations)."""

    def __init__(self, in_dim: int, d: int, n_blocks: int) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = d, N_CLASSES, False
        self.embed = nn.Linear(in_dim, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(d, d))
                                    for _ in range(n_blocks))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(d, N_CLASSES))

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)

    def as_sequential(self) -> nn.Sequential:
        """The same layers (copies) as one nn.Sequential."""
        layers: list[nn.Module] = [self.embed]
        for block in self.blocks:
            layers += list(block)
        layers += list(self.head)
        return copy.deepcopy(nn.Sequential(*layers))


@dataclass
class PeerNet:
    """One benchmark network: ``net`` (a plain nn.Module every variant copies), the states
    creditaudit's rules adapt it at, one input's shape, a description for the table and,
    for the MLP, creditaudit's own contract form of the same weights."""

    net: nn.Module
    states: list[str]
    input_shape: tuple[int, ...]
    description: str
    contract: ResidualNet | None = None


def mlp(in_dim: int, d: int, n_blocks: int) -> PeerNet:
    own = PlainMLP(in_dim, d, n_blocks)
    return PeerNet(own.as_sequential(), [str(i) for i in range(0, 2 * n_blocks + 1, 2)],
                   (in_dim,), f"MLP {in_dim} → {d} → [{d}×{d}] × {n_blocks} → {N_CLASSES}, ReLU",
                   contract=own)


def biotorch_lenet() -> nn.Module:
    """BioTorch's own LeNetMNIST, from its file: ``import biotorch.models`` imports every
    model family, and with them torchvision, which BioTorch needs for nothing here."""
    spec = importlib.util.find_spec("biotorch")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "models" / "le_net.py"
    source = importlib.util.spec_from_file_location("biotorch_le_net", path)
    assert source is not None and source.loader is not None
    module = importlib.util.module_from_spec(source)
    source.loader.exec_module(module)
    return module.LeNetMNIST()


def lenet(in_dim: int, d: int, n_blocks: int) -> PeerNet:
    return PeerNet(biotorch_lenet(), ["pool1", "pool2", "relu3", "relu4"], (1, 32, 32),
                   "BioTorch's LeNet-MNIST on 1×32×32")


def resnet(in_dim: int, d: int, n_blocks: int) -> PeerNet:
    net = resnet20(n_classes=N_CLASSES)
    blocks = [f"layer{stage}.{block}" for stage in (1, 2, 3) for block in range(3)]
    return PeerNet(net, ["stem", *blocks], (3, 32, 32),
                   "creditaudit's ResNet-20 (option A, BatchNorm) on 3×32×32")


NETS: dict[str, Callable[[int, int, int], PeerNet]] = {
    "mlp": mlp, "lenet": lenet, "resnet20": resnet}
