"""What a run record holds beyond training, shared by the training loop and the Recorder.

The reference check as a run starts (:func:`reference_at_start`), the protocol of an epoch
(:func:`record_protocol`, when :func:`protocol_due`), the final
results (:func:`final_results`), the end-of-run block (:func:`end_of_run_metrics`),
a rule's NaN/Inf credits (:func:`note_credit_not_finite`) and
whether an epoch's numbers are finite (:func:`finite_entry`) are functions of the record,
the rule and the evaluation set: :class:`creditaudit.run.trainer.Trainer` and
:class:`creditaudit.run.recorder.Recorder` (a user's own loop) call the same ones, so both write
the same record. :func:`epoch_record` is an epoch's diagnostic fields in one call.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from creditaudit.config import DiagnosticsConfig
from creditaudit.descriptions import CREDIT_NOT_FINITE, EpochMeasures
from creditaudit.errors import GuestError
from creditaudit.guests.blame import VALUE_ADVICE, blame
from creditaudit.guests.returned import metrics_problem, shown
from creditaudit.measures.drift import feature_drift
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.measures.gradients import StateGradients
from creditaudit.measures.nudging import DEFAULT_ETAS
from creditaudit.measures.quality import NonFiniteModelError, Progress, credit_quality
from creditaudit.measures.reference_check import checked_reference
from creditaudit.measures.reference_modules import ReferenceGradientError
from creditaudit.methods import CreditRule
from creditaudit.methods.base import all_finite
from creditaudit.methods.footprint import nonfinite_part
from creditaudit.models.contract import measurement_mode
from creditaudit.protocol import DiagnosticReport, evaluate_protocol
from creditaudit.protocol.records import record_metadata
from creditaudit.protocol.verdicts import Protocol
from creditaudit.records import (
    DERIVED,
    RECORD_KEYS,
    EpochEntry,
    FinalResults,
    ReferenceState,
    RunRecord,
)
from creditaudit.records.copies import final_from_entry
from creditaudit.registry import RULES
from creditaudit.report.runs import credit_not_finite_text
from creditaudit.run.data_writes import data_left_alone
from creditaudit.run.recorder_inputs import recordable_number

log = logging.getLogger(__name__)

# Step sizes of the end-of-run nudging test: the measure's own defaults, which audit uses.
NUDGING_ETAS = DEFAULT_ETAS


def protocol_due(epoch: int, every: int, last_epoch: int | None) -> bool:
    """Whether the protocol runs at ``epoch``: every ``every``-th trained epoch (0 = never)
    and the last one, ``last_epoch`` (epoch 0 only when it is the last: before any training
    (d) would compare an untrained net with a trained baseline)."""
    last = last_epoch is not None and epoch == last_epoch
    return every > 0 and ((epoch >= 1 and epoch % every == 0) or last)


def record_protocol(record: RunRecord, entry: EpochEntry, sg: StateGradients, *,
                    protocol: Protocol, frozen_acc: float | None,
                    terminal_ln: bool | None) -> None:
    """:func:`judge_protocol`, then :func:`note_protocol` in ``record``."""
    note_protocol(record, entry.epoch, judge_protocol(
        record, entry, sg, protocol=protocol, frozen_acc=frozen_acc, terminal_ln=terminal_ln))


def judge_protocol(record: RunRecord, entry: EpochEntry, sg: StateGradients, *,
                   protocol: Protocol, frozen_acc: float | None,
                   terminal_ln: bool | None) -> DiagnosticReport:
    """Evaluate the protocol on an epoch's own measures (``entry.measures``) and gradients
    ``sg`` (no second backward): its statuses and verdict (judged with
    ``record.reference``, the check made when the run started) go into ``entry``; the report
    is returned, for :func:`note_protocol` (``record`` is only read). ``frozen_acc``: the
    baseline of (d) (a fraction, None = not evaluated); ``terminal_ln``: whether the model
    ends in a LayerNorm, as the model says. The norms of the run's epoch 0 (the network at
    initialisation, when recorded) let (a) judge the growth before h_0; at epoch 0 itself
    (a 0-epoch run) the network is untrained, and (d) is not evaluated. An epoch whose
    numbers are not finite (a diverged one, :func:`finite_entry`) has (d) judge the
    accuracy of the last finite epoch before it — the run's headline accuracy
    (:func:`final_results`), which ``audit`` of its checkpoint judges too — not its own
    (the share of the one class an overflowed network predicts)."""
    epoch, measures = entry.epoch, entry.measures
    if measures is None:
        raise ValueError(f"epoch {epoch}: the protocol is evaluated on a measured epoch")
    start = entry if epoch == 0 else record.entry(0)
    initial = None if start is None or start.measures is None else start.measures.hidden_norms
    headline = entry
    if not finite_entry(entry):
        headline = last_finite([e for e in record.log if e.epoch < epoch])
    report = evaluate_protocol(
        sg, headline_acc=None if headline is None else headline.acc_eval,
        frozen_acc=frozen_acc, terminal_ln=terminal_ln,
        measures=measures, protocol=protocol, thresholds=protocol.thresholds(),
        metadata={**record_metadata(record), "epoch": epoch},
        reference=record.reference.to_dict(),
        initial_hidden_norms=initial, trained=epoch > 0)
    entry.protocol = {r.id: r.status for r in report.diagnostics}
    entry.verdict = report.verdict
    return report


def note_protocol(record: RunRecord, epoch: int, report: DiagnosticReport) -> None:
    """Keep epoch ``epoch``'s protocol ``report`` (:func:`judge_protocol`'s) in
    ``record.protocol``: the latest report and verdict, and the first epoch each diagnostic
    fired."""
    state = record.protocol
    if not state.first_fired:
        state.first_fired = dict.fromkeys(r.id for r in report.diagnostics)
    for fired in report.fired:
        if state.first_fired.get(fired) is None:
            state.first_fired[fired] = epoch
    state.epoch, state.verdict, state.fired = epoch, report.verdict, list(report.fired)
    state.report = report.to_dict(norms=False)  # the norms are the entry's


def reference_at_start(model: torch.nn.Module, eval_x: torch.Tensor, eval_y: torch.Tensor,
                       *, allow: bool, fix: str, suspects: str = "the network",
                       doing: str = "the reference gradient was checked") -> ReferenceState:
    """The reference check of a run as it starts, on ``model`` as built (a contract model:
    ``forward_states``/``forward_from``) and the evaluation set ``(N, …)``, ``(N,)`` (its
    first samples): in eval mode under a forked RNG, on a float64 copy or on detached
    inputs, so training is the same with and without it. A backward that is not the
    gradient raises the one-line refusal naming the module, whose way out is ``fix``;
    ``allow`` (``diagnostics.allow_unverified_reference``) records it instead. A forward
    that writes the evaluation set in place stops it in one line naming ``suspects`` and
    what was being done (``doing``; :func:`~creditaudit.run.data_writes.data_left_alone`)."""
    devices = [eval_x.device] if eval_x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), measurement_mode(model), data_left_alone(
            (eval_x, eval_y), suspects, doing):
        check = checked_reference(model, model.forward_states, eval_x, eval_y,
                                  forward_from=model.forward_from, allow=allow, fix=fix)
    return ReferenceState(verified=check.verified, how=check.how, where=check.where,
                          detail=check.detail)


def reference_since_start(start: ReferenceState, model: torch.nn.Module,
                          eval_x: torch.Tensor, eval_y: torch.Tensor, *, epoch: int,
                          allow: bool, fix: str, suspects: str = "the network",
                          started: str = "the Recorder was created") -> ReferenceState:
    """The reference as a loop's epoch ``epoch`` is measured: ``start`` (the run's
    :func:`reference_at_start`), checked again when it was verified there, since a loop may
    change what its forward computes without changing its modules — a fake-quantiser or a
    straight-through estimator switched on after a few epochs (``FakeQuantize``'s enable
    flag, an attribute its ``forward`` reads) makes autograd's ∂CE/∂h_l that estimator's
    credit, which BP would score cos +1.000 against. A backward no longer the gradient
    raises the one-line refusal saying so (``fix`` its way out); ``allow`` records it instead
    (``how="failed"``, the epoch in ``detail``), and every cosine, Γ and (b) of the run is
    then marked. A network with NaN/Inf parameters is not checked (its epoch is recorded
    as diverged). ``started``: when ``start`` was checked, as the messages say it."""
    if not start.verified or not all(all_finite(p) for p in model.parameters()):
        return start
    try:
        now = reference_at_start(model, eval_x, eval_y, allow=allow, fix=fix,
                                 suspects=suspects,
                                 doing=f"epoch {epoch}'s reference gradient was checked")
    except ReferenceGradientError as err:
        raise ReferenceGradientError(f"epoch {epoch}: {changed_since(started)}: {err}",
                                     where=err.where) from None
    if now.verified or now.how != "failed":
        return start
    return dataclasses.replace(now, detail=f"from epoch {epoch} ({changed_since(started)}): "
                                           f"{now.detail}")


def reference_on_resume(recorded: ReferenceState, built: ReferenceState, *,
                        rechecked: bool) -> ReferenceState:
    """The reference a resumed run goes on from: ``built``, the check of its network as
    built now (a checkpoint written before the check existed gets it; code that changed the
    backward since is judged as it now is), unless the run checks its network again at each
    epoch (``rechecked``) and its record (``recorded``) says an epoch found the backward no
    longer the gradient of a network whose build still is: that finding stands (the
    network as built cannot show it), and the epochs after it stay marked."""
    if rechecked and built.verified and recorded.failed:
        return recorded
    return built


def changed_since(started: str) -> str:
    """What :func:`reference_since_start` found, ``started`` saying when the reference was
    the gradient (``the Recorder was created``)."""
    return (f"the model's backward was the gradient of its forward when {started}, and is "
            "no longer (a straight-through estimator or fake-quantiser switched on since?)")


def final_results(log: Sequence[EpochEntry]) -> FinalResults:
    """The headline numbers of a run from its epoch entries: those of the last epoch whose
    evaluation was finite (a network that overflowed predicts one class, and its accuracy,
    that class's share, measures nothing); ``from_epoch`` says which epoch when it is not
    the last."""
    last = log[-1]
    kept = last_finite(log)
    if kept is None:
        return FinalResults(epochs_completed=last.epoch)
    return final_from_entry(kept, last.epoch)


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
    # e.g. EP's update cosine with BP, which takes gradients: never in the caller's
    # inference mode (a Recorder's finish() inside the loop's evaluation block)
    with torch.random.fork_rng(devices=devices), torch.inference_mode(False):
        out.update(rule_metrics(rule, rule.run_metrics(eval_x, eval_y)))
    return out


def epoch_record(rule: CreditRule, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[dict[str, Any], StateGradients]:
    """(the epoch entry's diagnostic fields, the state gradients) on an evaluation set: what
    an epoch of training records, for one call from a notebook or a test."""
    measures, sg = epoch_diagnostics(rule, x, y)
    entry = EpochEntry(measures=measures)
    keys = [*(f.name for f in dataclasses.fields(EpochMeasures)), *DERIVED]
    values = {key: entry.value(key) for key in keys}  # test_acc: no test pass here
    return {key: value for key, value in values.items() if value is not None}, sg


def note_credit_not_finite(record: RunRecord, rule: CreditRule, epoch: int,
                           invalid: Sequence[str | None] | None) -> None:
    """Keep in ``record.credit_not_finite`` the first epoch whose per-state ``invalid``
    reasons (an epoch's ``cos_invalid``, or the end-of-run table's) say the rule's credits
    were NaN/Inf, where, and the rule as the registry names it (a plugin: as its guest, with
    its distribution), and say so once in a warning naming it. The run goes on: its
    training and accuracy are its own, only the measures of its credits are void."""
    states = [state for state, why in enumerate(invalid or []) if why == CREDIT_NOT_FINITE]
    if not states or record.credit_not_finite is not None:
        return
    what, guest = rule_named(rule)
    record.credit_not_finite = {"epoch": epoch, "states": states, "rule": what,
                                "guest": guest}
    with blame(RULES.guest(rule.name) if guest else None):
        part = nonfinite_part(rule)
    if part is not None:  # the rule's own net, not the network, went non-finite
        record.credit_not_finite["part"] = part
    log.warning("warning: %s", credit_not_finite_text(record))


def rule_named(rule: CreditRule) -> tuple[str, bool]:
    """How messages name ``rule`` (as the registry does: a plugin with its distribution) and
    whether it is a guest's code: a plugin, or a class of the user's own that the registry
    does not hold under its name."""
    cls = type(rule)
    if RULES.find(rule.name) is not cls:
        return f"{RULES.noun} {cls.__module__}.{cls.__qualname__} (your own class)", True
    guest = RULES.guest(rule.name)
    if guest is not None:
        return guest.what, True
    return f"{RULES.noun} {rule.name!r}", False


def rule_extras(rule: CreditRule, values: Any) -> dict[str, float]:
    """``values``, what ``rule.end_epoch`` returned (the epoch's own per-epoch fields), as
    the entry's extras (floats: :func:`recordable_number`, NaN and ±inf kept; None stays
    None), once none is named like a key the entry writes itself
    (:data:`~creditaudit.records.RECORD_KEYS`: it would replace that value in record.json)
    and each is a number under a string key. One line naming the rule and the key: a
    GuestError for a plugin's or your own class's, RuntimeError (creditaudit's own fault)
    for a built-in's."""
    problem = None
    if not isinstance(values, Mapping):
        problem = f"returned a {type(values).__name__}, not a dict of per-epoch values"
    elif taken := sorted(str(key) for key in values if key in RECORD_KEYS):
        problem = (f"returned per-epoch values named {', '.join(map(repr, taken))}, keys the "
                   "epoch entry writes itself, which they would replace in record.json; give "
                   "them other names")
    else:
        extras: dict[str, Any] = {}
        for key, value in values.items():
            number = None if value is None else recordable_number(value)
            if not isinstance(key, str) or not key.strip():
                kind = f"a {type(key).__name__}" if not isinstance(key, str) else "no name"
                problem = (f"returned a per-epoch value under the key {key!r}, {kind}: name "
                           "each value with a string that says what it is")
            elif number is None and value is not None:
                problem = (f"returned {shown(value)} as the per-epoch value {key!r}, which a "
                           "record cannot hold: return a number (a float, an int, a numpy or "
                           "one-element tensor number)")
            if problem is not None:
                break
            extras[key] = number
        else:
            return extras
    what, guest = rule_named(rule)
    if not guest:
        raise RuntimeError(f"{what}: end_epoch() {problem}")
    raise GuestError(f"{what}: end_epoch() {problem}; {VALUE_ADVICE}")


def rule_metrics(rule: CreditRule, values: Any) -> Any:
    """``values``, what ``rule.run_metrics`` returned, once it is a dict of plain JSON values
    (record.json and a report's JSON hold them: a tensor or a numpy float32 among them failed
    the record's write at the end of the run, as creditaudit's "internal error") and no
    object in it names two keys that JSON spells alike (``1`` and ``"1"``, ``True`` and
    ``"true"``): record.json would hold the key twice, one value lost, and reading the
    record back refuses it. One line naming the rule: a GuestError for a plugin's or your
    own class's, RuntimeError (creditaudit's own fault) for a built-in's."""
    problem = metrics_problem(values)
    if problem is None:
        return values
    what, guest = rule_named(rule)
    if not guest:
        raise RuntimeError(f"{what}: {problem}")
    raise GuestError(f"{what}: {problem}; {VALUE_ADVICE}")


def note_end_of_run_credits(record: RunRecord, rule: CreditRule) -> None:
    """:func:`note_credit_not_finite` for the end-of-run block's cosine table (measured on
    the network of the last epoch)."""
    table = record.diagnostics.cosine_table or []
    note_credit_not_finite(record, rule, record.log[-1].epoch,
                           [row.get("cos_invalid") for row in table])


def last_finite(log: Sequence[EpochEntry]) -> EpochEntry | None:
    """The last entry of ``log`` whose numbers are finite (:func:`finite_entry`), or None:
    the epoch whose accuracy is a diverged run's headline."""
    return next((e for e in reversed(log) if finite_entry(e)), None)


def finite_entry(entry: EpochEntry) -> bool:
    """False when a recorded loss (test or train) or any state norm is NaN/Inf; a loss not
    recorded (None: a user's loop that passes none) says nothing either way."""
    norms = entry.measures.hidden_norms if entry.measures is not None else []
    values = [entry.test_loss, entry.train_loss, *norms]
    return all(math.isfinite(v) for v in values if v is not None)


def training_state_fault(model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why the network can no longer train though every step's loss and state were finite,
    in one line, else None: a trained parameter that holds NaN/Inf, or a moment of its
    optimiser that does (a frozen one may hold ±inf by design, as a -inf mask does). A huge
    finite setting (a penalty, a feedback or learning-rate scale of 1e30) overflows AdamW's
    second moment to inf; every update of that parameter is then
    m/(√inf + ε) = 0, so training stops silently and the run would read as completed with
    the accuracy it had then. Read once per epoch (one min/max pass over each tensor, never
    in the step)."""
    for name, p in model.named_parameters():
        # a parameter that does not train may hold ±inf by design (a -inf mask)
        if p.requires_grad and not all_finite(p):
            return f"non-finite parameter {name}"
    names = {id(p): name for name, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() \
                    and value.dim() > 0 and not all_finite(value):
                return (f"the optimiser's {key} of {names.get(id(p), 'a parameter')} "
                        "overflowed to NaN/Inf, so its updates are 0 and training stopped: "
                        "a method.* setting that scales the loss or the credit (or the "
                        "learning rate) is too large")
    return None
