"""MNIST-1D: generation, seeding, the on-disk cache and training on it."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.config import DataConfig, RunConfig
from creditaudit.data import load_dataset, make_teacher_student
from creditaudit.data import mnist1d as m1d
from creditaudit.errors import ConfigError, DataError
from creditaudit.run.plan import plan_run

N_TRAIN, N_TEST = 600, 200


def data_config(**overrides):
    base = {"data.name": "mnist1d", "data.n_train": N_TRAIN, "data.n_test": N_TEST}
    return RunConfig().replace(**{**base, **overrides}).data


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty cache folder for this test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(m1d.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def generator_calls(monkeypatch) -> list[dict]:
    """Counts calls of the (real) generator: one entry of its arguments per call."""
    calls: list[dict] = []
    real = m1d.generate_mnist1d

    def counting(args):
        calls.append(args)
        return real(args)

    monkeypatch.setattr(m1d, "generate_mnist1d", counting)
    return calls


@pytest.fixture(scope="module")
def seed42():
    """Arrays generated once for seed 42 (generation is the slow part)."""
    return m1d.generate_mnist1d(m1d.mnist1d_generator_args(data_config(), 42))


def test_shapes_dtypes_and_balanced_labels(seed42):
    train_x, train_y, test_x, test_y = seed42
    assert train_x.shape == (N_TRAIN, 40) and test_x.shape == (N_TEST, 40)
    assert train_x.dtype == test_x.dtype == np.float32
    assert train_y.shape == (N_TRAIN,) and test_y.shape == (N_TEST,)
    assert train_y.dtype == test_y.dtype == np.int64
    labels = np.concatenate([train_y, test_y])
    # Generated with (N_TRAIN + N_TEST) / 10 samples of every digit, then shuffled.
    np.testing.assert_array_equal(np.bincount(labels, minlength=10),
                                  [(N_TRAIN + N_TEST) // 10] * 10)
    assert labels.min() == 0 and labels.max() == 9
    # The generator standardises the whole set (train + test) to mean 0, std 1.
    x = np.concatenate([train_x, test_x]).astype(np.float64)
    assert abs(x.mean()) < 1e-5 and abs(x.std() - 1.0) < 1e-5
    assert np.isfinite(x).all()


def test_same_seed_same_arrays_and_other_seed_different(seed42):
    args = m1d.mnist1d_generator_args(data_config(), 42)
    for a, b in zip(seed42, m1d.generate_mnist1d(args)):
        np.testing.assert_array_equal(a, b)
    other = m1d.generate_mnist1d(m1d.mnist1d_generator_args(data_config(), 43))
    assert not np.array_equal(seed42[0], other[0])
    assert not np.array_equal(seed42[1], other[1])


def test_generator_args_are_the_package_defaults_with_sizes_and_seed():
    from mnist1d.data import get_dataset_args

    args = m1d.mnist1d_generator_args(data_config(), 7)
    defaults = get_dataset_args(as_dict=True)
    assert args["num_samples"] == N_TRAIN + N_TEST
    assert args["train_split"] == N_TRAIN / (N_TRAIN + N_TEST)
    assert args["seed"] == 7
    assert "url" not in args
    changed = {"num_samples", "train_split", "seed"}
    assert {k: v for k, v in args.items() if k not in changed} == {
        k: v for k, v in defaults.items() if k not in changed | {"url"}}


def test_package_defaults_are_cached_signed_and_asked_again_when_the_generator_changes(
        cache, monkeypatch):
    """Reading the defaults costs an import of scipy.interpolate and matplotlib, so they are
    cached; a cache entry edited without the key, or one written for another version or
    another data.py, is not believed."""
    from mnist1d.data import get_dataset_args

    truth = {k: v for k, v in get_dataset_args(as_dict=True).items() if k != "url"}
    assert m1d.package_defaults() == truth
    stored = (cache / m1d.DEFAULTS_CACHE)
    entry = json.loads(stored.read_text())
    assert entry["args"] == truth and entry["signature"]

    # A cached value is what a later process reads ...
    entry["args"]["template_len"] = 99  # ... but not one edited without the key
    stored.write_text(json.dumps(entry))
    assert m1d.package_defaults() == truth

    # another generator source (an upgrade, an edit) is asked again
    monkeypatch.setattr(m1d, "_generator_source", lambda: "0" * 64)
    asked = []
    real = get_dataset_args
    monkeypatch.setattr("mnist1d.data.get_dataset_args",
                        lambda **kw: asked.append(kw) or real(**kw))
    assert m1d.package_defaults() == truth and asked
    asked.clear()
    assert m1d.package_defaults() == truth and not asked  # now cached under the new key


def test_planning_an_mnist1d_run_imports_neither_the_generator_nor_the_compiler(cache):
    """A run plan reads the generator's defaults from the cache and sizes the model on the
    meta device without PyTorch's compiler: a fresh process plans in milliseconds, not the
    2–4 s those imports cost (in the parent and in every worker of a sweep)."""
    import subprocess
    import sys

    plan = ("import sys\n"
            "from creditaudit.config import RunConfig\n"
            "from creditaudit.run.plan import plan_run\n"
            f"c = RunConfig().replace(**{{'data.name': 'mnist1d', 'data.n_train': {N_TRAIN}, "
            f"'data.n_test': {N_TEST}}})\n"
            "print(plan_run(c).run_id)\n"
            "print(sorted(m for m in ('mnist1d.data', 'torch._dynamo', 'matplotlib.pyplot') "
            "if m in sys.modules))\n")
    first = subprocess.run([sys.executable, "-c", plan], capture_output=True, text=True,
                           check=True)
    second = subprocess.run([sys.executable, "-c", plan], capture_output=True, text=True,
                            check=True)
    run_id = first.stdout.splitlines()[0]
    assert second.stdout.splitlines() == [run_id, "[]"], second.stderr
    assert run_id == plan_run(RunConfig().replace(**{
        "data.name": "mnist1d", "data.n_train": N_TRAIN, "data.n_test": N_TEST})).run_id


def test_split_is_exact_where_the_package_would_truncate():
    # int(50 · (29 / 50)) == 28 in floating point: the package alone would put 28 in train.
    assert int(50 * (29 / 50)) == 28
    config = RunConfig().replace(**{"data.name": "mnist1d", "data.n_train": 29,
                                    "data.n_test": 21}).data
    train_x, train_y, test_x, test_y = m1d.generate_mnist1d(
        m1d.mnist1d_generator_args(config, 0))
    assert train_x.shape == (29, 40) and train_y.shape == (29,)
    assert test_x.shape == (21, 40) and test_y.shape == (21,)


def test_generation_leaves_global_rngs_untouched():
    np.random.seed(123)
    random.seed(7)
    np_before, py_before = np.random.get_state(), random.getstate()
    small = data_config(**{"data.n_train": 40, "data.n_test": 10})
    m1d.generate_mnist1d(m1d.mnist1d_generator_args(small, 5))
    np_after, py_after = np.random.get_state(), random.getstate()
    assert py_after == py_before
    assert np_after[0] == np_before[0]
    np.testing.assert_array_equal(np_after[1], np_before[1])
    assert np_after[2:] == np_before[2:]


def test_cache_hit_returns_identical_arrays_without_regenerating(cache, generator_calls):
    config = data_config()
    assert not m1d.is_cached(config, 42)
    first = load_dataset(config, seed=42)
    assert len(generator_calls) == 1
    assert m1d.is_cached(config, 42) and not m1d.is_cached(config, 43)
    files = list(cache.glob("mnist1d-*.npz"))
    assert len(files) == 1
    # Beside it: its signed digest, the cache's key and the generator's signed defaults; no
    # temp file left behind.
    assert sorted(p.name for p in cache.iterdir() if p not in files) == sorted([
        "cache.key", m1d.DEFAULTS_CACHE, m1d.digest_path(files[0]).name])
    second = load_dataset(config, seed=42)
    assert len(generator_calls) == 1
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, name), getattr(second, name))
    # Another seed is another file.
    load_dataset(config, seed=43)
    assert len(generator_calls) == 2 and len(list(cache.glob("mnist1d-*.npz"))) == 2


def test_cached_arrays_equal_freshly_generated(cache, seed42):
    dataset = load_dataset(data_config(), seed=42)  # generates and caches
    dataset = load_dataset(data_config(), seed=42)  # reads the cache
    for tensor, array in zip((dataset.train_x, dataset.train_y, dataset.test_x,
                              dataset.test_y), seed42):
        np.testing.assert_array_equal(tensor.numpy(), array)


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "half", "wrong-shape",
                                    "one-array"])
def test_corrupt_cache_file_is_regenerated(cache, generator_calls, caplog, damage):
    config = data_config()
    original = load_dataset(config, seed=42)
    (path,) = cache.glob("mnist1d-*.npz")
    good = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not an npz file at all" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(good[:-100])
    elif damage == "half":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "one-array":  # a .npy file: np.load returns the array, not an archive
        with path.open("wb") as f:
            np.save(f, np.zeros((3, 40), np.float32))
    else:
        np.savez(path, train_x=np.zeros((3, 40), np.float32), train_y=np.zeros(3, np.int64),
                 test_x=np.zeros((1, 40), np.float32), test_y=np.zeros(1, np.int64))
    with caplog.at_level(logging.WARNING, logger="creditaudit.data.mnist1d"):
        again = load_dataset(config, seed=42)
    assert len(generator_calls) == 2
    assert "generating the data again" in caplog.text
    assert torch.equal(again.train_x, original.train_x)
    assert torch.equal(again.test_y, original.test_y)
    assert path.read_bytes() == good  # rewritten whole


def test_unwritable_cache_folder_means_no_cache(tmp_path, monkeypatch, generator_calls, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(m1d.CACHE_ENV, str(blocker / "cache"))  # cannot mkdir under a file
    with caplog.at_level(logging.WARNING, logger="creditaudit.data.mnist1d"):
        first = load_dataset(data_config(), seed=42)
        second = load_dataset(data_config(), seed=42)
    assert "could not cache MNIST-1D" in caplog.text
    assert len(generator_calls) == 2
    assert torch.equal(first.train_x, second.train_x)


def test_cache_folder_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv(m1d.CACHE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert m1d.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(m1d.CACHE_ENV)
    assert m1d.cache_dir() == tmp_path / "xdg" / "creditaudit"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid per the XDG spec
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert m1d.cache_dir() == tmp_path / "home" / ".cache" / "creditaudit"


def test_cache_key_depends_on_every_argument_and_the_package_version(cache, monkeypatch):
    args = m1d.mnist1d_generator_args(data_config(), 42)
    path = m1d.cache_path(args, "0.0.2.post1")
    assert m1d.cache_path(dict(args), "0.0.2.post1") == path
    assert m1d.cache_path(args, "0.0.3") != path
    for key, value in (("seed", 1), ("iid_noise_scale", 0.03), ("shuffle_seq", True),
                       ("padding", [36, 61])):
        assert m1d.cache_path({**args, key: value}, "0.0.2.post1") != path


def test_data_seed_seeds_generated_datasets_and_defaults_to_the_run_seed(cache):
    by_run_seed = load_dataset(data_config(), seed=7)
    by_data_seed = load_dataset(data_config(**{"data.data_seed": 7}), seed=42)
    assert torch.equal(by_run_seed.train_x, by_data_seed.train_x)
    assert by_data_seed.provenance["args"]["seed"] == 7
    # Synthetic: the default (None) keeps the run-seed behaviour; data_seed overrides it.
    synth = {"data.n_train": 64, "data.n_test": 32, "data.in_dim": 8}
    default = load_dataset(RunConfig().replace(**synth).data, seed=42)
    expected = make_teacher_student(n_train=64, n_test=32, in_dim=8, alpha=1.0, seed=42)
    assert torch.equal(default.train_x, expected[0]) and torch.equal(default.train_y,
                                                                     expected[1])
    seeded = load_dataset(RunConfig().replace(**synth, **{"data.data_seed": 3}).data, seed=42)
    assert torch.equal(seeded.train_x, make_teacher_student(
        n_train=64, n_test=32, in_dim=8, alpha=1.0, seed=3)[0])


def test_provenance_regenerates_the_same_data(cache):
    dataset = load_dataset(data_config(), seed=42)
    prov = dataset.provenance
    assert prov["generator"] == "mnist1d.data.make_dataset"
    assert prov["version"] == m1d.package_version()
    assert prov["args"] == m1d.mnist1d_generator_args(data_config(), 42)
    regenerated = m1d.generate_mnist1d(prov["args"])
    np.testing.assert_array_equal(regenerated[0], dataset.train_x.numpy())
    synth = load_dataset(RunConfig().replace(**{"data.n_train": 64, "data.n_test": 32,
                                                 "data.in_dim": 8}).data, seed=5)
    again = make_teacher_student(**synth.provenance["args"])
    assert torch.equal(again[0], synth.train_x) and torch.equal(again[3], synth.test_y)


def test_config_rules_for_mnist1d():
    config = RunConfig().replace(**{"data.name": "mnist1d"})  # reads no data_dir
    assert "data_dir" not in config.to_dict()["data"]
    with pytest.raises(ConfigError, match="data.data_dir is not read by mnist1d"):
        config.replace(**{"data.data_dir": "/somewhere"})
    with pytest.raises(ConfigError, match="multiple of 10"):  # the dataset's own rule
        plan_run(RunConfig().replace(**{"data.name": "mnist1d", "data.n_train": 512,
                                        "data.n_test": 256}))
    with pytest.raises(ConfigError, match="data.augment is not read by mnist1d"):
        RunConfig().replace(**{"data.name": "mnist1d", "data.augment": True})
    with pytest.raises(DataError, match="multiple of 10"):
        m1d.mnist1d_generator_args(DataConfig(n_train=5, n_test=3), 0)


def test_smoke_scale_on_mnist1d_is_a_valid_config():
    from creditaudit.study.experiments.scales import base_config

    config = base_config("smoke", dataset="mnist1d", data_dir="ignored")
    assert config.data.name == "mnist1d" and "data_dir" not in config.to_dict()["data"]
    assert (config.data.n_train + config.data.n_test) % 10 == 0


def test_tiny_training_run_on_mnist1d(tmp_path, single_thread):
    from creditaudit.records import load_record
    from creditaudit.run.plan import run_id
    from creditaudit.run.trainer import train

    config = RunConfig().replace(**{
        "data.name": "mnist1d", "data.n_train": N_TRAIN, "data.n_test": N_TEST,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 3, "optim.batch_size": 32,
        "optim.lr": 1e-2, "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(tmp_path)})
    result = train(config)
    assert result.status == "completed"
    record = load_record(result.run_dir)
    assert record.dataset == "mnist1d"
    assert run_id(config).startswith("bp-resmlp-mnist1d-s42-")
    assert record.data.provenance["generator"] == "mnist1d.data.make_dataset"
    assert record.data.provenance["args"]["seed"] == 42
    log = record.to_dict()["log"]
    assert [e["epoch"] for e in log] == [0, 1, 2, 3]
    # Three epochs of BP on 600 samples learn something (chance is 0.1; measured 0.36 / 0.25).
    assert log[-1]["train_acc"] > 0.25 and log[-1]["acc_eval"] > 0.15
    assert all(np.isfinite(e["h_L_norm"]) for e in log)


def test_a_run_seed_past_32_bits_is_refused_before_generating_unless_data_seed_is_set(
        cache, generator_calls):
    """Seeds may be 0 … 2⁶³−1, but mnist1d's numpy generator takes 32-bit seeds: the data
    seed (by default the run seed) is refused in one line, before anything is generated;
    an explicit data.data_seed runs, and seeds that fit keep their data."""
    big = 2**32
    config = RunConfig().replace(**{"data.name": "mnist1d", "data.n_train": N_TRAIN,
                                    "data.n_test": N_TEST, "run.seed": big})
    with pytest.raises(ConfigError) as error:
        plan_run(config)
    message = str(error.value)
    assert "\n" not in message and "32-bit seed" in message
    assert "RunConfig.replace(**{'data.data_seed': 0})" in message and f"run.seed={big}" in message
    with pytest.raises(ConfigError, match="32-bit seed"):
        load_dataset(config.data, seed=big)
    assert generator_calls == []
    assert plan_run(config.replace(**{"data.data_seed": 0})).data_seed == 0
    largest = 2**32 - 1  # the largest seed that fits is still the run seed
    assert load_dataset(data_config(), seed=largest).provenance["args"]["seed"] == largest
