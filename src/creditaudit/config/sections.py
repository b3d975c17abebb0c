"""The six sections of a run config, field by field, and the values they allow.

Every field is declared with :func:`opt`: its default, its help text (what ``creditaudit
config`` and docs/configuration.md show) and its allowed values or range, which
:func:`creditaudit.config.config_from_dict` checks. :class:`creditaudit.config.RunConfig`
holds one of each section.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

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
EP_SOLVERS = ("residual-cg", "cg", "gd")


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
    feedback_seed: int | None = opt(
        None, "seed the feedback generator is derived from (None = run seed)", min=0,
        max=MAX_SEED)
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
                         "has cosine ≈ 0.99 with BP's on a fresh d=256 L=4 net, at 0.01 ≈ 0.9999; "
                         "0.957 on one trained 20 epochs on Fashion-MNIST)",
                         min=1e-12)
    ep_steps: int = opt(20, "EP: steps of the nudged relaxation (each one forward and "
                        "input-gradient pass through the blocks)", min=1)
    ep_step_size: float = opt(0.25, "EP: state step size η of the nudged relaxation: gd's step "
                              "(stable while η < 2/λ_max of the energy Hessian; halved when "
                              "‖∇F‖ grows), the CG solvers' first and shortest curvature "
                              "probe", min=0.0)
    ep_solver: str = opt(
        "residual-cg", "EP: relaxation solver. residual-cg = conjugate gradients per sample "
        "over the residuals r_l, the states following by one forward pass (same fixed point; "
        "its Hessian is the identity up to the nudge's curvature, so it converges however "
        "stiff the blocks); cg = the same over the state displacements (diverges once training "
        "makes the blocks stiff); gd = plain gradient descent on the displacements, step η",
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
    rho_flops: float = opt(
        2e11, "end of run: compute budget for ρ in floating-point operations — ρ uses at "
        "most budget / (one sample's perturbed forwards, counted on the model) of its "
        "rho_samples (at least 8; nudging then averages over the same samples), the same "
        "count on any machine; the record says what it used and ρ's standard error (raise "
        "it to always use rho_samples)", min=0.0)
    end_of_run_memory_gb: float = opt(
        2.0, "end of run: memory for one chunk of ρ, nudging, the fresh-B null and the "
        "cosines, in GB (chunk sizes follow from the model's activation bytes per sample, "
        "measured on a few samples)", min=0.01)


# Keys earlier versions read that no longer exist, with what replaced them: an old config or
# record holding one still loads (the key is ignored with a warning), never fails.
RETIRED_KEYS: dict[tuple[str, str], str] = {
    ("diagnostics", "rho_seconds"): "ρ's time budget made its samples depend on the "
    "machine's speed and load; its budget is now diagnostics.rho_flops (floating-point "
    "operations, the same samples on any machine)",
}


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
