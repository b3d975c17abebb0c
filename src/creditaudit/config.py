"""Dataclass configs, TOML loading, command-line overrides and validation.

A run is described by one :class:`RunConfig` with six sections (data, model, method, optim,
diagnostics, run). Every field carries its help text, allowed values and range in its
metadata; :func:`config_from_dict` validates against them and raises a one-line
:class:`~creditaudit.errors.ConfigError` naming the bad key, what was given and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.safe_files import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATASETS = ("synthetic", "mnist1d", "cifar10", "cifar100", "mnist", "fashion-mnist")
# Generated in memory from a seed: no data folder, feature vectors (no image augmentation).
GENERATED_DATASETS = ("synthetic", "mnist1d")
ARCHS = ("resmlp", "vit", "convmixer", "student")
# Architectures that read images (B, C, H, W): ViT-Mini and ConvMixer.
IMAGE_ARCHS = ("vit", "convmixer")
# The image each dataset holds, as (C, H, W); the synthetic task's in_dim = 3072 features are
# viewed as one 3×32×32 image (the CIFAR shape) by the image architectures.
IMAGE_SHAPES: dict[str, tuple[int, int, int]] = {
    "cifar10": (3, 32, 32), "cifar100": (3, 32, 32), "mnist": (1, 28, 28),
    "fashion-mnist": (1, 28, 28), "synthetic": (3, 32, 32)}
SYNTHETIC_IMAGE_DIM = 3 * 32 * 32
# Credit rules are a registry (creditaudit.methods), open to plugins: the config only checks
# the name's form; the layers that build or list rules check that it is installed.
METHOD_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
SCHEDULES = ("cosine", "constant")
DEVICES = ("auto", "cpu", "cuda")
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; keep them non-negative
PRECISIONS = ("fp32", "bf16")
EP_SOLVERS = ("cg", "gd")


def opt(default: Any, help: str, *, choices: tuple | None = None, min: float | None = None,
        max: float | None = None) -> Any:
    """A dataclass field with help text and validation metadata."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min,
                                            "max": max})


@dataclass
class DataConfig:
    name: str = opt("synthetic", "dataset", choices=DATASETS)
    data_dir: str | None = opt(None, "folder holding the dataset files (not for synthetic "
                               "or mnist1d)")
    download: bool = opt(False, "download CIFAR if missing (needs internet)")
    n_train: int = opt(50000, "synthetic, mnist1d: training samples (mnist1d: n_train + "
                       "n_test must be a multiple of 10)", min=1)
    n_test: int = opt(10000, "synthetic, mnist1d: test samples", min=1)
    data_seed: int | None = opt(None, "seed of the generated datasets (synthetic, mnist1d; "
                                "None = run.seed)")
    in_dim: int = opt(256, "synthetic: input dimension", min=1)
    alpha: float = opt(1.0, "synthetic: teacher nonlinearity φ_α mix (0 linear, 1 tanh)",
                       min=0.0, max=1.0)
    teacher_width: int = opt(256, "synthetic: teacher hidden width", min=1)
    teacher_depth: int = opt(2, "synthetic: teacher hidden layers", min=1)
    train_subset: int | None = opt(None, "use only the first N training samples", min=1)
    augment: bool | None = opt(None, "random crop + flip (default: on for CIFAR, off otherwise)")
    random_targets: bool = opt(False, "control: i.i.d. uniform labels drawn afresh each batch")


@dataclass
class ModelConfig:
    arch: str = opt("resmlp", "architecture (student = 4-block d=128 ResidualMLP, no out_ln; "
                    "vit and convmixer need images, or the synthetic task with in_dim=3072 "
                    "viewed as 3×32×32)", choices=ARCHS)
    d: int = opt(256, "width", min=1)
    n_blocks: int = opt(4, "number of residual blocks L", min=1)
    out_ln: bool = opt(True, "terminal LayerNorm before the head (ConvMixer: on the pooled "
                       "vector)")
    residual: bool = opt(True, "skip connections (False = no-residual control)")
    w2_std: float = opt(0.01, "init std of each block's last linear layer (ConvMixer: its "
                        "pointwise convolution)", min=0.0)
    heads: int = opt(4, "ViT: attention heads", min=1)
    mlp_ratio: int = opt(4, "ViT: MLP hidden width / d", min=1)
    patch: int = opt(4, "ViT, ConvMixer: patch size p (p×p patches; must divide the image "
                     "side)", min=1)
    kernel: int = opt(5, "ConvMixer: depthwise convolution kernel size (same padding)", min=1)


@dataclass
class MethodConfig:
    name: str = opt("bp", "credit rule: a built-in (bp, fa, dfa, ep, state-bridge, "
                    "credit-bridge, frozen, …; `creditaudit train --help` lists them) or one "
                    "an installed package registers")
    penalty: float = opt(0.0, "residual-branch penalty λ (λ·‖f_l‖² per block)", min=0.0)
    trainable_blocks: int | None = opt(
        None, "train only the last k blocks (depth ladder; None = all)", min=0)
    feedback_seed: int | None = opt(None, "seed of the feedback matrices (None = run seed)",
                                    min=0, max=MAX_SEED)
    feedback_scale: float = opt(1.0, "feedback entries ~ N(0, scale²/fan_in) (FA, DFA, DRTP, "
                                "fa-linear, KP; the magnitudes of uSF, brSF, frSF)", min=0.0)
    normalise_credit: bool = opt(
        True, "local rules (FA, DFA, DRTP, bridges): train on the per-sample RMS-normalised "
        "credit â = a/(RMS(a)+1e-6); false = the raw credit on the batch-mean scale")
    bridge_hidden: int = opt(256, "State/Credit Bridge: hidden width of the auxiliary net",
                             min=1)
    bridge_lr: float = opt(1e-3, "State/Credit Bridge: AdamW learning rate of the auxiliary net",
                           min=0.0)
    bridge_skip: bool = opt(
        False, "State Bridge: predict h_L as h_l + RMS(h_l)·MLP(…) (identity at init) instead "
        "of MLP(…)")
    warmup_fraction: float = opt(
        0.2, "Credit Bridge: fraction of epochs trained with DFA credit before ∇V takes over",
        min=0.0, max=1.0)
    bridge_noise: float = opt(
        0.1, "Credit Bridge: noise std of the consistency copies, × per-sample RMS of h_{l+1}",
        min=0.0)
    bridge_copies: int = opt(8, "Credit Bridge: noisy copies K in the soft-min target", min=1)
    bridge_temperature: float = opt(
        0.1, "Credit Bridge: soft-min temperature τ in nats (→0 hard min, →∞ mean)", min=1e-6)
    ema_decay: float = opt(0.995, "Credit Bridge: EMA decay of the target value net",
                           min=0.0, max=1.0)
    ep_beta: float = opt(0.01, "EP: nudging strength β of the cross-entropy term (the credit's "
                         "bias grows with β: at 0.1 even a converged relaxation's weight update "
                         "has cosine ≈ 0.99 with BP's on a d=256 L=4 net, at 0.01 ≈ 0.9999)",
                         min=1e-12)
    ep_steps: int = opt(20, "EP: steps of the nudged relaxation (each one forward and "
                        "input-gradient pass through the blocks)", min=1)
    ep_step_size: float = opt(0.25, "EP: state step size η of the nudged relaxation: gd's step "
                              "(stable while η < 2/λ_max of the energy Hessian; halved when "
                              "‖∇F‖ grows), cg's first and shortest curvature probe", min=0.0)
    ep_solver: str = opt(
        "cg", "EP: relaxation solver. cg = conjugate gradients per sample, the curvature along "
        "each direction measured by one gradient probe (same fixed point and matmuls per step "
        "as gd, far fewer steps to converge); gd = plain gradient descent with step size η",
        choices=EP_SOLVERS)


@dataclass
class OptimConfig:
    epochs: int = opt(10, "training epochs", min=0)
    batch_size: int = opt(128, "batch size", min=1)
    lr: float = opt(1e-3, "AdamW learning rate", min=0.0)
    weight_decay: float = opt(0.01, "AdamW weight decay", min=0.0)
    schedule: str = opt("cosine", "learning-rate schedule over all steps", choices=SCHEDULES)


@dataclass
class DiagnosticsConfig:
    eval_samples: int = opt(1280, "held-out samples for per-epoch diagnostics (10 × 128)",
                            min=1)
    every: int = opt(1, "record diagnostics every k epochs", min=1)
    protocol_every: int = opt(1, "run the four-diagnostic protocol every k epochs (0 = off)",
                              min=0)
    stop_on_walkback: bool = opt(False, "stop the run when the protocol verdict turns")
    end_of_run: bool = opt(True, "credit-quality metrics (ρ, nudging, drift) at the end")
    frozen_acc: float | None = opt(
        None, "frozen-blocks test accuracy (fraction in [0, 1], same arch/data/recipe) for "
        "protocol diagnostic (d); None = (d) not evaluated", min=0.0, max=1.0)
    rho_samples: int = opt(1024, "end of run: samples for the perturbation correlation ρ "
                           "(at most eval_samples; the record says how many were used)", min=1)
    rho_directions: int = opt(32, "end of run: random unit directions per sample for ρ", min=1)
    null_draws: int = opt(20, "end of run: fresh feedback draws for the fresh-B null (FA/DFA)",
                          min=2)


@dataclass
class RunSettings:
    seed: int = opt(42, "seed of init, data order and feedback", min=0, max=MAX_SEED)
    out_dir: str = opt("runs", "results folder; each run gets OUT_DIR/RUN_ID/")
    device: str = opt("auto", "device (auto = cuda if available)", choices=DEVICES)
    precision: str = opt("fp32", "training precision; diagnostics always fp32",
                         choices=PRECISIONS)
    threads: int | None = opt(None, "torch CPU threads (None = torch default)", min=1)
    tensorboard: str | None = opt(None, "log every epoch, the protocol, the end-of-run metrics "
                                  "and the config to this TensorBoard folder (DIR/RUN_ID/)")
    wandb_project: str | None = opt(None, "log the same to this Weights & Biases project "
                                    "(WANDB_MODE=offline writes it to disk)")
    progress: bool = opt(True, "console progress: a run-level bar in a terminal, one line "
                         "per epoch when stdout is not a terminal")


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
                ("run", "threads"), ("run", "device"), ("diagnostics", "frozen_acc")}


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
        fields = {f.name: f for f in dataclasses.fields(cls)}
        bad = set(given) - set(fields)
        if bad:
            raise ConfigError(f"unknown key {name}.{sorted(bad)[0]}; allowed keys in [{name}]: "
                              f"{', '.join(fields)}")
        sections[name] = cls(**{k: _coerce(name, fields[k], v) for k, v in given.items()})
    config = RunConfig(**sections)
    _check_consistency(config)
    return config


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
        if name not in raw[section]:
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
