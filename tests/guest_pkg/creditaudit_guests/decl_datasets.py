"""Datasets that declare, or load a ``Dataset`` holding, what creditaudit cannot use:
numpy or float numbers where Python ints belong, a numpy mean and std (each ended its run
in an internal error), two files under one name (a run id that does not follow one of
them). Each is one of fx20's datasets otherwise (tests/test_data_declarations.py).
"""

import numpy as np
import torch

from .fx20_datasets import CLASSES, DIM, NpyNormalised, _Generated


class NumpyClasses(_Generated):
    name, label = "decl-numpy-classes", "numpy classes"

    def n_classes(self):
        return np.int64(CLASSES)


class FloatClasses(_Generated):
    name, label = "decl-float-classes", "float classes"

    def n_classes(self):
        return float(CLASSES)


class OneClass(_Generated):
    """Declares (and loads) one class: a loss of 0, no gradient to compare."""

    name, label = "decl-one-class", "one class"

    def n_classes(self):
        return 1

    def load(self, seed):
        dataset = super().load(seed)
        dataset.train_y, dataset.test_y = dataset.train_y * 0, dataset.test_y * 0
        dataset.n_classes = 1
        return dataset


class NumpyShape(_Generated):
    name, label = "decl-numpy-shape", "numpy shape"

    def input_shape(self):
        return (np.int64(DIM),)


class NumpyLoadedClasses(_Generated):
    """Declares 4 classes; loads a Dataset of np.int64(4) classes."""

    name, label = "decl-numpy-loaded-classes", "numpy loaded classes"

    def load(self, seed):
        dataset = super().load(seed)
        dataset.n_classes = np.int64(CLASSES)
        return dataset


class NumpyMean(_Generated):
    """uint8 images (1, 2, 4) in a Dataset given a numpy mean and std."""

    name, label = "decl-numpy-mean", "numpy mean"

    def input_shape(self):
        return (1, 2, DIM // 2)

    def load(self, seed):
        x, y = self.arrays(seed)
        images = (x.clamp(-4, 4) * 30 + 128).to(torch.uint8).view(-1, 1, 2, DIM // 2)
        return self.dataset(seed, images, y, mean=np.array([0.5]), std=np.array([0.25]))


class TwoFilesOneName(NpyNormalised):
    """Lists DATA_DIR/x.npy and DATA_DIR/y.npy both as "x": one digest per name, so the run
    id would not follow y.npy."""

    name, label = "decl-two-files-one-name", "two files, one name"

    def files(self):
        return [("x", self.folder() / "x.npy", None), ("x", self.folder() / "y.npy", None)]


class ProvenanceWithoutArgs(_Generated):
    """provenance() without its generator's arguments under "args" (a KeyError inside
    creditaudit's identity, blamed on the plugin as its own)."""

    name, label = "decl-provenance-without-args", "provenance without args"

    def provenance(self, seed):
        return {"generator": self.name, "seed": seed}


class NumpyProvenance(_Generated):
    """A numpy int among its generator's arguments (json's TypeError, at encoder.py)."""

    name, label = "decl-numpy-provenance", "numpy provenance"

    def provenance(self, seed):
        provenance = super().provenance(seed)
        provenance["args"]["n_train"] = np.int64(self.options.n_train)
        return provenance


class NaNProvenance(_Generated):
    """A NaN among its generator's arguments (told as an identity() that is not
    deterministic: NaN != NaN)."""

    name, label = "decl-nan-provenance", "NaN provenance"

    def provenance(self, seed):
        provenance = super().provenance(seed)
        provenance["args"]["noise"] = float("nan")
        return provenance


class NoFiles(NpyNormalised):
    """files() lists nothing: every folder's data would have one fingerprint, one run id."""

    name, label = "decl-no-files", "no files"

    def files(self):
        return []


def _as_text(path):
    return path.read_bytes().hex()


class TextDecoder(NpyNormalised):
    """A decoder that returns str, not bytes (hashlib's TypeError, at identity.py)."""

    name, label = "decl-text-decoder", "text decoder"

    def files(self):
        return [(name, path, _as_text) for name, path, _ in super().files()]
