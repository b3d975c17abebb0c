"""Audit table (science.md §7): every method × seed → accuracy, headline Γ and protocol verdict.

Runs: BP, FA, DFA, DFA + λ=1e-2, State Bridge, Credit Bridge, EP and the frozen-blocks
baseline on the scale's ResidualMLP and dataset, main epoch count, every seed of the scale.
The verdict's (d) uses the frozen runs' mean final accuracy (see :mod:`.base`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.protocol import HEADLINE_GAMMA, DepthUtility
from creditaudit.records import RunRecord
from creditaudit.report.runs import ACC, DEEP_COS, GAMMA
from creditaudit.results import full_length
from creditaudit.study.experiments.aggregate import aggregate, format_aggregate
from creditaudit.study.experiments.configs import (
    AUDIT_METHODS,
    arch_config,
    baseline_rule,
    method_overrides,
    single_arch,
)
from creditaudit.study.experiments.groups import (
    fmt,
    format_lambda,
    frozen_accuracy,
    group_records,
    group_summary,
    markdown_table,
    verdicts,
)
from creditaudit.study.experiments.marks import TableMarks
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

GAMMA_KEYS = ("layers_then_samples", "samples_then_layers", "pooled", "deep_only")


def labels_of(methods: Sequence[tuple[str, float]]) -> list[str]:
    """The rows' labels of (method, λ) pairs, in that order."""
    return [m + (f"+λ={format_lambda(p)}" if p else "") for m, p in methods]


ORDER = labels_of(AUDIT_METHODS)


def audit_methods(choices: Choices) -> list[tuple[str, float]]:
    """(method, λ) of the audit runs: :data:`AUDIT_METHODS`, or the chosen rules at λ = 0
    and the frozen-blocks baseline."""
    if choices.rules is None:
        return list(AUDIT_METHODS)
    return [*((rule, 0.0) for rule in choices.rules), (baseline_rule(), 0.0)]


def audit_configs(scale: str, *, dataset: str | None, data_dir: str | None, out_dir: str,
                  control: bool = False, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    """The audit runs (also used by decision_utility and threshold_sensitivity)."""
    variant = single_arch(choices.archs)
    return [arch_config(variant, scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=control, **method_overrides(method, penalty), run__seed=seed)
            for method, penalty in audit_methods(choices) for seed in get_scale(scale).seeds]


def _order(label: str, order: Sequence[str] = ORDER) -> tuple[int, str]:
    return (order.index(label) if label in order else len(order), label)



def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    verdict_of = verdicts(records)
    rows = []
    for members in group_records(records).values():
        row = group_summary(members, verdict_of)
        gammas = [r.diagnostics.gamma or {} for r in full_length(members)]
        row["gamma"] = {key: aggregate(g.get(key) for g in gammas) for key in GAMMA_KEYS}
        rows.append(row)
    order = labels_of(audit_methods(choices))
    rows.sort(key=lambda row: _order(row["label"], order))
    return {
        "headline_gamma_aggregation": HEADLINE_GAMMA,
        "frozen_acc": frozen_accuracy(records),
        "d_rule": f"{DepthUtility.id_label()} = final test accuracy − mean final accuracy of "
                  "the frozen runs of the same architecture, data and recipe; the other "
                  "diagnostics as recorded at the last evaluated epoch",
        "rows": rows,
    }


def to_markdown(summary: dict[str, Any]) -> str:
    frozen = summary.get("frozen_acc")
    d = DepthUtility.id_label()
    mark = TableMarks(summary)
    rows = []
    for row in summary["rows"]:
        gamma = row["gamma"]
        rows.append([
            row["label"], mark(format_aggregate(row["test_acc"]), row, ACC),
            mark(fmt(row["headline_gamma"]["mean"], "+.3f"), row, GAMMA),
            mark(fmt(row["deep_cos"]["mean"], "+.3f"), row, DEEP_COS),
            " / ".join(mark(fmt(gamma[k]["mean"], "+.3f"), row, GAMMA) for k in GAMMA_KEYS),
            "—" if row["baseline"] else mark(fmt(row["margin_pp"]["mean"], "+.1f"), row, ACC),
            (f"baseline for {d}" if row["baseline"] else
             "<br>".join(f"s{s['seed']}: {s['verdict']}" for s in row["seeds"])),
        ])
    table = markdown_table(["method", "test acc", "Γ (samples→layers)", "deep cos",
                      "Γ: layers→samples / samples→layers / pooled / deep", f"{d} margin pp",
                      "verdict per seed"], rows)
    notes = [
        "", f"Frozen-blocks baseline: {mark(format_aggregate(frozen), frozen, ACC)}.",
        "", f"Verdicts: {summary['d_rule']}.",
        "", "Published (science.md §7; CIFAR-10 d=256 L=4, 100 epochs, 3 seeds): BP .615 ± .004 "
        "trustworthy; FA .401 ± .009; EP .316 ± .037 trustworthy; DFA .306 ± .008 walked back "
        "by (a)(b)(d); Credit Bridge .289 ± .031 and State Bridge .205 ± .039 walked back by "
        "(a)(b)(d); frozen .349.",
    ]
    return table + mark.notes_text() + "\n" + "\n".join(notes)


EXPERIMENT = register(Experiment(
    name="audit_table",
    question="Which credit rules' headline accuracy and alignment survive the four-diagnostic "
             "protocol?",
    needs="bp, fa, dfa, dfa+λ=1e-2, state-bridge, credit-bridge, ep and frozen on the "
          "scale's ResidualMLP × every seed, main epochs",
    build_configs=audit_configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "the audited rules, each at λ = 0 (the frozen-blocks baseline is always "
                    "added)",
           "arch": "the ResidualMLP: one architecture"},
))
