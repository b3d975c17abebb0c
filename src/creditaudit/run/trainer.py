"""The training loop: epochs, evaluation, per-epoch diagnostics, checkpoints and resume.

Every run writes ``OUT_DIR/RUN_ID/record.json`` after each epoch (atomically) and a
checkpoint next to it. A killed run resumes from its last checkpoint to the same final
record (wall-clock fields aside); a run whose loss or states turn NaN/Inf ends with status
``diverged`` and keeps every record so far.

How an epoch is measured for the record (evaluation, diagnostics, the protocol when due)
is :mod:`creditaudit.run.epoch_measurement`'s. What a record holds beyond training — the
protocol of an epoch, the final results, the end-of-run metrics — comes from
:mod:`creditaudit.run.results`, which
:class:`creditaudit.run.recorder.Recorder` shares for runs trained in a user's own loop; what a
run's folder says before training (finished, resume, start over) from
:mod:`creditaudit.run.folder`; how the record ends (finished, interrupted, failed) from
:mod:`creditaudit.run.record_keeping`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from creditaudit.config import RunConfig, config_to_toml
from creditaudit.data import Dataset
from creditaudit.errors import ConfigError, DiskFullError, ended_by_ray
from creditaudit.files.safe_files import atomic_write_bytes, ensure_folder, remove_leftovers
from creditaudit.loggers import LoggerGroup, RunLogger, RunStart, build_loggers
from creditaudit.methods import CreditRule
from creditaudit.optim import make_adamw
from creditaudit.records import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    RUN_FILES,
    EpochEntry,
    ResumedPart,
    new_record,
)
from creditaudit.records.claims import check_held
from creditaudit.records.files import environment, now
from creditaudit.run.checkpoints import TrainingState, restore
from creditaudit.run.data_writes import run_suspects
from creditaudit.run.epoch_measurement import TRAIN_FIX, EpochMeasurement
from creditaudit.run.evaluation import TestEvaluation
from creditaudit.run.folder import RunResult, holding_for_train, prepare_run
from creditaudit.run.init_file import write_initial
from creditaudit.run.plan import RunPlan, plan_run
from creditaudit.run.record_keeping import RecordKeeping
from creditaudit.run.results import (
    finite_entry,
    reference_at_start,
    reference_on_resume,
    rule_extras,
    training_state_fault,
)
from creditaudit.run.resume import changed_settings
from creditaudit.run.run_code import model_guest
from creditaudit.run.setup import (
    caller_process,
    make_schedule,
    refuse_one_sample_batch,
    resolve_device,
)
from creditaudit.run.stack_checkpoints import drop_previous
from creditaudit.run.steps.capture import CapturedEpochs
from creditaudit.run.steps.reported import checked_step
from creditaudit.run.steps.stepping import cuda_graphs_decision, uses_device_data


class Trainer(EpochMeasurement, RecordKeeping):
    """Owns one run: its model, rule, optimiser, schedule, data streams and record.

    Constructing it checks the reference gradient on the model as built
    (:func:`~creditaudit.run.results.reference_at_start`): a model whose backward is not the
    gradient of its forward raises a one-line ReferenceGradientError naming the module,
    before any file of the run is written, unless ``diagnostics.allow_unverified_reference``.
    """

    def __init__(self, config: RunConfig | RunPlan, *, dataset: Dataset | None = None) -> None:
        plan = config if isinstance(config, RunPlan) else plan_run(config)
        if dataset is not None:
            plan.use_data(dataset)
        self.plan = plan
        self.config = config = plan.config
        self.device = resolve_device(config.run.device)
        if config.run.threads is not None:
            torch.set_num_threads(config.run.threads)
        # The torch thread count the epochs run on (a resumed run: the recorded one).
        self.threads = torch.get_num_threads()
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
        self.protocol = plan.protocol
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
        # The model as built, before anything of the run is written: one whose backward is
        # not the gradient is refused here (every cosine would be its own credit).
        self.reference = reference_at_start(
            self.model, self.eval_x, self.eval_y,
            allow=config.diagnostics.allow_unverified_reference, fix=TRAIN_FIX,
            suspects=run_suspects(plan))
        refuse_one_sample_batch(self.model, self.eval_x, self.dataset.train_y.shape[0],
                                config.optim.batch_size)
        self.record = new_record(config, device=str(self.device), data=self.data_identity,
                                 run_id=self.run_id, model=self.model.describe(),
                                 code=plan.code.to_dict())
        self.record.reference = self.reference
        self.rechecks_reference = model_guest(plan.architecture) is not None
        self.cuda_graphs = cuda_graphs_decision(config.run.cuda_graphs, self.device, self.rule,
                                                config.optim.lr)
        self.record.environment["execution"] = {
            "device_data": self.device_data, "cuda_graphs": self.cuda_graphs.text,
            "stacked_runs": 1}
        # What the part of the run this trainer trains runs on: the record's environment, or
        # (resumed) that of its latest part.
        self.environment = self.record.environment
        self._captured: CapturedEpochs | None = None
        self.start_epoch = 1
        self.checkpointed: int | None = None  # the last epoch saved in checkpoint.pt
        self.init_digest: str | None = None  # init.pt's, kept in every checkpoint
        self.loggers = LoggerGroup([])
        self.resuming = False  # set by start()
        self._found = []  # what measuring an epoch found (EpochMeasurement)

    # --- persistence --------------------------------------------------------------------
    @property
    def training_state(self) -> TrainingState:
        """What the checkpoint saves: model, rule, optimiser, schedule, data-order RNG."""
        return TrainingState(self.model, self.rule, self.optimizer, self.scheduler,
                             self.data_generator, self.init_digest)

    def checkpoint(self, epoch: int) -> None:
        check_held(self.run_dir)  # another process took the run over: write nothing
        self.training_state.save(
            self.run_dir / CHECKPOINT_FILE, method=self.config.method.name, epoch=epoch,
            record=self.record)
        self.checkpointed = epoch

    def restore(self) -> None:
        """Continue from the run folder's checkpoint (checked against this run first)."""
        restored = restore(self.run_dir / CHECKPOINT_FILE, self.training_state, self.plan,
                           identity=self.data_identity, device=self.device)
        record = restored.record
        if restored.threads is not None:
            self.threads = restored.threads
            torch.set_num_threads(restored.threads)
        # The record says what ran in every part: the first part's environment and config
        # stay; this part's own environment (threads as just set) and options are added.
        part = ResumedPart(epoch=restored.epoch + 1, started=now(), environment={
            **environment(str(self.device), self.plan.code.to_dict()),
            "execution": self.record.environment["execution"]},
            settings=changed_settings(record.config, self.config))
        record.resumed.append(part)
        self.environment = part.environment
        self.record = record
        # The check of the model as built now (the same model a fresh start builds), or the
        # record's where an epoch's check found a guest's backward changed since
        self.record.reference = reference_on_resume(record.reference, self.reference,
                                                    rechecked=self.rechecks_reference)
        self.record.status = "running"
        # A run that stopped on its walk-back verdict (killed before its final write, in
        # its end-of-run metrics) trains no further epoch: it only finishes, as it would have.
        self.start_epoch = (self.config.optim.epochs + 1 if record.stopped_early
                            else restored.epoch + 1)
        self.checkpointed = restored.epoch
        self.init_digest = restored.init_digest

    # --- one epoch ----------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """Train one epoch; returns the epoch's training stats, or None on divergence."""
        if self.cuda_graphs.on:  # the step captured once and replayed (run.steps.capture)
            if self._captured is None:
                self._captured = CapturedEpochs([self])
            stats = self._captured.train_epoch(epoch)[0]
            if isinstance(stats, Exception):  # its loggers' in log_step: raised, or kept
                return self.loggers.step_failed(stats)  # (a stack's group of one): None
            return stats
        self.model.train()
        loss_sum, correct, n = 0.0, 0, 0
        for step, (x, y) in enumerate(self.train_loader):
            x, y = x.to(self.device), y.to(self.device)
            result = checked_step(self.rule.train_step(x, y, self.optimizer), y.shape[0],
                                  self.rule)
            if not result.finite:
                self.record.divergence = {"epoch": epoch, "step": step,
                                          "reason": "non-finite loss or state"}
                return None
            self.scheduler.step()
            loss_sum += result.loss * result.n
            correct += result.correct
            n += result.n
            self.loggers.log_step(result.loss)
        extra = rule_extras(self.rule, self.rule.end_epoch(epoch, self.config.optim.epochs))
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
            result = self._run(resume)
        except BaseException:
            self.loggers.close_quietly()  # the run's own error is what the caller sees
            raise
        self.loggers.close()
        return result

    def _run(self, resume: bool) -> RunResult:
        try:
            # An interrupt or error once the epoch-0 record is written (its checkpoint, its
            # first logging) ends the run like one in an epoch; before, the folder keeps
            # what it held (:meth:`record_stop`).
            self.start(resume)
            torch.set_num_threads(self.threads)  # another run in this process may set others
            for epoch in range(self.start_epoch, self.config.optim.epochs + 1):
                started = time.perf_counter()
                if self.close_epoch(epoch, self.train_epoch(epoch), started):
                    break
            else:
                self.record.status = "completed"
            self.finish()
        except KeyboardInterrupt as interrupt:
            self.record_stop("interrupted")
            interrupt.add_note(self.interrupted_note())  # what the command line says
            raise
        except DiskFullError:
            # Nothing is wrong with the run: it resumes from its last checkpoint once space
            # is freed.
            self.record_stop("interrupted", disk_full=True)
            raise
        except BaseException as err:  # an Exception, or a guest's sys.exit or BaseException
            if not ended_by_ray(err):  # a worker shut down: its sweep says interrupted
                self.record_stop("failed", err)
            raise
        self.loggers.finish(self.record)
        return RunResult(self.run_dir, self.record, self.rule)

    def start(self, resume: bool) -> None:
        """Before the first epoch: restore a resumed run, or write a new run's folder (config,
        initial weights, the epoch-0 record and checkpoint)."""
        self.resuming = resume
        if resume:
            self.restore()
        # another process took the run over (this one was stopped while it started): touch
        # nothing, its loggers' folders included (a TensorBoard restart mark would drop
        # that process's points)
        check_held(self.run_dir)
        self.loggers.start(RunStart(
            config=self.config, run_id=self.run_id, run_dir=self.run_dir,
            first_epoch=self.start_epoch, epochs=self.config.optim.epochs,
            steps_per_epoch=len(self.train_loader),
            elapsed_before=sum(e.seconds or 0.0 for e in self.record.log),
            reference=self.record.reference.to_dict(),
            resumed_after=self.record.log[-1] if resume and self.record.log else None,
            logged_before=tuple(self.record.log[:-1]) if resume else ()))
        ensure_folder(self.run_dir)
        remove_leftovers(self.run_dir, RUN_FILES)  # temporary files of writes killed (-9)
        drop_previous([self.run_dir])  # a stack's kept checkpoint, its resume decided
        if not resume:
            atomic_write_bytes(self.run_dir / CONFIG_FILE,
                               config_to_toml(self.config).encode())
            self.init_digest = write_initial(self.run_dir, self.model)
            self._log_measured(self._with_lr(self.measure(0), seconds=0.0))
            self._write()
            self.checkpoint(0)
            self.loggers.log_epoch(self.record.log[-1])

    def close_epoch(self, epoch: int, stats: dict[str, Any] | None, started: float) -> bool:
        """Record trained epoch ``epoch`` (``stats`` from :meth:`train_epoch`, None when it
        diverged; ``started``: its perf_counter start): evaluate, check, checkpoint, write,
        log. True when the run ends here (status set: diverged, or completed when the
        protocol verdict stops it). A stack runs each step for all its runs before the
        next (:func:`~creditaudit.run.stacked.train_stacked`)."""
        entry = self.measure_epoch(epoch, stats, started)
        ending = self.save_epoch(entry)
        if entry is not None:
            self.publish_epoch(entry, ending)
        return ending is not None

    def measure_epoch(self, epoch: int, stats: dict[str, Any] | None, started: float
                      ) -> EpochEntry | None:
        """Trained epoch ``epoch``'s entry, evaluated and measured (None: it diverged in
        training); nothing of it saved yet."""
        if stats is None:
            return None
        entry = replace(self.measure(epoch), **stats)
        return self._with_lr(entry, time.perf_counter() - started)

    def save_epoch(self, entry: EpochEntry | None) -> str | None:
        """Add ``entry`` (:meth:`measure_epoch`'s) to the record, check it and checkpoint
        its epoch; the status the run ends with once the entry is written ('diverged', or
        'completed' when the protocol verdict stops it), None when it goes on."""
        if entry is None:
            self.record.status = "diverged"
            return "diverged"
        self._log_measured(entry)
        reason = ("non-finite evaluation loss or state norms" if not finite_entry(entry)
                  else training_state_fault(self.model, self.optimizer))
        if reason is not None:
            # no checkpoint; 'running' until finish() writes its results: a kill between
            # leaves a run to resume, not a bare 'diverged'
            self.record.divergence = {"epoch": entry.epoch, "reason": reason}
            return "diverged"
        stop = self.walkback_stop(entry)
        self.checkpoint(entry.epoch)
        return "completed" if stop else None

    def publish_epoch(self, entry: EpochEntry, ending: str | None) -> None:
        """Write the record holding ``entry`` and log it; then set the status the run ends
        with (``ending``, :meth:`save_epoch`'s)."""
        self._write()
        self.loggers.log_epoch(entry)
        if ending is not None:
            self.record.status = ending

    def _with_lr(self, entry: EpochEntry, seconds: float) -> EpochEntry:
        entry.lr = float(self.optimizer.param_groups[0]["lr"])  # a tensor when captured
        entry.seconds = seconds
        return entry


def train(config: RunConfig | RunPlan, *, resume: bool = False, force: bool = False,
          dataset: Dataset | None = None, loggers: Sequence[RunLogger] = ()) -> RunResult:
    """Train one run and return its folder and record (``config``: the run's config, or its
    :class:`~creditaudit.run.plan.RunPlan`, which is then not planned again; ``dataset``: the
    data :func:`~creditaudit.data.load_dataset` returned for this config, to spare loading it
    again — other data is refused, ConfigError).

    A completed run with the same config and data (same run id) is not rerun: its record is
    returned, and replayed into the loggers asked for (``loggers``, TensorBoard, W&B). An
    unfinished one needs ``resume=True`` (continue from its checkpoint) or ``force=True``
    (start over). The run's folder is held (its ``claim.json``) from the first look until
    the run ends: RunBusyError, one line, while another process holds it (a finished run
    in a folder this process cannot write is served without holding it).

    The run trains as the command would whatever torch settings the caller has (grad mode,
    autocast, matmul precision, …), and leaves the caller's settings, thread count and random
    streams as they were (:func:`~creditaudit.run.setup.caller_process`).
    """
    if not isinstance(config, RunConfig | RunPlan):
        raise ConfigError(f"train() takes a RunConfig, got {type(config).__name__}: build it "
                          "with RunConfig().replace(**{'method.name': 'dfa', …}) or "
                          "load_config(path)")
    device = (config.config if isinstance(config, RunPlan) else config).run.device
    with caller_process(device):  # torch as a command has it; the caller's settings after
        plan = config if isinstance(config, RunPlan) else plan_run(config)
        if dataset is not None:
            plan.use_data(dataset)
        # One process at a time reads, clears and writes the run's folder (RunBusyError
        # names the other); a sweep's worker trains under the claim it holds.
        with holding_for_train(plan.run_dir, force=force):
            ready = prepare_run(plan, resume=resume, force=force, loggers=loggers)
            if isinstance(ready, RunResult):
                return ready
            plan, resume = ready
            return Trainer(plan).run(resume=resume, loggers=loggers)
