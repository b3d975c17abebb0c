"""Several runs trained as one stacked model, each with its own folder, record and checkpoint.

Runs whose configs differ only in :data:`VARYING` keys (seeds, learning rates, weight decay,
λ, feedback seeds and scales, diagnostics settings) and whose rule steps stacked (its class
declares a ``stacked_step``, :meth:`~creditaudit.methods.CreditRule.stacks_as`) share one
training step per batch
(:mod:`creditaudit.methods.stacked`); everything else — data order, optimiser, schedule,
evaluation, diagnostics, checkpoints, resume, the record — is each run's own, as if it
trained alone. :func:`~creditaudit.run.stack_groups.stack_groups` finds such groups in a
list of configs (``creditaudit sweep --stack K``); :func:`train_stacked` trains one group.

::

    from creditaudit.run.stacked import train_stacked
    results = train_stacked([config.replace(**{"run.seed": s}) for s in (1, 2, 3, 4)])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from creditaudit.errors import ConfigError, DiskFullError, ended_by_ray
from creditaudit.guests.blame import guest_failure
from creditaudit.loggers import RunLogger, build_loggers
from creditaudit.methods.stacked import stack_refusal
from creditaudit.records.claims import holding_run
from creditaudit.run.folder import RunResult, prepare_run
from creditaudit.run.plan import RunPlan, plan_run
from creditaudit.run.setup import caller_process
from creditaudit.run.stack_checkpoints import drop_previous, keep_previous, resume_together
from creditaudit.run.stack_groups import (  # noqa: F401 — importable from here as before
    VARYING,
    VARYING_SECTIONS,
    Run,
    check_stackable,
    config_and_rule,
    stack_groups,
    stack_key,
)
from creditaudit.run.steps.capture import CapturedEpochs
from creditaudit.run.steps.epochs import StackedEpochs
from creditaudit.run.steps.stepping import STACKED_WITH_UNCAPTURED
from creditaudit.run.trainer import Trainer

log = logging.getLogger(__name__)
# What no run's failure is: an interrupt and a full disk stop every run (resumable), a
# generator's close passes; anything else a run raises — an Exception, a guest's sys.exit or
# BaseException of its own — fails that run, recorded as a run alone records it.
NOT_A_FAILURE = (KeyboardInterrupt, GeneratorExit, DiskFullError)


@contextmanager
def _own_rng(states: dict[int, torch.Tensor], trainer: Trainer) -> Iterator[None]:
    """Inside the block the global torch RNG is ``trainer``'s own, as if it ran alone (its
    checkpoints save it; nothing in training draws from it)."""
    torch.set_rng_state(states[id(trainer)])
    try:
        yield
    finally:
        states[id(trainer)] = torch.get_rng_state()


def train_stacked(configs: Sequence[Run], *, resume: bool | Sequence[bool] = False,
                  force: bool | Sequence[bool] = False,
                  loggers: Sequence[RunLogger] = (),
                  after_record: dict[str, Exception] | None = None) -> list[RunResult]:
    """Train ``configs`` as one stack; one result per config, in order. Each is a run's
    config, or its plan (a sweep worker's: not planned again).

    ``resume`` and ``force`` (one for all, or one per config) mean what they mean for
    :func:`~creditaudit.run.trainer.train`; finished runs are returned without training, and
    a run that cannot stack (its rule, a model with buffers) trains alone, after the
    others (its failure fails it alone, as below). Runs resumed from different epochs, or
    on different torch thread counts (each goes on with the count it ran on), train in one
    stack per starting epoch and count; a run left alone in its stack (there, or once the
    others have ended) takes its own step, bit for bit the run trained alone. An error in
    the shared step fails every run still training in the stack (and is raised); one in a
    run's start (its checkpoint read), its evaluation or end-of-run block, or its loggers
    (``loggers`` go to every run: :func:`~creditaudit.loggers.current_run_id` tells them
    which run a call is for) fails that run alone — an error being anything but an
    interrupt or a full disk (:data:`NOT_A_FAILURE`: a guest's ``sys.exit`` or own
    ``BaseException`` too), recorded as the run alone records it; a logger's error in ``finish`` or
    ``close`` of a run that completed is raised once every run has ended — or, with an
    ``after_record`` dict, kept there under its run's id (the first of each run) and not
    raised. ConfigError when the configs differ in more than :data:`VARYING` or list one
    run twice; RunRecordError as :func:`train` raises it; both before anything trains.
    Torch's settings are as :func:`train` has them; the caller's settings, thread count and
    random streams are back afterwards. Each run's folder is held as :func:`train` holds it
    (RunBusyError while another process holds one, before anything trains).
    """
    first = configs[0] if configs else None
    device = first.config.run.device if isinstance(first, RunPlan) else (
        first.run.device if first is not None else "cpu")
    with caller_process(device):
        check_stackable(configs)
        plans = [c if isinstance(c, RunPlan) else plan_run(c) for c in configs]
        _refuse_repeated_runs(plans)
        with ExitStack() as held:
            for plan in plans:
                held.enter_context(holding_run(plan.run_dir))
            return _train_stacked(plans, resume=resume, force=force, loggers=loggers,
                                  after_record=after_record)


def _train_stacked(plans: list[RunPlan], *, resume: bool | Sequence[bool],
                   force: bool | Sequence[bool], loggers: Sequence[RunLogger],
                   after_record: dict[str, Exception] | None) -> list[RunResult]:
    n = len(plans)
    resumes = [resume] * n if isinstance(resume, bool) else list(resume)
    forces = [force] * n if isinstance(force, bool) else list(force)
    # killed between two checkpoint writes: the runs resumed go on from one epoch (one
    # started over, --force, is no reason to put another back)
    resume_together([plan.run_dir for plan, r, f in zip(plans, resumes, forces, strict=True)
                     if r and not f])
    ready = [prepare_run(p, resume=r, force=f, loggers=loggers)
             for p, r, f in zip(plans, resumes, forces, strict=True)]
    results: dict[int, RunResult] = {i: r for i, r in enumerate(ready)
                                     if isinstance(r, RunResult)}
    todo = [(i, r) for i, r in enumerate(ready) if not isinstance(r, RunResult)]
    _share_data([plan for _, (plan, _) in todo])
    rng: dict[int, torch.Tensor] = {}
    trainers: list[tuple[int, Trainer, bool]] = []
    for index, (plan, resume_run) in todo:
        trainer = Trainer(plan)
        rng[id(trainer)] = torch.get_rng_state()
        trainers.append((index, trainer, resume_run))
    alone = [(i, t, r) for i, t, r in trainers if stack_refusal(t.rule) is not None
             or len(t.train_loader) != len(trainers[0][1].train_loader)]
    stacked = [item for item in trainers if item not in alone]
    started: list[Trainer] = []
    # (run id, error) of loggers that raised after a final record: raised once every run
    # has ended (the first), or handed to after_record
    logger_errors: list[tuple[str, Exception]] = []
    try:
        for index, trainer, resume_run in list(stacked):
            with _own_rng(rng, trainer):
                try:
                    # its loggers (a TensorBoard folder it cannot write, say), its checkpoint
                    trainer.loggers = build_loggers(trainer.config, trainer.run_id,
                                                    stacked=len(stacked) > 1)
                    trainer.loggers.loggers.extend(loggers)
                    trainer.start(resume_run)
                except NOT_A_FAILURE:
                    raise
                except BaseException as err:  # noqa: BLE001 — it fails alone
                    if ended_by_ray(err):
                        raise
                    results[index] = _failed_start(trainer, err)
                    stacked.remove((index, trainer, resume_run))
                    continue
            started.append(trainer)
        # One stack per starting epoch and thread count (a resumed run keeps the count it
        # ran on).
        for start, threads in sorted({(t.start_epoch, t.threads) for _, t, _ in stacked}):
            group = [t for _, t, _ in stacked if (t.start_epoch, t.threads) == (start, threads)]
            uncaptured = not all(t.cuda_graphs.on for t in group)
            for trainer in group:
                trainer.environment["execution"]["stacked_runs"] = len(group)
                if uncaptured and trainer.cuda_graphs.on:  # the stack trains eagerly
                    trainer.cuda_graphs = STACKED_WITH_UNCAPTURED
                    trainer.environment["execution"]["cuda_graphs"] = trainer.cuda_graphs.text
            torch.set_num_threads(threads)
            for trainer, result in zip(group, _train_group(group, rng, logger_errors),
                                       strict=True):
                results[next(i for i, t, _ in stacked if t is trainer)] = result
    except (KeyboardInterrupt, DiskFullError) as stop:
        # The runs started and not stopped yet (those of a stack still to train, one started
        # before the others) are interrupted too: each resumes from its last checkpoint.
        _interrupt([t for t in started if t.record.status == "running"], stop)
        raise
    for index, trainer, resume_run in alone:
        log.info("run %s trains alone: %s", trainer.run_id, stack_refusal(trainer.rule)
                 or "its data give another number of batches per epoch")
        with _own_rng(rng, trainer):
            try:
                results[index] = trainer.run(resume=resume_run, loggers=loggers)
            except NOT_A_FAILURE:
                raise
            except BaseException as err:  # noqa: BLE001 — recorded by run(); the rest train on
                if ended_by_ray(err):
                    raise
                if trainer.record.is_finished:  # a logger's finish or close, after it
                    if not isinstance(err, Exception):  # (a guest logger's is a GuestError)
                        raise
                    logger_errors.append((trainer.run_id, err))
                    results[index] = RunResult(trainer.run_dir, trainer.record, trainer.rule)
                else:
                    results[index] = _failed(trainer, err)
    if logger_errors and after_record is None:
        raise logger_errors[0][1]
    for run_id, err in logger_errors:
        after_record.setdefault(run_id, err)  # type: ignore[union-attr]
    return [results[i] for i in range(n)]


def _refuse_repeated_runs(plans: list[RunPlan]) -> None:
    """ConfigError when two of ``plans`` are one run (the same run id): both would train
    into its one folder, and its record would count it twice in its stack."""
    first: dict[str, int] = {}
    for index, plan in enumerate(plans, start=1):
        if plan.run_id in first:
            raise ConfigError(f"runs {first[plan.run_id]} and {index} of the stack are the "
                              f"same run ({plan.run_id}): list each run once")
        first[plan.run_id] = index


def _failed_start(trainer: Trainer, err: BaseException) -> RunResult:
    """The result of a run whose start (its checkpoint read, its epoch-0 record) raised
    ``err``: failed, with the other runs of its stack training on. Its folder keeps what
    it held when nothing of this part was recorded yet, as when it runs alone."""
    trainer.record_stop("failed", err)
    trainer.loggers.close_quietly()
    return _failed(trainer, err)


def _failed(trainer: Trainer, err: BaseException) -> RunResult:
    """The failed result of ``trainer``'s run, ended by ``err`` (recorded where its record
    could say it: :meth:`Trainer.record_stop`)."""
    record = trainer.record
    record.status = "failed"
    record.error = record.error or guest_failure(err) or f"{type(err).__name__}: {err}"
    return RunResult(trainer.run_dir, record)


def _share_data(plans: list[RunPlan]) -> None:
    """Plans with the same data identity train on one loaded copy."""
    loaded: dict[str, Any] = {}
    for plan in plans:
        key = plan.identity.fingerprint
        if key in loaded:
            plan.use_data(loaded[key])
        else:
            loaded[key] = plan.load_data()


class AloneEpochs:
    """The epochs of a group of one run: its own step (:meth:`Trainer.train_epoch`), bit for
    bit the run trained alone, as its record's ``stacked_runs`` = 1 says."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def train_epoch(self, epoch: int) -> list[dict[str, Any] | Exception | None]:
        """The run's training stats of ``epoch`` (None: diverged), as a list of one; or the
        exception its loggers raised in ``log_step`` (the run fails alone, as in a stack)."""
        with self.trainer.loggers.kept_step_error() as kept:
            stats = self.trainer.train_epoch(epoch)
        return [kept[0] if kept else stats]


def epoch_runner(group: list[Trainer]) -> StackedEpochs | AloneEpochs:
    """The group's epoch runner: a run left alone takes its own step; a stack is captured
    on CUDA where every run's decision says so, else eager, checked every step on the
    CPU (a read costs nothing there) and once per epoch on a GPU."""
    first = group[0]
    if len(group) == 1:
        return AloneEpochs(first)
    if all(t.cuda_graphs.on for t in group):
        return CapturedEpochs(group)
    return StackedEpochs(group, check="step" if first.device.type == "cpu" else "epoch")


def _train_group(group: list[Trainer], rng: dict[int, torch.Tensor],
                 logger_errors: list[tuple[str, Exception]]) -> list[RunResult]:
    """Train runs that all start at the same epoch (their ``_start`` done). A logger's
    error in ``finish`` or ``close`` of a run that ended goes to ``logger_errors``: the
    run's record is final, and the others train on."""
    results: dict[int, RunResult] = {}
    live = list(group)
    runner = epoch_runner(live)

    def finish(trainer: Trainer) -> None:
        with _own_rng(rng, trainer):
            try:
                trainer.finish()
            except NOT_A_FAILURE:
                raise  # e.g. no run of the stack can write: all stop, resumable (below)
            except BaseException as err:  # noqa: BLE001 — one run's failure ends it alone
                if ended_by_ray(err):
                    raise
                trainer.record_stop("failed", err)
                results[id(trainer)] = RunResult(trainer.run_dir, trainer.record)
                return
        results[id(trainer)] = RunResult(trainer.run_dir, trainer.record, trainer.rule)
        try:  # its record is final: a logger's error there is raised once the stack ends
            trainer.loggers.finish(trainer.record)
        except Exception as err:  # noqa: BLE001 — kept for the caller, as train() raises it
            trainer.loggers.close_quietly()
            logger_errors.append((trainer.run_id, err))
            return
        try:
            trainer.loggers.close()
        except Exception as err:  # noqa: BLE001 — as above
            logger_errors.append((trainer.run_id, err))

    try:
        for epoch in range(group[0].start_epoch, group[0].config.optim.epochs + 1):
            started = time.perf_counter()
            stats = runner.train_epoch(epoch)
            share = (time.perf_counter() - started) / len(live)  # each run's part of it
            ended = _close_epoch(live, epoch, stats, share, rng, results)
            for trainer in ended:
                finish(trainer)
            remaining = [t for t in live if id(t) not in results]
            if not remaining:
                break
            if len(remaining) != len(live):
                live, runner = remaining, epoch_runner(remaining)
                if epoch < group[0].config.optim.epochs:
                    _record_smaller_stack(live, epoch + 1)
        else:
            for trainer in live:
                if id(trainer) not in results:
                    trainer.record.status = "completed"
                    finish(trainer)
    except (KeyboardInterrupt, DiskFullError) as stop:
        # Nothing is wrong with the runs: each resumes from its last checkpoint, as a run
        # trained alone does (a full disk is 'interrupted', not 'failed').
        _interrupt([t for t in live if id(t) not in results], stop)
        raise
    except GeneratorExit:
        raise
    except BaseException as err:  # the shared step's (a guest's own BaseException too)
        if ended_by_ray(err):  # a worker shut down: its sweep says interrupted
            raise
        for trainer in live:
            if id(trainer) not in results:
                trainer.record_stop("failed", err)
                trainer.loggers.close_quietly()
        raise
    return [results[id(t)] for t in group]


def _close_epoch(live: list[Trainer], epoch: int, stats: list[dict[str, Any] | Exception | None],
                 share: float, rng: dict[int, torch.Tensor], results: dict[int, RunResult]
                 ) -> list[Trainer]:
    """Close trained epoch ``epoch`` of every run of the stack (``stats``: each run's, from
    its runner; ``share``: each run's part of the epoch's seconds), each step for all runs
    before the next: measure them all, then checkpoint them all, then write and log. An
    interrupt or a kill while any of them measures (the long part) then leaves every run
    checkpointed at the same epoch, so they resume as one stack, bit for bit the stack
    left alone; closed one run after the other, the runs measured last resumed an epoch
    behind the others, each in a stack of its own, whose step differs in the last bits. The
    checkpoints are one commit (:mod:`~creditaudit.run.stack_checkpoints`): a kill between
    two of them resumes the stack from the epoch before. A run whose close raises fails
    alone (``results``). The runs that end here."""
    def alone(trainer: Trainer, err: BaseException) -> None:
        if isinstance(err, NOT_A_FAILURE) or ended_by_ray(err):
            raise err
        trainer.record_stop("failed", err)
        trainer.loggers.close_quietly()
        results[id(trainer)] = RunResult(trainer.run_dir, trainer.record)

    measured = []
    for trainer, run_stats in zip(live, stats, strict=True):
        with _own_rng(rng, trainer):
            try:
                if isinstance(run_stats, Exception):  # its loggers' (log_step)
                    raise run_stats
                entry = trainer.measure_epoch(epoch, run_stats, time.perf_counter() - share)
                measured.append((trainer, entry))
            except BaseException as err:  # noqa: BLE001 — fails this run only
                alone(trainer, err)
    saved = []
    # one commit: a kill between two writes resumes every run from the epoch before
    in_commit = [trainer.run_dir for trainer, _ in measured] if len(live) > 1 else []
    keep_previous(in_commit)
    for trainer, entry in measured:
        with _own_rng(rng, trainer):  # the checkpoint keeps the run's own torch stream
            try:
                saved.append((trainer, entry, trainer.save_epoch(entry)))
            except BaseException as err:  # noqa: BLE001 — fails this run only
                alone(trainer, err)
    drop_previous(in_commit)
    ended = []
    for trainer, entry, ending in saved:
        with _own_rng(rng, trainer):
            try:
                if entry is not None:
                    trainer.publish_epoch(entry, ending)
                if ending is not None:
                    ended.append(trainer)
            except BaseException as err:  # noqa: BLE001 — fails this run only
                alone(trainer, err)
    return ended


def _record_smaller_stack(live: list[Trainer], epoch: int) -> None:
    """Say in each record of ``live`` (the runs of a stack that a member left, by diverging
    or stopping early) that from ``epoch`` on it trained in a stack of ``len(live)`` (1:
    alone, its own step): ``environment.execution.stacked_runs`` is the stack it started
    in, ``stacked_runs_from`` lists each change."""
    for trainer in live:
        changes = trainer.environment["execution"].setdefault("stacked_runs_from", [])
        changes.append({"epoch": epoch, "stacked_runs": len(live)})


def _interrupt(trainers: list[Trainer], stop: BaseException) -> None:
    """Record ``trainers`` (started, not finished) as interrupted by ``stop`` (an interrupt,
    or a full disk: their records may then keep their last state, which resumes too)."""
    for trainer in trainers:
        trainer.record_stop("interrupted", disk_full=isinstance(stop, DiskFullError))
        trainer.loggers.close_quietly()


__all__ = ["VARYING", "AloneEpochs", "check_stackable", "epoch_runner", "stack_key", "stack_groups",
           "train_stacked"]
