"""Capacity-cost control (science.md §7): BP/DFA × no penalty/λ=1e-2, with the frozen line.

Separates what the penalty costs any learner (BP with vs without it) from what DFA's credit
lacks (BP + penalty vs DFA + penalty, same constraint). Runs: BP and DFA at λ ∈ {0, 1e-2}
and the frozen baseline, control epochs, every seed. Published reference (CIFAR-10, 30 epochs):
BP .585 / .532, DFA .301 / .360 (no penalty / penalty); frozen .349.
"""

from __future__ import annotations

import math
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord
from creditaudit.report.runs import ACC
from creditaudit.results import full_length
from creditaudit.study.experiments.aggregate import format_aggregate
from creditaudit.study.experiments.configs import (
    arch_config,
    baseline_rule,
    method_overrides,
    single_arch,
)
from creditaudit.study.experiments.groups import (
    fmt,
    frozen_accuracy,
    frozen_runs,
    markdown_table,
    rule_groups,
)
from creditaudit.study.experiments.marks import TableMarks, marks_of
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

PENALTY = 1e-2
CELLS = (("bp", 0.0), ("bp", PENALTY), ("dfa", 0.0), ("dfa", PENALTY))
# The effects between two cells (cell a − cell b, by the summary's cell keys), each over the
# seeds both cells have.
PAIRS = {"bp_penalty_cost": (f"bp|{PENALTY:g}", "bp|0"),
         "dfa_penalty_gain": (f"dfa|{PENALTY:g}", "dfa|0"),
         "credit_quality_gap": (f"bp|{PENALTY:g}", f"dfa|{PENALTY:g}")}
# The published 2×2 (science.md §7; CIFAR-10, 30 epochs): test accuracy without → with the
# penalty, and the frozen line. The effects the summary quotes are computed from these.
PUBLISHED = {"bp": (0.585, 0.532), "dfa": (0.301, 0.360), "frozen": 0.349}


def _three(value: float) -> str:
    """``.585``: an accuracy as science.md writes it."""
    return f"{value:.3f}".removeprefix("0")


def published_text() -> str:
    """The published reference line: the 2×2, the frozen line, BP's penalty cost and the
    credit-quality gap (BP+λ − DFA+λ), in pp, computed from :data:`PUBLISHED`."""
    (bp0, bp1), (dfa0, dfa1) = PUBLISHED["bp"], PUBLISHED["dfa"]
    cost = f"{100.0 * (bp1 - bp0):+.1f}".replace("-", "−")
    return (f"Published (science.md §7; CIFAR-10, 30 epochs): BP {_three(bp0)} → {_three(bp1)}, "
            f"DFA {_three(dfa0)} → {_three(dfa1)}, frozen {_three(PUBLISHED['frozen'])} (BP "
            f"penalty cost {cost} pp; gap {100.0 * (bp1 - dfa1):.0f} pp = credit quality).")


def configs(scale: str, *, dataset: str | None, data_dir: str | None,
            out_dir: str, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    variant = single_arch(choices.archs)
    return [arch_config(variant, scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        control=True, **method_overrides(method, lam), run__seed=seed)
            for method, lam in (*CELLS, (baseline_rule(), 0.0))
            for seed in get_scale(scale).seeds]


def _mean(cell: dict[str, Any] | None) -> float | None:
    return None if cell is None or not cell["test_acc"]["n"] else cell["test_acc"]["mean"]


def _pp(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else 100.0 * (a - b)


def _accuracies(cell: dict[str, Any] | None) -> dict[int, float]:
    """Seed → final accuracy of the runs a cell's mean averages (not stopped early, finite)."""
    return {s["seed"]: s["test_acc"] for s in (cell or {}).get("seeds", ())
            if not s["stopped_early"] and s["test_acc"] is not None
            and math.isfinite(s["test_acc"])}


def _paired(a: dict[str, Any] | None, b: dict[str, Any] | None
            ) -> tuple[float | None, list[int]]:
    """(mean accuracy of cell ``a`` − that of cell ``b``, in pp, the seeds it is over): over
    the seeds both cells have, so that a seed one cell lacks (failed, missing, stopped early)
    does not read as an effect of the penalty or the rule. With the same seeds in both,
    the difference of the cells' means."""
    acc_a, acc_b = _accuracies(a), _accuracies(b)
    seeds = sorted(set(acc_a) & set(acc_b))
    if not seeds:
        return None, []
    return (100.0 * (sum(acc_a[s] for s in seeds) - sum(acc_b[s] for s in seeds))
            / len(seeds), seeds)


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {}
    # The runs whose accuracies each cell's mean averages (:func:`full_length`).
    runs = {"frozen": frozen_runs(records)}
    frozen = frozen_accuracy(records)
    for members, row in rule_groups(records):
        key = (members[0].method, members[0].penalty)
        if key in CELLS:
            cells[f"{key[0]}|{key[1]:g}"] = row
            runs[f"{key[0]}|{key[1]:g}"] = full_length(members)
    index = RecordSet(records)

    def effect_marks(a: str, b: str, seeds: list[int] | None = None) -> dict[str, str]:
        """The marks of a difference of two cells' accuracies: those of both cells' runs
        (of ``seeds`` only, where given: the seeds the difference is over)."""
        return marks_of([r for r in (*runs.get(a, []), *runs.get(b, []))
                         if seeds is None or r.seed in seeds], index)

    def cell(method: str, lam: float) -> dict[str, Any] | None:
        return cells.get(f"{method}|{lam:g}")

    bp0, bp1 = _mean(cell("bp", 0.0)), _mean(cell("bp", PENALTY))
    dfa0, dfa1 = _mean(cell("dfa", 0.0)), _mean(cell("dfa", PENALTY))
    frozen_mean = frozen["mean"] if frozen and frozen["n"] else None
    # Between cells: over the seeds both have (a seed one of them lacks is no effect).
    paired = {name: _paired(cells.get(a), cells.get(b)) for name, (a, b) in PAIRS.items()}
    return {
        "penalty": PENALTY,
        "cells": cells,
        "table": {"bp": {"no_penalty": bp0, "penalty": bp1},
                  "dfa": {"no_penalty": dfa0, "penalty": dfa1}},
        "frozen_acc": frozen,
        "effects_pp": {
            **{name: value for name, (value, _) in paired.items()},
            "dfa_penalty_over_frozen": _pp(dfa1, frozen_mean),
            "bp_penalty_over_frozen": _pp(bp1, frozen_mean),
        },
        # the seeds each between-cell effect is over (both cells' runs of those seeds)
        "effects_seeds": {name: seeds for name, (_, seeds) in paired.items()},
        "effects_marks": {
            # each over the runs its number is over
            **{name: effect_marks(a, b, paired[name][1]) for name, (a, b) in PAIRS.items()},
            "dfa_penalty_over_frozen": effect_marks(f"dfa|{PENALTY:g}", "frozen"),
            "bp_penalty_over_frozen": effect_marks(f"bp|{PENALTY:g}", "frozen"),
        },
    }


def _over(seeds: list[int] | None, pair: tuple[dict[str, Any] | None, ...]) -> str:
    """`` (over seed 42: the seeds both cells have)`` where an effect is over fewer
    seeds than one of its two cells (``pair``) has; "" where it is over every seed of both."""
    if not seeds:
        return ""
    every = {s["seed"] for cell in pair for s in (cell or {}).get("seeds", ())}
    if set(seeds) == every:
        return ""
    return f" (over seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: the " \
           "seeds both cells have)"


def to_markdown(summary: dict[str, Any]) -> str:
    mark = TableMarks(summary)
    rows = []
    for method in ("bp", "dfa"):
        row = [method.upper()]
        for lam in (0.0, summary["penalty"]):
            entry = summary["cells"].get(f"{method}|{lam:g}")
            row.append(mark(format_aggregate(entry["test_acc"]), entry, ACC) if entry else "—")
            row.append(entry["verdict"]["text"] if entry else "—")
        rows.append(row)
    header = ["method", "no penalty", "verdict", f"λ={summary['penalty']:g}", "verdict"]
    table = markdown_table(header, rows)
    e, e_marks = summary["effects_pp"], summary.get("effects_marks") or {}

    seeds_of = summary.get("effects_seeds") or {}  # none in summaries of older versions

    def effect(name: str) -> str:
        text = mark(fmt(e[name], "+.1f"), {"marks": e_marks.get(name)}, ACC)
        pair = tuple(summary["cells"].get(key) for key in PAIRS.get(name, ()))
        return f"{text} pp" + _over(seeds_of.get(name), pair)

    frozen = mark(format_aggregate(summary["frozen_acc"]), summary["frozen_acc"], ACC)
    return (table + f"\n\nFrozen baseline: {frozen}." + mark.notes_text() + "\n\n"
            f"- penalty cost for BP: {effect('bp_penalty_cost')}\n"
            f"- penalty gain for DFA: {effect('dfa_penalty_gain')}\n"
            f"- credit-quality gap at equal constraint (BP+λ − DFA+λ): "
            f"{effect('credit_quality_gap')}\n"
            f"- DFA+λ over frozen: {effect('dfa_penalty_over_frozen')}\n\n"
            + published_text() + "\n")


EXPERIMENT = register(Experiment(
    name="capacity_cost",
    question="How much of DFA's gap to BP is the penalty's capacity cost and how much is "
             "credit quality?",
    needs="bp and dfa at λ ∈ {0, 1e-2} and frozen × every seed, control epochs",
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"arch": "the ResidualMLP: one architecture"},
    refuses={"rules": "it separates what the penalty costs the exact gradient (BP) from what "
                      "DFA's credit lacks, a fixed 2×2 of BP and DFA"},
))
