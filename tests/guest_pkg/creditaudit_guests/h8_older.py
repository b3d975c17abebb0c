"""Plugins written for the older interface of architectures and datasets — their methods
classmethods taking the options first — which keep working unchanged
(tests/test_component_instances.py): the older twins of tests/plugin_pkg's plain MLP and
Gaussian mixture (the same code as those were before the interface took instances), and
two classes that lack a method they must implement, which the registries refuse.
"""

from dataclasses import dataclass

import torch
from torch import nn

from creditaudit.config import opt
from creditaudit.data import Dataset, DatasetSpec, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions
from creditaudit.models import Architecture, ResidualNet

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


class PlainMLP(ResidualNet):
    residual = False
    terminal_ln = False
    state_layout = "vectors"

    def __init__(self, in_dim, width, depth, n_classes, activation):
        super().__init__()
        act = ACTIVATIONS[activation]
        self.d, self.n_classes = width, n_classes
        self.embed = nn.Sequential(nn.Linear(in_dim, width), act())
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), act())
                                    for _ in range(depth))
        self.head = nn.Linear(width, n_classes)

    def readout(self, h):
        return self.head(h)


@dataclass
class PlainMLPOptions:
    width: int = opt(64, "hidden width (every state is (B, width))", min=1)
    depth: int = opt(3, "hidden layers after the first (the blocks)", min=1)
    activation: str = opt("relu", "hidden nonlinearity", choices=tuple(ACTIVATIONS))


class OlderPlainMLPArchitecture(Architecture):
    name = "h8-plain-mlp"
    label = "Plain MLP"
    Options = PlainMLPOptions
    input_kind = "vector"

    @classmethod
    def build(cls, options, *, input_shape, n_classes):
        return PlainMLP(cls.flat_dim(input_shape), options.width, options.depth, n_classes,
                        options.activation)


@dataclass
class GaussianMixtureOptions(GeneratedOptions):
    dim: int = opt(16, "input dimension", min=1)
    classes: int = opt(4, "number of classes (one Gaussian each)", min=2)
    separation: float = opt(3.0, "distance scale of the class means (noise std 1)", min=0.0)


class OlderGaussianMixture(GeneratedDataset):
    name = "h8-gaussian-mixture"
    label = "Gaussian mixture"
    Options = GaussianMixtureOptions

    @classmethod
    def input_shape(cls, options):
        return (options.dim,)

    @classmethod
    def n_classes(cls, options):
        return options.classes

    @classmethod
    def provenance(cls, options, seed):  # the twin's generator: the same data
        return {"generator": "gaussian-mixture", "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test,
                         "dim": options.dim, "classes": options.classes,
                         "separation": options.separation, "seed": seed}}

    @classmethod
    def load(cls, options, seed):
        provenance = cls.provenance(options, seed)
        generator = torch.Generator().manual_seed(seed)
        means = torch.randn(options.classes, options.dim, generator=generator)
        means *= options.separation / options.dim ** 0.5
        n = options.n_train + options.n_test
        y = torch.randint(0, options.classes, (n,), generator=generator)
        x = means[y] + torch.randn(n, options.dim, generator=generator)
        cut = options.n_train
        return Dataset(cls.name, x[:cut], y[:cut], x[cut:], y[cut:],
                       n_classes=options.classes, provenance=provenance)


class NoBuild(Architecture):
    """Declares itself but builds nothing: no build()."""

    name = "h8-no-build"
    label = "No build"


class NoIdentity(DatasetSpec):
    """Loads, but says nothing of what it loads: no identity()."""

    name = "h8-no-identity"
    label = "No identity"
    kind = "generated"

    def input_shape(self):
        return (4,)

    def load(self, seed):
        x = torch.zeros(8, 4)
        return Dataset(self.name, x, torch.zeros(8, dtype=torch.long), x,
                       torch.zeros(8, dtype=torch.long), n_classes=10)
