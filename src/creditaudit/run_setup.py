"""A run's pieces, shared by training and auditing: its device, optimiser and schedule, and
a finished run rebuilt from its checkpoint.

:func:`rebuild_run` is what ``creditaudit audit`` and :attr:`RunResult.rule
<creditaudit.training.RunResult.rule>` use to bring a run back on the CPU; the training loop
builds its optimiser with :func:`creditaudit.optim.make_adamw` and its schedule with
:func:`make_schedule`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from creditaudit.config import IMAGE_ARCHS, RunConfig
from creditaudit.data import Dataset, load_dataset
from creditaudit.data.identity import DataIdentity
from creditaudit.errors import ConfigError, RunRecordError
from creditaudit.methods import CreditRule, build_rule
from creditaudit.models import build_model
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, RunRecord, load_checkpoint
from creditaudit.resume import check_same_data, load_into
from creditaudit.run_ids import run_data_identity


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device='cuda' but no CUDA device is available; use --device cpu")
    return torch.device(name)


def flatten_inputs(config: RunConfig) -> bool:
    """Whether the model reads flat vectors (ResidualMLP) rather than images."""
    return config.model.arch not in IMAGE_ARCHS


def make_schedule(optimizer: torch.optim.Optimizer, kind: str, total_steps: int
                  ) -> torch.optim.lr_scheduler.LRScheduler:
    """``cosine``: decay from the base rate to 0 over ``total_steps`` (torch's
    CosineAnnealingLR); ``constant``: the base rate throughout."""
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total_steps, 1),
                                                          eta_min=0.0)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


def rebuild_run(record: RunRecord, run_dir: Path, *, dataset: Dataset | None = None
                ) -> tuple[CreditRule, Dataset, int]:
    """(rule with its model, data, epoch) of the run in ``run_dir`` at its checkpointed
    epoch, on the CPU.

    Checks that the data on disk is the data the run trained on (its fingerprint) and loads
    ``checkpoint.pt`` without unpickling anything but tensors and plain containers. The
    caller's RNG is untouched (the random init that the checkpoint overwrites is forked).
    Raises RunRecordError for a run without a checkpoint or one that does not fit.
    """
    config = record.config
    checkpoint = run_dir / CHECKPOINT_FILE
    if not checkpoint.exists():
        raise RunRecordError(f"no checkpoint at {checkpoint}: the run never finished an epoch; "
                             "train it (creditaudit train … --resume) first")
    state = load_checkpoint(checkpoint)
    if dataset is None:
        dataset = load_dataset(config.data, seed=config.run.seed)
    check_same_data(record, identity_of(config, dataset), run_dir / RECORD_FILE)
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model, input_shape=dataset.input_shape,
                            n_classes=dataset.n_classes)
        rule = build_rule(model, config.method, n_classes=dataset.n_classes,
                          seed=config.run.seed)
    load_into(state, checkpoint, config, model=model, rule=rule)
    return rule, dataset, int(state["epoch"])


def identity_of(config: RunConfig, dataset: Dataset) -> DataIdentity:
    """The data identity of ``config`` with the sizes of the loaded ``dataset``."""
    return replace(run_data_identity(config), n_train=int(dataset.train_x.shape[0]),
                   n_test=int(dataset.test_x.shape[0]))
