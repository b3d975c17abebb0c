"""How a trainer's run ends, in its record: finished (final results, end-of-run metrics; early,
when its protocol verdict turns to walk-back and it was asked to stop there), or
stopped by an interrupt, a full disk or an error (what the record keeps, and the one line
the command line adds to say what to do next).

:class:`RecordKeeping` is the part of :class:`creditaudit.run.trainer.Trainer` that writes
the record; the trainer (and the stacked runs of :mod:`creditaudit.run.stacked`, which
finish and stop each of their trainers) call it. The epochs are the trainer's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from creditaudit.caller import RESUME
from creditaudit.errors import OutputError, note_unrecorded
from creditaudit.guests.blame import guest_failure
from creditaudit.protocol import WALK_BACK, labels
from creditaudit.records import save_record
from creditaudit.records.claims import check_held, lost_claim
from creditaudit.run.data_writes import data_left_alone, measured_data, run_suspects
from creditaudit.run.init_file import read_initial
from creditaudit.run.results import end_of_run_metrics, final_results, note_end_of_run_credits

if TYPE_CHECKING:
    from creditaudit.config import RunConfig
    from creditaudit.loggers import LoggerGroup
    from creditaudit.methods import CreditRule
    from creditaudit.models import ResidualNet
    from creditaudit.records import EpochEntry, RunRecord
    from creditaudit.run.plan import RunPlan


class RecordKeeping:
    """Writes, finishes and stops a run's record; mixed into the trainer, which sets what
    it reads (below)."""

    config: RunConfig
    plan: RunPlan  # what names the network and the rule when they write the run's data
    record: RunRecord
    run_id: str
    run_dir: Path
    model: ResidualNet
    rule: CreditRule
    device: torch.device
    eval_x: torch.Tensor  # the evaluation subset's inputs, (n_eval, …)
    eval_y: torch.Tensor  # its labels, (n_eval,)
    loggers: LoggerGroup
    resuming: bool  # this part resumes the run
    checkpointed: int | None  # the last epoch saved in checkpoint.pt
    init_digest: str | None  # init.pt's digest, kept in every checkpoint

    def interrupted_note(self) -> str:
        """What an interrupt leaves, in one line: the epoch to resume from, or nothing."""
        if self.resuming and not self.record.log:  # stopped while its checkpoint was read
            return (f"run {self.run_id} stopped while resuming, before it trained: continue "
                    f"with {RESUME}")
        if self.checkpointed:
            return (f"run {self.run_id} stopped after epoch {self.checkpointed}, which is "
                    f"checkpointed: continue with {RESUME}")
        return (f"run {self.run_id} stopped before its first epoch finished (nothing trained "
                "is saved): run the same command again to start it")

    def record_stop(self, status: str, err: BaseException | None = None, *,
                 disk_full: bool = False) -> None:
        """The run stopped on an interrupt or an error: record why and tell the loggers.
        On a full disk the write may fail again; the record then keeps its last state,
        which resumes too. When the failed record of ``err`` cannot be written, ``err``
        stays the run's error, noted with why (:func:`note_unrecorded`): the caller raises
        it, so the cause is not replaced by the write's OutputError. Stopped before this
        part had a record to write (the epoch-0 evaluation of a new run, the reading of a
        resumed one's checkpoint), it writes nothing: the folder keeps what it held. Nor
        does it when another process took the run over (:func:`lost_claim`): the folder
        is that process's."""
        if not self.record.log:
            return
        self.record.status = status
        if err is not None and not disk_full:  # a guest's (a factory's forward) names it
            self.record.error = guest_failure(err) or f"{type(err).__name__}: {err}"
        if lost_claim(self.run_dir) is not None:
            return
        if disk_full:
            with contextlib.suppress(OutputError):
                self._write()
            self.loggers.finish_quietly(self.record, saved_through=self.checkpointed)
            return
        try:
            self._write()
        except OutputError as write_error:
            if err is None:
                raise
            note_unrecorded(err, write_error)
        self.loggers.finish_quietly(self.record, saved_through=self.checkpointed)

    def walkback_stop(self, entry: EpochEntry) -> bool:
        """With ``diagnostics.stop_on_walkback``: whether the run stops at ``entry`` (its
        protocol verdict turned to walk-back) before its last epoch, recorded as
        ``record.stopped_early`` (the epoch, and the diagnostics that fired). At its last
        epoch (``optim.epochs``) a run ends anyway: it trained every epoch of its recipe and
        is no run stopped early — readers leave those out of end-of-run means and of (d)'s
        frozen baselines."""
        if not (self.config.diagnostics.stop_on_walkback and entry.verdict == WALK_BACK
                and entry.epoch < self.config.optim.epochs):
            return False
        fired = [i for i, status in (entry.protocol or {}).items() if status == "fired"]
        self.record.stopped_early = {
            "epoch": entry.epoch,
            "reason": f"protocol verdict needs walk-back: {labels(fired)}"}
        return True

    def finish(self) -> None:
        """Final results and end-of-run metrics for completed or diverged runs."""
        self.record.final = final_results(self.record.log)
        if self.config.diagnostics.end_of_run:
            # checked again here: replaced while the run trained, another run's file would
            # give a wrong drift without a word
            initial = read_initial(self.run_dir, self.model, self.init_digest,
                                   doing="cannot compute the end-of-run drift",
                                   map_location=self.device)
            with data_left_alone(measured_data(self), run_suspects(self.plan),
                                 "the end-of-run metrics were measured"):
                metrics = end_of_run_metrics(
                    self.rule, self.eval_x, self.eval_y, initial=initial,
                    settings=self.config.diagnostics, seed=self.config.run.seed,
                    progress=self.loggers.log_stage)
            self.record.diagnostics.update(metrics)
            note_end_of_run_credits(self.record, self.rule)
        self._write()

    def _write(self) -> None:
        """Write the record to the run's folder (atomically); RunBusyError, writing nothing,
        when another process took the run over (:func:`check_held`)."""
        check_held(self.run_dir)
        save_record(self.run_dir, self.record)
