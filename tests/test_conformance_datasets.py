"""Every registered dataset passes the public dataset suite (check_dataset): generated ones
at tiny sizes, file ones on tiny folders written here (and Fashion-MNIST on its real files
where this machine has them); and the suite catches datasets that break their declarations."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.data import DATASETS, Dataset
from creditaudit.data.registry import MNIST, SyntheticData
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import ConfigError
from creditaudit.testing import check_dataset, dataset_checks
from integrity_support import write_cifar10, write_idx_dataset

REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_cifar100(parent: Path, *, per_file: int = 4, seed: int = 0) -> Path:
    """An official-layout cifar-100-python folder (train, test) of ``per_file`` images each."""
    folder = parent / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in ("train", "test"):
        batch = {b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                 b"fine_labels": rng.integers(0, 100, per_file).tolist(),
                 b"coarse_labels": [0] * per_file}
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def folders(kind: str, root: Path) -> tuple[dict, dict]:
    """(options, other options) of a dataset read from two tiny folders of other data."""
    first, second = root / "a", root / "b"
    if kind == "idx":
        write_idx_dataset(first, n_train=16, n_test=8, seed=0)
        write_idx_dataset(second, n_train=16, n_test=8, seed=1)
    elif kind == "cifar10":
        write_cifar10(first, seed=0)
        write_cifar10(second, seed=1)
    else:
        write_cifar100(first, seed=0)
        write_cifar100(second, seed=1)
    return {"data_dir": str(first)}, {"data_dir": str(second)}


FOLDERS = {"mnist": "idx", "fashion-mnist": "idx", "cifar10": "cifar10",
           "cifar100": "cifar100"}


def options_of(cls, root: Path) -> tuple[dict, dict]:
    if cls.kind == "generated":
        return {}, {"n_train": 50}  # 50 + 20: a multiple of 10, as MNIST-1D needs
    return folders(FOLDERS[cls.name], root)


NAMES = DATASETS.names(warn=False)
CHECKS = [(name, check.__name__) for name in NAMES
          for check in dataset_checks(DATASETS.get(name), other={})]


@pytest.mark.parametrize("name,check_name", CHECKS, ids=[f"{n}-{c}" for n, c in CHECKS])
def test_dataset_conforms(name, check_name, tmp_path):
    cls = DATASETS.get(name)
    options, other = options_of(cls, tmp_path)
    check = next(c for c in dataset_checks(cls, options, other=other)
                 if c.__name__ == check_name)
    check()


def test_every_builtin_dataset_is_checked():
    assert set(FOLDERS) | {"synthetic", "mnist1d"} == set(NAMES)


@pytest.mark.skipif(not REAL_FASHION.is_dir(), reason="no Fashion-MNIST files on this machine")
def test_fashion_mnist_conforms_on_its_real_files():
    check_dataset(DATASETS.get("fashion-mnist"), {"data_dir": str(REAL_FASHION)})


def test_options_it_does_not_declare_are_refused():
    with pytest.raises(ConfigError, match="has no option 'data_dir'"):
        check_dataset(SyntheticData, {"data_dir": "x"})


def test_the_data_check_runs_only_with_other_options():
    names = {c.__name__ for c in dataset_checks(SyntheticData)}
    assert "identity_follows_the_data" not in names
    assert "identity_follows_the_seed" in names


class IgnoresSeed(SyntheticData):
    name, label = "ignores-seed", "Ignores its seed"

    def load(self, seed):
        return super().load(0)


class Int32Labels(SyntheticData):
    name, label = "int32-labels", "int32 labels"

    def load(self, seed):
        dataset = super().load(seed)
        dataset.test_y = dataset.test_y.to(torch.int32)
        return dataset


class DoubleFeatures(SyntheticData):
    name, label = "float64", "float64 features"

    def load(self, seed):
        dataset = super().load(seed)
        dataset.train_x, dataset.test_x = dataset.train_x.double(), dataset.test_x.double()
        return dataset


class LabelsOutOfRange(SyntheticData):
    name, label = "labels-out", "Labels out of range"

    def n_classes(self):
        return 3  # the teacher labels 10 classes

    def load(self, seed):
        dataset = super().load(seed)
        dataset.n_classes = 3
        return dataset


class DrawsFromTheGlobalRNG(SyntheticData):
    name, label = "global-rng", "Global RNG"

    def load(self, seed):
        np.random.rand()
        return super().load(seed)


class ReseedsNumpy(SyntheticData):
    """Reseeds numpy's global RNG: loads are deterministic, and the RNG training draws from
    afterwards is reset (passed while the RNG happened to be in that seed's state)."""

    name, label = "reseeds-numpy", "Reseeds numpy"

    def load(self, seed):
        np.random.seed(0)
        return super().load(seed)


class EditsWhatItKept(SyntheticData):
    """Keeps the arrays it returned and shifts them in place on every later load: two loads
    compared after the second are the same objects, equal, though the first run's data was
    changed under it (passed while the check compared them only then)."""

    name, label = "edits-kept", "Edits kept"
    kept: dict = {}

    def load(self, seed):
        key = (repr(self.options), seed)
        if key in self.kept:
            self.kept[key].train_x.add_(1.0)
        else:
            self.kept[key] = super().load(seed)
        return self.kept[key]


class MiscountsItsSizes(SyntheticData):
    name, label = "miscounts", "Miscounts"

    def sizes(self):
        return self.options.n_train + 1, self.options.n_test


class SeedInTheSource(SyntheticData):
    name, label = "seeded-source", "Seeded source"

    def identity(self, seed):
        identity = super().identity(seed)
        identity.source = identity.fingerprint
        return identity


class HoldsOutNothing(SyntheticData):
    """Its test split is the first training samples: test accuracy would be memorisation."""

    name, label = "tests-on-training", "Tests on training"

    def load(self, seed):
        dataset = super().load(seed)
        n = dataset.test_x.shape[0]
        dataset.test_x, dataset.test_y = dataset.train_x[:n].clone(), dataset.train_y[:n].clone()
        return dataset


class ReadsTrainingFilesAsTest(MNIST):
    """Reads the training files as its test split too."""

    name, label = "tests-on-training-files", "Tests on training files"

    def load(self, seed):
        dataset = super().load(seed)
        dataset.test_x, dataset.test_y = dataset.train_x.clone(), dataset.train_y.clone()
        return dataset


class NoisyTrainingAsTest(SyntheticData):
    """Its test split is the first training samples plus 1e-6 noise: no test sample is a
    training sample byte for byte (passed while the check compared bytes only)."""

    name, label = "tests-on-noisy-training", "Tests on noisy training"

    def load(self, seed):
        dataset = super().load(seed)
        n, noise = dataset.test_x.shape[0], torch.Generator().manual_seed(seed)
        dataset.test_x = dataset.train_x[:n] + 1e-6 * torch.randn(
            dataset.train_x[:n].shape, generator=noise)
        dataset.test_y = dataset.train_y[:n].clone()
        return dataset


class ReadsNoisyTrainingFilesAsTest(MNIST):
    """Reads the training images, each pixel moved by a grey level, as its test split."""

    name, label = "tests-on-noisy-training-files", "Tests on noisy training files"

    def load(self, seed):
        dataset = super().load(seed)
        step = torch.randint(-1, 2, dataset.train_x.shape,
                             generator=torch.Generator().manual_seed(0))
        dataset.test_x = (dataset.train_x.short() + step).clamp(0, 255).to(torch.uint8)
        dataset.test_y = dataset.train_y.clone()
        return dataset


class UnhashedAlpha(SyntheticData):
    """Generates with data.alpha but leaves it out of its provenance, so of its fingerprint:
    runs on two teachers' data would record one fingerprint (without ``other`` options, as
    at the door, nothing compared two settings)."""

    name, label = "unhashed-alpha", "Unhashed alpha"

    def provenance(self, seed):
        provenance = super().provenance(seed)
        provenance["args"] = {k: v for k, v in provenance["args"].items() if k != "alpha"}
        return provenance

    def load(self, seed):
        from creditaudit.data.synthetic import make_teacher_student

        provenance = super().provenance(seed)  # the generator's own arguments, alpha too
        return Dataset(self.name, *make_teacher_student(**provenance["args"]), n_classes=10,
                       provenance=provenance)


class UnhashedFiles(MNIST):
    """Its identity ignores the files: changed data would reuse old runs."""

    name, label = "unhashed", "Unhashed"

    def identity(self, seed):
        return DataIdentity(self.name, "same", "same", n_classes=10, input_shape=[1, 28, 28])


@pytest.mark.parametrize("cls,check", [
    (IgnoresSeed, "identity_follows_the_seed"),
    (Int32Labels, "loads_what_it_declares"),
    (DoubleFeatures, "loads_what_it_declares"),
    (LabelsOutOfRange, "loads_what_it_declares"),
    (DrawsFromTheGlobalRNG, "load_is_deterministic_and_leaves_global_rngs_untouched"),
    (ReseedsNumpy, "load_is_deterministic_and_leaves_global_rngs_untouched"),
    (EditsWhatItKept, "load_is_deterministic_and_leaves_global_rngs_untouched"),
    (MiscountsItsSizes, "sizes_match_what_was_loaded"),
    (SeedInTheSource, "identity_follows_the_seed"),
    (UnhashedFiles, "identity_follows_the_data"),
    (HoldsOutNothing, "test_split_is_held_out"),
    (ReadsTrainingFilesAsTest, "test_split_is_held_out"),
    (NoisyTrainingAsTest, "test_split_is_held_out"),
    (ReadsNoisyTrainingFilesAsTest, "test_split_is_held_out"),
    (UnhashedAlpha, "identity_follows_every_option"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_suite_catches_datasets_that_break_their_declarations(cls, check, tmp_path):
    options, other = options_of(cls, tmp_path) if cls.kind == "generated" else \
        folders("idx", tmp_path)
    with pytest.raises(AssertionError) as err:
        check_dataset(cls, options, other=other)
    assert "fails 1 conformance check:" in str(err.value)  # that one, and only that one
    assert f"- {check}:" in str(err.value)


def test_the_door_catches_an_option_the_fingerprint_leaves_out():
    """The door gives no ``other`` options: the varied option is found by the suite itself."""
    with pytest.raises(AssertionError) as err:
        check_dataset(UnhashedAlpha)
    assert ("identity_follows_every_option: alpha=0.5 loads other arrays than alpha=1.0 under "
            "the same fingerprint") in str(err.value)
