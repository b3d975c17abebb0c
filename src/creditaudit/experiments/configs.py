"""How the shipped experiments build their runs: a scale's base config plus a few overrides.

Every experiment builds its runs as ``scales.base_config(scale, dataset) + overrides``, so the
same settings always give the same run ids, shared between experiments and with
``creditaudit sweep``.
"""

from __future__ import annotations

import copy
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.experiments.scales import base_config, get_scale

CIFAR = ("cifar10", "cifar100")
# The methods of the audit table (method, penalty λ), the frozen baseline last.
AUDIT_METHODS: tuple[tuple[str, float], ...] = (
    ("bp", 0.0), ("fa", 0.0), ("dfa", 0.0), ("dfa", 1e-2), ("state-bridge", 0.0),
    ("credit-bridge", 0.0), ("ep", 0.0), ("frozen", 0.0))
# The alternative rules the decision-utility count runs over ("x/5").
RULES = ("fa", "dfa", "ep", "state-bridge", "credit-bridge")


def scale_dataset(scale: str, dataset: str | None) -> str:
    return dataset or get_scale(scale).dataset


_CONFIG_CACHE: dict[tuple[Any, ...], RunConfig] = {}


def scale_config(scale: str, *, dataset: str | None, data_dir: str | None, out_dir: str,
                 control: bool = False, **overrides: Any) -> RunConfig:
    """``base_config(scale, …)`` with dotted ``overrides`` given as ``section__key=value``.

    Memoised (config validation is the slow part of building an experiment's runs, and the
    experiments share most of theirs); every call returns a fresh copy.
    """
    key = (scale, dataset, data_dir, str(out_dir), control, tuple(sorted(overrides.items())))
    if key not in _CONFIG_CACHE:
        config = base_config(scale, dataset=dataset, data_dir=data_dir, out_dir=str(out_dir),
                             control=control)
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


ARCH_VARIANTS = ("resmlp", "resmlp-noLN", "student", "vit")


def arch_config(variant: str, scale: str, *, dataset: str | None, data_dir: str | None,
                out_dir: str, control: bool = False, **overrides: Any) -> RunConfig:
    """A run of one architecture variant of the cross-architecture experiments.

    ``resmlp``: the scale's ResidualMLP with terminal LN; ``resmlp-noLN``: without it;
    ``student``: StudentNet on the synthetic teacher–student task (whatever the scale's
    dataset: the task needs no download); ``vit``: ViT-Mini (d=128 except at smoke scale),
    CIFAR only.
    """
    if variant == "resmlp":
        extra: dict[str, Any] = {}
    elif variant == "resmlp-noLN":
        extra = {"model__out_ln": False}
    elif variant == "student":
        extra = {"model__arch": "student"}
        dataset, data_dir = "synthetic", None
    elif variant == "vit":
        extra = {"model__arch": "vit"}
        if scale != "smoke":
            extra["model__d"] = 128
    else:
        raise ConfigError(f"unknown architecture variant {variant!r}; use one of "
                          f"{', '.join(ARCH_VARIANTS)}")
    return scale_config(scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=control, **extra, **overrides)


def arch_variants(scale: str, dataset: str | None) -> list[str]:
    """The architectures of the cross-architecture experiments (ViT only on CIFAR)."""
    variants = ["resmlp", "resmlp-noLN", "student"]
    if scale_dataset(scale, dataset) in CIFAR:
        variants.append("vit")
    return variants
