"""Dataclass configs, TOML loading, command-line overrides and validation.

A run is described by one :class:`RunConfig` with six sections (data, model, method, optim,
diagnostics, run), declared field by field in :mod:`creditaudit.config.sections`. Every
field carries its help text, allowed values and range in its metadata;
:func:`config_from_dict` validates against them and raises a one-line
:class:`~creditaudit.errors.ConfigError` naming the bad key, what was given and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config.sections import (
    ARCHS,
    DATASETS,
    DEVICES,
    EP_SOLVERS,
    GENERATED_DATASETS,
    IMAGE_ARCHS,
    IMAGE_SHAPES,
    MAX_SEED,
    METHOD_NAME,
    PRECISIONS,
    RETIRED_KEYS,
    SCHEDULES,
    SYNTHETIC_IMAGE_DIM,
    DataConfig,
    DiagnosticsConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunSettings,
    opt,
)
from creditaudit.errors import ConfigError
from creditaudit.safe_files import read_text

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "ARCHS", "DATASETS", "DEVICES", "EP_SOLVERS", "GENERATED_DATASETS", "IMAGE_ARCHS",
    "IMAGE_SHAPES", "MAX_SEED", "METHOD_NAME", "PRECISIONS", "SCHEDULES",
    "SYNTHETIC_IMAGE_DIM", "DataConfig", "DiagnosticsConfig", "MethodConfig", "ModelConfig",
    "OptimConfig", "RunSettings", "opt", "RunConfig", "config_from_dict", "config_to_toml",
    "load_config", "parse_value", "parse_override", "device_overrides", "apply_overrides",
    "semantic_dict", "config_help", "SECTIONS", "SECTION_TYPES", "NON_SEMANTIC",
]


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    run: RunSettings = field(default_factory=RunSettings)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def replace(self, **overrides: Any) -> RunConfig:
        """A copy with dotted-key overrides, e.g. ``replace(**{"method.name": "dfa"})``."""
        return apply_overrides(self, overrides)


SECTIONS: dict[str, type] = {f.name: f.type for f in dataclasses.fields(RunConfig)}
SECTION_TYPES = {
    "data": DataConfig, "model": ModelConfig, "method": MethodConfig, "optim": OptimConfig,
    "diagnostics": DiagnosticsConfig, "run": RunSettings,
}
# Fields that change where or how visibly a run is written, never what it computes, plus
# ``diagnostics.frozen_acc``: a baseline accuracy only enters the verdict of (d), which readers
# re-evaluate against the frozen runs they have.
NON_SEMANTIC = {("data", "data_dir"), ("data", "download"), ("run", "out_dir"),
                ("run", "tensorboard"), ("run", "wandb_project"), ("run", "progress"),
                ("run", "threads"), ("run", "device"), ("diagnostics", "frozen_acc"),
                ("diagnostics", "end_of_run_memory_gb")}


def _type_name(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    name = getattr(base, "__name__", str(base))
    return f"{name} or none" if type(None) in typing.get_args(tp) else name


@functools.cache
def _field_types(section: str) -> dict[str, Any]:
    """Resolved type hints of a section's fields (resolving them is slow; do it once)."""
    return typing.get_type_hints(SECTION_TYPES[section])


def _coerce(section: str, f: dataclasses.Field, value: Any) -> Any:
    key = f"{section}.{f.name}"
    tp = _field_types(section)[f.name]
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    if value is None or (optional and isinstance(value, str) and value.lower() == "none"):
        if optional:
            return None
        raise ConfigError(f"{key} must be a {_type_name(tp)}, got none")
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
    elif base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value")
    elif base is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    meta = f.metadata
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of "
                          f"{', '.join(map(str, meta['choices']))}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}={value!r} is out of range; it must be >= {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"{key}={value!r} is out of range; it must be <= {meta['max']}")
    return value


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from nested dicts (missing keys take defaults)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a table of sections, got {type(raw).__name__}")
    unknown = set(raw) - set(SECTION_TYPES)
    if unknown:
        raise ConfigError(f"unknown config section {sorted(unknown)[0]!r}; allowed sections: "
                          f"{', '.join(SECTION_TYPES)}")
    sections: dict[str, Any] = {}
    for name, cls in SECTION_TYPES.items():
        given = raw.get(name, {})
        if not isinstance(given, dict):
            raise ConfigError(f"config section {name!r} must be a table, got {given!r}")
        given = _without_retired(name, given)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        bad = set(given) - set(fields)
        if bad:
            raise ConfigError(f"unknown key {name}.{sorted(bad)[0]}; allowed keys in [{name}]: "
                              f"{', '.join(fields)}")
        sections[name] = cls(**{k: _coerce(name, fields[k], v) for k, v in given.items()})
    config = RunConfig(**sections)
    _check_consistency(config)
    return config


def _without_retired(section: str, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` without the keys of :data:`RETIRED_KEYS`, each logged as ignored."""
    retired = [key for key in given if (section, key) in RETIRED_KEYS]
    for key in retired:
        log.warning("warning: %s.%s is no longer read and is ignored: %s", section, key,
                    RETIRED_KEYS[(section, key)])
    return {k: v for k, v in given.items() if k not in retired} if retired else given


def _check_consistency(config: RunConfig) -> None:
    """Cross-field rules that single-field validation cannot see."""
    if not METHOD_NAME.match(config.method.name):
        raise ConfigError(f"method.name={config.method.name!r} is not a rule name (lower-case "
                          "letters, digits, - and _); `creditaudit train --help` lists the "
                          "installed rules")
    tb = config.method.trainable_blocks
    if tb is not None and tb > config.model.n_blocks:
        raise ConfigError(f"method.trainable_blocks={tb} exceeds model.n_blocks="
                          f"{config.model.n_blocks}; use 0…{config.model.n_blocks}")
    if config.model.arch in IMAGE_ARCHS:
        _check_image_arch(config)
    if config.data.name in GENERATED_DATASETS and config.data.augment:
        raise ConfigError("data.augment=true needs an image dataset (random crop and flip); "
                          f"{config.data.name} has feature vectors: drop data.augment")
    if config.data.name == "mnist1d" and (config.data.n_train + config.data.n_test) % 10:
        raise ConfigError(f"data.name='mnist1d' generates equally many samples per digit: "
                          f"data.n_train + data.n_test must be a multiple of 10, got "
                          f"{config.data.n_train} + {config.data.n_test}")
    if config.data.name not in GENERATED_DATASETS and config.data.data_dir is None:
        raise ConfigError(f"data.name={config.data.name!r} needs data.data_dir (--data-dir) "
                          "pointing at the dataset folder")


def _check_image_arch(config: RunConfig) -> None:
    """ViT-Mini and ConvMixer read C×H×W images whose sides the patch size divides."""
    arch, data, model = config.model.arch, config.data, config.model
    shape = IMAGE_SHAPES.get(data.name)
    if shape is None:
        images = ", ".join(IMAGE_SHAPES)
        raise ConfigError(f"model.arch={arch!r} needs images, and data.name={data.name!r} "
                          f"holds feature vectors: use one of {images}, or model.arch='resmlp'")
    if data.name == "synthetic" and data.in_dim != SYNTHETIC_IMAGE_DIM:
        raise ConfigError(f"model.arch={arch!r} views the synthetic task's inputs as 3×32×32 "
                          f"images: set data.in_dim={SYNTHETIC_IMAGE_DIM} (got {data.in_dim})")
    _, height, width = shape
    if height % model.patch or width % model.patch:
        fits = [p for p in range(1, height + 1) if height % p == 0 and width % p == 0]
        raise ConfigError(f"model.patch={model.patch} does not divide the {height}×{width} "
                          f"images of {data.name}: use one of {', '.join(map(str, fits))}")
    if arch == "vit" and model.d % model.heads:
        raise ConfigError(f"model.d={model.d} is not divisible by model.heads={model.heads}: "
                          "ViT-Mini splits the width evenly across its attention heads")


def config_to_toml(config: RunConfig) -> str:
    """The config as a TOML file that :func:`load_config` reads back to an equal config.

    Fields set to None are left out (TOML has no null; every optional field defaults to
    None, so leaving it out restores it).
    """
    import tomli_w

    raw = {section: {k: v for k, v in values.items() if v is not None}
           for section, values in config.to_dict().items()}
    return tomli_w.dumps(raw)


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file (sections [data], [model], [method], …; e.g. a run folder's
    ``config.toml``). A run's ``record.json`` is read by
    :func:`creditaudit.records.load_config_file`."""
    path = Path(path)
    text = read_text(path, "config file", ConfigError)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    return config_from_dict(raw)


def parse_value(text: str) -> Any:
    """Parse an override value with TOML syntax (``3``, ``1e-3``, ``true``), else a string."""
    if text.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_override(item: str) -> tuple[str, Any]:
    """``"method.penalty=1e-2"`` → ``("method.penalty", 0.01)``."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. "
                          "method.penalty=0.01")
    key, text = item.split("=", 1)
    return key.strip(), parse_value(text.strip())


def device_overrides(device: str | None = None, precision: str | None = None
                     ) -> dict[str, str]:
    """Dotted overrides ``run.device`` / ``run.precision`` for the values that are given."""
    return {key: value for key, value in (("run.device", device), ("run.precision", precision))
            if value is not None}


def apply_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A validated copy of ``config`` with dotted-key overrides applied."""
    raw = config.to_dict()
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if section not in raw or not name:
            raise ConfigError(f"override key {key!r} must be section.key with section one of "
                              f"{', '.join(SECTION_TYPES)}")
        if name not in raw[section] and (section, name) not in RETIRED_KEYS:
            raise ConfigError(f"unknown key {key}; allowed keys in [{section}]: "
                              f"{', '.join(raw[section])}")
        raw[section][name] = value
    return config_from_dict(raw)


def semantic_dict(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The fields that change what a run computes and differ from their defaults.

    Only non-default values are kept, so adding an option whose default keeps the old
    behaviour does not change existing run ids (see :mod:`creditaudit.run_ids`).
    """
    raw = config.to_dict()
    defaults = RunConfig().to_dict()
    for section, values in raw.items():
        for name in list(values):
            if (section, name) in NON_SEMANTIC or values[name] == defaults[section][name]:
                del values[name]
    return raw


def config_help() -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every field, for ``--help`` texts and docs."""
    rows = []
    for section, cls in SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            choices = f.metadata.get("choices")
            extra = f" [{'|'.join(choices)}]" if choices else ""
            rows.append((f"{section}.{f.name}", repr(f.default), f.metadata["help"] + extra))
    return rows


__all__ = [
    "RunConfig", "DataConfig", "ModelConfig", "MethodConfig", "OptimConfig",
    "DiagnosticsConfig", "RunSettings", "config_from_dict", "load_config", "apply_overrides",
    "parse_override", "semantic_dict", "config_help", "config_to_toml", "types",
]
