"""The training loop: epochs, evaluation, per-epoch diagnostics, checkpoints and resume.

Every run writes ``OUT_DIR/RUN_ID/record.json`` after each epoch (atomically) and a
checkpoint next to it. A killed run resumes from its last checkpoint to the same final
record (wall-clock fields aside); a run whose loss or states turn NaN/Inf ends with status
``diverged`` and keeps every record so far.

What a record holds beyond training — the protocol of an epoch (:func:`record_protocol`,
when :func:`protocol_due`), the final results (:func:`final_results`) and the end-of-run
metrics (:func:`end_of_run_metrics`) — are functions of the record, the rule and the
evaluation set, which :class:`creditaudit.recorder.Recorder` shares for runs trained in a
user's own loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from creditaudit.capture import CapturedEpochs
from creditaudit.config import DiagnosticsConfig, RunConfig, config_to_toml
from creditaudit.data import Dataset
from creditaudit.diagnostics.drift import feature_drift
from creditaudit.diagnostics.epoch import EpochMeasures, epoch_diagnostics
from creditaudit.diagnostics.gradients import StateGradients
from creditaudit.diagnostics.quality import NonFiniteModelError, Progress, credit_quality
from creditaudit.errors import DiskFullError, OutputError, RunRecordError
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
from creditaudit.resume import (
    check_same_data,
    check_same_question,
    load_into,
    no_run_to_resume,
    restartable,
)
from creditaudit.run_setup import make_schedule, rebuild_run, resolve_device
from creditaudit.safe_files import atomic_write_bytes, ensure_folder
from creditaudit.stepping import cuda_graphs_decision, uses_device_data

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
        # Data on a GPU: batches drawn and prepared there (the same batches as on the host).
        self.device_data = uses_device_data(config.run.device_data, self.device)
        if self.device_data:
            self.dataset = self.dataset.to(self.device)
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
            generator=self.data_generator, draw_per_epoch=self.device_data,
            random_targets=self.dataset.n_classes if config.data.random_targets else None)
        self.scheduler = make_schedule(self.optimizer, config.optim.schedule,
                                       config.optim.epochs * len(self.train_loader))
        self.eval_x, self.eval_y = eval_x.to(self.device), eval_y.to(self.device)
        self.record = new_record(config, device=str(self.device), data=self.data_identity,
                                 run_id=self.run_id, model=self.model.describe(),
                                 code=plan.code.to_dict())
        self.cuda_graphs = cuda_graphs_decision(config.run.cuda_graphs, self.device, self.rule)
        self.record.environment["execution"] = {
            "device_data": self.device_data, "cuda_graphs": self.cuda_graphs.text,
            "stacked_runs": 1}
        self._captured: CapturedEpochs | None = None
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
                                 "over with --force")
        state = load_checkpoint(path, map_location=self.device)
        record = RunRecord.from_dict(state["record"], f"in checkpoint {path}")
        check_same_data(record, self.data_identity, path)
        check_same_question(record.config, self.config, path)
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
            record_protocol(self.record, entry, sg, measures, protocol=self.protocol,
                            frozen_acc=self.config.diagnostics.frozen_acc,
                            terminal_ln=self.model.terminal_ln)
        return entry

    def _protocol_due(self, epoch: int) -> bool:
        return protocol_due(epoch, self.config.diagnostics.protocol_every,
                            self.config.optim.epochs)

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
        if self.cuda_graphs.on:  # the step captured once and replayed (creditaudit.capture)
            if self._captured is None:
                self._captured = CapturedEpochs([self])
            return self._captured.train_epoch(epoch)[0]
        self.model.train()
        loss_sum, correct, n = 0.0, 0, 0
        for step, (x, y) in enumerate(self.train_loader):
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
        self._start(resume)
        try:
            for epoch in range(self.start_epoch, self.config.optim.epochs + 1):
                started = time.perf_counter()
                if self._close_epoch(epoch, self.train_epoch(epoch), started):
                    break
            else:
                self.record.status = "completed"
            self._finish()
        except KeyboardInterrupt:
            self._stopped("interrupted")
            raise
        except DiskFullError:
            # Nothing is wrong with the run: it resumes from its last checkpoint once space
            # is freed.
            self._stopped("interrupted", disk_full=True)
            raise
        except Exception as err:
            self._stopped("failed", err)
            raise
        self.loggers.finish(self.record)
        return RunResult(self.run_dir, self.record, self.rule)

    def _start(self, resume: bool) -> None:
        """Before the first epoch: restore a resumed run, or write a new run's folder (config,
        initial weights, the epoch-0 record and checkpoint)."""
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

    def _close_epoch(self, epoch: int, stats: dict[str, Any] | None, started: float) -> bool:
        """Record trained epoch ``epoch`` (``stats`` from :meth:`train_epoch`, None when it
        diverged; ``started``: its perf_counter start): evaluate, check, checkpoint, write,
        log. True when the run ends here (status set: diverged, or completed when the
        protocol verdict stops it)."""
        if stats is None:
            self.record.status = "diverged"
            return True
        entry = replace(self.measure(epoch), **stats)
        self.record.log.append(self._with_lr(entry, time.perf_counter() - started))
        if not _finite_entry(entry):
            self.record.status = "diverged"
            self.record.divergence = {"epoch": epoch, "reason":
                                      "non-finite evaluation loss or state norms"}
            self._write()
            self.loggers.log_epoch(entry)
            return True
        stop = self._walkback_stop(entry)
        self.checkpoint(epoch)
        self._write()
        self.loggers.log_epoch(entry)
        if stop:
            self.record.status = "completed"
        return stop

    def _stopped(self, status: str, err: Exception | None = None, *,
                 disk_full: bool = False) -> None:
        """The run stopped on an interrupt or an error: record why and tell the loggers.
        On a full disk the write may fail again; the record then keeps its last state,
        which resumes too."""
        self.record.status = status
        if disk_full:
            with contextlib.suppress(OutputError):
                self._write()
            self.loggers.finish_quietly(self.record)
            return
        if err is not None:
            self.record.error = f"{type(err).__name__}: {err}"
        self._write()
        self.loggers.finish_quietly(self.record)

    def _finish(self) -> None:
        """Final results and end-of-run metrics for completed or diverged runs."""
        self.record.final = final_results(self.record.log)
        if self.config.diagnostics.end_of_run:
            initial = load_parameters(self.run_dir / INIT_FILE, map_location=self.device)
            self.record.diagnostics.update(end_of_run_metrics(
                self.rule, self.eval_x, self.eval_y, initial=initial,
                settings=self.config.diagnostics, seed=self.config.run.seed,
                progress=self.loggers.log_stage))
        self._write()

    def _with_lr(self, entry: EpochEntry, seconds: float) -> EpochEntry:
        entry.lr = float(self.optimizer.param_groups[0]["lr"])  # a tensor when captured
        entry.seconds = seconds
        return entry

    def _write(self) -> None:
        save_record(self.run_dir, self.record)


def protocol_due(epoch: int, every: int, last_epoch: int | None) -> bool:
    """Whether the protocol runs at ``epoch``: every ``every``-th trained epoch (0 = never)
    and the last one, ``last_epoch`` (epoch 0 only when it is the last: before any training
    (d) would compare an untrained net with a trained baseline)."""
    last = last_epoch is not None and epoch == last_epoch
    return every > 0 and ((epoch >= 1 and epoch % every == 0) or last)


def record_protocol(record: RunRecord, entry: EpochEntry, sg: StateGradients,
                    measures: EpochMeasures, *, protocol: Protocol, frozen_acc: float | None,
                    terminal_ln: bool | None) -> None:
    """Evaluate the protocol on an epoch's own measures and gradients (no second backward):
    its statuses and verdict go into ``entry``, the report and the first epoch each
    diagnostic fired into ``record.protocol``. ``frozen_acc``: the baseline of (d) (a
    fraction, None = not evaluated); ``terminal_ln``: whether the model ends in a
    LayerNorm, as the model says."""
    epoch = entry.epoch
    report = evaluate_protocol(
        sg, headline_acc=entry.acc_eval, frozen_acc=frozen_acc, terminal_ln=terminal_ln,
        measures=measures, protocol=protocol, thresholds=protocol.thresholds(),
        metadata={**record_metadata(record), "epoch": epoch})
    entry.protocol = {r.id: r.status for r in report.diagnostics}
    entry.verdict = report.verdict
    state = record.protocol
    if not state.first_fired:
        state.first_fired = dict.fromkeys(r.id for r in report.diagnostics)
    for fired in report.fired:
        if state.first_fired.get(fired) is None:
            state.first_fired[fired] = epoch
    state.epoch, state.verdict, state.fired = epoch, report.verdict, list(report.fired)
    state.report = report.to_dict(norms=False)  # the norms are the entry's


def final_results(log: Sequence[EpochEntry]) -> FinalResults:
    """The headline numbers of a run from its epoch entries: those of the last epoch whose
    evaluation was finite (a network that overflowed predicts one class, and its accuracy,
    that class's share, measures nothing); ``from_epoch`` says which epoch when it is not
    the last."""
    last = log[-1]
    kept = next((e for e in reversed(log) if _finite_entry(e)), None)
    if kept is None:
        return FinalResults(epochs_completed=last.epoch)
    return FinalResults(
        epochs_completed=last.epoch, test_acc=kept.acc_eval, test_loss=kept.test_loss,
        h_L_norm=kept.h_L_norm, g_L_norm=kept.g_L_norm, deep_cos=kept.deep_cos,
        from_epoch=None if kept is last else kept.epoch)


def end_of_run_metrics(rule: CreditRule, eval_x: torch.Tensor, eval_y: torch.Tensor, *,
                       initial: dict[str, torch.Tensor], settings: DiagnosticsConfig,
                       seed: int, progress: Progress | None = None) -> dict[str, Any]:
    """The end-of-run block on the evaluation set ``(N, …)``, ``(N,)``: feature drift from
    the ``initial`` parameters (keyed as ``rule.model.named_parameters()``), the
    credit-quality metrics (ρ, nudging, cosines, Γ, the fresh-feedback null; a non-finite
    model records why not) and the rule's own metrics, under a forked RNG."""
    out: dict[str, Any] = {"drift": feature_drift(initial, dict(rule.model.named_parameters()))}
    try:
        out.update(credit_quality(rule, eval_x, eval_y, rho_samples=settings.rho_samples,
                                  rho_directions=settings.rho_directions,
                                  null_draws=settings.null_draws, etas=NUDGING_ETAS,
                                  seed=seed, rho_flops=settings.rho_flops,
                                  memory_gb=settings.end_of_run_memory_gb,
                                  progress=progress))
    except NonFiniteModelError as err:
        out["credit_quality_error"] = str(err)
    devices = [eval_x.device] if eval_x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # e.g. EP's update cosine with BP
        out.update(rule.run_metrics(eval_x, eval_y))
    return out


def epoch_record(rule: CreditRule, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[dict[str, Any], StateGradients]:
    """(the epoch entry's diagnostic fields, the state gradients) on an evaluation set: what
    an epoch of training records, for one call from a notebook or a test."""
    measures, sg = epoch_diagnostics(rule, x, y)
    entry = EpochEntry(**measures.record_fields())
    derived = {key: entry.value(key) for key in DERIVED}  # test_acc: no test pass here
    return {**measures.record_fields(),
            **{k: v for k, v in derived.items() if v is not None}}, sg


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
    ready = prepare_run(config, resume=resume, force=force, dataset=dataset, loggers=loggers)
    if isinstance(ready, RunResult):
        return ready
    plan, resume = ready
    return Trainer(plan).run(resume=resume, loggers=loggers)


def prepare_run(config: RunConfig, *, resume: bool = False, force: bool = False,
                dataset: Dataset | None = None, loggers: Sequence[RunLogger] = ()
                ) -> RunResult | tuple[RunPlan, bool]:
    """What :func:`train` does before training: the finished run's result (not rerun), or
    (its plan, whether to resume) — with ``force``, the old run's files removed. Raises
    RunRecordError for an unfinished run without ``resume``/``force`` and for ``resume``
    without a run."""
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
        if restartable(existing, run_dir, resume=resume):
            log.info("run %s stopped before its first checkpoint (status %s); starting it "
                     "over", existing.run_id, existing.status)
            force = True
        elif resume:
            check_same_question(existing.config, config, record_path)
        else:
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
    return plan, resume
