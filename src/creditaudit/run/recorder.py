"""The run record of a network trained in your own loop: :class:`Recorder`.

::

    rec = creditaudit.Recorder(dfa, eval_x, eval_y, out="runs/mine", name="resnet20-dfa",
                               data="my-images", config={"optim.lr": 1e-3, "run.seed": 0})
    for epoch in range(1, epochs + 1):
        ...                                   # your training
        rec.epoch(epoch, test_acc=acc, test_loss=loss, train_loss=train_loss)
    record = rec.finish()                     # end-of-run metrics; the RunRecord

Each :meth:`Recorder.epoch` measures what an epoch of ``creditaudit train`` measures — the
per-layer norms, reference gradients and cosines on the evaluation set, then the protocol —
with the training loop's own functions (:mod:`creditaudit.run.results`), and
writes ``OUT/NAME/record.json`` atomically; :meth:`Recorder.finish` closes it with the
status, the final results and the end-of-run block (ρ, nudging, Γ, drift, the fresh-feedback
null: :mod:`creditaudit.run.recorder_finish`). ``creditaudit report``, ``figures`` and
``export`` read such records beside the command line's. The record, opened when the
Recorder is created (:mod:`creditaudit.run.recorder_start`), says what was trained: the
model's own description, the rule and its options, the data (a built-in dataset's identity,
or a fingerprint of the evaluation arrays) and the code (``environment.components``; the
network's ``code_digest``, which the run id and the recipe cover, as a ``module``
factory's). Its ``model.arch`` is ``own-loop``, which describes and never builds: ``audit``
and ``resume`` refuse such a run in one line (audit it in the loop with
:func:`creditaudit.diagnose`).

Diagnostics never change training: they run in eval mode under a forked RNG and take
gradients with respect to states only, so a loop trains the same weights with and without a
recorder.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from creditaudit.errors import ConfigError
from creditaudit.files.safe_files import ensure_folder
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.measures.gradients import StateGradients
from creditaudit.measures.progress import Say
from creditaudit.measures.working import check_copy_runs
from creditaudit.methods import CreditRule
from creditaudit.models.contract import measurement_mode, parameter_snapshot
from creditaudit.records import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    INIT_FILE,
    EpochEntry,
    RunRecord,
    atomic_torch_save,
    save_record,
)
from creditaudit.records.claims import check_held, lost_claim
from creditaudit.run.data_writes import data_left_alone, own_loop_suspects
from creditaudit.run.recorder_config import (
    OWN_DATA,
    array_fingerprint,
    check_frozen_as_recorded,
    recorder_config,
    user_network,
)
from creditaudit.run.recorder_finish import finish_record
from creditaudit.run.recorder_inputs import (
    check_epoch_number,
    check_folder_written,
    check_network_unchanged,
    check_rule_held,
    checked_eval_set,
    checked_extras,
    checked_number,
    claim_folder,
    hold_rule,
    network_layout,
    released_on_error,
    replaced_writer,
    tensor_versions,
    write_folder,
)
from creditaudit.run.recorder_progress import RecorderProgress
from creditaudit.run.recorder_start import open_record
from creditaudit.run.results import (
    note_credit_not_finite,
    protocol_due,
    record_protocol,
    reference_at_start,
    reference_since_start,
    rule_extras,
)

RECORDER_FIX = ("pass Recorder(..., allow_unverified_reference=True) to record it with every "
                "cosine, Γ and (b) marked unverified")


class Recorder:
    """Writes the run record of a rule trained in your own loop (module docstring).

    ``rule``: the credit rule your loop steps (``creditaudit.rule(name, model)``; its model
    an adapted model or a contract ``ResidualNet``). ``eval_x`` ``(N, …)`` and ``eval_y``
    ``(N,)``: the held-out evaluation set every epoch's diagnostics run on, on the model's
    device (N ≥ 1024 for diagnostic (c); the command line uses 1280 test samples).
    ``out``/``name``: the record goes to ``out/name/record.json`` (default name: a run id
    from the rule, the data, the seed and a hash of the config, the data, the model's
    description and the network's code: the source files of the modules defining its
    classes — a script's file — and of the modules of your own they import, or the module
    tree of a network made only of installed classes; the description includes the
    parameters' dtype and those frozen outside the rule). ``data``: what
    the data is — a dataset creditaudit knows (a name, or its ``[data]`` section as a
    mapping, e.g. ``{"name": "fashion-mnist", "data_dir": …}``),
    whose identity is asked of the dataset (file digests, generator arguments) once
    ``eval_x``/``eval_y`` are checked to be samples of its test split; or a name of your
    own (lower-case letters, digits, ``-``, ``_``; default ``own-data``; with
    ``train_subset`` and ``random_targets`` when you used them), identified by a sha256
    fingerprint of ``eval_x`` and ``eval_y`` — the evaluation arrays only, not your
    training data. ``config``: the rest of the recipe as dotted keys or nested sections of
    ``optim``, ``diagnostics`` and ``run`` (``{"optim.lr": 1e-3, "optim.batch_size": 64,
    "run.seed": 0, "diagnostics.frozen_acc": 0.41}``; the run keys of role ``place`` —
    ``run.device``, ``run.threads``, ``run.out_dir``, … — are refused: the loop decides them,
    the record's environment says what ran); data, optimiser and run keys left out
    are listed in ``record.not_recorded`` (reports print "not recorded"), ``optim.epochs``
    follows the last recorded epoch unless given (an epoch past it is then refused),
    ``diagnostics.eval_samples`` is N.
    ``checkpoint``: also save the model's and the rule's state (and the initial parameters)
    beside the record each epoch. ``overwrite``: replace a record already at ``out/name``
    (refused otherwise; an unfinished Recorder of this process writing it records no
    more). ``allow_unverified_reference`` (or the config key
    ``diagnostics.allow_unverified_reference``): record a model whose backward is not the
    gradient of its forward, which is otherwise refused. ``progress``: where the recorder says what
    it measures while it takes seconds (an epoch's diagnostics, each end-of-run stage with
    its ETA) — ``True`` standard error, ``False`` nowhere, or a function of one line.

    Create it before training: it snapshots the initial parameters (for the drift of the
    end-of-run block) and checks the reference gradient on the model as it is (float64
    central differences on four evaluation samples, under a forked RNG: a BioTorch layer or
    a ``torch.autograd.Function`` with its own backward raises a one-line
    ReferenceGradientError naming the module; the record's ``reference`` says how it was
    checked). One-line ConfigError/ModelContractError for what cannot be recorded.
    """

    def __init__(self, rule: CreditRule, eval_x: Tensor, eval_y: Tensor, *,
                 out: str | Path = "runs", name: str | None = None,
                 data: str | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, checkpoint: bool = False,
                 overwrite: bool = False, allow_unverified_reference: bool = False,
                 progress: bool | Say = True) -> None:
        eval_x = checked_eval_set(rule, eval_x, eval_y)
        model = rule.model
        self.rule, self.eval_x, self.eval_y = rule, eval_x, eval_y
        self._eval_versions = tensor_versions(eval_x, eval_y)
        self._suspects = own_loop_suspects(rule)  # who wrote eval_x while it was measured
        self._layout = network_layout(user_network(model))
        self._say = RecorderProgress(progress)
        self.checkpointing = bool(checkpoint)
        self.config, spec, given = recorder_config(rule, data, config, int(eval_x.shape[0]))
        self._epochs_given = ("optim", "epochs") in given
        self._needs_length = rule.reads_run_length()
        if self._needs_length and not self._epochs_given:
            raise ConfigError(f"{rule.name}: {self._needs_length}: give the epochs your loop "
                              "runs as config={'optim.epochs': N}")
        settings = self.config.diagnostics
        if not isinstance(allow_unverified_reference, bool):
            raise ConfigError(f"allow_unverified_reference={allow_unverified_reference!r} must "
                              "be True or False")
        settings.allow_unverified_reference |= allow_unverified_reference
        # The model as it is now, before anything is written: one whose backward is not the
        # gradient is refused (every cosine would be its own credit), unless allowed.
        reference = reference_at_start(model, eval_x, eval_y,
                                       allow=settings.allow_unverified_reference,
                                       fix=RECORDER_FIX, suspects=self._suspects)
        if settings.end_of_run:  # finish() runs a float64 copy: say now if it cannot run
            check_copy_runs(model, eval_x)
        self.run_dir, self.record, self.protocol = open_record(
            rule, self.config, spec, given, eval_x, eval_y, out=out, name=name,
            reference=reference)
        self._say.prefix = f"Recorder {self.run_dir.name}: "
        self.initial = parameter_snapshot(model)
        self.finished = False
        self._ended: tuple[int, dict[str, float]] = (0, {})  # the rule's last ended epoch
        self._unjudged: StateGradients | None = None  # the last epoch's, when not judged
        self._since = time.perf_counter()
        self.replaced = False  # by a Recorder created since on its folder (overwrite=True)
        if (earlier := replaced_writer(self.run_dir, overwrite)) is not None:
            earlier._replace()
        # Held until the run ends (finish(), the with-block's end, a failed write here).
        self._held = claim_folder(self.run_dir, overwrite)
        # A Recorder left unfinished releases its claim when it is collected or, alive at
        # the interpreter's exit, then (atexit, while Python still runs): not from its
        # claim's generator finalised at shutdown, which failed there and left the claim.
        weakref.finalize(self, self._held.close)
        with released_on_error(self._held):
            ensure_folder(self.run_dir)
            if self.checkpointing:
                atomic_torch_save(self.run_dir / INIT_FILE, self.initial)
            self._write()
        write_folder(self.run_dir, self)
        hold_rule(rule, self, self.run_dir.name)  # the one Recorder ending its epochs now

    # --- per epoch ----------------------------------------------------------------------
    def epoch(self, epoch: int, *, test_acc: float | None = None,
              test_loss: float | None = None, train_loss: float | None = None,
              train_acc: float | None = None, extras: Mapping[str, float] | None = None
              ) -> EpochEntry:
        """Record epoch ``epoch`` (0 = before training; each call after the last one).

        ``test_acc`` (a fraction) and ``test_loss`` (mean cross-entropy, nats): your loop's
        numbers on its test split — the headline accuracy diagnostic (d) judges (left out:
        (d) is not evaluated); ``train_loss``/``train_acc``: the epoch's training numbers;
        ``extras``: further numbers to keep with the epoch. For ``epoch`` ≥ 1 it ends the
        rule's epoch as ``creditaudit train`` does (a Credit Bridge's warm-up ends on time;
        its fields — bridge errors, EP's relaxation ratios — join ``extras``; call it after
        each trained epoch, with the epoch's number). Measures the diagnostics on the
        evaluation set and, every ``diagnostics.protocol_every`` epochs (and at
        ``optim.epochs`` when the config gives it; an epoch between that ends the run is
        judged by :meth:`finish`), the protocol; writes the record (and the checkpoint when
        asked). Returns the entry.
        """
        if self.finished:
            raise ConfigError("epoch() after finish(): the run is finished; start a new "
                              "Recorder for another run")
        check_folder_written(self)
        check_epoch_number(epoch, self.record.log[-1].epoch if self.record.log else None,
                           epochs=self.config.optim.epochs if self._epochs_given else None,
                           every_epoch=self._needs_length and f"{self.rule.name} ends each "
                           f"epoch ({self._needs_length})")
        self._check_unchanged()
        check_rule_held(self.rule, self)
        numbers = {"test_acc": checked_number("test_acc", test_acc, fraction=True),
                   "test_loss": checked_number("test_loss", test_loss, loss=True),
                   "train_loss": checked_number("train_loss", train_loss),
                   "train_acc": checked_number("train_acc", train_acc, fraction=True)}
        kept = checked_extras(extras)
        if epoch >= 1:  # the rule's end of a trained epoch, as `creditaudit train` ends it
            if self._ended[0] != epoch:  # once: a retried epoch(n) keeps its fields
                self._ended = (epoch, rule_extras(self.rule, self.rule.end_epoch(
                    epoch, self.config.optim.epochs if self._epochs_given else epoch)))
            own = self._ended[1]
            if clash := sorted(own.keys() & kept.keys()):
                raise ConfigError(f"extras {clash} are {self.rule.name}'s own per-epoch "
                                  "fields: give yours other names")
            kept = {**own, **kept}
        model = self.rule.model
        self.record.reference = reference_since_start(
            self.record.reference, model, self.eval_x, self.eval_y, epoch=epoch,
            allow=self.config.diagnostics.allow_unverified_reference, fix=RECORDER_FIX,
            suspects=self._suspects)
        # the previous epoch is not the last: its state gradients, kept for finish(), go
        # before this epoch's are taken (two sets at once would double the peak memory)
        self._unjudged = None
        measuring = self._say.epoch_starts(epoch, len(self.eval_y))
        with measurement_mode(model), data_left_alone(
                (self.eval_x, self.eval_y), self._suspects, f"epoch {epoch} was measured"):
            measures, sg = epoch_diagnostics(self.rule, self.eval_x, self.eval_y)
        note_credit_not_finite(self.record, self.rule, epoch, measures.cos_invalid)
        entry = EpochEntry(epoch=epoch, test_loss=numbers["test_loss"],
                           acc_eval=numbers["test_acc"], train_loss=numbers["train_loss"],
                           train_acc=numbers["train_acc"], extras=kept,
                           measures=measures)
        settings, optim = self.config.diagnostics, self.config.optim
        due = protocol_due(epoch, settings.protocol_every,
                           optim.epochs if self._epochs_given else None)
        if due:
            self._judge(entry, sg)
        # kept until the next epoch: a run that ends here is judged on it by finish()
        self._unjudged = None if due or settings.protocol_every == 0 else sg
        now = time.perf_counter()
        self._say.epoch_ends(epoch, now - measuring, entry.verdict)
        entry.seconds, self._since = now - self._since, now
        self.record.log.append(entry)
        if not self._epochs_given:  # the record says how many epochs the loop ran
            optim.epochs = epoch
        if self.checkpointing:
            self._checkpoint(epoch)
        self._write()
        return entry

    def finish(self) -> RunRecord:
        """End the run: status ``completed`` (``diverged`` when the last epoch's numbers
        or state norms are NaN/Inf; a run finished before the ``optim.epochs`` its config
        gives is recorded as stopped early at its last epoch), the protocol on the last
        epoch when :meth:`epoch` did not run it there (a loop that ends off the
        ``protocol_every`` beat: the verdict is of the final accuracy's epoch), the final
        results and, unless ``diagnostics.end_of_run`` is off, the end-of-run block.
        Returns the record."""
        if self.finished:
            return self.record
        check_folder_written(self)
        started = time.perf_counter()
        if not self.record.log:
            raise ConfigError("finish() before any epoch(): record at least one epoch "
                              "(rec.epoch(0) before training records the initial network)")
        self._check_unchanged()
        if self._unjudged is not None:
            # its last epoch, judged as `creditaudit train` judges the last: the verdict is
            # of the epoch whose accuracy is the run's final one
            self._judge(self.record.log[-1], self._unjudged)
        with data_left_alone((self.eval_x, self.eval_y), self._suspects,
                             "the end-of-run metrics were measured"):
            finish_record(self.record, self.rule, self.eval_x, self.eval_y, config=self.config,
                          initial=self.initial, say=self._say.line, started=started)
        self.finished = True
        with self._held:  # released, written or not
            self._write()
        return self.record

    def _judge(self, entry: EpochEntry, sg: StateGradients) -> None:
        """The protocol on ``entry`` and its epoch's state gradients ``sg``."""
        ln = self.rule.model.terminal_ln
        record_protocol(self.record, entry, sg, protocol=self.protocol,
                        frozen_acc=self.config.diagnostics.frozen_acc,
                        terminal_ln=ln if isinstance(ln, bool) else None)

    def _check_unchanged(self) -> None:
        """ConfigError (one line) when the network (its modules, parameters, what is frozen)
        or ``eval_x`` or ``eval_y`` changed in place since the Recorder was created: the
        record's model, run id and data identity (the arrays' fingerprint, the check against
        a dataset's test split) are of them as they were then."""
        check_network_unchanged(self._layout, user_network(self.rule.model))
        check_frozen_as_recorded(self.record.model.frozen_parameters, self.rule)
        if tensor_versions(self.eval_x, self.eval_y) != self._eval_versions:
            raise ConfigError("eval_x or eval_y was changed in place since the Recorder was "
                              "created, and the record identifies the data by the arrays as "
                              "they were then: change a copy (x = x * 2, not x.mul_(2)), or "
                              "create a new Recorder with the arrays your loop evaluates on")

    # --- with-statement: a loop that raises leaves a failed (or interrupted) record -------
    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: Any) -> None:
        if self.finished or self.replaced:  # a replaced run's folder is another's now
            return
        with self._held:  # the run's folder is released however the block ended
            if kind is None:
                if self.record.log:
                    try:
                        self.finish()
                    except BaseException as err:  # its end-of-run block: out of memory, ^C
                        self._failed(type(err), err)
                        raise
                return
            self._failed(kind, error)

    def _replace(self) -> None:
        """Stop this unfinished run for a Recorder created on its folder with
        ``overwrite=True``: its claim is released and its later writes are refused."""
        self.replaced = True
        self._held.close()

    def _failed(self, kind: type[BaseException], error: BaseException | None) -> None:
        """Record the run ``interrupted`` (Ctrl-C) or ``failed`` with ``error``, unless it
        finished or another process's run holds the folder now."""
        if self.finished or lost_claim(self.run_dir) is not None:
            return
        self.record.status = ("interrupted" if issubclass(kind, KeyboardInterrupt)
                              else "failed")
        self.record.error = f"{kind.__name__}: {error}"
        self._write()

    # --- files --------------------------------------------------------------------------
    def _write(self) -> None:
        """Write the record; RunBusyError, writing nothing, when another process took the
        run over while this one was stopped (:func:`check_held`)."""
        check_held(self.run_dir)
        save_record(self.run_dir, self.record)

    def _checkpoint(self, epoch: int) -> None:
        """Model and rule state as of ``epoch`` (tensors and plain containers, like the
        command line's checkpoints; no optimiser: the loop owns it)."""
        check_held(self.run_dir)
        atomic_torch_save(self.run_dir / CHECKPOINT_FILE, {
            "format": CHECKPOINT_FORMAT, "method": self.rule.name, "epoch": epoch,
            "model": self.rule.model.state_dict(), "rule": self.rule.state_dict(),
            "record": self.record.to_dict()})


__all__ = ["Recorder", "array_fingerprint", "OWN_DATA"]
