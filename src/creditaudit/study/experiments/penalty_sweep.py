"""Penalty λ sweep (science.md §7): DFA with the residual-branch penalty λ‖f_l‖² for λ ∈ {0,
1e-4, 1e-3, 1e-2, 1e-1}.

Runs: DFA at every λ and the frozen baseline on the scale's ResidualMLP, control epoch
count (science.md §4: 30 epochs at paper scale), every seed. Reports per λ: accuracy, the final
‖h_L‖, ‖g_2‖, ‖g_L‖ and max block growth, deep cosine, the verdict (d against the frozen
run), when (a) and (b) first fired, and the per-epoch trajectories (medians over seeds)
behind Figure 4.
"""

from __future__ import annotations

from typing import Any

from creditaudit.config import RunConfig
from creditaudit.protocol import DepthUtility
from creditaudit.records import RunRecord
from creditaudit.report.runs import ACC, DEEP_COS, G_NORM, H_NORM
from creditaudit.results import full_length, method_rank
from creditaudit.study.experiments.aggregate import aggregate, format_aggregate
from creditaudit.study.experiments.configs import (
    arch_config,
    baseline_rule,
    method_overrides,
    single_arch,
    trained_rules,
)
from creditaudit.study.experiments.groups import (
    evaluated_in_training,
    evaluated_seeds,
    first_fired_cell,
    fmt,
    format_lambda,
    frozen_accuracy,
    markdown_table,
    rule_groups,
    trajectory,
)
from creditaudit.study.experiments.marks import TableMarks
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

LAMBDAS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)
PENALISED = ("dfa",)


def configs(scale: str, *, dataset: str | None, data_dir: str | None,
            out_dir: str, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    runs = [(rule, lam) for rule in trained_rules(choices.rules, PENALISED) for lam in LAMBDAS]
    runs.append((baseline_rule(), 0.0))
    variant = single_arch(choices.archs)
    return [arch_config(variant, scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=True, **method_overrides(method, lam), run__seed=seed)
            for method, lam in runs for seed in get_scale(scale).seeds]


def _first(row: dict[str, Any], diagnostic: str) -> str:
    """When ``diagnostic`` first fired over the row's seeds that evaluated it (a run that
    diverged in its first epoch evaluated nothing: counted as not evaluated, not as never)."""
    evaluated = evaluated_seeds(row["seeds"], diagnostic)
    return first_fired_cell([s["first_fired"].get(diagnostic) for s in evaluated],
                            len(row["seeds"]) - len(evaluated))


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    rows = []
    for members, row in rule_groups(records):
        row["lambda"] = members[0].penalty
        row["g_2_norm"] = aggregate(r.headline_value("g_2_norm") for r in full_length(members))
        row["trajectory"] = trajectory(members)
        rows.append(row)
    rows.sort(key=lambda r: (method_rank(r["method"]), r["lambda"]))
    return {"frozen_acc": frozen_accuracy(records), "rows": rows,
            "first_fired": evaluated_in_training(records)}


def to_markdown(summary: dict[str, Any]) -> str:
    ids = summary.get("first_fired", [])
    several = len({r["method"] for r in summary["rows"]}) > 1
    mark = TableMarks(summary)
    rows = [[*([r["method"]] if several else []), format_lambda(r["lambda"]),
             mark(format_aggregate(r["test_acc"]), r, ACC),
             mark(fmt(r["h_L_norm"]["mean"]), r, H_NORM),
             mark(fmt(r["g_2_norm"]["mean"]), r, G_NORM),
             mark(fmt(r["g_L_norm"]["mean"]), r, G_NORM),
             mark(fmt(r["max_block_growth"]["mean"]), r, H_NORM),
             mark(fmt(r["deep_cos"]["mean"], "+.3f"), r, DEEP_COS),
             mark(fmt(r["margin_pp"]["mean"], "+.1f"), r, ACC), *(_first(r, i) for i in ids),
             r["verdict"]["text"]] for r in summary["rows"]]
    table = markdown_table([*(["rule"] if several else []), "λ", "test acc", "‖h_L‖", "‖g_2‖",
                            "‖g_L‖", "max growth", "deep cos",
                            f"{DepthUtility.id_label()} margin pp",
                            *(f"({i}) first" for i in ids), "verdict"], rows)
    frozen = mark(format_aggregate(summary["frozen_acc"]), summary["frozen_acc"], ACC)
    return (table + f"\n\nFrozen baseline (control epochs): {frozen}. Norms are means over "
            "seeds of the last epoch's medians." + mark.notes_text() + "\n\nPublished "
            "(science.md §7): the penalty contains the residual stream ((a) and (b) stop "
            "firing) while whether (d) passes depends on λ.\n")


EXPERIMENT = register(Experiment(
    name="penalty_sweep",
    question="Does the residual-branch penalty rescue DFA's measurement (a, b), and at what "
             "accuracy cost (d)?",
    needs="dfa at λ ∈ {0, 1e-4, 1e-3, 1e-2, 1e-1} and frozen × every seed, control epochs",
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "dfa: the penalised rules, each at every λ (the frozen-blocks baseline "
                    "is always added)",
           "arch": "the ResidualMLP: one architecture"},
))
