"""Datasets that fail at creditaudit's door, or break at run time (tests/test_door*.py).
Each is a small Gaussian-mixture-like generated dataset of 8 features and 4 classes.

- ``door-nan-features``: some features are NaN (a run on it would be recorded as diverged,
  blaming the rule);
- ``door-shifting``: another draw on every ``load()`` (a run id would not name one data
  set);
- ``door-bad-labels``: labels up to 4 (of 4 classes) once more than 100 training samples
  are asked for — past the door's tiny sizes, so only the run's own load can tell;
- ``door-load-raises``: ``load()`` raises for more than 100 training samples;
- ``door-late-nan``: one NaN feature once more than 100 training samples are asked for;
- ``door-capped``: at most 100 training samples, whatever ``sizes()`` (``data.n_train``)
  says — right at the door's tiny sizes, wrong at a run's;
- ``door-late-overlap``: its test split is the first training samples once more than 100
  training samples are asked for (held out at the door's tiny sizes);
- ``door-repeats``: ``door-late-overlap`` declaring ``test_split_is_held_out`` an
  expected failure (inputs that repeat by design).
"""

import itertools

import torch

from creditaudit.data import Dataset, GeneratedDataset
from creditaudit.data.registry import GeneratedOptions

DIM, CLASSES = 8, 4
_DRAWS = itertools.count()


class Mixture(GeneratedDataset):
    name, label = "door-mixture", "Mixture"  # well-behaved: the others' base
    Options = GeneratedOptions  # data.n_train, n_test, data_seed

    @classmethod
    def input_shape(cls, options):
        return (DIM,)

    @classmethod
    def n_classes(cls, options):
        return CLASSES

    @classmethod
    def provenance(cls, options, seed):
        return {"generator": cls.name, "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test, "seed": seed}}

    @classmethod
    def arrays(cls, options, seed):
        generator = torch.Generator().manual_seed(seed)
        n = options.n_train + options.n_test
        y = torch.randint(0, CLASSES, (n,), generator=generator)
        x = torch.randn(n, DIM, generator=generator) + y[:, None].float()
        return x, y

    @classmethod
    def load(cls, options, seed):
        x, y = cls.arrays(options, seed)
        cut = options.n_train
        return Dataset(cls.name, x[:cut], y[:cut], x[cut:], y[cut:], n_classes=CLASSES,
                       provenance=cls.provenance(options, seed))


class NaNFeatures(Mixture):
    name, label = "door-nan-features", "NaN features"

    @classmethod
    def arrays(cls, options, seed):
        x, y = super().arrays(options, seed)
        x[::7, 3] = float("nan")
        return x, y


class Shifting(Mixture):
    name, label = "door-shifting", "Shifting"

    @classmethod
    def arrays(cls, options, seed):
        return super().arrays(options, seed + next(_DRAWS))


class BadLabels(Mixture):
    name, label = "door-bad-labels", "Bad labels"

    @classmethod
    def arrays(cls, options, seed):
        x, y = super().arrays(options, seed)
        if options.n_train > 100:
            y[5] = CLASSES
        return x, y


class LateNaN(Mixture):
    name, label = "door-late-nan", "Late NaN"

    @classmethod
    def arrays(cls, options, seed):
        x, y = super().arrays(options, seed)
        if options.n_train > 100:
            x[150, 2] = float("nan")
        return x, y


class LoadRaises(Mixture):
    name, label = "door-load-raises", "Load raises"

    @classmethod
    def arrays(cls, options, seed):
        if options.n_train > 100:
            raise OSError(28, "the mixture ran out of room")
        return super().arrays(options, seed)


class Capped(Mixture):
    name, label = "door-capped", "Capped"

    @classmethod
    def load(cls, options, seed):
        dataset = super().load(options, seed)
        dataset.train_x, dataset.train_y = dataset.train_x[:100], dataset.train_y[:100]
        return dataset


class LateOverlap(Mixture):
    name, label = "door-late-overlap", "Late overlap"

    @classmethod
    def load(cls, options, seed):
        dataset = super().load(options, seed)
        if options.n_train > 100:
            n = options.n_test
            dataset.test_x = dataset.train_x[:n].clone()
            dataset.test_y = dataset.train_y[:n].clone()
        return dataset


class Repeats(LateOverlap):
    name, label = "door-repeats", "Repeats"
    expected_failures = {"test_split_is_held_out": "its samples repeat by design"}
