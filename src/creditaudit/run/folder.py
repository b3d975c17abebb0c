"""A run's folder before training: its result when it has finished, else how to train it.

:func:`prepare_run` reads ``OUT_DIR/RUN_ID`` once: a finished run with the same run id, on
the same arrays (their digest: the data is loaded to check it), is not rerun, ``resume`` or not (its
:class:`RunResult`, its record replayed into the loggers asked for now); an unfinished one
is resumed (``resume``: with the options its record's epochs used, on the torch thread count
they ran on) or started over (``force``, its files removed) — one whose record.json is gone
but whose checkpoint holds a trained epoch (and the record as of it) too, never trained over
without ``force``; any other case — other arrays included — is one RunRecordError line.
:func:`creditaudit.run.trainer.train` and the stacked runs of :mod:`creditaudit.run.stacked`
start here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from creditaudit.caller import FORCE, RESUME
from creditaudit.config import RunConfig
from creditaudit.data import Dataset
from creditaudit.errors import (
    ConfigError,
    CreditAuditError,
    DiskFullError,
    NewerRecordError,
    OutputError,
    RunRecordError,
)
from creditaudit.loggers import RunLogger, build_loggers, replay
from creditaudit.methods import CreditRule
from creditaudit.models import ResidualNet
from creditaudit.records import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    RECORD_FILE,
    RunRecord,
    load_record,
)
from creditaudit.records.claims import broke_a_claim, holding_run
from creditaudit.run.plan import RunPlan, plan_run
from creditaudit.run.recorder_inputs import clear_run_files
from creditaudit.run.resume import (
    check_same_data,
    check_same_question,
    check_same_record,
    check_same_run,
    resume_threads,
)
from creditaudit.run.run_code import check_same_network
from creditaudit.run.setup import missing_checkpoint, rebuild_run
from creditaudit.run.unresumable import (
    no_run_to_resume,
    restartable,
    started_without_record,
    trained_epoch,
)

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """A run: its folder, its final record, and its trained rule and model.

    ``rule`` (the credit rule, feedback matrices and auxiliary nets included) and ``model``
    (``rule.model``) are the live objects when the run trained in this call, on its training
    device, with the weights of its last epoch. For a run that had already finished they
    are rebuilt on first use, on the CPU, from ``checkpoint.pt`` — the last epoch whose
    weights were finite (a diverged run's epoch that overflowed is logged, never saved) —
    with the rule's options and precision (a bf16 run's steps under bf16 autocast).
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
        return self.rule.model



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



@contextmanager
def holding_for_train(run_dir: Path, *, force: bool) -> Iterator[None]:
    """Hold ``run_dir`` while :func:`~creditaudit.run.trainer.train` reads, clears and writes
    it (:func:`~creditaudit.records.claims.holding_run`: RunBusyError while another process
    holds it). A finished run in a folder this process cannot write (a read-only copy of a
    lab's results) is served without a claim, since serving writes nothing there; without
    ``force`` only, and not for a full disk."""
    with ExitStack() as held:
        try:
            held.enter_context(holding_run(run_dir))
        except OutputError as err:
            if force or isinstance(err, DiskFullError) or not _finished(run_dir):
                raise
            log.info("%s; serving its finished run without holding it", err)
        yield


def _finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds the record of a finished run (an unreadable one: no)."""
    try:
        return load_record(run_dir / RECORD_FILE).is_finished
    except (CreditAuditError, OSError):
        return False


def prepare_run(config: RunConfig | RunPlan, *, resume: bool = False, force: bool = False,
                dataset: Dataset | None = None, loggers: Sequence[RunLogger] = ()
                ) -> RunResult | tuple[RunPlan, bool]:
    """What :func:`train` does before training: the finished run's result (not rerun), or
    (its plan, whether to resume) — with ``force``, the old run's files removed. ``config``:
    the run's config, or its plan when the caller has one (a sweep worker, a stack): it is
    not planned again. Raises RunRecordError for an unfinished run without
    ``resume``/``force`` and for ``resume`` without a run."""
    if resume and force:
        raise ConfigError("resume=True and force=True contradict each other: resume continues "
                          "the run from its checkpoint, force deletes it and starts over; "
                          "pass one of them")
    plan = config if isinstance(config, RunPlan) else plan_run(config)
    config = plan.config
    if dataset is not None:
        plan.use_data(dataset)
    identity = plan.identity
    run_dir = plan.run_dir
    record_path = run_dir / RECORD_FILE
    damaged = None  # why record.json cannot be read, when its checkpoint can stand in
    trained = None  # the trained epoch of the folder's checkpoint, once read
    restart = False  # started over because it trained nothing (not asked with --force)
    if record_path.exists() and not force:
        try:
            existing = load_record(record_path)
        except NewerRecordError as err:  # the newer version's run: --force would delete it
            raise NewerRecordError(f"{err} ({FORCE} would delete it and train the run again "
                                   "with this version)") from None
        except RunRecordError as err:
            damaged = err.fact  # without load_record's advice
            trained = trained_epoch(run_dir, plan.run_id)
            if trained <= 0:  # nothing trained is kept elsewhere
                advice = ("" if FORCE.named_in(damaged)
                          else f"; pass {FORCE} to start this run over")
                raise RunRecordError(f"{damaged}{advice}") from None
    if record_path.exists() and not force and damaged is None:
        check_same_run(existing, plan.run_id, record_path)
        # Served, resumed or restarted only on the arrays it trained on: load them now
        # (training would load them next anyway; the plan keeps them).
        check_same_data(existing, plan.data_identity(), record_path)
        check_same_network(existing, plan.code, plan.architecture, record_path)
        if existing.is_finished:  # with --resume too: there is nothing left to continue
            check_same_record(existing, config, run_dir)
            _replay_finished(config, existing, run_dir, loggers)
            return RunResult(run_dir, existing)
        if restartable(existing, run_dir, resume=resume):
            log.info("run %s stopped before it saved a trained epoch (status %s); starting "
                     "it over", existing.run_id, existing.status)
            force = restart = True
        elif resume:
            check_same_question(existing.config, config, record_path)
            resume_threads(existing, config, record_path)
        else:
            hint = (" (it failed: " + (existing.error or "no error recorded") + ")"
                    if existing.is_failed else "")
            # without a checkpoint --resume could not continue it (a folder copied without
            # its .pt files): say what was lost, not to resume
            advice = (f"pass {RESUME} to continue it or {FORCE} to start over"
                      if (run_dir / CHECKPOINT_FILE).exists() else
                      f"no {CHECKPOINT_FILE}: {missing_checkpoint(existing)}")
            raise RunRecordError(f"run {run_dir} exists with status {existing.status!r}"
                                 f"{hint}: {advice}")
    elif not force and (trained := trained if trained is not None
                        else trained_epoch(run_dir, plan.run_id)) > 0:
        # No readable record.json (deleted, a folder copied without it, cut short, edited),
        # but a checkpoint of a trained epoch, which holds the record as of it: resumed from
        # there — the resumed run writes record.json anew —, never trained over. Another
        # run's checkpoint (copied in by hand) is named first (trained_epoch): --resume
        # refuses it.
        what = f"has no {RECORD_FILE}" if damaged is None else f"has a damaged {RECORD_FILE}"
        if not resume:
            fact = f"{damaged}, " if damaged is not None else f"run {run_dir} {what}, "
            raise RunRecordError(
                f"{fact}but its {CHECKPOINT_FILE} holds trained epoch {trained} and the "
                f"record as of it: pass {RESUME} to continue it from there, or {FORCE} to "
                "start over")
        log.log(logging.INFO if damaged is None else logging.WARNING,
                "run %s %s: resuming it from its checkpoint of epoch %d, which holds the "
                "record as of it", plan.run_id, what, trained)
    elif resume and not record_path.exists():
        # A process killed before it wrote a file of the run (while it loaded the data or
        # checked the model) leaves only its claim, which holding the folder broke.
        if not (started_without_record(run_dir) or broke_a_claim(run_dir)):
            raise no_run_to_resume(config, run_dir, identity, plan.code)
        log.info("run %s stopped before its first record was written; starting it over",
                 plan.run_id)
        force = restart = True
    if force and run_dir.exists():
        # A run started over keeps its config.toml (this run's, rewritten as it starts):
        # stopped (Ctrl-C) before it writes a file, its folder still reads as a run started
        # that trained nothing, which --resume starts over — an empty one, as no run.
        clear_run_files(run_dir, again=f"then pass {FORCE} again",
                        keep=(CONFIG_FILE,) if restart else ())
        resume = False
    return plan, resume
