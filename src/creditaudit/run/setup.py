"""A run's pieces, shared by training and auditing: its device, optimiser and schedule, and
a finished run rebuilt from its checkpoint.

:func:`rebuild_run` is what ``creditaudit audit`` and :attr:`RunResult.rule
<creditaudit.run.folder.RunResult.rule>` use to bring a run back on the CPU; the training loop
builds its optimiser with :func:`creditaudit.optim.make_adamw` and its schedule with
:func:`make_schedule`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from creditaudit.caller import FORCE, train_again
from creditaudit.data import Dataset
from creditaudit.errors import ConfigError, RunRecordError
from creditaudit.guests.settings import SETTINGS
from creditaudit.methods import CreditRule
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import measurement_mode
from creditaudit.records import (
    CHECKPOINT_FILE,
    RECORD_FILE,
    EpochEntry,
    RunRecord,
    load_checkpoint,
)
from creditaudit.records.claim_files import claim_state
from creditaudit.registry import ARCHITECTURES
from creditaudit.run.plan import RunPlan, plan_run
from creditaudit.run.resume import (
    FOLDER_FIX,
    check_same_data,
    check_same_run,
    load_into,
    saved_record,
)

log = logging.getLogger(__name__)


def resolve_device(name: str, option: str = "run.device") -> torch.device:
    """The device ``name`` (``auto``: CUDA when available, else the CPU); ConfigError naming
    ``option`` (how the caller's user gave it) when it asks for CUDA on a machine without."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{option}='cuda' but no CUDA device is available; use --device cpu")
    return torch.device(name)


@contextlib.contextmanager
def caller_process(device: str = "cpu") -> Iterator[None]:
    """Around runs trained in a caller's process (:func:`~creditaudit.run.trainer.train`,
    :func:`~creditaudit.run.stacked.train_stacked`; ``device``: their ``run.device``).

    Inside, torch is as a command starts it — grad on, no inference mode, no autocast
    (a bf16 run's steps take their own), the CPU default device, float32 matrix products
    in full precision — so the record is the command's whatever the caller set (a run
    trained under the caller's ``torch.no_grad()`` would fail, one under its autocast
    would record other numbers under the same run id). The default dtype stays the
    caller's: models are built in it, and the record says their dtype. After it, the
    caller's torch settings (those of :data:`~creditaudit.guests.settings.SETTINGS`:
    thread count — ``run.threads`` and a resumed run's recorded count are the run's only —
    grad mode, default dtype and device, deterministic mode, matmul precision, cuDNN/TF32
    switches) and random streams (the CPU's; a CUDA device's when CUDA is in use or the run
    may use it) are back: each run seeds its own.
    """
    before = [(setting, setting.read()) for setting in SETTINGS]
    cuda = torch.cuda.is_available() and (torch.cuda.is_initialized() or device != "cpu")
    devices = list(range(torch.cuda.device_count())) if cuda else []
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=devices))
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
            for kind in ("cpu", "cuda"):
                if torch.is_autocast_enabled(kind):
                    stack.enter_context(torch.autocast(kind, enabled=False))
            torch.set_default_device(None)
            torch.set_float32_matmul_precision("highest")
            yield
    finally:
        for setting, value in before:
            if setting.read() != value:
                setting.write(value)


def make_schedule(optimizer: torch.optim.Optimizer, kind: str, total_steps: int
                  ) -> torch.optim.lr_scheduler.LRScheduler:
    """``cosine``: decay from the base rate to 0 over ``total_steps`` (torch's
    CosineAnnealingLR); ``constant``: the base rate throughout."""
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total_steps, 1),
                                                          eta_min=0.0)
    return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)


class _OneValuePerChannel(Exception):
    """Raised inside :func:`refuse_one_sample_batch`'s probe: the name of the BatchNorm."""


def refuse_one_sample_batch(model: nn.Module, sample: torch.Tensor, n_train: int,
                            batch_size: int) -> None:
    """ConfigError when the last batch of every epoch holds one sample (``n_train``
    training samples in batches of ``batch_size``) and a BatchNorm of ``model`` that
    normalises by its batch in training (not one held in eval mode) sees one value per
    channel there (BatchNorm1d, or a feature map of 1×1): torch cannot normalise
    that in training, so the run would fail at the end of its first epoch as if the model
    (a built-in, or a user's factory) were broken.

    ``sample``: ``(N, …)`` model-ready inputs, the first forwarded once in eval mode
    without gradients, under a forked RNG (nothing training draws from advances, nothing
    is updated) to see what each BatchNorm gets. A forward that fails otherwise is left
    to training, which names whose it is.
    """
    last = n_train - (math.ceil(n_train / batch_size) - 1) * batch_size if n_train else 0
    if last != 1:
        return
    net = model.net if isinstance(model, AdaptedModel) else model  # the user's names
    try:
        norms = _batch_statistics_in_training(model, net)
    except Exception:  # noqa: BLE001 — the network's own failure: training names it
        return
    if not norms:
        return

    def probe(name: str):  # noqa: ANN202
        def check(module: nn.Module, args: tuple) -> None:
            if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2 \
                    and args[0].numel() == args[0].shape[1]:
                raise _OneValuePerChannel(name)
        return check

    hooks = [module.register_forward_pre_hook(probe(name)) for name, module in norms]
    devices = [sample.device] if sample.device.type == "cuda" else []
    try:
        # A forked RNG: a network that draws in eval mode leaves training's streams alone.
        with torch.no_grad(), measurement_mode(model), torch.random.fork_rng(devices=devices):
            model(sample[:1])
    except _OneValuePerChannel as found:
        left = (f"optim.batch_size={batch_size} leaves 1 of the {n_train} training samples "
                "for the last batch of every epoch" if batch_size > 1 else
                "optim.batch_size=1 trains on batches of 1 sample")
        raise ConfigError(
            f"{left}, where the model's BatchNorm {found.args[0]!r} sees one value per "
            "channel, which it cannot normalise in training; choose a batch size B ≥ 2 "
            f"with {n_train} mod B ≠ 1") from None
    except Exception:  # noqa: BLE001 — the network's own failure: training names it
        return
    finally:
        for hook in hooks:
            hook.remove()


def _batch_statistics_in_training(model: nn.Module, net: nn.Module
                                  ) -> list[tuple[str, nn.Module]]:
    """(name in ``net``, module) of each BatchNorm that normalises by its batch's statistics
    once the trainer puts ``model`` in training mode (``model.train()``): not one a network
    holds in eval mode (a frozen BatchNorm whose ``train`` keeps it there uses its running
    statistics, and takes a batch of one sample). Every module's flag is put back."""
    flags = [(module, module.training) for module in model.modules()]
    try:
        model.train()
        return [(name, module) for name, module in net.named_modules()
                if isinstance(module, nn.modules.batchnorm._BatchNorm)
                and (module.training or module.running_mean is None)]
    finally:
        for module, training in flags:
            module.training = training


@dataclass
class RebuiltRun:
    """A run brought back from its folder: its plan, its rule (``rule.model`` inside), its
    data, the checkpointed epoch and that epoch's record entry (its test accuracy, the
    rule's own numbers)."""

    plan: RunPlan
    rule: CreditRule
    data: Dataset
    epoch: int
    entry: EpochEntry


def rebuild_refusal(record: RunRecord, run_dir: Path) -> str | None:
    """The one line refusing to rebuild (audit, resume, train) the run of ``record`` in
    ``run_dir`` whose architecture cannot be built again (a run recorded from a user's own
    loop); None for one that can."""
    arch = ARCHITECTURES.find(record.config.model.arch)
    if arch is None or not arch.unbuildable:
        return None
    return f"cannot rebuild {run_dir}: {arch.unbuildable}"


def rebuild_run(record: RunRecord, run_dir: Path, *, dataset: Dataset | None = None,
                folder_fix: str = FOLDER_FIX, audit: bool = False) -> RebuiltRun:
    """The run in ``run_dir`` at its checkpointed epoch, on the CPU.

    Checks that each guest's code is the code the run trained with (its digest; guests
    then pass the door as in training: :func:`~creditaudit.run.plan.plan_run`), that the
    data on disk is the data the run trained on (its fingerprint), and loads
    ``checkpoint.pt`` — this run's, by the record it holds — without unpickling anything
    but tensors and plain containers. The rule steps in the run's precision
    (``run.precision``: bf16 under autocast on the CPU). The caller's RNG is untouched
    (the random init that the checkpoint overwrites is forked). Raises RunRecordError for
    a run without a checkpoint, one that does not fit or is another run's, or whose guest's
    code changed, and ConfigError when a component it used is not installed here.
    ``folder_fix``: how the caller points at the run's data when its files differ;
    ``audit``: the caller audits the run (:func:`~creditaudit.run.resume.check_same_data`).
    """
    config = record.config
    refusal = rebuild_refusal(record, run_dir)
    if refusal is not None:
        raise RunRecordError(refusal)
    checkpoint = run_dir / CHECKPOINT_FILE
    if not checkpoint.exists():
        raise RunRecordError(f"no checkpoint at {checkpoint}: {missing_checkpoint(record)}")
    state = load_checkpoint(checkpoint)
    saved = saved_record(state, checkpoint)
    if saved.run_id == run_dir.name != record.run_id:  # the folder's checkpoint, another record
        check_same_run(record, run_dir.name, run_dir / RECORD_FILE)
    plan = plan_run(config, trained=record)
    if dataset is not None:
        plan.use_data(dataset)
    check_same_data(record, plan.data_identity(), run_dir / RECORD_FILE,
                    folder_fix=folder_fix, audit=audit)
    with torch.random.fork_rng(devices=[]):
        model = plan.build_model()
        rule = plan.build_rule(model)
    load_into(state, checkpoint, config, saved=saved, run_id=record.run_id or run_dir.name,
              model=model, rule=rule)
    # Its steps in the run's precision, as the trained rule's: a bf16 run's under autocast.
    rule.set_precision(config.run.precision, "cpu")
    epoch = int(state["epoch"])
    return RebuiltRun(plan, rule, plan.load_data(), epoch,
                      checkpointed_entry(record, saved, epoch, run_dir))


def missing_checkpoint(record: RunRecord) -> str:
    """Why a run folder holds no checkpoint, and what to do: a run that stopped before its
    first checkpoint never trained, but one whose record is finished or logs a trained
    epoch wrote a checkpoint with every epoch, so its file was moved or deleted (resuming
    cannot make it again: a finished run is served as it is)."""
    trained = [entry.epoch for entry in record.log if entry.epoch >= 1]
    if not record.is_finished and not trained:
        return f"the run never finished an epoch; train it ({train_again()}) first"
    done = f"logs training up to epoch {max(trained)}" if trained else f"is {record.status}"
    return (f"its record {done}, so the file was moved or deleted: restore the run's "
            f"checkpoint.pt, or train the run again with {FORCE}")


def checkpointed_entry(record: RunRecord, saved: RunRecord, epoch: int, run_dir: Path
                       ) -> EpochEntry:
    """The record entry of the checkpointed ``epoch``: record.json's (``record``), else the
    one the checkpoint holds (``saved``: its record as of that epoch) — a record write that
    failed after the checkpoint was written (a full disk) leaves record.json an epoch
    behind, and another epoch's accuracy would be paired with these weights; so does a
    run read while it trains, between its checkpoint's write and its record's. One-line
    RunRecordError when neither has it."""
    entry = record.entry(epoch)
    last = record.log[-1].epoch if record.log else None
    if entry is not None:
        if record.status == "completed" and last is not None and epoch < last:
            log.warning("%s logs a completed run up to epoch %s, but its checkpoint is of "
                        "epoch %d (an older file copied over it?): the weights and numbers "
                        "used are epoch %d's", run_dir / RECORD_FILE, last, epoch, epoch)
        return entry
    entry = saved.entry(epoch)
    if entry is None:
        raise RunRecordError(f"{run_dir / CHECKPOINT_FILE} is of epoch {epoch}, but neither "
                             f"{RECORD_FILE} nor the record it holds logs that epoch: the "
                             f"checkpoint is damaged; start the run again with {FORCE}")
    claim = claim_state(run_dir)
    if claim is not None and claim.stale is None:  # training now: the write is under way
        log.info("%s logs epochs up to %s while the run trains (%s holds it): epoch %d's "
                 "numbers are read from its checkpoint's own record", run_dir / RECORD_FILE,
                 last, claim.who, epoch)
        return entry
    log.warning("%s logs epochs up to %s, but the checkpoint is of epoch %d (its record "
                "write failed?): the epoch's numbers are read from the checkpoint's own "
                "record; resume the run (train … --resume) to bring %s up to date",
                run_dir / RECORD_FILE, last, epoch, RECORD_FILE)
    return entry
