"""Random-init sanity (science.md §7): untrained models must be trustworthy at chance accuracy.

0-epoch runs (the protocol runs once, at initialisation) of every architecture variant —
ResidualMLP with and without terminal LN, StudentNet, and ViT-Mini and ConvMixer on image
data (CIFAR, MNIST, Fashion-MNIST, the synthetic task viewed as 3×32×32) — with BP, FA
and DFA, every seed. (Every method of a seed starts from the same initial weights, so (a)–(c)
cannot depend on the method at epoch 0; the methods differ in their credit, hence in the
cosines the records hold.) (d) does
not apply before training (it would compare an untrained net with a trained baseline), so
the verdict here is over (a)–(c). "At chance" means a test accuracy below twice the
uniform rate 1/C (teacher–student labels are not exactly balanced).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.protocol import FIRED, NOT_EVALUATED, default_names, in_order, labels
from creditaudit.protocol.records import RecordSet, arch_variant, recorded_statuses
from creditaudit.protocol.verdicts import reads_reference
from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS
from creditaudit.report.runs import ACC, G_NORM, H_NORM
from creditaudit.results import full_length
from creditaudit.study.experiments.aggregate import aggregate, format_aggregate
from creditaudit.study.experiments.configs import (
    arch_config,
    arch_variants,
    method_overrides,
    rule_list,
)
from creditaudit.study.experiments.groups import fmt, group_records, markdown_table
from creditaudit.study.experiments.marks import TableMarks, marks_of
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

METHODS = ("bp", "fa", "dfa")


def configs(scale: str, *, dataset: str | None, data_dir: str | None,
            out_dir: str, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    out = []
    for variant in arch_variants(scale, dataset, choices.archs):
        for method in rule_list(choices.rules, METHODS):
            for seed in get_scale(scale).seeds:
                out.append(arch_config(variant, scale, dataset=dataset, data_dir=data_dir,
                                       out_dir=out_dir, **method_overrides(method),
                                       optim__epochs=0, run__seed=seed))
    return out


def untrained_diagnostics(recorded: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the diagnostics that judge an untrained network, those that do not apply before
    training) among the default protocol and ``recorded``; one not installed here counts
    as applying."""
    ids = in_order([*default_names(), *recorded])
    skip = [i for i in ids if (cls := DIAGNOSTICS.find(i)) is not None and not cls.before_training]
    return [i for i in ids if i not in skip], skip


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    ids, skip = untrained_diagnostics(i for r in records for i in r.recorded_statuses())
    index = RecordSet(records)
    rows = []
    for members in group_records(records).values():
        seeds = []
        for record in members:
            recorded = recorded_statuses(record)
            statuses = {i: recorded.get(i, NOT_EVALUATED) for i in ids}
            fired = [i for i in ids if statuses[i] == FIRED]
            skipped = [i for i in ids if statuses[i] == NOT_EVALUATED]
            acc = record.final_acc
            seeds.append({
                "seed": record.seed, "run_id": record.run_id, "test_acc": acc,
                "chance": record.chance,
                "at_chance": acc is not None and acc < 2 * record.chance,
                "statuses": statuses, "fired": fired, "not_evaluated": skipped,
                # nothing fired is no pass where a diagnostic was not evaluated ((c) on
                # fewer evaluation samples than it needs; every one in a record without
                # protocol statuses, such as a run that diverged before its first epoch's)
                "trustworthy": not fired and not skipped,
                "values": {i: record.recorded_value(i) for i in ids},
                "max_block_growth": record.headline_value("max_block_growth"),
                "g_L_norm": record.headline_value("g_L_norm"),
            })
        first = members[0]
        ended = [s for s, r in zip(seeds, members) if not r.stopped_early]
        rows.append({
            "arch": arch_variant(first), "method": first.method,
            "dataset": first.dataset, "chance": first.chance,
            "test_acc": aggregate(s["test_acc"] for s in ended),
            "values": {i: aggregate(s["values"][i] for s in ended) for i in ids},
            "trustworthy": all(s["trustworthy"] for s in seeds),
            "at_chance": all(s["at_chance"] for s in seeds),
            "marks": marks_of(full_length(members), index),
            "seeds": seeds,
        })
    all_seeds = [s for row in rows for s in row["seeds"]]
    over = labels(ids) + (f"; {labels(skip)} does not apply before training" if skip else "")
    return {
        "n_runs": len(all_seeds),
        "n_trustworthy": sum(s["trustworthy"] for s in all_seeds),
        "n_at_chance": sum(s["at_chance"] for s in all_seeds),
        "n_fired": sum(bool(s["fired"]) for s in all_seeds),
        "not_evaluated": {i: n for i in ids
                          if (n := sum(i in s.get("not_evaluated", ()) for s in all_seeds))},
        "all_trustworthy": bool(all_seeds) and all(s["trustworthy"] for s in all_seeds),
        "all_at_chance": bool(all_seeds) and all(s["at_chance"] for s in all_seeds),
        "diagnostics": ids, "verdict_over": over,
        "rows": rows,
    }


def _value(diagnostic: str, value: float | None) -> str:
    cls = DIAGNOSTICS.find(diagnostic)
    if value is None or value != value:  # no value, or NaN: no seed had one
        return "—"
    return cls.value_text(value) if cls is not None else fmt(value, ".3g")


def to_markdown(summary: dict[str, Any]) -> str:
    ids = summary["diagnostics"]
    mark = TableMarks(summary)
    rows = []
    for row in summary["rows"]:
        fired = in_order(i for s in row["seeds"] for i in s["fired"])
        n, n_fired = len(row["seeds"]), sum(bool(s["fired"]) for s in row["seeds"])
        unjudged = sum(not s["fired"] and all(v == NOT_EVALUATED for v in s["statuses"].values())
                       for s in row["seeds"])
        partly = [s for s in row["seeds"] if any(v != NOT_EVALUATED for v in s["statuses"].values())
                  and s.get("not_evaluated")]
        skipped = in_order(i for s in partly for i in s["not_evaluated"])
        verdict = "trustworthy" if row["trustworthy"] else "; ".join(
            [*([f"fired {labels(fired)} in {n_fired}/{n} seeds"] if n_fired
               else ["nothing fired"] if not unjudged else []),
             *([f"{labels(skipped)} not evaluated in {len(partly)}/{n} seeds"] if partly
               else []),
             *([f"nothing evaluated in {unjudged}/{n} seeds"] if unjudged else [])])
        rows.append([row["arch"], row["method"],
                     mark(format_aggregate(row["test_acc"]), row, ACC),
                     fmt(row["chance"], ".3f"),
                     *(mark(_value(i, row["values"][i]["mean"]), row,
                            G_NORM if reads_reference(i) else H_NORM) for i in ids),
                     verdict, "yes" if row["at_chance"] else "no"])
    columns = [f"({i}) {cls.short or cls.label}" if (cls := DIAGNOSTICS.find(i)) is not None
               else f"({i})" for i in ids]
    table = markdown_table(["architecture", "method", "test acc", "chance", *columns,
                            f"verdict {labels(ids)}", "at chance"], rows)
    skipped = summary.get("not_evaluated") or {}
    unevaluated = "".join(f"; {labels([i])} not evaluated in {k}/{summary['n_runs']}"
                          for i, k in skipped.items())
    fired = ("" if "n_fired" not in summary else
             f"; {summary['n_fired']}/{summary['n_runs']} fired{unevaluated}")
    return (f"**{summary['n_trustworthy']}/{summary['n_runs']} untrained runs trustworthy, "
            f"{summary['n_at_chance']}/{summary['n_runs']} at chance** (accuracy < 2/C; "
            f"verdict over {summary['verdict_over']}{fired}).\n\n"
            + table + mark.notes_text() + "\n\nReference (science.md §5, §8): random init "
            "gives max block growth ≈ 1.01, ‖g_L‖ ≈ 7.5e-3, (c) 0.08–0.18; nothing fires.\n")


EXPERIMENT = register(Experiment(
    name="random_init",
    question="Does the protocol pass untrained networks, which sit at chance accuracy?",
    needs="0-epoch runs: bp, fa, dfa on resmlp, resmlp-noLN, student (and vit, convmixer on "
          "image data) × every seed",
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "bp, fa, dfa", "arch": "the architectures (several)"},
    one_arch=False,
))
