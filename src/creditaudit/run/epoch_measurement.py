"""What a run's record holds of an epoch beyond its training: the test evaluation, the
per-epoch diagnostics and, at the epochs it is due, the protocol's judgement — measured
without changing training (the model in measurement mode, the data watched).

:class:`EpochMeasurement` is the part of :class:`creditaudit.run.trainer.Trainer` that
measures an evaluated epoch and adds its entry to the record; the trainer (and the stacked
runs of :mod:`creditaudit.run.stacked`) train the epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch

from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.models.contract import measurement_mode
from creditaudit.records import EpochEntry
from creditaudit.run.data_writes import data_left_alone, measured_data, run_suspects
from creditaudit.run.evaluation import KnownPredictions
from creditaudit.run.results import (
    judge_protocol,
    note_credit_not_finite,
    note_protocol,
    protocol_due,
    reference_since_start,
)

if TYPE_CHECKING:
    from creditaudit.config import RunConfig
    from creditaudit.methods import CreditRule
    from creditaudit.models import ResidualNet
    from creditaudit.protocol import Protocol
    from creditaudit.records import RunRecord
    from creditaudit.run.evaluation import TestEvaluation
    from creditaudit.run.plan import RunPlan


# The way out of a refused reference check, as a command's or a config's user takes it
TRAIN_FIX = ("set diagnostics.allow_unverified_reference = true (--allow-unverified-reference) "
             "to train it with every cosine, Γ and (b) marked unverified")


class EpochMeasurement:
    """Measures an epoch for the record and adds its entry; mixed into the trainer, which
    sets what it reads (below)."""

    config: RunConfig
    plan: RunPlan
    record: RunRecord
    model: ResidualNet
    rule: CreditRule
    protocol: Protocol
    device: torch.device
    eval_x: torch.Tensor  # the evaluation subset's inputs, (n_eval, …)
    eval_y: torch.Tensor  # its labels, (n_eval,)
    eval_indices: torch.Tensor  # the evaluation subset's rows of the test split, (n_eval,)
    test_evaluation: TestEvaluation  # the test split beyond the evaluation subset
    full_evaluation: TestEvaluation  # the whole test split
    # Whether the network is a guest's (a model factory's, a plugin architecture's), whose
    # forward may change what it computes during the run: its reference is checked again
    # at every trained epoch (creditaudit's own architectures' forwards cannot switch)
    rechecks_reference: bool
    # What measuring an epoch found for the record as a whole (its protocol state, the
    # first epoch of non-finite credits), noted in it with the epoch's entry: a run
    # interrupted in between (a stack's, while another run measures) records nothing of
    # an epoch its log and checkpoint lack
    _found: list[Callable[[], None]]

    def measure(self, epoch: int) -> EpochEntry:
        """Evaluation and diagnostics for the record of ``epoch`` (never changes training).

        When the diagnostics run, their forward pass over the evaluation subset also gives
        those samples' test predictions, so the evaluation forwards only the rest. In eval
        mode: BatchNorm uses (and leaves) its running statistics, so the test set never moves
        them and every diagnostic is per sample.

        A guest's network (:attr:`rechecks_reference`) has its reference gradient checked
        again first, against the record's (:func:`~creditaudit.run.results.
        reference_since_start`), as a Recorder checks a user's network: a straight-through
        estimator switched on after a few epochs would otherwise be scored as verified BP.
        """
        if epoch >= 1 and self.rechecks_reference:
            self.record.reference = reference_since_start(
                self.record.reference, self.model, self.eval_x, self.eval_y, epoch=epoch,
                allow=self.config.diagnostics.allow_unverified_reference, fix=TRAIN_FIX,
                suspects=run_suspects(self.plan), started="the run started")
        with measurement_mode(self.model), data_left_alone(
                measured_data(self), run_suspects(self.plan), f"epoch {epoch} was measured"):
            return self._measure(epoch)

    def _measure(self, epoch: int) -> EpochEntry:
        every = self.config.diagnostics.every
        protocol_due = self._protocol_due(epoch)
        known = sg = measures = None
        self._found = []
        if epoch % every == 0 or epoch == self.config.optim.epochs or protocol_due:
            measures, sg = epoch_diagnostics(self.rule, self.eval_x, self.eval_y)
            self._found.append(partial(note_credit_not_finite, self.record, self.rule, epoch,
                                       measures.cos_invalid))
            known = KnownPredictions.from_logits(self.eval_indices, sg.logits, self.eval_y)
        evaluation = self.test_evaluation if known is not None else self.full_evaluation
        test_loss, test_acc = evaluation.run(self.model, self.device, known)
        entry = EpochEntry(epoch=epoch, test_loss=test_loss, acc_eval=test_acc,
                           measures=measures)
        if protocol_due and sg is not None:
            report = judge_protocol(self.record, entry, sg, protocol=self.protocol,
                                    frozen_acc=self.config.diagnostics.frozen_acc,
                                    terminal_ln=self.model.terminal_ln)
            self._found.append(partial(note_protocol, self.record, epoch, report))
        return entry

    def _log_measured(self, entry: EpochEntry) -> None:
        """Add :meth:`measure`'s ``entry`` to the record's log, with what it found."""
        self.record.log.append(entry)
        for note in self._found:
            note()
        self._found = []

    def _protocol_due(self, epoch: int) -> bool:
        return protocol_due(epoch, self.config.diagnostics.protocol_every,
                            self.config.optim.epochs)
