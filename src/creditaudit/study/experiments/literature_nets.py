"""The networks of the published tables the ``literature`` experiment reproduces, written as
their sources write them: plain ``nn.Module`` classes with nothing of creditaudit in them.

The experiment trains them as any user would train their own network, through the
``module`` architecture (``model.factory = "creditaudit.study.experiments.literature_nets:NAME"``
and ``model.states``); nothing in the package knows these classes.

- :func:`lenet_mnist`: BioTorch's ``le_net_mnist`` (LeNet-5: conv 6@5×5, max-pool, conv
  16@5×5, max-pool, conv 120@5×5, fc 84, fc 10, ReLU) on 32×32 inputs. BioTorch resizes the
  28×28 MNIST and Fashion-MNIST images to 32×32 (``transforms.Resize``, bilinear) before
  normalising; here the network does it (bilinear resizing commutes with the per-channel
  standardisation the data already had, up to BioTorch's rounding to 8-bit pixels).
- :func:`lenet_cifar`: BioTorch's ``le_net_cifar`` (conv 32@3×3, pool, conv 64@3×3, pool,
  conv 128@3×3, global average pool, fc 256, fc 10, ReLU).
- :func:`mnist1d_mlp` and :func:`mnist1d_cnn`: the MLP and CNN baselines of MNIST-1D
  (Greydanus 2020, ``notebooks/models.py``: ``MLPBase`` with a residual second layer and
  ``ConvBase``, three stride-2 Conv1d layers of 25 channels).
- :func:`tanh_mlp`: fully connected networks with tanh hidden units (Nøkland 2016).
- :func:`local_loss_mlp`: Nøkland & Eidnes's (2019) BatchNorm/LeakyReLU/dropout MLP.

BioTorch initialises every convolution and linear layer with Xavier-uniform weights and
zero biases (``init: "xavier"`` in its benchmark configurations); the LeNets do the same.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn import functional as F


def xavier_init(net: nn.Module) -> nn.Module:
    """Xavier-uniform weights and zero biases for every Conv2d and Linear of ``net``
    (BioTorch's ``apply_xavier_init``); returns ``net``."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return net


class LeNetMNIST(nn.Module):
    """LeNet-5 as BioTorch's ``LeNetMNIST``: (B, C, H, W) images resized to ``size``×``size``
    (32 for the 5×5 kernels to leave a 1×1 map after conv3) → (B, ``n_classes``) logits.
    Flat (B, C·S·S) inputs are viewed as square images of ``in_channels`` channels.

    Shapes on 32×32: conv1 (6, 28, 28) → pool1 (6, 14, 14) → conv2 (16, 10, 10) → pool2
    (16, 5, 5) → conv3 (120, 1, 1) → fc1 (84) → fc2 (n_classes).
    """

    def __init__(self, in_channels: int = 1, n_classes: int = 10, size: int = 32) -> None:
        super().__init__()
        self.size, self.in_channels = size, in_channels
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(16, 120, kernel_size=5)
        self.relu3 = nn.ReLU()
        self.fc1 = nn.Linear(120, 84)
        self.relu4 = nn.ReLU()
        self.fc2 = nn.Linear(84, n_classes)
        xavier_init(self)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:  # flat samples: square images
            side = math.isqrt(x.shape[1] // self.in_channels)
            x = x.reshape(x.shape[0], self.in_channels, side, side)
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear",
                              align_corners=False)
        h = self.pool1(self.relu1(self.conv1(x)))
        h = self.pool2(self.relu2(self.conv2(h)))
        h = self.relu3(self.conv3(h)).flatten(1)
        return self.fc2(self.relu4(self.fc1(h)))


class LeNetCIFAR(nn.Module):
    """BioTorch's ``LeNetCIFAR``: (B, 3, 32, 32) → conv1 (32, 30, 30) → pool1 (32, 15, 15) →
    conv2 (64, 13, 13) → pool2 (64, 6, 6) → conv3 (128, 4, 4) → global average pool →
    fc1 (256) → fc2 (n_classes)."""

    def __init__(self, in_channels: int = 3, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(64, 128, kernel_size=3)
        self.relu3 = nn.ReLU()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(128, 256)
        self.relu4 = nn.ReLU()
        self.fc2 = nn.Linear(256, n_classes)
        xavier_init(self)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pool1(self.relu1(self.conv1(x)))
        h = self.pool2(self.relu2(self.conv2(h)))
        h = self.gap(self.relu3(self.conv3(h))).flatten(1)
        return self.fc2(self.relu4(self.fc1(h)))


class Residual(nn.Module):
    """h + relu(linear(h)): the second layer of MNIST-1D's ``MLPBase``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.linear(h).relu()


class MNIST1DMLP(nn.Module):
    """MNIST-1D's ``MLPBase``: (B, 40) → relu(linear1) (``hidden``) → h + relu(linear2 h)
    → linear3 (n_classes)."""

    def __init__(self, in_features: int = 40, hidden: int = 100, n_classes: int = 10) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_features, hidden)
        self.act1 = nn.ReLU()
        self.block2 = Residual(hidden)
        self.linear3 = nn.Linear(hidden, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear3(self.block2(self.act1(self.linear1(x.flatten(1)))))


class MNIST1DCNN(nn.Module):
    """MNIST-1D's ``ConvBase``: (B, 40) viewed as (B, 1, 40) → three Conv1d + ReLU of
    ``channels`` channels, stride 2 (lengths 20, 10, 5) → flatten (5·channels) → linear."""

    def __init__(self, length: int = 40, channels: int = 25, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(channels * (length // 8), n_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(x.shape[0], 1, -1)
        h = self.relu3(self.conv3(self.relu2(self.conv2(self.relu1(self.conv1(h))))))
        return self.linear(self.flatten(h))


class TanhMLP(nn.Module):
    """A fully connected tanh network: (B, …) flattened → ``widths`` hidden layers
    ``layers.{i}`` (Linear) each followed by ``acts.{i}`` (tanh) → ``head`` (n_classes)."""

    def __init__(self, in_features: int = 784, widths: Sequence[int] = (800, 800),
                 n_classes: int = 10) -> None:
        super().__init__()
        sizes = [in_features, *widths]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.acts = nn.ModuleList(nn.Tanh() for _ in widths)
        self.head = nn.Linear(sizes[-1], n_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.flatten(1)
        for layer, act in zip(self.layers, self.acts):
            h = act(layer(h))
        return self.head(h)


class LocalLossMLP(nn.Module):
    """Nøkland & Eidnes's (2019) fully connected network (the ``mlp`` of their local-loss
    train.py): (B, …) flattened → ``n_layers`` blocks ``blocks.{i}`` of Linear → BatchNorm1d
    → LeakyReLU(0.01) → Dropout(``dropout``) → ``out`` = Linear(``hidden``, n_classes).

    The states are the LeakyReLU outputs ``blocks.{i}.act``: what the source's local
    classifier of layer i reads (the dropout after it feeds only the next layer).
    ``zero_out`` zeroes the output layer's weights, as the source does when it trains with
    local losses."""

    def __init__(self, in_features: int = 784, hidden: int = 1024, n_layers: int = 3,
                 n_classes: int = 10, dropout: float = 0.1, zero_out: bool = False) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * n_layers
        self.blocks = nn.Sequential(*(nn.Sequential(OrderedDict(
            linear=nn.Linear(a, b), bn=nn.BatchNorm1d(b), act=nn.LeakyReLU(0.01),
            drop=nn.Dropout(dropout))) for a, b in zip(widths, widths[1:])))
        self.out = nn.Linear(hidden, n_classes)
        if zero_out:
            nn.init.zeros_(self.out.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.blocks(x.flatten(1)))


def lenet_mnist(in_channels: int = 1, n_classes: int = 10) -> LeNetMNIST:
    """BioTorch's LeNet MNIST (states: ``pool1``, ``pool2``, ``relu3``, ``relu4``)."""
    return LeNetMNIST(in_channels=in_channels, n_classes=n_classes)


def lenet_cifar(in_channels: int = 3, n_classes: int = 10) -> LeNetCIFAR:
    """BioTorch's LeNet CIFAR (states: ``pool1``, ``pool2``, ``gap``, ``relu4``)."""
    return LeNetCIFAR(in_channels=in_channels, n_classes=n_classes)


def mnist1d_mlp(hidden: int = 100, n_classes: int = 10) -> MNIST1DMLP:
    """MNIST-1D's MLP baseline (states: ``act1``, ``block2``)."""
    return MNIST1DMLP(hidden=hidden, n_classes=n_classes)


def mnist1d_cnn(channels: int = 25, n_classes: int = 10) -> MNIST1DCNN:
    """MNIST-1D's CNN baseline (states: ``relu1``, ``relu2``, ``flatten``)."""
    return MNIST1DCNN(channels=channels, n_classes=n_classes)


def tanh_mlp(widths: Sequence[int] = (800, 800), n_classes: int = 10) -> TanhMLP:
    """A tanh MLP with hidden ``widths`` (states: ``acts.0`` … ``acts.{n-1}``)."""
    return TanhMLP(widths=tuple(widths), n_classes=n_classes)


def local_loss_mlp(hidden: int = 1024, n_layers: int = 3, n_classes: int = 10,
                   dropout: float = 0.1, zero_out: bool = False) -> LocalLossMLP:
    """Nøkland & Eidnes's MLP on 28×28 images (states: ``blocks.{i}.act``)."""
    return LocalLossMLP(hidden=hidden, n_layers=n_layers, n_classes=n_classes,
                        dropout=dropout, zero_out=zero_out)


__all__ = ["LeNetMNIST", "LeNetCIFAR", "MNIST1DMLP", "MNIST1DCNN", "TanhMLP", "LocalLossMLP",
           "xavier_init", "lenet_mnist", "lenet_cifar", "mnist1d_mlp", "mnist1d_cnn",
           "tanh_mlp", "local_loss_mlp"]
