"""How the shipped experiments build their runs: a scale's base config plus a few overrides.

Every experiment builds its runs as ``scales.base_config(scale, dataset) + overrides``, so the
same settings always give the same run ids, shared between experiments and with
``creditaudit sweep``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from creditaudit.config import ModelConfig, RunConfig
from creditaudit.data import dataset_spec
from creditaudit.errors import ConfigError
from creditaudit.models.images import FLAT_IMAGE
from creditaudit.models.images import SYNTHETIC_IMAGE_DIM as FLAT_IMAGE_DIM
from creditaudit.registry import ARCHITECTURES, RULES
from creditaudit.study.experiments.options import chosen
from creditaudit.study.experiments.scales import base_config, get_scale

# The methods of the audit table (method, penalty λ), the frozen baseline last; --rules
# replaces all but the baseline, each at λ = 0.
AUDIT_METHODS: tuple[tuple[str, float], ...] = (
    ("bp", 0.0), ("fa", 0.0), ("dfa", 0.0), ("dfa", 1e-2), ("state-bridge", 0.0),
    ("credit-bridge", 0.0), ("ep", 0.0), ("frozen", 0.0))
# The alternative rules the decision-utility count runs over ("x/5").
DECISION_RULES = ("fa", "dfa", "ep", "state-bridge", "credit-bridge")


def scale_dataset(scale: str, dataset: str | None) -> str:
    return dataset or get_scale(scale).dataset


_CONFIG_CACHE: dict[tuple[Any, ...], RunConfig] = {}


def scale_config(scale: str, *, dataset: str | None, data_dir: str | None, out_dir: str,
                 control: bool = False, arch: str | None = None,
                 **overrides: Any) -> RunConfig:
    """``base_config(scale, …)`` with dotted ``overrides`` given as ``section__key=value``.

    Memoised (config validation is the slow part of building an experiment's runs, and the
    experiments share most of theirs); every call returns a fresh copy.
    """
    key = (scale, dataset, data_dir, str(out_dir), control, arch,
           tuple(sorted(overrides.items())))
    if key not in _CONFIG_CACHE:
        config = base_config(scale, dataset=dataset, data_dir=data_dir, out_dir=str(out_dir),
                             control=control, arch=arch)
        if overrides:
            config = config.replace(**{k.replace("__", "."): value
                                       for k, value in overrides.items()})
        _CONFIG_CACHE[key] = config
    return copy.deepcopy(_CONFIG_CACHE[key])


def method_overrides(method: str, penalty: float = 0.0) -> dict[str, Any]:
    out: dict[str, Any] = {"method__name": method}
    if penalty:
        out["method__penalty"] = float(penalty)
    return out


# The architecture variants of the cross-architecture experiments (their default lists):
# a registered architecture's name, or NAME-noLN for it without its terminal LayerNorm.
ARCH_VARIANTS = ("resmlp", "resmlp-noLN", "student", "vit", "convmixer")
NO_LN = "-noLN"
# The image architectures' sizes per scale (the scale's own n_blocks L is kept); ``grid``
# g sets the patch to side/g, i.e. g×g patches whatever the image side (28 or 32). Paper:
# ViT-Mini and ConvMixer alike at d=128, patch 4 (64 tokens + CLS / 8×8 maps on CIFAR).
# cpu (Fashion-MNIST 1×28×28; docs/benchmarks.md has the timings behind the choice): both
# d=64 on the same 4×4 grid of 7×7 patches (ViT: 16 tokens + CLS; ConvMixer: 4×4 maps, 3×3
# depthwise kernel). smoke: the scale's d=16 with 4×4 patches. Another image architecture
# keeps its own sizes, on the same grid at smoke and cpu scale when it has a patch size.
IMAGE_SIZES: dict[tuple[str, str], dict[str, Any]] = {
    ("vit", "smoke"): {"grid": 4},
    ("vit", "cpu"): {"model__d": 64, "grid": 4},
    ("vit", "paper"): {"model__d": 128},
    ("convmixer", "smoke"): {"grid": 4, "model__kernel": 3},
    ("convmixer", "cpu"): {"model__d": 64, "grid": 4, "model__kernel": 3},
    ("convmixer", "paper"): {"model__d": 128},
}
DEFAULT_GRID = {"smoke": 4, "cpu": 4}


def arch_of(variant: str) -> tuple[type, bool]:
    """(the architecture class, whether its terminal LayerNorm is left out) of ``variant``;
    ConfigError (one line) when the architecture is not installed or has no LayerNorm to
    leave out."""
    name, no_ln = (variant[:-len(NO_LN)], True) if variant.endswith(NO_LN) else (variant, False)
    try:
        arch = ARCHITECTURES.get(name)
    except ConfigError as err:
        raise ConfigError(f"{chosen('arch', [variant])}: {err}") from None
    if no_ln and "out_ln" not in arch.option_names():
        raise ConfigError(f"{chosen('arch', [variant])}: {name} has no terminal LayerNorm to "
                          f"leave out (no model.out_ln option); use {chosen('arch', [name])}")
    return arch, no_ln


def arch_config(variant: str, scale: str, *, dataset: str | None, data_dir: str | None,
                out_dir: str, control: bool = False, **overrides: Any) -> RunConfig:
    """A run of one architecture variant (:func:`arch_of`) at ``scale``.

    ``resmlp``: the scale's ResidualMLP with terminal LN; ``NAME-noLN``: an architecture
    without it; ``student``: StudentNet on the synthetic teacher–student task (whatever the
    scale's dataset: the task needs no download); an image architecture (ViT-Mini,
    ConvMixer, any registered one) at the scale's image sizes (:data:`IMAGE_SIZES`) on any
    image dataset — the synthetic task with ``data.in_dim=3072``, viewed as 3×32×32 — and
    ConfigError (one line) on data without images.
    """
    arch, no_ln = arch_of(variant)
    extra: dict[str, Any] = {}
    if no_ln:
        extra["model__out_ln"] = False
    if arch.task:  # the model of one task (StudentNet: the synthetic teacher–student task)
        dataset, data_dir = arch.task, None
    if arch.input_kind == "image":
        shape = image_view(scale, dataset)
        if shape is None:
            raise ConfigError(f"{chosen('arch', [variant])} reads images; the dataset "
                              f"{scale_dataset(scale, dataset)} holds none (use an image "
                              "dataset or the synthetic task)")
        extra.update(IMAGE_SIZES.get((arch.name, scale),
                                     {"grid": DEFAULT_GRID[scale]} if scale in DEFAULT_GRID
                                     else {}))
        grid = extra.pop("grid", None)
        if grid is not None and "patch" in arch.option_names():
            extra["model__patch"] = shape[1] // grid
        if "in_dim" in dataset_spec(scale_dataset(scale, dataset)).option_names():
            extra["data__in_dim"] = FLAT_IMAGE_DIM
    # the architecture from the start: the scale's model sizes go only where it reads them
    return scale_config(scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=control, arch=arch.name, **extra, **overrides)


def image_view(scale: str, dataset: str | None) -> tuple[int, int, int] | None:
    """The (C, H, W) images the image architectures read from the dataset: its own images,
    or 3×32×32 for a generated dataset whose input dimension can be set to 3072 (the
    synthetic task); None for fixed feature vectors (MNIST-1D's 40-point signals)."""
    spec = dataset_spec(scale_dataset(scale, dataset))
    if "in_dim" in spec.option_names():
        return FLAT_IMAGE
    shape = tuple(spec(RunConfig().replace(**{"data.name": spec.name}).data).input_shape())
    return shape if len(shape) == 3 else None


def arch_variants(scale: str, dataset: str | None,
                  chosen: Sequence[str] | None = None) -> list[str]:
    """The architectures of the cross-architecture experiments: ``chosen`` (``--arch``),
    or :data:`ARCH_VARIANTS` with the image architectures only where the dataset holds
    images (CIFAR, MNIST, Fashion-MNIST, the synthetic task's 3×32×32 view), not on
    MNIST-1D's 40-point signals."""
    if chosen is not None:
        return list(chosen)
    images = image_view(scale, dataset) is not None
    return [v for v in ARCH_VARIANTS if images or arch_of(v)[0].input_kind != "image"]


def rule_list(chosen: Sequence[str] | None, default: Sequence[str]) -> list[str]:
    """``chosen`` (``--rules``) or the experiment's ``default`` rules."""
    return list(default if chosen is None else chosen)


def trained_rules(chosen: Sequence[str] | None, default: Sequence[str]) -> list[str]:
    """:func:`rule_list` without the frozen-blocks baseline, for the runs an experiment
    varies what blocks train with (a penalty λ, a ladder of trainable blocks): the baseline
    trains no block, so each variant would change nothing (and is refused); the experiment
    adds its one baseline run per seed itself (:func:`baseline_rule`)."""
    return [name for name in rule_list(chosen, default) if not RULES.get(name).baseline]


def single_arch(chosen: Sequence[str] | None) -> str:
    """The architecture variant of a one-architecture experiment: the one ``--arch`` names,
    else the default architecture (the scale's ResidualMLP)."""
    return chosen[0] if chosen else ModelConfig().arch


def baseline_rule() -> str:
    """The name of the frozen-blocks baseline rule (the one that declares ``baseline``),
    whose runs every experiment with (d) adds."""
    return next(cls.name for cls in RULES.classes() if cls.baseline)
