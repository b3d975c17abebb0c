"""Datasets for the outside battery (tests/test_outside_battery.py), each a variation of
door-mixture (8 features, 4 classes) with one thing wrong in what ``load()`` returns.
"""

import sys

import torch

from creditaudit.data import Dataset

from .door_datasets import CLASSES, Mixture


class _Variant(Mixture):
    """Mixture whose arrays pass through :meth:`spoil` (x, y) → (x, y)."""

    @classmethod
    def spoil(cls, x, y):
        return x, y

    @classmethod
    def arrays(cls, options, seed):
        return cls.spoil(*super().arrays(options, seed))


class InfFeatures(_Variant):
    name, label = "battery-inf-features", "Inf features"

    @classmethod
    def spoil(cls, x, y):
        x[::5, 0] = float("inf")
        return x, y


class Float64Features(_Variant):
    name, label = "battery-float64-features", "Float64 features"

    @classmethod
    def spoil(cls, x, y):
        return x.double(), y


class IntegerFeatures(_Variant):
    name, label = "battery-integer-features", "Integer features"

    @classmethod
    def spoil(cls, x, y):
        return x.round().long(), y


class FloatLabels(_Variant):
    name, label = "battery-float-labels", "Float labels"

    @classmethod
    def spoil(cls, x, y):
        return x, y.float()


class NegativeLabels(_Variant):
    name, label = "battery-negative-labels", "Negative labels"

    @classmethod
    def spoil(cls, x, y):
        return x, y - 1


class WrongShape(_Variant):
    """Declares 8 features, loads 9."""

    name, label = "battery-wrong-shape", "Wrong shape"

    @classmethod
    def spoil(cls, x, y):
        return torch.cat([x, x[:, :1]], dim=1), y


class TwoDLabels(_Variant):
    name, label = "battery-2d-labels", "2-D labels"

    @classmethod
    def spoil(cls, x, y):
        return x, y[:, None]


class MoreClasses(Mixture):
    """Its load() says 6 classes; its n_classes() says 4."""

    name, label = "battery-more-classes", "More classes"

    @classmethod
    def load(cls, options, seed):
        data = super().load(options, seed)
        return Dataset(cls.name, data.train_x, data.train_y, data.test_x, data.test_y,
                       n_classes=CLASSES + 2, provenance=data.provenance)


class ShortLabels(Mixture):
    """One training label fewer than training samples."""

    name, label = "battery-short-labels", "Short labels"

    @classmethod
    def load(cls, options, seed):
        data = super().load(options, seed)
        return Dataset(cls.name, data.train_x, data.train_y[:-1], data.test_x, data.test_y,
                       n_classes=CLASSES, provenance=data.provenance)


class ReturnsTuple(Mixture):
    name, label = "battery-returns-tuple", "Returns tuple"

    @classmethod
    def load(cls, options, seed):
        return cls.arrays(options, seed)


class ReturnsNone(Mixture):
    name, label = "battery-load-returns-none", "Returns None"

    @classmethod
    def load(cls, options, seed):
        return None


class LoadExits(Mixture):
    name, label = "battery-load-exits", "Load exits"

    @classmethod
    def load(cls, options, seed):
        if options.n_train > 100:  # past the door's tiny sizes
            sys.exit("no more data")
        return super().load(options, seed)


class SeedsGlobal(Mixture):
    """Draws from torch's global RNG after seeding it: the run's own streams move."""

    name, label = "battery-seeds-global", "Seeds global"

    @classmethod
    def load(cls, options, seed):
        torch.manual_seed(seed)
        torch.rand(3)
        return super().load(options, seed)


class Talkative(Mixture):
    """Well behaved, but prints while it loads."""

    name, label = "battery-talkative-data", "Talkative data"

    @classmethod
    def load(cls, options, seed):
        print("loading talkative data")
        return super().load(options, seed)


class OneClass(Mixture):
    """Every label 0 (of 4 classes): refused, like a dataset of one class."""

    name, label = "battery-one-class", "One class"

    @classmethod
    def arrays(cls, options, seed):
        x, y = super().arrays(options, seed)
        return x, torch.zeros_like(y)


class ShapeRaises(Mixture):
    name, label = "battery-shape-raises", "Shape raises"

    @classmethod
    def input_shape(cls, options):
        raise AttributeError("no shape table")
