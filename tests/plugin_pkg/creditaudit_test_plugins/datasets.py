"""A seeded Gaussian mixture: one isotropic Gaussian per class, equal class shares; the
class means are N(0, separation²/dim · I), the noise N(0, I). docs/extending.md shows this
file from its imports down.
"""

from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions


@dataclass
class GaussianMixtureOptions(GeneratedOptions):   # + data.n_train, n_test, data_seed
    dim: int = opt(16, "input dimension", min=1)
    classes: int = opt(4, "number of classes (one Gaussian each)", min=2)
    separation: float = opt(3.0, "distance scale of the class means (noise std 1)", min=0.0)


class GaussianMixture(GeneratedDataset[GaussianMixtureOptions]):
    name = "gaussian-mixture"     # what --dataset and data.name accept
    label = "Gaussian mixture"

    def input_shape(self):
        return (self.options.dim,)

    def n_classes(self):
        return self.options.classes

    def provenance(self, seed):   # everything that determines the arrays
        options = self.options    # the data section it was made with
        return {"generator": "gaussian-mixture", "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test,
                         "dim": options.dim, "classes": options.classes,
                         "separation": options.separation, "seed": seed}}

    def load(self, seed):
        options, provenance = self.options, self.provenance(seed)
        generator = torch.Generator().manual_seed(seed)
        means = torch.randn(options.classes, options.dim, generator=generator)
        means *= options.separation / options.dim ** 0.5
        n = options.n_train + options.n_test
        y = torch.randint(0, options.classes, (n,), generator=generator)
        x = means[y] + torch.randn(n, options.dim, generator=generator)
        cut = options.n_train
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:],
                       n_classes=options.classes, provenance=provenance)
