"""A training split whose labels are all of one class is refused when loaded, like a dataset
declaring one class (``n_classes() == 1``): a network trained on it learns to answer that
class whatever its input, so a run would compare credit rules on nothing to learn. Before,
labels all 0 of 4 declared classes trained without a word. A split that misses some
classes but holds two or more loads (a small ``data.train_subset`` of CIFAR-100 does)."""

from __future__ import annotations

import pytest
import torch

from creditaudit.config import bind
from creditaudit.data import Dataset, GeneratedDataset, load_dataset
from creditaudit.data.registry import GeneratedOptions, SyntheticData
from creditaudit.errors import ConfigError, LoadedDataError


class Labelled(GeneratedDataset[GeneratedOptions]):
    """8 features, 4 declared classes; training labels ``labels(i)`` of sample i."""

    name, label = "labelled", "Labelled"

    @staticmethod
    def labels(i: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(i)

    def input_shape(self):
        return (8,)

    def n_classes(self):
        return 4

    def provenance(self, seed):
        options = self.options
        return {"generator": self.name, "version": 1,
                "args": {"n_train": options.n_train, "n_test": options.n_test, "seed": seed}}

    def load(self, seed):
        options = self.options
        x = torch.randn(options.n_train + options.n_test, 8,
                        generator=torch.Generator().manual_seed(seed))
        train_y = self.labels(torch.arange(options.n_train))
        test_y = torch.arange(options.n_test) % 4
        return Dataset(self.name, x[:options.n_train], train_y, x[options.n_train:], test_y,
                       n_classes=4, provenance=self.provenance(seed))


class TwoOfFour(Labelled):
    name = "two-of-four"

    @staticmethod
    def labels(i):
        return i % 2


class ZerosFirst(Labelled):
    name = "zeros-first"

    @staticmethod
    def labels(i):
        return (i >= 10).long() * (i % 4)


def _load(cls, **options):
    data = bind(cls, "data", n_train=40, n_test=20, **options)
    return load_dataset(data, seed=0, spec=cls(data))


def test_training_labels_of_one_class_are_refused():
    with pytest.raises(LoadedDataError) as error:
        _load(Labelled)
    assert str(error.value) == (
        "the training labels of labelled are all 0 (of its 4 classes): a network trained on "
        "one class learns to answer it whatever its input, so no rule's credit is compared on "
        "learning to tell classes apart; give training labels of at least 2 classes")


def test_a_training_subset_of_one_class_is_refused_naming_the_subset():
    assert _load(ZerosFirst, train_subset=11).train_y.unique().tolist() == [0, 2]
    with pytest.raises(ConfigError, match=r"^data.train_subset=10 keeps training samples of "
                       r"zeros-first labelled 0 only \(its first 10\): a network trained on "
                       r"one class .*; use a larger subset$"):
        _load(ZerosFirst, train_subset=10)


def test_a_training_split_missing_some_classes_loads():
    assert _load(TwoOfFour).train_y.unique().tolist() == [0, 1]


def test_a_builtin_generators_few_samples_of_one_class_name_data_n_train():
    """data.n_train=2 of the teacher drew two samples of one class at some seeds (4 of the
    first 40): refused as the data's fault, asking for "training labels of at least 2
    classes", which a user of a built-in generator cannot give. Now a ConfigError naming
    the size, and its way out."""
    data = bind(SyntheticData, "data", n_train=2, n_test=20)
    with pytest.raises(ConfigError, match=r"^data.n_train=2: the training labels of synthetic "
                       r"are all \d \(of its 10 classes\): a network trained on one class .*"
                       r"tell classes apart; use a larger data.n_train$"):
        load_dataset(data, seed=4, spec=SyntheticData(data))


def test_a_training_subset_of_one_class_asks_for_a_larger_subset_only():
    with pytest.raises(ConfigError) as error:
        _load(ZerosFirst, train_subset=10)
    assert "give training labels" not in str(error.value)
