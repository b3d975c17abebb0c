"""Threshold sensitivity (science.md §7): how many runs does each diagnostic flag as its
threshold moves?

Computed from the audit runs' records only (no new training): for each run, the statistic
each diagnostic stored at the run's last protocol evaluation (its protocol block; (d)
against the frozen-blocks runs of its recipe, as in every summary) is judged again at every
threshold of the range the diagnostic declares (``sensitivity``), with the diagnostic's own
:meth:`~creditaudit.protocol.ProtocolDiagnostic.fires`. For each threshold it reports how
many runs fire and how many runs the whole verdict walks back with that one threshold
changed (every other diagnostic at its default threshold). A diagnostic that declares no
range — (c), whose statistic is bimodal — is judged at its default only. The *stable band*
is the range of thresholds that flags exactly the runs the default flags: the gap between
the closest passing and the closest firing statistic, as a ratio for diagnostics on a log
scale (science.md §5 calibration: 63× for (a), 24,338× for (b)) and as a difference
otherwise.
"""

from __future__ import annotations

from typing import Any

from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DepthUtility,
    ProtocolDiagnostic,
    default_names,
    in_order,
)
from creditaudit.protocol.records import RecordSet, is_frozen_baseline, not_judged_reason
from creditaudit.protocol.verdicts import reads_reference
from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS
from creditaudit.report.runs import ACC, G_NORM, H_NORM
from creditaudit.study.experiments.audit_table import audit_configs
from creditaudit.study.experiments.groups import fmt, markdown_table, method_label
from creditaudit.study.experiments.marks import TableMarks, marks_of
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register


def default_threshold(diagnostic: type[ProtocolDiagnostic]) -> float:
    return diagnostic().limit()


def run_statistics(record: RunRecord, index: RecordSet) -> dict[str, Any]:
    """Each diagnostic's stored statistic (None where it was not evaluated), status and, where
    not evaluated, why — at the run's last protocol evaluation, (d) against its recipe's
    frozen runs. A run with no protocol evaluation (one that diverged before the first) is
    read as every other table reads it (:meth:`RecordSet.protocol_report`: (d) against the
    frozen runs, the rest not evaluated; without frozen runs, its verdict), so it is
    counted as decision_utility counts it."""
    report = index.protocol_report(record)
    if report is not None:
        results = report.diagnostics
        return {"values": {r.id: r.value for r in results},
                "statuses": {r.id: r.status for r in results},
                "reasons": {r.id: r.reason for r in results if r.status == NOT_EVALUATED}}
    verdict = index.verdict(record)
    why = not_judged_reason(record)
    return {"values": {DepthUtility.name: verdict.margin_pp},
            "statuses": dict(verdict.statuses),
            "reasons": {i: why for i, status in verdict.statuses.items()
                        if status == NOT_EVALUATED}}


def _kind(diagnostic: str) -> str:
    """The kind of headline number (:mod:`.marks`) a diagnostic's statistic is."""
    if diagnostic == DepthUtility.name:
        return ACC
    return G_NORM if reads_reference(diagnostic) else H_NORM


def status_at(diagnostic: str, stats: dict[str, Any], threshold: float | None = None) -> str:
    """The status of ``diagnostic`` for a run's ``stats`` at ``threshold`` (default: the
    diagnostic's default threshold); a diagnostic not installed here, or one without a
    stored statistic, keeps its recorded status."""
    cls = DIAGNOSTICS.find(diagnostic)
    recorded = stats["statuses"].get(diagnostic, NOT_EVALUATED)
    value = stats["values"].get(diagnostic)
    if cls is None or recorded == NOT_EVALUATED or value is None:
        return recorded
    limit = default_threshold(cls) if threshold is None else threshold
    return cls().with_threshold(limit).status_of(value)


def _stable_band(cls: type[ProtocolDiagnostic], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Closest passing and firing statistics at the default threshold, and their gap."""
    default = default_threshold(cls)
    values = [(r["stats"]["values"].get(cls.name), status_at(cls.name, r["stats"]))
              for r in runs]
    fired = [v for v, status in values if status == FIRED]
    passed = [v for v, status in values if status == PASSED]
    above = cls.operator == ">"  # fires above the threshold, else below it
    closest_fired = (min if above else max)(fired, default=None)
    closest_passed = (max if above else min)(passed, default=None)
    gap = None
    if closest_fired is not None and closest_passed is not None:
        high, low = ((closest_fired, closest_passed) if above
                     else (closest_passed, closest_fired))
        if cls.scale == "log":
            gap = high / low if low > 0 else None
        else:
            gap = high - low
    return {"default": default, "closest_fired": closest_fired, "closest_passed": closest_passed,
            "gap": gap, "gap_unit": "×" if cls.scale == "log" else cls.unit.strip()}


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    index = RecordSet(records)
    runs = []
    for record in sorted((r for r in records if not is_frozen_baseline(r)),
                         key=lambda r: (method_label(r), r.seed)):
        runs.append({"label": f"{method_label(record)} s{record.seed}",
                     "run_id": record.run_id, "stats": run_statistics(record, index),
                     "marks": marks_of([record], index)})
    ids = in_order(i for r in runs for i in r["stats"]["statuses"]) or default_names()
    # each run's marks (kind → marks), shown beside its label wherever a table names it
    out: dict[str, Any] = {"n_runs": len(runs), "diagnostics": {},
                           "marks": {r["label"]: r["marks"] for r in runs}}
    for diagnostic in ids:
        cls = DIAGNOSTICS.find(diagnostic)
        if cls is None or not cls.sensitivity:
            continue
        default = default_threshold(cls)
        rows = []
        for threshold in cls.sensitivity:
            statuses = [status_at(diagnostic, r["stats"], threshold) for r in runs]
            walked = 0
            for run, status in zip(runs, statuses):
                others = [status_at(i, run["stats"]) for i in ids if i != diagnostic]
                walked += status == FIRED or FIRED in others
            rows.append({
                "threshold": threshold, "default": threshold == default,
                "n_fired": statuses.count(FIRED),
                "n_evaluated": len(statuses) - statuses.count(NOT_EVALUATED),
                "fired": [r["label"] for r, s in zip(runs, statuses) if s == FIRED],
                "n_walked_back": walked,
            })
        out["diagnostics"][diagnostic] = {
            "statistic": cls.axis_label(), "operator": cls.operator, "rows": rows,
            "stable_band": _stable_band(cls, runs),
            "values": {r["label"]: r["stats"]["values"].get(diagnostic) for r in runs},
            "kind": _kind(diagnostic),
            "not_evaluated": [
                {"label": r["label"], "reason": r["stats"]["reasons"].get(diagnostic, "")}
                for r in runs if status_at(diagnostic, r["stats"]) == NOT_EVALUATED],
        }
    out["judged_at_default"] = [i for i in ids if i not in out["diagnostics"]]
    # such a diagnostic not evaluated walks no run back in the counts above: say how often
    out["not_evaluated_at_default"] = {
        i: n for i in out["judged_at_default"]
        if (n := sum(status_at(i, r["stats"]) == NOT_EVALUATED for r in runs))}
    return out


def _left_out(block: dict[str, Any], n_runs: int, named: Any) -> list[str]:
    """The runs a diagnostic did not evaluate (left out of its "runs fired" counts, still
    in "runs walked back"), grouped by why."""
    skipped = block.get("not_evaluated") or []
    if not skipped:
        return []
    by_reason: dict[str, list[str]] = {}
    for run in skipped:
        by_reason.setdefault(run["reason"] or "not evaluated", []).append(named(run["label"]))
    reasons = "; ".join(f"{', '.join(labels)}: {reason}" for reason, labels in by_reason.items())
    return ["", f"Not evaluated in {len(skipped)} of the {n_runs} runs (left out of the runs "
                f"fired, counted in the runs walked back): {reasons}."]


def to_markdown(summary: dict[str, Any]) -> str:
    mark = TableMarks(summary)
    marks = summary.get("marks") or {}
    n_runs = summary["n_runs"]
    parts = [f"{n_runs} audit runs (frozen baselines excluded)."]
    for diagnostic, block in summary["diagnostics"].items():
        kind = block.get("kind", H_NORM)

        def named(label: str, kind: str = kind) -> str:
            return mark(label, {"marks": marks.get(label)}, kind)

        rows = [[(f"**{fmt(r['threshold'], 'g')}** (default)" if r["default"]
                  else fmt(r["threshold"], "g")),
                 f"{r['n_fired']}/{r['n_evaluated']}", f"{r['n_walked_back']}/{n_runs}",
                 ", ".join(map(named, r["fired"])) or "—"] for r in block["rows"]]
        band = block["stable_band"]
        unit = band["gap_unit"]
        gap = ("—" if band["gap"] is None else
               f"{band['gap']:.3g}{unit if unit == '×' else ' ' + unit if unit else ''}")
        parts += ["", f"## ({diagnostic}) {block['statistic']}, fires when "
                      f"{block['operator']} threshold", "",
                  markdown_table(["threshold", "runs fired", "runs walked back", "which"],
                                 rows), "",
                  f"Stable band around the default: closest firing value "
                  f"{fmt(band['closest_fired'])}, closest passing value "
                  f"{fmt(band['closest_passed'])}, gap {gap}.",
                  *_left_out(block, n_runs, named)]
    fixed = summary.get("judged_at_default") or []
    if fixed:
        skipped = summary.get("not_evaluated_at_default") or {}
        parts += ["", "Judged at the default threshold only (no range to sweep): "
                      + "".join(f"({i})" for i in fixed)
                      + "".join(f"; ({i}) not evaluated in {n} of the {n_runs} runs"
                                for i, n in skipped.items()) + "."]
    notes = mark.notes_text().strip()
    if notes:
        parts += ["", notes]
    parts += ["", "Reference (science.md §5): (a) healthy max 11.0 vs degenerate min 694 "
              "(63× gap); (b) healthy min 1.02e-4 vs degenerate max 4.18e-9 (24,338× gap)."]
    return "\n".join(parts) + "\n"


EXPERIMENT = register(Experiment(
    name="threshold_sensitivity",
    question="How many runs does each diagnostic ((a), (b), the (d) margin, any added one) "
             "flag across a range of thresholds, and how wide is the gap around each default?",
    needs="the audit_table runs (no new training)",
    build_configs=audit_configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    means=False,  # each run's statistic, counted: no mean of end-of-run values
    takes={"rules": "the audited rules, each at λ = 0 (the frozen-blocks baseline is always "
                    "added)",
           "arch": "the ResidualMLP: one architecture"},
))
