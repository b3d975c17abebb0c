"""``module`` factories that fail at creditaudit's door, or break, print or exit
(tests/test_door*.py). Each builds a small network with named states ``stem``, ``b1``,
``b2`` (``model.states = ["stem", "b1", "b2"]``) for 1×28×28 images or flat features.
"""

import sys

import torch
from torch import nn

STATES = ["stem", "b1", "b2"]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, h):
        return h + torch.relu(self.linear(h))


class ImageNet(nn.Module):
    """conv stem → pooled (B, 8) → two residual blocks → head."""

    def __init__(self, in_channels=1, n_classes=10, head_ln=False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 8, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.b1, self.b2 = Block(8), Block(8)
        self.head = nn.Sequential(nn.LayerNorm(8) if head_ln else nn.Identity(),
                                  nn.Linear(8, n_classes))

    def forward(self, x):
        return self.head(self.b2(self.b1(self.stem(x))))


def three_channel_net(n_classes=10, weights="imagenet"):
    """Like torchvision's resnet18: its first convolution reads 3-channel images."""
    if weights is not None:
        raise ValueError(f"no weights {weights!r} here: pass weights=None")
    return ImageNet(in_channels=3, n_classes=n_classes)


class FlatNet(nn.Module):
    """A network for flat features, whose first layer reads ``in_features`` of them."""

    def __init__(self, in_features=100, n_classes=10):
        super().__init__()
        self.stem, self.b1, self.b2 = nn.Linear(in_features, 8), Block(8), Block(8)
        self.head = nn.Linear(8, n_classes)

    def forward(self, x):
        return self.head(self.b2(self.b1(self.stem(x))))


def printing_net(n_classes=10):
    print("building printing_net")  # a factory that talks on stdout
    return ImageNet(n_classes=n_classes)


def exiting_net(n_classes=10):
    sys.exit(3)


def seeding_net(n_classes=10):
    """Seeds torch's RNG itself: every run seed would train the same initial weights."""
    torch.manual_seed(0)
    return ImageNet(n_classes=n_classes)


class ForwardRaises(ImageNet):
    def forward(self, x):
        if x.shape[0] > 4:  # larger than the probe batch: only during training
            raise ValueError("the forward lost its way")
        return super().forward(x)


def forward_raises_net(n_classes=10):
    return ForwardRaises(n_classes=n_classes)


class ForwardOutOfMemory(ImageNet):
    def forward(self, x):
        if self.training and x.shape[0] > 4:  # a training step: as torch's allocator says it
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: "
                               "can't allocate memory: you tried to allocate 10000000000 bytes")
        return super().forward(x)


def out_of_memory_net(n_classes=10):
    return ForwardOutOfMemory(n_classes=n_classes)


def torch_layers_net(n_classes=10):
    """Only torch's own classes, no code of the factory's on the traceback: its
    InstanceNorm1d, which keeps running statistics, normalises a single spatial element,
    which it refuses in training mode only (the door's probes and the diagnostics forward
    it in eval mode)."""
    from collections import OrderedDict

    return nn.Sequential(OrderedDict(
        stem=nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 8)),
        b1=nn.Sequential(nn.Unflatten(1, (8, 1)),
                         nn.InstanceNorm1d(8, track_running_stats=True), nn.Flatten(),
                         nn.ReLU()),
        b2=nn.Sequential(nn.Linear(8, 8), nn.ReLU()), head=nn.Linear(8, n_classes)))
