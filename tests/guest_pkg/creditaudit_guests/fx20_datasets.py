"""Datasets whose loaded data do not fit how creditaudit turns samples into model inputs
(tests/test_data_at_the_door.py); each would end a run in an internal error, not naming it.

- ``fx20-npy-images``: uint8 images (1, 8, 8) read from ``DATA_DIR/x.npy`` by a
  ``FileDataset`` that leaves ``mean``/``std`` at ``()`` (no normalisation);
- ``fx20-npy-rgb-stats``: the same images with a mean and std of three channels;
- ``fx20-npy-normalised``: the same images with one mean and std (well-behaved);
- ``fx20-images-without-mean``: generated uint8 images in a ``Dataset`` built without mean;
- ``fx20-augmented-features``: float features in a ``Dataset`` built with ``augment=True``;
- ``fx20-late-float64``: float64 features once more than 100 training samples are asked for
  (past the door's tiny sizes);
- ``fx20-late-int32-labels``: int32 labels once more than 100 training samples are asked
  for.
"""

import numpy as np
import torch

from creditaudit.data import Dataset, FileDataset, GeneratedDataset
from creditaudit.data.registry import FileOptions, GeneratedOptions

CLASSES, SIDE, DIM = 4, 8, 8


class NpyImages(FileDataset[FileOptions]):
    name, label = "fx20-npy-images", "npy images"

    def input_shape(self):
        return (1, SIDE, SIDE)

    def n_classes(self):
        return CLASSES

    def files(self):
        return [("x", self.folder() / "x.npy", None)]

    def arrays(self):
        x = torch.from_numpy(np.load(self.folder() / "x.npy", allow_pickle=False))
        y = torch.arange(x.shape[0]) % CLASSES
        cut = x.shape[0] * 2 // 3
        return x[:cut], y[:cut], x[cut:], y[cut:]


class NpyRGBStats(NpyImages):
    name, label = "fx20-npy-rgb-stats", "npy images, three channels' statistics"
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class NpyNormalised(NpyImages):
    name, label = "fx20-npy-normalised", "npy images, normalised"
    mean, std = (0.5,), (0.25,)


class _Generated(GeneratedDataset[GeneratedOptions]):
    name, label = "fx20-generated", "generated"  # the others' base, not registered

    def input_shape(self):
        return (DIM,)

    def n_classes(self):
        return CLASSES

    def provenance(self, seed):
        options = self.options
        return {"generator": self.name, "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test, "seed": seed}}

    def arrays(self, seed):
        options, generator = self.options, torch.Generator().manual_seed(seed)
        n = options.n_train + options.n_test
        y = torch.randint(0, CLASSES, (n,), generator=generator)
        return torch.randn(n, DIM, generator=generator) + y[:, None], y

    def dataset(self, seed, x, y, **extra):
        cut = self.options.n_train
        return Dataset(self.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=CLASSES,
                       provenance=self.provenance(seed), **extra)

    def load(self, seed):
        return self.dataset(seed, *self.arrays(seed))


class ImagesWithoutMean(_Generated):
    name, label = "fx20-images-without-mean", "images without mean"

    def input_shape(self):
        return (1, 2, DIM // 2)

    def load(self, seed):
        x, y = self.arrays(seed)
        images = (x.clamp(-4, 4) * 30 + 128).to(torch.uint8).view(-1, 1, 2, DIM // 2)
        return self.dataset(seed, images, y)


class AugmentedFeatures(_Generated):
    name, label = "fx20-augmented-features", "augmented features"

    def load(self, seed):
        return self.dataset(seed, *self.arrays(seed), augment=True)



class LateFloat64(_Generated):
    name, label = "fx20-late-float64", "late float64"

    def load(self, seed):
        x, y = self.arrays(seed)
        return self.dataset(seed, x.double() if self.options.n_train > 100 else x, y)


class LateInt32Labels(_Generated):
    name, label = "fx20-late-int32-labels", "late int32 labels"

    def load(self, seed):
        x, y = self.arrays(seed)
        return self.dataset(seed, x, y.int() if self.options.n_train > 100 else y)
