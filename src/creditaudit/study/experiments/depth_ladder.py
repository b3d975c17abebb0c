"""Depth ladder (science.md §4, §7): train only the last k blocks, k = 0 … L, with BP and DFA.

Does each additional trainable block add accuracy over the frozen-blocks baseline, and does
a rule's credit reach the deep blocks at all? k = L is the ordinary run with every block
trainable (``method.trainable_blocks = None``, so it is the audit table's run); k = 0 trains
only the embedding and readout. Main epochs, every seed, with the frozen baseline for (d).
"""

from __future__ import annotations

from typing import Any

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.protocol import DepthUtility
from creditaudit.protocol.records import model_description
from creditaudit.records import RunRecord
from creditaudit.report.runs import ACC
from creditaudit.study.experiments.aggregate import format_aggregate
from creditaudit.study.experiments.configs import (
    arch_config,
    baseline_rule,
    method_overrides,
    rule_list,
    single_arch,
    trained_rules,
)
from creditaudit.study.experiments.groups import (
    fmt,
    frozen_accuracy,
    markdown_table,
    rule_groups,
)
from creditaudit.study.experiments.marks import TableMarks
from creditaudit.study.experiments.options import chosen
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

METHODS = ("bp", "dfa")


def configs(scale: str, *, dataset: str | None, data_dir: str | None,
            out_dir: str, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    variant = single_arch(choices.archs)
    common = {"dataset": dataset, "data_dir": data_dir, "out_dir": out_dir}
    n_blocks = getattr(arch_config(variant, scale, **common).model, "n_blocks", None)
    if n_blocks is None:
        raise ConfigError(f"experiment depth_ladder steps through model.n_blocks: "
                          f"{chosen('arch', [variant])} has no such option (its depth is "
                          "fixed)")
    out = []
    for method in trained_rules(choices.rules, METHODS):
        for k in range(n_blocks + 1):
            ladder = {} if k == n_blocks else {"method__trainable_blocks": k}
            out += [arch_config(variant, scale, **common, **method_overrides(method), **ladder,
                                run__seed=seed) for seed in get_scale(scale).seeds]
    out += [arch_config(variant, scale, **common, **method_overrides(baseline_rule()),
                        run__seed=seed) for seed in get_scale(scale).seeds]
    return out


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    rows = []
    for members, row in rule_groups(records):
        k = members[0].config.method.trainable_blocks
        model = model_description(members[0])
        row["n_blocks"] = model.n_blocks if model is not None else None
        row["k"] = row["n_blocks"] if k is None else k
        rows.append(row)
    methods = rule_list(choices.rules, METHODS)
    rows.sort(key=lambda r: (methods.index(r["method"]) if r["method"] in methods
                             else len(methods), r["method"], r["k"]))
    return {"frozen_acc": frozen_accuracy(records), "rows": rows,
            "methods": list(dict.fromkeys(r["method"] for r in rows))}


def to_markdown(summary: dict[str, Any]) -> str:
    by_key = {(r["method"], r["k"]): r for r in summary["rows"]}
    ks = sorted({r["k"] for r in summary["rows"]})
    methods = summary.get("methods") or [m for m in METHODS
                                         if any(r["method"] == m for r in summary["rows"])]
    mark = TableMarks(summary)
    rows = []
    for k in ks:
        row: list[Any] = [k]
        for method in methods:
            entry = by_key.get((method, k))
            row += ([mark(format_aggregate(entry["test_acc"]), entry, ACC),
                     mark(fmt(entry["margin_pp"]["mean"], "+.1f"), entry, ACC),
                     entry["verdict"]["text"]] if entry else ["—", "—", "—"])
        rows.append(row)
    header = ["trainable blocks k"]
    for method in methods:
        header += [f"{method} acc", f"{method} {DepthUtility.id_label()} margin pp",
                   f"{method} verdict"]
    frozen = mark(format_aggregate(summary["frozen_acc"]), summary["frozen_acc"], ACC)
    return (markdown_table(header, rows) + f"\n\nFrozen baseline: {frozen}. k = L is the run "
            "with every block trainable; k = 0 trains only the embedding and readout (for BP "
            "that is the frozen baseline's recipe)." + mark.notes_text() + "\n")


EXPERIMENT = register(Experiment(
    name="depth_ladder",
    question="Does training more of the blocks (k = 0 … L) add accuracy over the frozen "
             "baseline, for BP and for DFA?",
    needs="bp and dfa with trainable_blocks k = 0 … L (k = L: all blocks) and frozen × every "
          "seed, main epochs",
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "bp, dfa (the frozen-blocks baseline is always added)",
           "arch": "the ResidualMLP: one architecture whose depth is an option"},
))
