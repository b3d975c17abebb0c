"""Loaded data the loader cannot turn into model inputs is refused at the door — by the
conformance check (``check_dataset``) and by the run's own check of what it loaded
(``check_loaded``) — in one line naming the dataset plugin and what to set, never an
internal error in the middle of a run: uint8 images without a mean and std (a
``FileDataset`` left at ``()``, a ``Dataset`` built without them), a mean/std of another
channel count, float features marked augmented; and, past the door's tiny sizes, samples
or labels of a dtype the loader and the loss do not take (float64 features, int32 labels).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.data import Dataset, check_loaded, dataset_spec
from creditaudit.errors import GuestError, LoadedDataError
from creditaudit.run.plan import plan_run
from creditaudit.testing import check_dataset
from door_support import ORIGIN, cli_args, error_line, guests, site_with, tiny_config
from plugin_support import cli

N_IMAGES = 96  # 64 training + 32 test images of 1×8×8
FIX_IMAGES = "set mean and std, one value per channel (1)"


def npy_folder(root: Path) -> Path:
    """A folder holding x.npy: N_IMAGES uint8 images (1, 8, 8) for the fx20-npy-* guests."""
    folder = root / "npy"
    folder.mkdir(parents=True, exist_ok=True)
    pixels = (np.arange(N_IMAGES * 64) * 7 % 251).astype(np.uint8)
    np.save(folder / "x.npy", pixels.reshape(N_IMAGES, 1, 8, 8))
    return folder


def npy_run(folder: Path, name: str) -> dict[str, object]:
    return {"data.name": name, "data.data_dir": str(folder), "data.n_train": None,
            "data.n_test": None, "diagnostics.eval_samples": 32}


REFUSED = [
    ("fx20-npy-images", True, "loaded uint8 images but no normalisation for them (mean=None "
                              "and std=None): " + FIX_IMAGES),
    ("fx20-npy-rgb-stats", True, "loaded 1-channel images with mean=(0.5, 0.5, 0.5) and "
                                 "std=(0.25, 0.25, 0.25): mean/std need one value per channel "
                                 "(1), got 3 and 3; " + FIX_IMAGES),
    ("fx20-images-without-mean", False, "loaded uint8 images but no normalisation for them "
                                        "(mean=None and std=None): " + FIX_IMAGES),
    ("fx20-augmented-features", False, "loaded float features with augment=True, but only "
                                       "uint8 images are augmented: set data.augment=false"),
]


@pytest.mark.parametrize(("name", "files", "says"), REFUSED, ids=[r[0] for r in REFUSED])
def test_data_the_loader_cannot_normalise_is_refused_at_the_door_naming_the_plugin(
        tmp_path, name, files, says):
    folder = npy_folder(tmp_path)
    overrides = npy_run(folder, name) if files else {"data.name": name}
    with guests(tmp_path / "api", name):
        with pytest.raises(GuestError) as error:
            plan_run(tiny_config(tmp_path / "runs", **overrides))
        with pytest.raises(AssertionError, match=f"(?s)loads_what_it_declares.*"
                                                 f"{re.escape(says[:40])}"):
            check_dataset(dataset_spec(name), {"data_dir": str(folder)} if files else None)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"dataset plugin '{name}' ({ORIGIN}) fails the conformance "
                              "check loads_what_it_declares"), message
    assert f"{name} {says}" in message, message


def test_the_cli_names_the_plugin_of_uint8_images_left_without_mean_and_std(tmp_path):
    """The FileDataset recipe of docs/extending.md with mean/std left at (): one line."""
    site = site_with(tmp_path, "fx20-npy-images")
    done = cli(site, "train", *cli_args(tmp_path / "runs", **npy_run(
        npy_folder(tmp_path), "fx20-npy-images")), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith("creditaudit: error: dataset plugin 'fx20-npy-images'"), line
    assert FIX_IMAGES in line and "internal error" not in line


def test_images_with_one_mean_and_std_per_channel_train(tmp_path):
    with guests(tmp_path / "api", "fx20-npy-normalised"):
        plan = plan_run(tiny_config(tmp_path / "runs", **npy_run(
            npy_folder(tmp_path), "fx20-npy-normalised")))
        data = plan.load_data()
        assert data.mean == (0.5,) and data.std == (0.25,)
        inputs, _ = data.eval_subset(8, flatten=True)
        assert inputs.dtype == torch.float32 and bool(torch.isfinite(inputs).all())


def _images(**extra: object) -> Dataset:
    x = torch.zeros(6, 1, 4, 4, dtype=torch.uint8)
    y = torch.arange(6) % 2
    return Dataset("tiny", x[:4], y[:4], x[4:], y[4:], n_classes=2, **extra)


class _Spec:
    """What check_loaded asks of a dataset: its name, sample shape and classes."""

    name = "tiny"

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def input_shape(self) -> tuple[int, ...]:
        return self.shape

    def n_classes(self) -> int:
        return 2


@pytest.mark.parametrize(("extra", "says"), [
    ({}, "no normalisation for them (mean=None and std=None)"),
    ({"mean": (), "std": ()}, "no normalisation for them (mean=() and std=())"),
    ({"mean": (0.5,), "std": None}, "no normalisation"),
    ({"mean": (0.5, 0.5), "std": (0.2, 0.2)}, "need one value per channel (1), got 2 and 2"),
    ({"mean": (0.5,), "std": (0.0,)}, "std must be positive"),
    # an infinite std trained on a channel of zeros; a NaN mean, on NaN (a "diverged" rule)
    ({"mean": (0.5,), "std": (math.inf,)}, "std must be positive and finite, got (inf,)"),
    ({"mean": (0.5,), "std": (math.nan,)}, "std must be positive and finite, got (nan,)"),
    ({"mean": (math.nan,), "std": (0.2,)}, "mean must be finite, got (nan,)"),
    ({"mean": (-math.inf,), "std": (0.2,)}, "mean must be finite, got (-inf,)"),
    ({"mean": ("0.5",), "std": (0.2,)}, "must be real number, not str"),
    # creditaudit's own truth test of a numpy mean raised ValueError, blamed on the plugin
    ({"mean": np.array([0.5]), "std": np.array([0.2])}, "a mean of type ndarray and a std "
                                                         "of type ndarray"),
])
def test_the_runs_own_check_refuses_images_it_cannot_normalise(extra, says):
    """Past the door (its check is remembered), the run's own check of the loaded data."""
    with pytest.raises(LoadedDataError, match=re.escape(says)):
        check_loaded(_Spec((1, 4, 4)), _images(**extra))
    check_loaded(_Spec((1, 4, 4)), _images(mean=(0.5,), std=(0.2,)))


def test_the_runs_own_check_refuses_normalised_or_augmented_features():
    x, y = torch.zeros(6, 3), torch.arange(6) % 2
    for extra, says in (({"augment": True}, "set data.augment=false"),
                        ({"mean": (0.5,), "std": (0.2,)}, "leave mean and std unset")):
        with pytest.raises(LoadedDataError, match=says):
            check_loaded(_Spec((3,)), Dataset("tiny", x[:4], y[:4], x[4:], y[4:],
                                              n_classes=2, **extra))


@pytest.mark.parametrize("split", ["train_x", "train_y", "test_x"])
def test_numpy_arrays_are_refused_as_no_tensors(split):
    """A numpy float32 array is not torch's float32: the refusal said 'must be … float32
    features, got float32'."""
    x, y = torch.zeros(6, 3), torch.arange(6) % 2
    data = Dataset("tiny", x[:4], y[:4], x[4:], y[4:], n_classes=2)
    setattr(data, split, getattr(data, split).numpy())
    role = {"train_x": "training samples", "train_y": "training labels",
            "test_x": "test samples"}[split]
    with pytest.raises(LoadedDataError) as error:
        check_loaded(_Spec((3,)), data)
    assert str(error.value) == (f"the {role} of tiny are a numpy.ndarray, not a torch.Tensor: "
                                "give tensors (torch.from_numpy(array))")


@pytest.mark.parametrize(("name", "says"), [
    ("fx20-late-float64", "the training samples of fx20-late-float64: x must be uint8 "
                          "images (N, C, H, W) or float32 features (N, D), got torch.float64 "
                          "with shape (256, 8)"),
    ("fx20-late-int32-labels", "the training labels of fx20-late-int32-labels are "
                               "torch.int32, not int64: give int64 labels (N,)"),
])
def test_dtypes_past_the_doors_sizes_are_refused_at_the_runs_load_naming_the_plugin(
        tmp_path, name, says):
    """The door checked (and remembers) the tiny sizes, where the dtypes are right; the
    run's own load at its real size is checked too, before any training."""
    with guests(tmp_path / "api", name):
        plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": name}))
        with pytest.raises(GuestError) as error:
            plan.load_data()
    assert str(error.value) == (f"dataset plugin '{name}' ({ORIGIN}) loaded data creditaudit "
                                f"cannot use: {says}")
    site = site_with(tmp_path, name)
    line = error_line(cli(site, "train", *cli_args(tmp_path / "runs", **{"data.name": name}),
                          cwd=tmp_path))
    assert line == f"creditaudit: error: {error.value}", line
