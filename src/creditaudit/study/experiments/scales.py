"""Run sizes of the shipped experiments: ``smoke`` (tests), ``cpu`` (a 2-core machine) and
``paper`` (the published CIFAR-10 configuration, for users with the data and a GPU).

Every experiment builds its runs as ``base_config(scale, dataset) + overrides``, so the
same experiment at the same scale always produces the same run ids and reuses finished runs
— also runs started by ``creditaudit sweep`` with the same settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from creditaudit.config import DataConfig, ModelConfig, RunConfig, split_key
from creditaudit.data import dataset_spec
from creditaudit.data.idx import FASHION_MNIST_DIR
from creditaudit.errors import ConfigError
from creditaudit.registry import ARCHITECTURES

SCALES = ("smoke", "cpu", "paper")
# Where a dataset's files are found when no data folder is given (Debian's package).
DEFAULT_DATA_DIRS = {"fashion-mnist": FASHION_MNIST_DIR}
# Per (scale, dataset) sizes that replace the scale's: MNIST-1D generates equally many
# samples of each digit, so n_train + n_test must be a multiple of 10; the smoke scale's
# 512 + 256 is not, and its 256 evaluation samples would exceed the 200 test samples.
DATASET_OVERRIDES: dict[tuple[str, str], tuple[tuple[str, Any], ...]] = {
    ("smoke", "mnist1d"): (("data.n_train", 600), ("data.n_test", 200),
                           ("diagnostics.eval_samples", 200)),
}


@dataclass(frozen=True)
class Scale:
    """What one scale means: epochs (main / control runs), seeds and the default dataset."""

    name: str
    epochs: int
    control_epochs: int
    seeds: tuple[int, ...]
    dataset: str
    overrides: tuple[tuple[str, Any], ...]


SCALE_TABLE: dict[str, Scale] = {
    "smoke": Scale(
        "smoke", epochs=2, control_epochs=2, seeds=(42, 123), dataset="synthetic",
        overrides=(("data.n_train", 512), ("data.n_test", 256), ("data.in_dim", 16),
                   ("model.d", 16), ("model.n_blocks", 2), ("optim.batch_size", 64),
                   ("diagnostics.eval_samples", 256), ("diagnostics.rho_samples", 64),
                   ("diagnostics.rho_directions", 4), ("diagnostics.null_draws", 3),
                   ("run.progress", False))),
    # 20 epochs on 20k training samples: one run takes about a minute per core, so a
    # 3-seed method × architecture grid fits in tens of minutes on two cores.
    "cpu": Scale(
        "cpu", epochs=20, control_epochs=20, seeds=(42, 123, 456), dataset="fashion-mnist",
        overrides=(("data.n_train", 20000), ("data.train_subset", 20000),
                   ("run.progress", False))),
    "paper": Scale(
        "paper", epochs=100, control_epochs=30, seeds=(42, 123, 456), dataset="cifar10",
        overrides=()),
}


def get_scale(name: str) -> Scale:
    if name not in SCALE_TABLE:
        raise ConfigError(f"scale {name!r} is not one of {', '.join(SCALES)}")
    return SCALE_TABLE[name]


def base_config(scale: str, *, dataset: str | None = None, data_dir: str | None = None,
                out_dir: str = "results", control: bool = False,
                arch: str | None = None) -> RunConfig:
    """The starting config of every run of an experiment at ``scale``.

    ``dataset`` defaults to the scale's (synthetic for smoke, Fashion-MNIST for cpu,
    CIFAR-10 for paper); ``data_dir`` defaults to /usr/share/datasets/fashion-mnist for
    Fashion-MNIST and is ignored for the generated datasets (synthetic, mnist1d), which keep
    the scale's sample counts. ``control=True`` uses the shorter epoch count of penalty and control
    runs (science.md §4: 30 epochs at paper scale). ``arch``: the architecture (default:
    the config's), which gets the scale's model sizes it takes — StudentNet, whose size is
    its task's, none — so no option is handed to a model that does not read it.
    """
    spec = get_scale(scale)
    dataset = dataset or spec.dataset
    data = dataset_spec(dataset)
    overrides: dict[str, Any] = {"data.name": dataset}
    model = ARCHITECTURES.get(arch if arch is not None else ModelConfig().arch)
    if model.name != ModelConfig().arch:
        overrides["model.arch"] = model.name
    reads = {"data": {*data.option_names(), *(f.name for f in dataclasses.fields(DataConfig))},
             "model": {*model.option_names(), *(f.name for f in dataclasses.fields(ModelConfig))}}
    for key, value in spec.overrides:
        section, name = split_key(key)
        # The scale's sizes apply where the dataset and the model read them: generated data
        # get n_train, n_test and in_dim, file datasets the training subset; models their
        # width and depth.
        if section not in reads or name in reads[section]:
            overrides[key] = value
    if data.kind == "generated":
        overrides.pop("data.train_subset", None)
    else:
        overrides["data.data_dir"] = (data_dir if data_dir is not None
                                      else DEFAULT_DATA_DIRS.get(dataset))
    overrides.update(DATASET_OVERRIDES.get((scale, dataset), ()))
    overrides["optim.epochs"] = spec.control_epochs if control else spec.epochs
    overrides["run.out_dir"] = out_dir
    return RunConfig().replace(**overrides)
