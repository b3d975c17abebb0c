"""The training loop: epochs, evaluation, per-epoch diagnostics, checkpoints and resume.

Every run writes ``OUT_DIR/RUN_ID/record.json`` after each epoch (atomically) and a
checkpoint next to it. A killed run resumes from its last checkpoint to the same final
record (wall-clock fields aside); a run whose loss or states turn NaN/Inf ends with status
``diverged`` and keeps every record so far.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from creditaudit.config import RunConfig, config_to_toml
from creditaudit.data import Dataset
from creditaudit.diagnostics.drift import feature_drift
from creditaudit.diagnostics.epoch import EpochMeasures, epoch_diagnostics
from creditaudit.diagnostics.gradients import StateGradients
from creditaudit.diagnostics.quality import NonFiniteModelError, credit_quality
from creditaudit.errors import RunRecordError
from creditaudit.evaluation import KnownPredictions, TestEvaluation
from creditaudit.loggers import LoggerGroup, RunLogger, RunStart, build_loggers, replay
from creditaudit.methods import CreditRule
from creditaudit.models import ResidualNet
from creditaudit.models.contract import eval_mode, parameter_snapshot
from creditaudit.optim import make_adamw
from creditaudit.plan import RunPlan, plan_run
from creditaudit.protocol import (
    WALK_BACK,
    evaluate_protocol,
    labels,
)
from creditaudit.protocol.records import record_metadata
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    CONFIG_FILE,
    DERIVED,
    INIT_FILE,
    RECORD_FILE,
    EpochEntry,
    FinalResults,
    RunRecord,
    atomic_torch_save,
    load_checkpoint,
    load_parameters,
    load_record,
    new_record,
    save_record,
)
from creditaudit.resume import check_same_data, load_into, no_run_to_resume
from creditaudit.run_setup import make_schedule, rebuild_run, resolve_device
from creditaudit.safe_files import atomic_write_bytes, ensure_folder

log = logging.getLogger(__name__)
# Step sizes of the end-of-run nudging test.
NUDGING_ETAS = (0.01, 0.1)


@dataclass
class RunResult:
    """A run: its folder, its final record, and its trained rule and model.

    ``rule`` (the credit rule, feedback matrices and auxiliary nets included) and ``model``
    (``rule.model``) are the live objects when the run trained in this call, on its training
    device, with the weights of its last epoch. For a run that had already finished they
    are rebuilt on first use, on the CPU, from ``checkpoint.pt`` — the last epoch whose
    weights were finite (a diverged run's epoch that overflowed is logged, never saved).
    """

    run_dir: Path
    record: RunRecord
    _rule: CreditRule | None = field(default=None, repr=False, compare=False)

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def rule(self) -> CreditRule:
        if self._rule is None:
            self._rule = rebuild_run(self.record, self.run_dir).rule
        return self._rule

    @property
    def model(self) -> ResidualNet:
        return self.rule.model  # type: ignore[return-value]


class Trainer:
    """Owns one run: its model, rule, optimiser, schedule, data streams and record."""

    def __init__(self, config: RunConfig | RunPlan, *, dataset: Dataset | None = None) -> None:
        plan = config if isinstance(config, RunPlan) else plan_run(config)
        if dataset is not None:
            plan.use_data(dataset)
        self.plan = plan
        self.config = config = plan.config
        self.device = resolve_device(config.run.device)
        if config.run.threads is not None:
            torch.set_num_threads(config.run.threads)
        self.dataset = plan.load_data()
        self.data_identity = plan.data_identity()
        self.run_id = plan.run_id
        self.run_dir = plan.run_dir
        self.flatten = plan.flatten
        self.eval_indices = self.dataset.eval_indices(plan.eval_samples)
        # Epochs with diagnostics reuse their predictions on the evaluation subset.
        self.test_evaluation = TestEvaluation(self.dataset, flatten=self.flatten,
                                              shared=self.eval_indices)
        self.full_evaluation = TestEvaluation(self.dataset, flatten=self.flatten)
        eval_x, eval_y = self.dataset.eval_subset(plan.eval_samples, flatten=self.flatten)
        torch.manual_seed(config.run.seed)
        self.model = plan.build_model().to(self.device)
        self.rule: CreditRule = plan.build_rule(self.model).to(self.device)
        self.rule.set_precision(config.run.precision, self.device.type)
        self.protocol = Protocol.from_config(config.diagnostics)
        self.optimizer = make_adamw(self.rule.trainable_parameters(), lr=config.optim.lr,
                                    weight_decay=config.optim.weight_decay)
        self.data_generator = torch.Generator().manual_seed(config.run.seed)
        self.train_loader = self.dataset.loader(
            "train", config.optim.batch_size, flatten=self.flatten, shuffle=True,
            generator=self.data_generator)
        self.scheduler = make_schedule(self.optimizer, config.optim.schedule,
                                       config.optim.epochs * len(self.train_loader))
        self.eval_x, self.eval_y = eval_x.to(self.device), eval_y.to(self.device)
        self.record = new_record(config, device=str(self.device), data=self.data_identity,
                                 run_id=self.run_id, model=self.model.describe(),
                                 code=plan.code.to_dict())
        self.start_epoch = 1
        self.loggers = LoggerGroup([])

    # --- persistence --------------------------------------------------------------------
    def checkpoint(self, epoch: int) -> None:
        atomic_torch_save(self.run_dir / CHECKPOINT_FILE, {
            "format": CHECKPOINT_FORMAT,
            "method": self.config.method.name,
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rule": self.rule.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "data": self.data_generator.get_state()},
            "record": self.record.to_dict(),
        })

    def restore(self) -> None:
        path = self.run_dir / CHECKPOINT_FILE
        if not path.exists():
            raise RunRecordError(f"cannot resume: no checkpoint at {path}; start the run "
                                 "without --resume")
        state = load_checkpoint(path, map_location=self.device)
        record = RunRecord.from_dict(state["record"], f"in checkpoint {path}")
        check_same_data(record, self.data_identity, path)
        load_into(state, path, self.config, model=self.model, rule=self.rule,
                  optimizer=self.optimizer, scheduler=self.scheduler,
                  generator=self.data_generator)
        self.rule.to(self.device)
        self.record = record
        self.record.status = "running"
        self.start_epoch = state["epoch"] + 1

    # --- one epoch ----------------------------------------------------------------------
    def measure(self, epoch: int) -> EpochEntry:
        """Evaluation and diagnostics for the record of ``epoch`` (never changes training).

        When the diagnostics run, their forward pass over the evaluation subset also gives
        those samples' test predictions, so the evaluation forwards only the rest. In eval
        mode: BatchNorm uses (and leaves) its running statistics, so the test set never moves
        them and every diagnostic is per sample.
        """
        with eval_mode(self.model):
            return self._measure(epoch)

    def _measure(self, epoch: int) -> EpochEntry:
        every = self.config.diagnostics.every
        protocol_due = self._protocol_due(epoch)
        fields: dict[str, Any] = {}
        known = sg = measures = None
        if epoch % every == 0 or epoch == self.config.optim.epochs or protocol_due:
            measures, sg = epoch_diagnostics(self.rule, self.eval_x, self.eval_y)
            fields = measures.record_fields()
            known = KnownPredictions.from_logits(self.eval_indices, sg.logits, self.eval_y)
        evaluation = self.test_evaluation if known is not None else self.full_evaluation
        test_loss, test_acc = evaluation.run(self.model, self.device, known)
        entry = EpochEntry(epoch=epoch, test_loss=test_loss, acc_eval=test_acc, **fields)
        if protocol_due and sg is not None and measures is not None:
            self._record_protocol(entry, sg, measures)
        return entry

    def _protocol_due(self, epoch: int) -> bool:
        """Every k-th trained epoch, and the final one (epoch 0 only for 0-epoch runs:
        before any training (d) would compare an untrained net with a trained baseline)."""
        k = self.config.diagnostics.protocol_every
        last = epoch == self.config.optim.epochs
        return k > 0 and ((epoch >= 1 and epoch % k == 0) or last)

    def _record_protocol(self, entry: EpochEntry, sg: StateGradients,
                         measures: EpochMeasures) -> None:
        """The protocol from the epoch's own measures and gradients (no second backward)."""
        epoch = entry.epoch
        report = evaluate_protocol(
            sg, headline_acc=entry.acc_eval, frozen_acc=self.config.diagnostics.frozen_acc,
            terminal_ln=self.model.terminal_ln, measures=measures, protocol=self.protocol,
            thresholds=self.protocol.thresholds(),
            metadata={**record_metadata(self.record), "epoch": epoch})
        entry.protocol = {r.id: r.status for r in report.diagnostics}
        entry.verdict = report.verdict
        state = self.record.protocol
        if not state.first_fired:
            state.first_fired = dict.fromkeys(r.id for r in report.diagnostics)
        for fired in report.fired:
            if state.first_fired.get(fired) is None:
                state.first_fired[fired] = epoch
        state.epoch, state.verdict, state.fired = epoch, report.verdict, list(report.fired)
        state.report = report.to_dict(norms=False)  # the norms are the entry's

    def _walkback_stop(self, entry: EpochEntry) -> bool:
        """With stop_on_walkback: mark the run stopped once the verdict turns."""
        if not (self.config.diagnostics.stop_on_walkback and entry.verdict == WALK_BACK):
            return False
        fired = [i for i, status in (entry.protocol or {}).items() if status == "fired"]
        self.record.stopped_early = {
            "epoch": entry.epoch,
            "reason": f"protocol verdict needs walk-back: {labels(fired)}"}
        return True

    def train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """Train one epoch; returns the epoch's training stats, or None on divergence."""
        self.model.train()
        loss_sum, correct, n = 0.0, 0, 0
        random_targets = self.config.data.random_targets
        for step, (x, y) in enumerate(self.train_loader):
            if random_targets:
                y = torch.randint(0, self.dataset.n_classes, y.shape, generator=self.data_generator)
            x, y = x.to(self.device), y.to(self.device)
            result = self.rule.train_step(x, y, self.optimizer)
            if not result.finite:
                self.record.divergence = {"epoch": epoch, "step": step,
                                          "reason": "non-finite loss or state"}
                return None
            self.scheduler.step()
            loss_sum += result.loss * result.n
            correct += result.correct
            n += result.n
            self.loggers.log_step(result.loss)
        extra = self.rule.end_epoch(epoch, self.config.optim.epochs)
        return {"train_loss": loss_sum / max(n, 1), "train_acc": correct / max(n, 1),
                "extras": extra}

    # --- the run ------------------------------------------------------------------------
    def run(self, *, resume: bool = False, loggers: Sequence[RunLogger] = ()) -> RunResult:
        """Train (or resume) the run; ``loggers`` are added to those the config asks for."""
        # Loggers first: a missing package or an unusable folder must stop the run before
        # its folder holds a record that says 'running'.
        self.loggers = build_loggers(self.config, self.run_id)
        self.loggers.loggers.extend(loggers)
        try:
            return self._run(resume)
        finally:
            self.loggers.close()

    def _run(self, resume: bool) -> RunResult:
        if resume:
            self.restore()
        self.loggers.start(RunStart(
            config=self.config, run_id=self.run_id, run_dir=self.run_dir,
            first_epoch=self.start_epoch, epochs=self.config.optim.epochs,
            steps_per_epoch=len(self.train_loader),
            elapsed_before=sum(e.seconds or 0.0 for e in self.record.log)))
        ensure_folder(self.run_dir)
        if not resume:
            atomic_write_bytes(self.run_dir / CONFIG_FILE,
                               config_to_toml(self.config).encode())
            atomic_torch_save(self.run_dir / INIT_FILE, parameter_snapshot(self.model))
            self.record.log.append(self._with_lr(self.measure(0), seconds=0.0))
            self._write()
            self.checkpoint(0)
            self.loggers.log_epoch(self.record.log[-1])
        try:
            for epoch in range(self.start_epoch, self.config.optim.epochs + 1):
                started = time.perf_counter()
                stats = self.train_epoch(epoch)
                if stats is None:
                    self.record.status = "diverged"
                    break
                entry = replace(self.measure(epoch), **stats)
                self.record.log.append(self._with_lr(entry, time.perf_counter() - started))
                if not _finite_entry(entry):
                    self.record.status = "diverged"
                    self.record.divergence = {"epoch": epoch, "reason":
                                              "non-finite evaluation loss or state norms"}
                    self._write()
                    self.loggers.log_epoch(entry)
                    break
                stop = self._walkback_stop(entry)
                self.checkpoint(epoch)
                self._write()
                self.loggers.log_epoch(entry)
                if stop:
                    self.record.status = "completed"
                    break
            else:
                self.record.status = "completed"
            self._finish()
        except KeyboardInterrupt:
            self.record.status = "interrupted"
            self._write()
            self.loggers.finish_quietly(self.record)
            raise
        except Exception as err:
            self.record.status = "failed"
            self.record.error = f"{type(err).__name__}: {err}"
            self._write()
            self.loggers.finish_quietly(self.record)
            raise
        self.loggers.finish(self.record)
        return RunResult(self.run_dir, self.record, self.rule)

    def _finish(self) -> None:
        """Final results and end-of-run metrics for completed or diverged runs."""
        last = self.record.log[-1]
        self.record.final = FinalResults(
            epochs_completed=last.epoch, test_acc=last.acc_eval, test_loss=last.test_loss,
            h_L_norm=last.h_L_norm, g_L_norm=last.g_L_norm, deep_cos=last.deep_cos)
        if self.config.diagnostics.end_of_run:
            initial = load_parameters(self.run_dir / INIT_FILE, map_location=self.device)
            self.record.diagnostics.drift = feature_drift(
                initial, dict(self.model.named_parameters()))
            self.record.diagnostics.update(self._credit_quality())
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):  # e.g. EP's update cosine with BP
                self.record.diagnostics.update(self.rule.run_metrics(self.eval_x, self.eval_y))
        self._write()

    def _credit_quality(self) -> dict[str, Any]:
        """End-of-run credit metrics; a non-finite (diverged) model records why instead."""
        settings = self.config.diagnostics
        try:
            return credit_quality(self.rule, self.eval_x, self.eval_y,
                                  rho_samples=settings.rho_samples,
                                  rho_directions=settings.rho_directions,
                                  null_draws=settings.null_draws, etas=NUDGING_ETAS,
                                  seed=self.config.run.seed, progress=self.loggers.log_stage)
        except NonFiniteModelError as err:
            return {"credit_quality_error": str(err)}

    def _with_lr(self, entry: EpochEntry, seconds: float) -> EpochEntry:
        entry.lr = self.optimizer.param_groups[0]["lr"]
        entry.seconds = seconds
        return entry

    def _write(self) -> None:
        save_record(self.run_dir, self.record)


def epoch_record(rule: CreditRule, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[dict[str, Any], StateGradients]:
    """(the epoch entry's diagnostic fields, the state gradients) on an evaluation set: what
    an epoch of training records, for one call from a notebook or a test."""
    measures, sg = epoch_diagnostics(rule, x, y)
    entry = EpochEntry(**measures.record_fields())
    return {key: entry.value(key) for key in (*measures.record_fields(), *DERIVED)}, sg


def _finite_entry(entry: EpochEntry) -> bool:
    """False when the evaluation loss or any state norm is NaN/Inf."""
    values = [entry.test_loss, *(entry.hidden_norms or [])]
    return all(v is not None and math.isfinite(v) for v in values)


def _replay_finished(config: RunConfig, record: RunRecord, run_dir: Path,
                     loggers: Sequence[RunLogger]) -> None:
    """A finished run trains no more, but the loggers asked for now (``--tensorboard``,
    ``--wandb``, ``loggers=``) get its record: every epoch, the protocol, the end-of-run
    metrics and the config, as a live run logs them."""
    group = build_loggers(config, record.run_id, console=False)
    group.loggers.extend(loggers)
    replayed = "; its record is replayed into the loggers" if group else ""
    log.info("run %s already %s; not rerun%s", record.run_id, record.status, replayed)
    if group:
        replay(record, run_dir, group)


def train(config: RunConfig, *, resume: bool = False, force: bool = False,
          dataset: Dataset | None = None, loggers: Sequence[RunLogger] = ()) -> RunResult:
    """Train one run and return its folder and record.

    A completed run with the same config and data (same run id) is not rerun: its record is
    returned, and replayed into the loggers asked for (``loggers``, TensorBoard, W&B). An
    unfinished one needs ``resume=True`` (continue from its checkpoint) or ``force=True``
    (start over).
    """
    plan = plan_run(config)
    if dataset is not None:
        plan.use_data(dataset)
    identity = plan.identity
    run_dir = plan.run_dir
    record_path = run_dir / RECORD_FILE
    if record_path.exists() and not force:
        try:
            existing = load_record(record_path)
        except RunRecordError as err:
            raise RunRecordError(f"{err}; pass --force to start this run over") from None
        check_same_data(existing, identity, record_path)
        if existing.is_finished and not resume:
            _replay_finished(config, existing, run_dir, loggers)
            return RunResult(run_dir, existing)
        if not resume:
            hint = (" (it failed: " + (existing.error or "no error recorded") + ")"
                    if existing.is_failed else "")
            raise RunRecordError(f"run {run_dir} exists with status {existing.status!r}"
                                 f"{hint}: pass --resume to continue it or --force to start "
                                 "over")
    elif resume and not record_path.exists():
        raise no_run_to_resume(config, run_dir, identity)
    if force and run_dir.exists():
        for name in (RECORD_FILE, CHECKPOINT_FILE, INIT_FILE, CONFIG_FILE):
            (run_dir / name).unlink(missing_ok=True)
        resume = False
    return Trainer(plan).run(resume=resume, loggers=loggers)
