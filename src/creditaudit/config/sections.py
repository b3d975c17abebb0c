"""The six sections of a run config, field by field, and the values they allow.

Every field is declared with :func:`opt`: its default, its help text (what ``creditaudit
train --help`` and docs/configuration.md show), its allowed values or range (which
:func:`creditaudit.config.config_from_dict` checks) and its *role*:

- ``"compute"`` (the default): changes what the run computes, so it is part of the run id;
- ``"record"``: changes what the run records but no weight (``diagnostics.frozen_acc``):
  not part of the run id, and a resumed run must keep it;
- ``"place"``: where or how visibly a run is written (output folder, data folder, device,
  threads, progress, loggers): neither. The device and the thread count can change the last
  bits of a sum (the order its pieces are added in), not what is computed: a run's record
  says what it ran on, and a resumed run keeps the thread count it ran on.

The ``[data]``, ``[model]`` and ``[method]`` sections hold a few common keys plus the own
options of the dataset, architecture and credit rule they select (each component declares
an ``Options`` dataclass with the same :func:`opt` metadata; see
:mod:`creditaudit.config.composed`). :class:`creditaudit.config.RunConfig` holds one of each
section.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A component's name: what method.name, model.arch and data.name accept.
COMPONENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
METHOD_NAME = COMPONENT_NAME  # the name of PR 1's check; kept for plugins that import it
SCHEDULES = ("cosine", "constant")
DEVICES = ("auto", "cpu", "cuda")
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; keep them non-negative
PRECISIONS = ("fp32", "bf16")
DEVICE_DATA = ("auto", "on", "off")
CUDA_GRAPHS = ("auto", "off")
ROLES = ("compute", "record", "place")


def opt(default: Any, help: str, *, choices: tuple | None = None, min: float | None = None,
        max: float | None = None, role: str = "compute", path: bool = False,
        name: bool = False, above: float | None = None) -> Any:
    """A dataclass field with help text, validation metadata and its role (module doc).

    ``min``/``max``: inclusive bounds; ``above``: an exclusive lower bound (a value that must
    be positive: ``above=0.0``).

    ``path``: the value is a file or folder path, which must not be empty (an empty path
    silently means the current folder). ``name``: the value names something (a project),
    which must not be empty either."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return field(default=default, metadata={"help": help, "choices": choices, "min": min,
                                            "max": max, "role": role, "path": path,
                                            "name": name, "above": above})


@dataclass
class DataConfig:
    """Keys every dataset reads; the selected dataset adds its own options."""

    name: str = opt("synthetic", "dataset: a built-in (synthetic, mnist1d, mnist, "
                    "fashion-mnist, cifar10, cifar100) or one an installed package registers; "
                    "its own options follow below")
    train_subset: int | None = opt(
        None, "train on the first N training samples only (any dataset; None = all)", min=1)
    random_targets: bool = opt(False, "control: i.i.d. uniform labels drawn afresh each batch")


@dataclass
class ModelConfig:
    """The key every architecture reads; the selected architecture adds its own options."""

    arch: str = opt("resmlp", "architecture: a built-in (resmlp, vit, convmixer, student; "
                    "module: any nn.Module that model.factory builds) or one an installed "
                    "package registers; its own options follow below")


@dataclass
class MethodConfig:
    """Keys every credit rule reads; the selected rule adds its own options."""

    name: str = opt("bp", "credit rule: a built-in (bp, fa, dfa, ep, state-bridge, "
                    "credit-bridge, frozen, …; `creditaudit train --help` lists them) or one "
                    "an installed package registers; its own options follow below")
    penalty: float = opt(0.0, "residual-branch penalty λ (λ·‖f_l‖² per block)", min=0.0)
    trainable_blocks: int | None = opt(
        None, "train only the last k blocks (depth ladder; None = all)", min=0)


@dataclass
class OptimConfig:
    epochs: int = opt(10, "training epochs", min=0)
    batch_size: int = opt(128, "batch size; an epoch's last batch holds the samples left "
                          "over (one larger than the training set: every step trains on all "
                          "of it)", min=1)
    lr: float = opt(1e-3, "AdamW learning rate (where the schedule starts)", min=0.0)
    weight_decay: float = opt(0.01, "AdamW (decoupled) weight decay of every model parameter "
                              "the rule trains, biases and LayerNorm gains included; "
                              "local-ce's classifiers take none and the bridges' auxiliary "
                              "nets keep the recipe's 0.01 (methods.md)", min=0.0)
    schedule: str = opt("cosine", "learning-rate schedule over all steps, stepped after "
                        "every batch: cosine decays optim.lr to 0 by the end of the last epoch",
                        choices=SCHEDULES)


@dataclass
class DiagnosticsConfig:
    """Keys of the per-epoch and end-of-run diagnostics; each diagnostic of the protocol
    adds a table of its own options (its thresholds), e.g. ``[diagnostics.a] growth = 50``."""

    protocol: list[str] | None = opt(
        None, "the protocol's diagnostics by name (None = the built-in four, a b c d; a list "
        "runs those it names, at least one, e.g. [\"b\"]; list a diagnostic an installed "
        "package registers to add it, e.g. [\"a\", \"b\", \"c\", \"d\", \"e\"])")
    eval_samples: int = opt(1280, "held-out samples for per-epoch diagnostics (10 × 128; "
                            "the default shrinks to the test split when it is smaller)",
                            min=1)
    every: int = opt(1, "record diagnostics every k epochs", min=1)
    protocol_every: int = opt(1, "run the four-diagnostic protocol every k epochs (0 = off)",
                              min=0)
    stop_on_walkback: bool = opt(False, "stop the run when the protocol verdict turns")
    end_of_run: bool = opt(True, "credit-quality metrics (ρ, nudging, drift) at the end")
    allow_unverified_reference: bool = opt(
        False, "train a model whose backward is not the gradient of its forward (a BioTorch "
        "layer, a torch.autograd.Function with its own backward) instead of refusing it; "
        "the record says where the reference check failed, the verdict is unverified and "
        "every cosine, Γ and (b) is marked unverified")
    frozen_acc: float | None = opt(
        None, "frozen-blocks test accuracy (fraction in [0, 1], same arch/data/recipe) for "
        "protocol diagnostic (d); None = (d) not evaluated", min=0.0, max=1.0, role="record")
    rho_samples: int = opt(1024, "end of run: samples for the perturbation correlation ρ "
                           "(at most eval_samples; the record says how many were used)", min=1)
    rho_directions: int = opt(32, "end of run: random unit directions per sample for ρ", min=1)
    null_draws: int = opt(20, "end of run: fresh feedback draws for the fresh-B null (FA/DFA)",
                          min=2)
    rho_flops: float = opt(
        2e11, "end of run: compute budget for ρ in floating-point operations — ρ uses at "
        "most budget / (one sample's perturbed forwards, counted on the model) of its "
        "rho_samples (at least 8; nudging then averages over the same samples), the same "
        "count on any machine; the record says what it used and ρ's standard error (raise "
        "it to always use rho_samples)", min=0.0)
    end_of_run_memory_gb: float = opt(
        2.0, "end of run: memory for one chunk of ρ, nudging, the fresh-B null and the "
        "cosines, in GB (chunk sizes follow from the model's activation bytes per sample, "
        "measured on a few samples)", min=0.01, role="place")


# Keys earlier versions read that no longer exist, with what replaced them: an old config
# holding one still loads (the key is ignored with a warning), never fails; a record drops it
# as it drops every key its run's version no longer reads.
RETIRED_KEYS: dict[tuple[str, str], str] = {
    ("diagnostics", "rho_seconds"): "ρ's time budget made its samples depend on the "
    "machine's speed and load; its budget is now diagnostics.rho_flops (floating-point "
    "operations, the same samples on any machine)",
}


@dataclass
class RunSettings:
    seed: int = opt(42, "seed of init, data order and feedback", min=0, max=MAX_SEED)
    out_dir: str = opt("runs", "results folder; each run gets OUT_DIR/RUN_ID/", role="place",
                       path=True)
    device: str = opt("auto", "device (auto = cuda if available)", choices=DEVICES,
                      role="place")
    precision: str = opt("fp32", "training precision; diagnostics run in the parameters' "
                         "dtype, never under bf16 autocast (fp32; a Python caller's float64 "
                         "run: float64; a Recorder's network held in bf16 or fp16: that "
                         "dtype, model.dtype)", choices=PRECISIONS)
    threads: int | None = opt(None, "torch CPU threads of the run (None = the process's "
                              "count, torch's default in a command; train() puts the caller's "
                              "count, torch settings and random streams back after the run); "
                              "not in the run id, though the count can change the last bits "
                              "of sums; a resumed run goes on with the count it ran on", min=1,
                              role="place")
    device_data: str = opt("auto", "keep the train and test sets on the run's device and draw "
                           "each batch there: the same batches, no host copy per batch (auto "
                           "= on for CUDA)", choices=DEVICE_DATA, role="place")
    cuda_graphs: str = opt("auto", "capture the training step in a CUDA graph and replay it "
                           "(auto = on for CUDA runs of rules whose step can be captured, "
                           "which each rule declares: its stacked_step; float32 runs only; "
                           "the record says what was used)",
                           choices=CUDA_GRAPHS, role="place")
    tensorboard: str | None = opt(None, "log every epoch, the protocol, the end-of-run metrics "
                                  "and the config to this TensorBoard folder (DIR/RUN_ID/)",
                                  role="place", path=True)
    wandb_project: str | None = opt(None, "log the same to this Weights & Biases project "
                                    "(WANDB_MODE=offline writes it to disk)", role="place",
                                    name=True)
    progress: bool = opt(True, "console progress: a run-level bar in a terminal, one line "
                         "per epoch when stdout or stderr is not one", role="place")


# The values earlier versions wrote for keys that are now a component's own option. A config
# file (``--print-config``, a run's config.toml) or record of an earlier version lists every
# key of its section; a key the selected component does not read is dropped when it holds one
# of these values (a default of some version, never read), and refused otherwise (records:
# dropped — the run never read it). Found by printing the config of every rule, architecture
# and dataset with each version since config files were written (c6b4234): EP's β was 0.1
# before it became 0.01, its solver "cg" before "residual-cg".
LEGACY_DEFAULTS: dict[tuple[str, str], tuple[Any, ...]] = {
    ("data", "data_dir"): (None,), ("data", "download"): (False,),
    ("data", "n_train"): (50000,), ("data", "n_test"): (10000,), ("data", "data_seed"): (None,),
    ("data", "in_dim"): (256,), ("data", "alpha"): (1.0,), ("data", "teacher_width"): (256,),
    ("data", "teacher_depth"): (2,), ("data", "augment"): (None,),
    ("model", "d"): (256,), ("model", "n_blocks"): (4,), ("model", "out_ln"): (True,),
    ("model", "residual"): (True,), ("model", "w2_std"): (0.01,), ("model", "heads"): (4,),
    ("model", "mlp_ratio"): (4,), ("model", "patch"): (4,), ("model", "kernel"): (5,),
    ("method", "feedback_seed"): (None,), ("method", "feedback_scale"): (1.0,),
    ("method", "normalise_credit"): (True,), ("method", "bridge_hidden"): (256,),
    ("method", "bridge_lr"): (1e-3,), ("method", "bridge_skip"): (False,),
    ("method", "warmup_fraction"): (0.2,), ("method", "bridge_noise"): (0.1,),
    ("method", "bridge_copies"): (8,), ("method", "bridge_temperature"): (0.1,),
    ("method", "ema_decay"): (0.995,), ("method", "ep_beta"): (0.1, 0.01),
    ("method", "ep_steps"): (20,), ("method", "ep_step_size"): (0.25,),
    ("method", "ep_solver"): ("cg", "residual-cg"),
}


def legacy_default(section: str, key: str, value: Any) -> bool:
    """Whether ``value`` is what an earlier version wrote by default for ``section.key``
    (:data:`LEGACY_DEFAULTS`); a bool matches a bool only (``0`` is not ``false``)."""
    return any(value == written and isinstance(value, bool) == isinstance(written, bool)
               for written in LEGACY_DEFAULTS.get((section, key), ()))


# The six sections of a RunConfig, by name, in the order of its fields.
SECTION_TYPES: dict[str, type] = {
    "data": DataConfig, "model": ModelConfig, "method": MethodConfig, "optim": OptimConfig,
    "diagnostics": DiagnosticsConfig, "run": RunSettings,
}
