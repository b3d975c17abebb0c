"""The augmentation of file datasets takes its crop padding and its flip from the config
(``data.augment_padding``, ``data.augment_flip``): padding 2 jitters by at most ±2 pixels,
flip off never flips yet draws what a flipping loader draws, and the defaults give the
batches and run ids of every config written before the options existed. A padding or flip
no augmentation reads is refused in one line; the record says what the loaded data did.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import config_from_dict
from creditaudit.data import Dataset, check_loaded, dataset_spec, load_dataset
from creditaudit.data.loader import InMemoryLoader
from creditaudit.errors import ConfigError, LoadedDataError
from creditaudit.records import load_record
from creditaudit.run.plan import plan_run, run_id
from creditaudit.run.trainer import train
from integrity_support import write_idx_dataset

FASHION = "/usr/share/datasets/fashion-mnist"
needs_fashion = pytest.mark.skipif(not Path(FASHION).exists(),
                                   reason="Fashion-MNIST is not installed here")


def images(n: int = 64, side: int = 8, seed: int = 0) -> torch.Tensor:
    """(n, 2, side, side) uint8 images with no zero pixel: a zero in a crop is padding."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (n, 2, side, side), dtype=torch.uint8, generator=gen)


def shifted(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``x`` (C, H, W) moved by (dy, dx) pixels (down, right), zeros where it left."""
    out = torch.zeros_like(x)
    h, w = x.shape[-2:]
    out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        x[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def epochs(loader: InMemoryLoader, n: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [batch for _ in range(n) for batch in loader]


def loader(x: torch.Tensor, *, seed: int = 3, per_epoch: bool = False, shuffle: bool = False,
           **kwargs: object) -> InMemoryLoader:
    return InMemoryLoader(x, torch.arange(x.shape[0]) % 10, 16, shuffle=shuffle,
                          generator=torch.Generator().manual_seed(seed), augment=True,
                          draw_per_epoch=per_epoch, **kwargs)


# --- the loader ---------------------------------------------------------------------------
@pytest.mark.parametrize("per_epoch", [False, True])
def test_padding_2_crops_are_the_image_shifted_by_at_most_2_pixels(per_epoch):
    x = images()
    seen = set()
    for i, (xb, _) in enumerate(epochs(loader(x, crop_padding=2, flip=False,
                                              per_epoch=per_epoch), 4)):
        xb = (xb * 255).round().to(torch.uint8).view(-1, *x.shape[1:])
        for j, crop in enumerate(xb):
            source = x[(i * 16 + j) % x.shape[0]]
            shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                      if torch.equal(crop, shifted(source, dy, dx))]
            assert len(shifts) == 1, f"batch {i} sample {j} is no ±2 px shift of its image"
            seen.add(shifts[0])
    assert len(seen) == 25  # every offset in [−2, 2]², the extremes included


@pytest.mark.parametrize("per_epoch", [False, True])
def test_flip_off_never_flips(per_epoch):
    """Padding 0 and no flip: every augmented batch is its images as they are."""
    x = images()
    batches = epochs(loader(x, crop_padding=0, flip=False, per_epoch=per_epoch), 3)
    plain = torch.cat([x] * 3).to(torch.float32).div(255)
    assert torch.equal(torch.cat([xb for xb, _ in batches]), plain)
    # the same loader flipping does flip (so the comparison above can fail)
    flipping = epochs(loader(x, crop_padding=0, per_epoch=per_epoch), 3)
    assert not torch.equal(torch.cat([xb for xb, _ in flipping]), plain)


@pytest.mark.parametrize("per_epoch", [False, True])
@pytest.mark.parametrize("padding", [0, 2, 4])
def test_flip_off_draws_what_flip_on_draws(per_epoch, padding):
    """The flips are drawn and ignored: the same permutations, crops and random targets as
    the flipping loader, each sample either equal to its batch-mate there or its mirror."""
    x = images()

    def run(flip: bool) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        source = loader(x, crop_padding=padding, flip=flip, per_epoch=per_epoch, shuffle=True,
                        random_targets=10)
        return epochs(source, 3), source.generator.get_state()

    (on, state_on), (off, state_off) = run(True), run(False)
    mirrored = 0
    for (x_on, y_on), (x_off, y_off) in zip(on, off, strict=True):
        assert torch.equal(y_on, y_off)
        same = (x_on == x_off).flatten(1).all(1)
        mirror = (x_on.flip(-1) == x_off).flatten(1).all(1)
        assert bool((same | mirror).all())
        mirrored += int((mirror & ~same).sum())
    assert mirrored > 0
    assert torch.equal(state_on, state_off)


def test_per_epoch_draws_give_the_per_batch_batches_with_new_options():
    x = images()
    kwargs = {"crop_padding": 1, "flip": False, "shuffle": True, "random_targets": 10}
    a = epochs(loader(x, per_epoch=False, **kwargs))
    b = epochs(loader(x, per_epoch=True, **kwargs))
    assert all(torch.equal(p, q) and torch.equal(s, t) for (p, s), (q, t) in zip(a, b))


# sha256 of two epochs of augmented batches (per-batch, then per-epoch draws; shuffled,
# random targets) computed with the code before the options existed (b0873bc).
BEFORE = "9fe541d494d2360b380fc91e9ed7ca673e528bea2f0dcfdf31c9025d79f86d2f"


def default_batches_digest(**kwargs: object) -> str:
    x = torch.randint(0, 256, (50, 3, 8, 8), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    y = torch.arange(50) % 10
    h = hashlib.sha256()
    for per_epoch in (False, True):
        source = InMemoryLoader(x, y, 16, shuffle=True, generator=torch.Generator().manual_seed(5),
                                augment=True, random_targets=10, draw_per_epoch=per_epoch,
                                **kwargs)
        for xb, yb in epochs(source):
            h.update(xb.numpy().tobytes())
            h.update(yb.numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("kwargs", [{}, {"crop_padding": 4, "flip": True}])
def test_default_augmentation_gives_the_batches_of_before(kwargs):
    assert default_batches_digest(**kwargs) == BEFORE


def test_other_padding_or_flip_gives_other_batches():
    assert default_batches_digest(crop_padding=2) != BEFORE
    assert default_batches_digest(flip=False) != BEFORE


@pytest.mark.parametrize("padding", [-1, 1.5, True])
def test_loader_refuses_a_padding_that_is_no_pixel_count(padding):
    with pytest.raises(ValueError, match="crop_padding must be an integer >= 0"):
        loader(images(), crop_padding=padding)


# --- the options, from the config to the loader --------------------------------------------
def idx_data(tmp_path: Path, **data: object) -> dict[str, object]:
    folder = write_idx_dataset(tmp_path / "idx", n_train=64, n_test=32)
    return {"data": {"name": "mnist", "data_dir": str(folder), **data}}


def test_file_datasets_hand_the_options_to_the_train_loader(tmp_path):
    config = config_from_dict(idx_data(tmp_path, augment=True, augment_padding=2,
                                       augment_flip=False))
    data = load_dataset(config.data, seed=0)
    train_loader = data.loader("train", 16, flatten=False, shuffle=True,
                               generator=torch.Generator())
    assert (train_loader.augment, train_loader.crop_padding, train_loader.flip) == (True, 2, False)
    assert not data.loader("test", 16, flatten=False).augment
    default = load_dataset(config_from_dict(idx_data(tmp_path, augment=True)).data, seed=0)
    assert (default.augment_padding, default.augment_flip) == (4, True)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10", "cifar100"])
def test_every_built_in_file_dataset_reads_both_options(name):
    assert {"augment_padding", "augment_flip"} <= set(dataset_spec(name).option_names())


@pytest.mark.parametrize("data,match", [
    ({"augment_padding": 2},
     "data.augment_padding=2 is read only when training images are augmented, and mnist is "
     "not augmented by default: set data.augment=true, or drop data.augment_padding"),
    ({"augment": False, "augment_flip": False},
     "data.augment_flip=false is read only when training images are augmented, and "
     "data.augment=false: set data.augment=true, or drop data.augment_flip"),
    ({"augment_padding": 1, "augment_flip": False}, "data.augment_padding=1 and "
     "data.augment_flip=false are read only when"),
    ({"augment": True, "augment_padding": 28},
     "data.augment_padding=28 is as wide as the 28-pixel side of mnist's images, so a crop "
     "could hold padding only; use at most 27"),
])
def test_settings_nothing_reads_or_that_mislead_are_refused_in_one_line(tmp_path, data, match):
    with pytest.raises(ConfigError) as err:
        plan_run(config_from_dict(idx_data(tmp_path, **data)))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(match)


def test_default_values_need_no_augmentation(tmp_path):
    """A config that lists the defaults (a record, a printed config) plans with augmentation
    off: only a value that would change something is refused."""
    plan_run(config_from_dict(idx_data(tmp_path, augment=False, augment_padding=4,
                                       augment_flip=True)))
    plan_run(config_from_dict(idx_data(tmp_path, augment=True, augment_padding=27,
                                       augment_flip=False)))


@pytest.mark.parametrize("dataset,match", [
    (dict(augment=True, augment_padding=-2), "crop padding of -2"),
    (dict(augment=True, augment_padding=2.0), "crop padding of 2.0"),
    (dict(augment=True, augment_flip="yes"), "flip='yes'"),
    (dict(augment=True, augment_padding=28), "crop padding of 28 pixels, as wide as their "
                                             "28-pixel side, so a crop could hold padding "
                                             "only: use at most 27"),
])
def test_a_loaded_dataset_whose_augmentation_cannot_apply_is_refused(dataset, match):
    spec = dataset_spec("mnist")()
    x = torch.zeros(4, 1, 28, 28, dtype=torch.uint8)
    y = torch.arange(4) % 2  # two classes: a training split of one is refused first
    stats = {"mean": spec.mean, "std": spec.std}  # images are normalised by these
    with pytest.raises(LoadedDataError, match=match):
        check_loaded(spec, Dataset("mnist", x, y, x, y, n_classes=10, **stats, **dataset))
    check_loaded(spec, Dataset("mnist", x, y, x, y, n_classes=10, **stats,
                               augment_padding=-2))  # off


# --- run ids: those of before, computed with b0873bc's code ---------------------------------
PINNED = [
    ({}, "bp-resmlp-fashion-mnist-s42-7afdcdc8d6"),
    ({"augment": True}, "bp-resmlp-fashion-mnist-s42-52fca7603e"),
    ({"augment": False}, "bp-resmlp-fashion-mnist-s42-83d49955a5"),
]


@needs_fashion
@pytest.mark.parametrize("data,pinned", PINNED, ids=["default", "on", "off"])
def test_run_ids_of_before_do_not_move(data, pinned):
    config = config_from_dict({"data": {"name": "fashion-mnist", "data_dir": FASHION, **data}})
    assert run_id(config) == pinned
    # the config as a record lists it now (every option, the new two at their defaults)
    listed = json.loads(json.dumps(config.to_dict()))
    assert listed["data"]["augment_padding"] == 4 and listed["data"]["augment_flip"] is True
    assert run_id(config_from_dict(listed)) == pinned
    # and as a record of before lists it (without them)
    before = {k: v for k, v in listed["data"].items() if not k.startswith("augment_")}
    assert run_id(config_from_dict({**listed, "data": before}, strict=False)) == pinned


@needs_fashion
def test_a_padding_or_flip_that_changes_the_batches_changes_the_run_id():
    def of(**data: object) -> str:
        return run_id(config_from_dict({"data": {"name": "fashion-mnist", "data_dir": FASHION,
                                                 "augment": True, **data}}))

    ids = {of(), of(augment_padding=2), of(augment_flip=False),
           of(augment_padding=2, augment_flip=False)}
    assert len(ids) == 4
    assert of(augment_padding=4, augment_flip=True) == of()


# --- the record and the command line --------------------------------------------------------
TINY = {"model": {"d": 16, "n_blocks": 2}, "optim": {"epochs": 1, "batch_size": 32},
        "diagnostics": {"eval_samples": 32, "end_of_run": False},
        "run": {"progress": False}}


@pytest.mark.parametrize("data,said", [
    ({"augment": True, "augment_padding": 2, "augment_flip": False},
     {"crop_padding": 2, "flip": False}),
    ({"augment": True}, {"crop_padding": 4, "flip": True}),
    ({}, None),
])
def test_the_record_says_how_training_images_were_augmented(tmp_path, data, said):
    raw = {**idx_data(tmp_path, **data), **TINY}
    raw["run"] = {**TINY["run"], "out_dir": str(tmp_path / "runs")}
    result = train(config_from_dict(raw))
    record = load_record(result.run_dir)
    assert record.data.provenance["augmentation"] == said
    assert record.config.data.augment_padding == data.get("augment_padding", 4)
    assert record.config.data.augment_flip == data.get("augment_flip", True)


def cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``creditaudit ARGV``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_sets_the_padding_and_refuses_bad_values_in_one_line(tmp_path):
    folder = write_idx_dataset(tmp_path / "idx", n_train=64, n_test=32)
    base = ["train", "--dataset", "mnist", "--data-dir", str(folder), "--set",
            "data.augment=true"]
    code, out, err = cli([*base, "--set", "data.augment_padding=2", "--print-config"])
    assert code == 0, err
    assert "augment_padding = 2" in out
    for cause, message in [
            ("data.augment_padding=-1", "data.augment_padding=-1 is out of range; it must be "
                                        ">= 0"),
            ("data.augment_padding=two", "data.augment_padding must be an integer, got 'two'"),
            ("data.augment_flip=2", "data.augment_flip must be true or false, got 2")]:
        code, _, err = cli([*base, "--set", cause, "--print-config"])
        assert code == 2
        assert err.strip().splitlines() == [f"creditaudit: error: {message}"]
    # a padding without augmentation is refused where the run is planned, before training
    code, _, err = cli(["train", "--dataset", "mnist", "--data-dir", str(folder), "--set",
                        "data.augment_padding=2", "--out", str(tmp_path / "runs")])
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(
        "creditaudit: error: data.augment_padding=2 is read only when training images are "
        "augmented")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
