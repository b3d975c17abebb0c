"""Summaries of groups of run records: runs equal but for their seed, their verdicts (with
(d) against the frozen runs of the same recipe), seed rows and per-epoch trajectories.

Runs are trained without ``diagnostics.frozen_acc`` (it would tie every run to a number), so
(d) is evaluated at summary time from the records
(:class:`~creditaudit.protocol.records.RecordSet`):
headline accuracy against the mean final accuracy of the frozen-blocks runs of the same
recipe, while (a), (b) and (c) keep the status the training-time protocol recorded at the
run's last evaluated epoch. A run that stopped early (``record.stopped_early``) keeps its
seed row and counts in its group's verdicts, but its end-of-run numbers are of an earlier
epoch than the group's other runs': they stay out of the group's means
(:func:`~creditaudit.results.full_length`), as in the report's summary.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from creditaudit.config import non_semantic
from creditaudit.formatting import fmt, format_lambda, markdown_table
from creditaudit.protocol import (
    FIRED,
    INCOMPLETE,
    NOT_EVALUATED,
    PASSED,
    UNVERIFIED,
    WALK_BACK,
    default_names,
    in_order,
    judge,
    labels,
)
from creditaudit.protocol.records import (
    RecordSet,
    Verdict,
    arch_variant,
    baseline_runs,
    is_frozen_baseline,
)
from creditaudit.records import RunRecord
from creditaudit.results import full_length, stopped_early_text
from creditaudit.study.experiments.aggregate import aggregate
from creditaudit.study.experiments.marks import marks_of, row_marks


def method_label(record: RunRecord) -> str:
    """``dfa``, ``dfa+λ=1e-2``, ``bp k=2`` …: the method with its penalty and ladder step."""
    method = record.config.method
    label = method.name
    if method.penalty:
        label += f"+λ={format_lambda(method.penalty)}"
    if method.trainable_blocks is not None:
        label += f" k={method.trainable_blocks}"
    return label


def seedless_key(record: RunRecord) -> str:
    """Equal for runs that differ only in their seed (same data, same everything else)."""
    raw = record.config.to_dict()
    skip = non_semantic(record.config) | {("run", "seed")}
    kept = {section: {k: v for k, v in values.items() if (section, k) not in skip}
            for section, values in raw.items()}
    kept["source"] = record.data.source if record.data else None
    return json.dumps(kept, sort_keys=True)


def group_records(records: Iterable[RunRecord]) -> dict[str, list[RunRecord]]:
    """Records grouped by :func:`seedless_key` (first-seen order; each group by seed)."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(seedless_key(record), []).append(record)
    for members in groups.values():
        members.sort(key=lambda r: r.seed)
    return groups


def verdicts(records: Sequence[RunRecord]) -> dict[str, Verdict]:
    """Every record's verdict (by run id), (d) against its recipe's frozen runs."""
    index = RecordSet(records)
    return {r.run_id: index.verdict(r) for r in records}


def frozen_runs(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The frozen-blocks runs that are the baseline of (d) for the runs among ``records``,
    chosen as the report chooses them (:func:`~creditaudit.protocol.records.baseline_runs`:
    finished, trained all their epochs, of the same recipe); none when the runs are of
    recipes with different baselines (each row's ``frozen_acc`` is its own then)."""
    trained = [r for r in records if not is_frozen_baseline(r)] or list(records)
    recipes = {r.recipe_key: r for r in trained}
    found = [runs for runs in (baseline_runs(r, records) for r in recipes.values()) if runs]
    return found[0] if len(found) == 1 else []


def frozen_accuracy(records: Sequence[RunRecord]) -> dict[str, Any] | None:
    """:func:`aggregate` of the final accuracy of :func:`frozen_runs` of ``records``, with
    the ``marks`` of their numbers (:func:`~.marks.marks_of`); None without such runs."""
    frozen = frozen_runs(records)
    if not frozen:
        return None
    return {**aggregate(r.final_acc for r in frozen), "marks": marks_of(frozen)}


def diagnostics_of(verdicts: Iterable[Verdict]) -> list[str]:
    """The diagnostics ``verdicts`` hold, in listing order (the default protocol's when
    none does)."""
    return in_order(i for v in verdicts for i in v.statuses) or default_names()


def verdict_overview(group: Sequence[Verdict]) -> dict[str, Any]:
    """Seeds walked back, how often each diagnostic fired, and a one-line overall verdict
    (``needs walk-back (a)(b) in 3/3 seeds``) over the verdicts of a group's seeds, for
    every diagnostic they hold. Its kind is :func:`~creditaudit.protocol.judge`'s on the
    seeds together — any seed fired, any not evaluated, the least verified reference — so
    "trustworthy" only when no seed fired, every diagnostic was evaluated and every seed's
    reference gradient was verified."""
    n = len(group)
    ids = diagnostics_of(group)
    walked = sum(v.walked_back for v in group)
    counts = {i: sum(i in v.fired for v in group) for i in ids}
    skipped = [i for i in ids if any(i in v.not_evaluated for v in group)]
    merged = {i: FIRED if counts[i] else NOT_EVALUATED if i in skipped else PASSED for i in ids}
    failed = [v.judgement for v in group if v.judgement.reference_failed]
    unchecked = [v.judgement for v in group if v.judgement.reference_verified is False]
    worst = (failed or unchecked or [None])[0]
    reference = None if worst is None else {
        "verified": False, "how": "failed" if worst.reference_failed else "skipped"}
    judged = judge(merged, reference)
    note = ([f"{worst.reference_note} in {len(unchecked)}/{n} seeds"]
            if worst is not None else [])
    # Seeds that evaluated each diagnostic: one seed that diverged before any evaluation
    # leaves the others' diagnostics evaluated, in fewer seeds.
    evaluated_in = {i: sum(i not in v.not_evaluated for v in group) for i in ids}
    not_evaluated = [f"{labels(names)} not evaluated" + ("" if k == 0 else f" in {n - k}/{n} "
                                                         "seeds")
                     for k, names in _by_count(skipped, evaluated_in)]
    if judged.verdict == WALK_BACK:
        parts = [f"needs walk-back {labels([i for i in ids if counts[i]])} in {walked}/{n} "
                 "seeds", *not_evaluated, *note]
    elif judged.verdict == UNVERIFIED:
        parts = [f"{UNVERIFIED}: {note[0]}", *not_evaluated]
    elif judged.verdict == INCOMPLETE:
        evaluated = [i for i in ids if evaluated_in[i]]
        parts = [*(f"no walk-back in {labels(names)} ({k}/{n} seeds)"
                   for k, names in _by_count(evaluated, evaluated_in)), *not_evaluated, *note]
    else:
        parts = [f"trustworthy ({n}/{n} seeds)"]
    return {"n": n, "walked_back": walked, "fired_counts": counts, "not_evaluated": skipped,
            "verdict": judged.verdict, "kind": judged.kind, "text": "; ".join(parts)}


def _by_count(ids: list[str], count: dict[str, int]) -> list[tuple[int, list[str]]]:
    """``ids`` grouped by ``count`` (most first), each group in listing order."""
    return [(k, [i for i in ids if count[i] == k])
            for k in sorted({count[i] for i in ids}, reverse=True)]


def seed_row(record: RunRecord, verdict: Verdict) -> dict[str, Any]:
    """One seed of a group: its headline numbers (a diverged run's all of its last finite
    epoch, as its accuracy is), verdict and — for a run that stopped early — the report's
    words for it (``stopped_early``; None otherwise)."""
    return {"seed": record.seed, "run_id": record.run_id, "status": record.status,
            "stopped_early": stopped_early_text(record),
            "test_acc": record.final_acc, "headline_gamma": record.headline_gamma,
            "deep_cos": record.deep_cos, "deep_cos_valid": record.deep_cos_valid,
            "h_L_norm": record.headline_value("h_L_norm"),
            "g_L_norm": record.headline_value("g_L_norm"),
            "max_block_growth": record.headline_value("max_block_growth"),
            "statuses": verdict.statuses, "verdict": verdict.text,
            "margin_pp": verdict.margin_pp, "first_fired": record.first_fired(),
            "evaluated": evaluated_in_training([record])}


def group_summary(members: Sequence[RunRecord], verdict_of: dict[str, Verdict]
                  ) -> dict[str, Any]:
    """Seed aggregates of one group (runs equal but for the seed), the marks its numbers
    carry (:func:`~creditaudit.study.experiments.marks.row_marks`) and its per-seed rows.
    The aggregates and marks are of the runs that trained all their epochs
    (:func:`~creditaudit.results.full_length`); every run has a seed row and a verdict."""
    first = members[0]
    seeds = [seed_row(r, verdict_of[r.run_id]) for r in members]
    ended = full_length(members)
    kept = [s for s, r in zip(seeds, members) if not r.stopped_early]  # ``ended``'s rows
    frozen = [verdict_of[r.run_id].frozen_acc for r in members]
    return {
        "label": method_label(first), "method": first.method, "penalty": first.penalty,
        "trainable_blocks": first.config.method.trainable_blocks,
        "arch": arch_variant(first), "dataset": first.dataset, "epochs": first.epochs,
        "baseline": is_frozen_baseline(first),
        "test_acc": aggregate(s["test_acc"] for s in kept),
        "headline_gamma": aggregate(s["headline_gamma"] for s in kept),
        "deep_cos": aggregate(s["deep_cos"] for s in kept),
        "deep_cos_valid": all(s["deep_cos_valid"] is not False for s in kept),
        "h_L_norm": aggregate(s["h_L_norm"] for s in kept),
        "g_L_norm": aggregate(s["g_L_norm"] for s in kept),
        "max_block_growth": aggregate(s["max_block_growth"] for s in kept),
        "margin_pp": aggregate(s["margin_pp"] for s in kept),
        "frozen_acc": next((f for f in frozen if f is not None), None),
        "verdict": verdict_overview([verdict_of[r.run_id] for r in members]),
        "marks": row_marks(ended, [verdict_of[r.run_id].judgement for r in ended]),
        "seeds": seeds,
    }


def rule_groups(records: Sequence[RunRecord]
                ) -> list[tuple[list[RunRecord], dict[str, Any]]]:
    """(members, :func:`group_summary`) of every group but the frozen baselines, with (d)
    against the frozen runs of each recipe among ``records``."""
    verdict_of = verdicts(records)
    return [(members, group_summary(members, verdict_of))
            for members in group_records(records).values()
            if not is_frozen_baseline(members[0])]


TRAJECTORY_KEYS = ("acc_eval", "h_L_norm", "g_L_norm", "g_2_norm", "max_block_growth")


def trajectory(members: Sequence[RunRecord], keys: Sequence[str] = TRAJECTORY_KEYS
               ) -> dict[str, list[Any]]:
    """Per-epoch median over seeds of each log ``key`` (medians: the norms span orders of
    magnitude across seeds); ``epoch`` lists the epochs with diagnostics. Each run counts up
    to the epoch of its headline numbers
    (:meth:`~creditaudit.records.RunRecord.headline_entries`): the epoch a diverged run
    overflowed in holds the NaN network's measures (its accuracy the share of one class)."""
    logs = [{e.epoch: e for e in r.headline_entries()} for r in members]
    epochs = sorted({epoch for log in logs for epoch, e in log.items() if e.has_diagnostics})
    out: dict[str, list[Any]] = {"epoch": epochs}
    for key in keys:
        column = []
        for epoch in epochs:
            values = []
            for log in logs:
                entry = log.get(epoch)
                value = entry.value(key) if entry is not None else None
                if isinstance(value, int | float) and not math.isnan(value):
                    values.append(float(value))
            column.append(statistics.median(values) if values else None)
        out[key] = column
    return out


def epoch_text(value: int | None) -> str:
    return "never" if value is None else str(value)


def evaluated_seeds(seeds: Sequence[dict[str, Any]], diagnostic: str
                    ) -> list[dict[str, Any]]:
    """The seed rows (:func:`seed_row`) whose training-time protocol evaluated
    ``diagnostic``. A run that diverged in its first epoch evaluated none, and its
    ``first_fired`` None would otherwise read as "never fired"; summaries written before
    ``evaluated`` was kept count a seed whose ``first_fired`` names the diagnostic."""
    return [s for s in seeds
            if diagnostic in (s["evaluated"] if "evaluated" in s else s["first_fired"])]


def first_fired_cell(epochs: Sequence[int | None], not_evaluated: int = 0,
                     at_end: int | None = None) -> str:
    """``3–5 (2/3; at end 1; not evaluated in 1)``: the first firing epochs of the seeds
    that evaluated a diagnostic (None: never fired) — their span, how many fired, how many
    still fire at the end (``at_end``, when given) — and how many seeds never evaluated it;
    ``not evaluated`` when no seed did."""
    n = len(epochs)
    if not n:
        return "not evaluated"
    skipped = f"; not evaluated in {not_evaluated}" if not_evaluated else ""
    fired = [e for e in epochs if e is not None]
    if not fired:
        return f"never (0/{n}{skipped})"
    lo, hi = min(fired), max(fired)
    span = str(lo) if lo == hi else f"{lo}–{hi}"
    end = "" if at_end is None else f"; at end {at_end}"
    return f"{span} ({len(fired)}/{n}{end}{skipped})"


def evaluated_in_training(records: Iterable[RunRecord]) -> list[str]:
    """The diagnostics the training-time protocol evaluated at some epoch of ``records``
    (fired or passed), in listing order: those whose first firing epoch means something."""
    return in_order(i for r in records for e in r.log for i, status in (e.protocol or {}).items()
                    if status != NOT_EVALUATED)


__all__ = ["method_label", "group_records", "verdicts", "verdict_overview", "seed_row",
           "group_summary", "trajectory", "markdown_table", "epoch_text", "fmt", "format_lambda",
           "evaluated_seeds", "first_fired_cell", "frozen_runs", "frozen_accuracy",
           "rule_groups", "diagnostics_of", "evaluated_in_training"]
