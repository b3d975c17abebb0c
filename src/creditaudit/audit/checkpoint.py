"""Audit a finished (or stopped) run: rebuild it from its folder and run the protocol.

::

    from creditaudit.audit import load_run, audit_run
    run = load_run("runs/dfa-resmlp-synthetic-s42-…")      # record, rule (model inside), data
    report = audit_run("runs/dfa-resmlp-synthetic-s42-…")  # a DiagnosticReport

:func:`load_run` reads the record, checks that the data on disk is the data the run trained
on (its fingerprint), rebuilds model and rule and loads the checkpoint without unpickling
anything but tensors and plain containers. :func:`audit_run` evaluates the four diagnostics
(plus, by default, the credit-quality metrics) on the run's fixed evaluation subset; the
baseline of (d) is, in this order, ``frozen`` (an accuracy or a frozen run's folder), the
mean final accuracy of the frozen-blocks runs of the same recipe found beside the run (in
its results folder; ``frozen_from_runs=False`` turns this off), or the config's
``diagnostics.frozen_acc`` — for a frozen-blocks run, the baseline itself, only the last.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from creditaudit.audit.diagnose import diagnose, with_frozen_hint
from creditaudit.caller import FORCE, Option, train_again
from creditaudit.data import Dataset
from creditaudit.errors import ConfigError, DataError, RunRecordError
from creditaudit.guests.settings import settings_kept
from creditaudit.methods import CreditRule
from creditaudit.protocol import DiagnosticReport, labels
from creditaudit.protocol.records import (
    baseline_text,
    epoch_fields,
    frozen_baseline,
    is_frozen_baseline,
    record_metadata,
)
from creditaudit.records import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    EpochEntry,
    RunRecord,
    load_record,
    load_records,
    record_path,
)
from creditaudit.records.claim_files import claim_state
from creditaudit.records.compare import recipe_difference
from creditaudit.report.runs import status_text
from creditaudit.run.data_writes import data_left_alone, run_suspects
from creditaudit.run.plan import RunPlan
from creditaudit.run.results import rule_metrics
from creditaudit.run.setup import rebuild_run, resolve_device

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class LoadedRun:
    """A run rebuilt from its folder: its record, its rule (``rule.model`` is the model at
    the checkpointed epoch), its data, that epoch and its record entry, and the folder it
    was read from (``run_dir``: where it is now, which a moved or copied run's
    ``run.out_dir`` does not say)."""

    record: RunRecord
    rule: CreditRule
    data: Dataset
    epoch: int
    plan: RunPlan
    entry: EpochEntry
    run_dir: Path


DATA_DIR_FIX = Option("--data-dir DIR (audit_run(..., data_dir=DIR))", "data_dir=DIR")


def load_run(path: str | Path, *, data_dir: str | Path | None = None) -> LoadedRun:
    """Rebuild the run in folder ``path`` (or its record.json) on the CPU.

    ``data_dir``: the folder of the run's data files, when it is not where the record says
    (a copied run, a relative folder recorded by an older version); the data found there
    must still be the data the run trained on (its recorded fingerprint and digests)."""
    record_file = record_path(path)
    record = load_record(record_file)
    rebuilt = rebuild_run(with_data_dir(record, record_file, data_dir), record_file.parent,
                          folder_fix=f"pass {DATA_DIR_FIX} pointing at the run's data",
                          audit=True)
    check_finite_state(rebuilt.rule, record_file.parent / CHECKPOINT_FILE)
    return LoadedRun(record, rebuilt.rule, rebuilt.data, rebuilt.epoch, rebuilt.plan,
                     rebuilt.entry, record_file.parent)


def check_finite_state(rule: CreditRule, checkpoint: Path) -> None:
    """One-line RunRecordError naming ``checkpoint`` and the first tensor of the rule's state
    (its model's weights included) that holds NaN or ±inf: training never checkpoints a
    diverged epoch, so such a file was damaged or edited, and the audit would otherwise fail
    later on the model's NaN logits, naming none of this."""
    parts = {"model": rule.model.state_dict(), "rule": rule.state_dict()}
    for part, state in parts.items():
        for name, tensor in state.items():
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() \
                    and not bool(torch.isfinite(tensor).all()):
                raise RunRecordError(
                    f"checkpoint {checkpoint} holds NaN/Inf values in the {part}'s {name} "
                    "(training never saves a diverged epoch: the file was damaged or "
                    f"edited); train the run again with {FORCE}")


def with_data_dir(record: RunRecord, path: Path, data_dir: str | Path | None) -> RunRecord:
    """``record`` to rebuild from: its config reading the data in ``data_dir`` when given;
    DataError (one line) when the data folder it names is not there, saying how to point
    at it. Only the rebuilt plan reads this copy: what is reported is the record as read."""
    config = record.config
    if data_dir is not None:
        try:
            config = config.replace(**{"data.data_dir": str(data_dir)})
        except ConfigError as err:
            given = Option(f"--data-dir {data_dir}", f"data_dir={str(data_dir)!r}")
            raise ConfigError(f"{given}: {err}") from None
    folder = getattr(config.data, "data_dir", None)
    if isinstance(folder, str):
        check_data_folder(folder, f"{Option('--data-dir', 'data_dir')}" if data_dir is not None
                          else f"run {path.absolute().parent.name} trained on")  # "." no name
    return replace(record, config=config) if config is not record.config else record


def check_flags(*, frozen: str | float | Path | None, device: str,
                data_dir: str | Path | None) -> torch.device:
    """What an audit's options say, checked before any run is read: a refusal here is the
    call's (one line, nothing written), not one run's. ``frozen``'s fraction or finished
    run (:func:`given_frozen`), ``device`` there (returned, resolved), ``data_dir`` a
    folder."""
    target = resolve_device(device, option="device")
    if frozen is not None:
        given_frozen(frozen)
    if data_dir is not None:
        check_data_folder(str(data_dir), Option("--data-dir", "data_dir"))
    return target


def check_data_folder(folder: str, given: str) -> None:
    """DataError (one line) when ``folder``, the data folder ``given`` names, is not one."""
    if Path(folder).expanduser().is_dir():
        return
    where = "" if Path(folder).expanduser().is_absolute() else f" (relative to {Path.cwd()})"
    state = "is not a folder" if Path(folder).expanduser().exists() else "does not exist"
    raise DataError(f"{given} data folder {folder}{where} {state}: pass {DATA_DIR_FIX} "
                    "pointing at the run's data (checked against its recorded digests)")


def frozen_accuracy(text: str | float | Path, record: RunRecord) -> float:
    """An accuracy fraction from ``--frozen``: a number in [0, 1] (or its text) or a frozen
    run's folder or record.json (which must share the audited run's recipe: data, model and
    its code, optimiser, precision)."""
    acc, frozen = given_frozen(text)
    if frozen is None:
        return acc
    difference = recipe_difference(frozen, record)
    if difference is not None:
        raise ConfigError(f"--frozen run {text} differs from the audited run in {difference}: "
                          "a frozen baseline must share the data, model (and its code), "
                          "optimiser and precision")
    if not is_frozen_baseline(frozen):
        log.warning("--frozen run %s was trained with method %r, not 'frozen'", text,
                    frozen.method)
    if frozen.stopped_early:
        log.warning("--frozen run %s stopped early at epoch %s of optim.epochs=%d: its "
                    "accuracy is of a readout trained for fewer epochs than its recipe's",
                    text, frozen.stopped_early.get("epoch"), frozen.config.optim.epochs)
    if frozen.status == "diverged":
        log.warning("--frozen run %s diverged in epoch %s: its accuracy is of its last finite "
                    "epoch", text, (frozen.divergence or {}).get("epoch"))
    return acc


def given_frozen(text: str | float | Path) -> tuple[float, RunRecord | None]:
    """``--frozen`` read as itself, whatever run it is for: (an accuracy fraction in
    [0, 1], None), or (final accuracy, record) of a finished run; one-line errors
    otherwise."""
    if isinstance(text, bool) or not isinstance(text, str | int | float | Path):
        raise ConfigError(f"--frozen (frozen=) must be an accuracy fraction in [0, 1] or a "
                          f"frozen run's folder, got {type(text).__name__} {text!r:.40}")
    value = None
    if not isinstance(text, Path):
        try:
            value = float(text)
        except ValueError:
            value = None
    if value is not None:
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"--frozen {text} is not an accuracy fraction in [0, 1]: pass "
                              "e.g. 0.349 (not 34.9) or a frozen run's folder")
        return value, None
    try:
        frozen = load_record(text)
    except RunRecordError as err:  # said of --frozen, not of the audited run
        raise RunRecordError(f"--frozen {text} is neither an accuracy fraction in [0, 1] "
                             f"(e.g. 0.349) nor a frozen run: {err}") from None
    if not frozen.is_finished:  # as the runs looked up beside RUN: completed or diverged
        done = frozen.log[-1].epoch if frozen.log else 0
        folder = record_path(text).parent
        # a process that trains it now would refuse a --resume: wait for it instead
        claim = claim_state(folder)
        finish = ("wait for it to finish" if claim is not None and claim.stale is None
                  else f"finish it with {train_again(str(folder / CONFIG_FILE))}")
        raise RunRecordError(f"--frozen run {text} is {status_text(frozen, folder)} ({done} "
                             f"of {frozen.epochs} "
                             f"epochs done), so it has no final test accuracy: {finish}, "
                             "then audit again")
    acc = frozen.final_acc
    if acc is None:
        raise RunRecordError(f"--frozen run {text} has no finished epoch with a test accuracy")
    return acc, frozen


def frozen_baseline_beside(record: RunRecord, folder: Path) -> tuple[float, int] | None:
    """(mean accuracy, runs) of the finished frozen-blocks runs of ``record``'s recipe among
    the runs in ``folder``, or None."""
    if is_frozen_baseline(record) or not folder.is_dir():
        return None
    records, _ = load_records(folder)
    return frozen_baseline(record, [r for _, r in records])


SELF_BASELINE_HINT = "this frozen-blocks run is the baseline (d) compares other runs with"
AUDIT_FIX = ("audit it with --allow-unverified-reference (audit_run(..., "
             "allow_unverified_reference=True)) to see its numbers marked unverified")


def audit_run(path: str | Path, *, frozen: str | float | Path | None = None,
              frozen_from_runs: bool = True, metrics: bool = True, device: str = "cpu",
              progress: Progress | None = None,
              allow_unverified_reference: bool | None = None,
              frozen_hint: str = "pass frozen=RUN_OR_ACC, a frozen-blocks run's folder or "
                                 "its test accuracy",
              data_dir: str | Path | None = None) -> DiagnosticReport:
    """The :class:`~creditaudit.protocol.DiagnosticReport` of the run in ``path``.

    The reference gradient is checked on the checkpointed model first: one whose backward
    is not the gradient is refused in one line naming the module, unless
    ``allow_unverified_reference`` (default: as the run was trained,
    ``diagnostics.allow_unverified_reference``); then the report says where it failed and
    its verdict is *unverified*. ``frozen``: (d)'s baseline, an accuracy fraction or a
    frozen-blocks run's folder (:func:`frozen_accuracy`). ``frozen_hint``: what (d) says
    when no frozen-blocks accuracy was found, in the terms of the caller (the command line
    names its --frozen flag). ``data_dir``: where the run's data files are now (:func:`load_run`).

    ``progress`` (e.g. ``print``) receives one line per stage: the diagnostics, then (with
    ``metrics``) ρ, nudging and, for FA/DFA, the fresh-feedback null.
    """
    say = progress or (lambda text: None)
    target = check_flags(frozen=frozen, device=device, data_dir=data_dir)
    # every check of the user's files comes before the first stage
    run = load_run(path, data_dir=data_dir)
    record, config = run.record, run.record.config
    run.rule.to(target)
    metadata: dict[str, Any] = {**record_metadata(record), "epoch": run.epoch,
                                "status": record.status}
    # a ``running`` record's process may be gone (killed): its claim says which
    held = status_text(record, run.run_dir)
    if held != record.status:
        metadata["status_text"] = held
    if is_frozen_baseline(record):
        # The baseline of (d) itself: judged on (d) only as trained (config's frozen_acc),
        # as reports of its record judge it; against a frozen run, its margin is ~0.
        frozen_acc: float | None = config.diagnostics.frozen_acc
        if frozen is not None:
            log.warning("%s is a frozen-blocks run, the baseline of (d) itself: --frozen "
                        "is not applied to it", path)
        frozen_hint = SELF_BASELINE_HINT
        if record.is_finished:  # its verdict, as the tables say it (not of a run cut short)
            metadata["baseline"] = baseline_text(record)
    elif frozen is not None:
        frozen_acc = frozen_accuracy(frozen, record)
    else:
        frozen_acc = config.diagnostics.frozen_acc
        # beside the folder as named (absolute: "." of a run's own folder has no parent)
        baseline = (frozen_baseline_beside(record, run.run_dir.absolute().parent)
                    if frozen_from_runs else None)
        if baseline is not None:
            frozen_acc, metadata["frozen_from_runs"] = baseline
    # The checkpointed epoch's accuracy (a diverged epoch is logged but never checkpointed;
    # record.json may lag the checkpoint by the epoch whose record write failed).
    entry = run.entry
    headline = entry.acc_eval
    # The evaluation set training used (the plan's: the default shrinks to a small test split).
    eval_x, eval_y = run.data.eval_subset(run.plan.eval_samples, flatten=run.plan.flatten)
    eval_x, eval_y = eval_x.to(target), eval_y.to(target)
    options = {"rho_samples": config.diagnostics.rho_samples,
               "rho_directions": config.diagnostics.rho_directions,
               "null_draws": config.diagnostics.null_draws, "seed": config.run.seed,
               "rho_flops": config.diagnostics.rho_flops,
               "memory_gb": config.diagnostics.end_of_run_memory_gb}
    # The diagnostics and thresholds the run was trained with (a plugin's, when it lists one).
    protocol = run.plan.protocol
    say(f"diagnostics {labels(protocol.names)} and per-layer cosines on {eval_x.shape[0]} "
        f"evaluation samples (epoch {run.epoch})")
    # Epoch 0 measured the network at initialisation on this evaluation set: (a) compares
    # ‖h_0‖ with it, to see growth before the first state.
    start = record.entry(0)
    # The network and the rule read the evaluation set (a view of the run's test split): one
    # that writes it stops the audit in one line rather than report numbers of other data
    # (this watch, naming the run's network and rule, is diagnose's: it watches none). A
    # torch setting their code changes is put back and refused, naming them, as diagnose's.
    suspects = run_suspects(run.plan)
    with settings_kept(suspects), \
            data_left_alone((eval_x, eval_y), suspects, f"audit measured epoch {run.epoch}"):
        report = diagnose(
            run.rule.model, eval_x, eval_y, credit=run.rule, headline_acc=headline,
            frozen_acc=frozen_acc, metrics=metrics, metric_options=options,
            metadata=metadata, progress=say, protocol=protocol,
            allow_unverified_reference=bool(config.diagnostics.allow_unverified_reference
                                            if allow_unverified_reference is None
                                            else allow_unverified_reference),
            reference_fix=AUDIT_FIX,
            initial_hidden_norms=(start.measures.hidden_norms
                                  if start is not None and start.measures else None),
            # epoch 0: the network at initialisation — but a run that diverged in its
            # first epoch did train, and is judged on epoch 0's numbers (d) included, as
            # its record is (protocol.records.untrained)
            trained=run.epoch > 0 or record.status == "diverged", watch_data=False)
        fields = rule_fields(run.rule, entry, eval_x, eval_y, metrics=metrics)
    if fields:
        report.metrics = {**(report.metrics or {}), **fields}
    return with_frozen_hint(report, frozen_hint)


def rule_fields(rule: CreditRule, entry: EpochEntry | None, eval_x: torch.Tensor,
                eval_y: torch.Tensor, *, metrics: bool) -> dict[str, Any]:
    """The rule's own numbers: what it recorded for the audited epoch (e.g. EP's relaxation
    ratio; one named as an end-of-run metric is left out, as the report leaves it:
    :func:`~creditaudit.protocol.records.epoch_fields`) and, with ``metrics``, its end-of-run
    metrics recomputed now (e.g. EP's update cosine with BP), under a forked RNG."""
    fields: dict[str, Any] = dict(epoch_fields(entry))
    if metrics:
        devices = [eval_x.device] if eval_x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            fields.update(rule_metrics(rule, rule.run_metrics(eval_x, eval_y)))
    return fields
