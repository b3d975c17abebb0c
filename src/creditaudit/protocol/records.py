"""The protocol over run records: verdicts, the frozen baseline of (d), and what a report
says about each run.

Records store what was measured and what the training-time protocol decided at each
evaluated epoch; deciding anew — (d) against the frozen-blocks runs of the same recipe,
another threshold — happens here, never in the record layer. (d) compares a run's accuracy
with the frozen-blocks baseline of the *same recipe* (same data, model — and its code,
where it is not creditaudit's —, optimiser and precision; :attr:`RunRecord.recipe_key`).
Runs are trained without ``diagnostics.frozen_acc``, so wherever the frozen-blocks runs of
a recipe are among the records, (d) is evaluated against their mean final accuracy
(:class:`RecordSet`, by default; ``use_frozen_runs=False`` keeps each record's own (d)).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from creditaudit.errors import ConfigError
from creditaudit.protocol.checks import (
    NOT_EVALUATED,
    UNTRAINED_REASON,
    DiagnosticResult,
    Thresholds,
    unfounded,
)
from creditaudit.protocol.diagnostics import DepthUtility, default_names, depth_utility
from creditaudit.protocol.evaluate import DiagnosticReport
from creditaudit.protocol.record_facts import (
    arch_variant,
    draws_default_feedback,
    is_frozen_baseline,
    model_description,
    record_metadata,
)
from creditaudit.protocol.verdicts import Judgement, Protocol, judge, statuses_of
from creditaudit.records import Copies, EndOfRun, EpochEntry, RunRecord, find_runs, results_folder
from creditaudit.registry import DIAGNOSTICS


def untrained(record: RunRecord) -> bool:
    """Whether ``record``'s verdict is of a network that never trained: its last protocol
    evaluation (else its numbers) is of epoch 0 — a 0-epoch run — and it did not diverge. A
    run that diverged in its first epoch did train: its epoch-0 numbers stand in for its
    last finite ones, and it is judged on them, (d) included."""
    epoch = record.protocol.epoch if record.protocol.epoch is not None else record.numbers_epoch
    return epoch == 0 and record.status != "diverged"


def judged_diverged_epoch(record: RunRecord) -> bool:
    """Whether ``record``'s protocol last judged the epoch its run diverged in (past the
    last finite one, :attr:`~creditaudit.records.RunRecord.numbers_epoch`), whose (d)
    judges that last finite accuracy; one judged before (``protocol_every`` > 1) its own."""
    epoch = record.protocol.epoch
    return (record.status == "diverged" and epoch is not None
            and (record.numbers_epoch is None or epoch > record.numbers_epoch))


def before_training(result: DiagnosticResult) -> DiagnosticResult:
    """``result`` as judged on an untrained network (a run's epoch 0): not evaluated when
    its diagnostic means nothing before training (``before_training`` False), as records
    written before the training-time protocol knew it are read too."""
    cls = DIAGNOSTICS.find(result.id)
    if cls is None or cls.before_training or result.status == NOT_EVALUATED:
        return result
    return DiagnosticResult(result.id, result.name, None, result.threshold, NOT_EVALUATED,
                            UNTRAINED_REASON, {**result.details, "claimed": result.status})


# --- verdicts -------------------------------------------------------------------------------
@dataclass
class Verdict:
    """A run's protocol outcome as readers report it.

    ``statuses``: (a)…(d) → fired / passed / not evaluated; ``judgement``: the verdict, its
    words and colour (:func:`~creditaudit.protocol.verdicts.judge` of the statuses and the
    record's reference check); ``margin_pp``: (d)'s statistic; ``frozen_acc``: the
    baseline it was compared with.
    """

    statuses: dict[str, str]
    judgement: Judgement
    margin_pp: float | None = None
    frozen_acc: float | None = None
    frozen_runs: int = 0

    @property
    def verdict(self) -> str:
        """needs walk-back, unverified, incomplete or trustworthy."""
        return self.judgement.verdict

    @property
    def text(self) -> str:
        """What a table prints."""
        return self.judgement.text

    @property
    def fired(self) -> list[str]:
        return list(self.judgement.fired)

    @property
    def not_evaluated(self) -> list[str]:
        return list(self.judgement.not_evaluated)

    @property
    def walked_back(self) -> bool:
        return bool(self.fired)


def record_verdict(record: RunRecord, frozen_acc: float | None = None, frozen_runs: int = 0,
                   thresholds: Thresholds | None = None) -> Verdict:
    """The verdict: the diagnostics of the run's last protocol evaluation (its report, as
    :func:`record_report` reads it — so a table's verdict and the run's report agree); (d)
    against ``frozen_acc`` when given (the mean accuracy of ``frozen_runs`` frozen-blocks
    runs of this recipe), else as recorded; judged with the record's reference check. A
    frozen baseline itself is not judged on (d). A record whose protocol report is missing
    is judged on the statuses its epochs logged."""
    report = record_report(record, frozen_acc, frozen_runs, thresholds)
    if report is not None:
        statuses = statuses_of(report.diagnostics)
        d = next((r for r in report.diagnostics if r.id == DepthUtility.name), None)
        return Verdict(statuses, report.judgement, d.value if d is not None else None,
                       frozen_acc, frozen_runs)
    statuses = recorded_statuses(record)
    for i in default_names():
        statuses.setdefault(i, NOT_EVALUATED)
    return Verdict(statuses, judge(statuses, record.reference.to_dict()),
                   record.recorded_value(DepthUtility.name), frozen_acc, frozen_runs)


def recorded_statuses(record: RunRecord) -> dict[str, str]:
    """The statuses of ``record``'s last protocol evaluation; one whose stored statistic
    cannot carry it (a pass without a finite number, written before statistics were
    checked) reads as not evaluated."""
    statuses = record.recorded_statuses()
    stored = (record.protocol.report or {}).get("diagnostics") or {}
    for i, result in stored.items():
        if i in statuses and isinstance(result, dict) and unfounded(statuses[i],
                                                                     result.get("value")):
            statuses[i] = NOT_EVALUATED
    return statuses


def epoch_fields(entry: EpochEntry | None) -> dict[str, float]:
    """The per-epoch fields of ``entry`` beyond the tool's own (``extras``: a rule's — EP's
    relaxation ratio and back-off share, a bridge's errors — or a loop's own), which the
    report's metrics show as ``creditaudit audit`` does; one named as an end-of-run metric
    (a loop's extra called ``bp_cosine``) is left out: it is not that metric."""
    if entry is None:
        return {}
    reserved = {field.name for field in fields(EndOfRun)}
    return {key: value for key, value in entry.extras.items() if key not in reserved}


def not_judged_reason(record: RunRecord) -> str:
    """Why ``record`` holds no protocol evaluation: the diagnostics' reason in
    :func:`unjudged_report` and wherever its statistics are read."""
    epoch = (record.divergence or {}).get("epoch")
    if record.status == "diverged" and epoch is not None:
        return f"diverged in epoch {epoch}, before the protocol's first evaluation"
    return "no protocol evaluation recorded"


def unjudged_report(record: RunRecord) -> DiagnosticReport:
    """A report of ``record``'s protocol (``diagnostics.protocol``, its thresholds) on its
    last finite epoch with every diagnostic not evaluated: what :func:`record_report`
    judges (d) in against a frozen baseline where the record holds no protocol evaluation
    (a run that diverged in its first epoch's steps) — as ``audit`` of its checkpoint does."""
    protocol = Protocol.from_config(record.config.diagnostics)
    why = not_judged_reason(record)
    results = [DiagnosticResult(d.name, d.label, None, d.limit(), NOT_EVALUATED, why)
               for d in protocol.diagnostics]
    last = record.entry(record.numbers_epoch) if record.numbers_epoch is not None else None
    measures = last.measures if last is not None else None
    return DiagnosticReport(
        list(measures.hidden_norms) if measures else [],
        list(measures.bp_grad_norms_per_sample_med) if measures else [], results, "", [], [],
        metadata={**record_metadata(record), "headline_acc": record.final_acc,
                  "n_samples": record.data.eval_samples if record.data else None,
                  "thresholds": protocol.thresholds().to_dict()})


def record_report(record: RunRecord, frozen_acc: float | None = None, frozen_runs: int = 0,
                  thresholds: Thresholds | None = None) -> DiagnosticReport | None:
    """The run's last protocol report (for a finished run whose record holds none, with
    ``frozen_acc`` given, :func:`unjudged_report`; else None), with Γ, per-layer cosines
    and the credit-quality metrics filled in from the end-of-run block and the epoch's own
    fields (:func:`epoch_fields`), the record's reference check as
    ``metadata["reference_check"]``, and (d) re-evaluated against ``frozen_acc`` when given
    (``metadata["frozen_from_runs"]`` = ``frozen_runs``; at ``thresholds``, default the
    report's own)."""
    entry = record.entry(record.protocol.epoch) if record.protocol.epoch is not None else None
    measures = entry.measures if entry is not None else None
    if record.protocol.report:
        report = DiagnosticReport.from_dict(
            json.loads(json.dumps(record.protocol.report)),
            hidden_norms=measures.hidden_norms if measures is not None else None,
            grad_norms=measures.bp_grad_norms_per_sample_med if measures is not None else None)
    elif frozen_acc is not None and record.is_finished and not is_frozen_baseline(record):
        report = unjudged_report(record)  # (d) is judged below, as in every other record
    else:
        return None
    # Judged with the run's reference check, as every reading of the record is.
    report.metadata["reference_check"] = record.reference.to_dict()
    if untrained(record):  # a 0-epoch run
        report.diagnostics = [before_training(r) for r in report.diagnostics]
    end = record.diagnostics
    if report.gamma is None and end.gamma:
        report.gamma = dict(end.gamma)
    if report.layer_cosines is None and end.cosine_table:
        report.layer_cosines = list(end.cosine_table)
    if report.metrics is None and end.bp_cosine is not None:
        metrics = end.to_dict()
        for key in ("drift", "cosine_table"):
            metrics.pop(key, None)
        report.metrics = metrics
    own = epoch_fields(entry)
    if own:
        report.metrics = {**(report.metrics or {}), **own}
    if frozen_acc is not None and not is_frozen_baseline(record):
        headline = (record.final_acc if judged_diverged_epoch(record)
                    else report.metadata.get("headline_acc"))
        if headline is None:
            headline = record.final_acc
        d = depth_utility(headline, frozen_acc, thresholds or report.thresholds,
                          trained=not untrained(record))
        d.details["frozen_runs"] = frozen_runs
        report.diagnostics = [d if r.id == d.id else r for r in report.diagnostics]
        report.metadata["frozen_acc"] = frozen_acc
        report.metadata["frozen_from_runs"] = frozen_runs
    report.rejudge()
    return report


# --- sets of records ------------------------------------------------------------------------
def not_a_baseline(record: RunRecord) -> str | None:
    """Why a finished frozen-blocks run is no baseline of (d) — ``stopped early`` (fewer
    epochs than its recipe's ``optim.epochs``) or ``diverged`` (its accuracy is of its last
    finite epoch, the untrained readout's where that is epoch 0), as the report labels it
    (:func:`baseline_runs` leaves both out) — else None."""
    if record.stopped_early:
        return "stopped early"
    if record.status == "diverged":
        return "diverged"
    return None


# A finished frozen-blocks run's verdict, in every table and figure (its method names it).
BASELINE_TEXT = f"baseline of {DepthUtility.id_label()}"


def baseline_text(record: RunRecord) -> str:
    """What tables and figures say of a finished frozen-blocks run in place of a verdict:
    the baseline of (d), or why it is none (:func:`not_a_baseline`)."""
    why = not_a_baseline(record)
    return BASELINE_TEXT if why is None else f"no {BASELINE_TEXT}: {why}"


def baseline_runs(record: RunRecord, records: Iterable[RunRecord]) -> list[RunRecord]:
    """The finished frozen-blocks runs of ``record``'s recipe among ``records`` that have a
    final accuracy — the one place the baseline of (d) is chosen. A frozen run that stopped
    early (``stopped_early``: fewer epochs than its recipe's ``optim.epochs``) is no
    baseline: its readout trained less; nor is one that diverged, whose final accuracy is
    of its last finite epoch (or of a readout already broken)."""
    key = record.recipe_key
    return [r for r in records
            if is_frozen_baseline(r) and r.status == "completed" and not r.stopped_early
            and r.recipe_key == key and r.final_acc is not None]


def frozen_baseline(record: RunRecord, records: Iterable[RunRecord]) -> tuple[float, int] | None:
    """(mean final accuracy, number of runs) of :func:`baseline_runs` of ``record`` among
    ``records``, or None when there are none."""
    accs = [r.final_acc for r in baseline_runs(record, records)]
    return (sum(accs) / len(accs), len(accs)) if accs else None


class RecordSet:
    """Records (with the paths they came from) plus the unreadable ones (path, reason)."""

    def __init__(self, records: Iterable[RunRecord], *, paths: Iterable[Path] | None = None,
                 skipped: Iterable[tuple[Path, str]] = (), root: Path | None = None,
                 use_frozen_runs: bool = True, copies: Iterable[Copies] = ()) -> None:
        self.records = list(records)
        self.copies = list(copies)  # run ids found more than once: which copy was read
        self.paths = list(paths) if paths is not None else [Path(r.run_id)
                                                            for r in self.records]
        self.skipped = list(skipped)
        self.root = root
        self.use_frozen_runs = use_frozen_runs
        self._baselines: dict[str, tuple[float, int] | None] = {}

    @classmethod
    def from_folder(cls, root: str | Path, *, dataset: str | None = None,
                    use_frozen_runs: bool = True) -> RecordSet:
        """Every record below ``root``, each run id once (``dataset``: only runs on that
        dataset); unreadable records are named in one warning each and listed in
        ``skipped``; a run found in several folders is read once (``copies`` says which
        copy; copies that differ with none to choose are left out and listed in
        ``skipped``: :mod:`creditaudit.records.duplicates`).

        ConfigError when ``root`` is empty (it would silently mean the current folder), is
        not a folder, or holds records but none on ``dataset``.
        """
        root = results_folder(root)
        found = find_runs(root)
        good, bad = found.records, found.unreadable
        kept = [(p, r) for p, r in good if dataset is None or r.dataset == dataset]
        if good and not kept:
            raise ConfigError(f"no run records of dataset {dataset!r} in {root} (it holds: "
                              f"{', '.join(sorted({r.dataset for _, r in good}))}); name one "
                              "of those, or leave the dataset out for every run")
        return cls([r for _, r in kept], paths=[p for p, _ in kept], skipped=bad, root=root,
                   use_frozen_runs=use_frozen_runs, copies=found.copies)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[RunRecord]:
        return iter(self.records)

    @property
    def finished(self) -> list[RunRecord]:
        return [r for r in self.records if r.is_finished]

    def frozen_baseline(self, record: RunRecord) -> tuple[float, int] | None:
        """(mean final accuracy, number of runs) of the finished frozen-blocks runs of
        ``record``'s recipe, or None when there are none."""
        key = record.recipe_key
        if key not in self._baselines:
            self._baselines[key] = frozen_baseline(record, self.records)
        return self._baselines[key]

    def _baseline_for(self, record: RunRecord) -> tuple[float | None, int]:
        if not self.use_frozen_runs or is_frozen_baseline(record):
            return None, 0
        baseline = self.frozen_baseline(record)
        return (None, 0) if baseline is None else baseline

    def verdict(self, record: RunRecord) -> Verdict:
        """``record``'s verdict, (d) against its recipe's frozen runs when there are any."""
        frozen_acc, n = self._baseline_for(record)
        return record_verdict(record, frozen_acc, n)

    def protocol_report(self, record: RunRecord) -> DiagnosticReport | None:
        """``record``'s protocol report, (d) against its recipe's frozen runs if any."""
        frozen_acc, n = self._baseline_for(record)
        return record_report(record, frozen_acc, n)


__all__ = ["Verdict", "RecordSet", "record_verdict", "record_report", "recorded_statuses",
           "not_judged_reason", "unjudged_report", "baseline_runs", "not_a_baseline",
           "BASELINE_TEXT", "baseline_text",
           "frozen_baseline", "is_frozen_baseline", "model_description", "record_metadata",
           "arch_variant", "draws_default_feedback"]
