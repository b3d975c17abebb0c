"""Rule zoo: every credit rule × every architecture family, audited side by side.

Runs: BP, block-level FA, the per-layer feedback rules (fa-linear, uSF, brSF, frSF,
Kolen–Pollack), DFA, DRTP, State Bridge, Credit Bridge, EP and the frozen baseline on the
ResidualMLP with terminal LN and — on image data (Fashion-MNIST, MNIST, CIFAR, the synthetic
task as 3×32×32) — on ViT-Mini and ConvMixer, two seeds (every seed at paper scale).

The ResidualMLP runs are the scale's own (the audit table's runs, shared by run id). The
image architectures train on a smaller budget at cpu scale (:data:`IMAGE_BUDGET`: 10 epochs
× 10 000 samples), sized so the whole grid trains in under 3 h on two cores; (d) compares
every run with the frozen runs of the same architecture and budget.

For each architecture × rule: accuracy, deep cosine, headline Γ, ‖h_L‖, the protocol's
verdict and how often each diagnostic fired, and whether the status quo (accuracy above
chance and Γ > 0, strategy S1 of the decision-utility experiment) would have accepted the
rule — the cases where accuracy and Γ hide what the protocol finds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.config import RunConfig
from creditaudit.data import dataset_spec
from creditaudit.protocol import DepthUtility, ResidualStreamScale, in_order
from creditaudit.records import RunRecord
from creditaudit.registry import RULES as RULES_REGISTRY
from creditaudit.report.runs import ACC, DEEP_COS, GAMMA, H_NORM
from creditaudit.results import full_length
from creditaudit.study.experiments.aggregate import format_aggregate
from creditaudit.study.experiments.configs import (
    arch_config,
    arch_of,
    baseline_rule,
    image_view,
    method_overrides,
    rule_list,
    scale_dataset,
)
from creditaudit.study.experiments.decision_utility import seed_decisions
from creditaudit.study.experiments.groups import (
    fmt,
    group_records,
    group_summary,
    markdown_table,
    verdicts,
)
from creditaudit.study.experiments.marks import TableMarks
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register
from creditaudit.study.experiments.scales import get_scale

RULES = ("bp", "fa", "fa-linear", "usf", "brsf", "frsf", "kp", "dfa", "drtp",
         "state-bridge", "credit-bridge", "ep")
ARCHS = ("resmlp", "vit", "convmixer")
# Training budget of the image architectures per scale (the ResidualMLP keeps the scale's).
IMAGE_BUDGET: dict[str, dict[str, int]] = {"cpu": {"epochs": 10, "n_train": 10000}}
SEEDS_PER_SCALE = {"smoke": 2, "cpu": 2}
GROWTH = ResidualStreamScale.name


def zoo_archs(scale: str, dataset: str | None, chosen: Sequence[str] | None = None
              ) -> list[str]:
    """``chosen`` (``--arch``), else the ResidualMLP everywhere and ViT-Mini and ConvMixer
    where the data are images."""
    if chosen is not None:
        return list(chosen)
    images = image_view(scale, dataset) is not None
    return [a for a in ARCHS if images or arch_of(a)[0].input_kind != "image"]


def _budget(scale: str, dataset: str | None, arch: str) -> dict[str, Any]:
    image = arch_of(arch)[0].input_kind == "image"
    budget = IMAGE_BUDGET.get(scale) if image else None
    if not budget:
        return {}
    generated = dataset_spec(scale_dataset(scale, dataset)).kind == "generated"
    size_key = "data__n_train" if generated else "data__train_subset"
    return {"optim__epochs": budget["epochs"], size_key: budget["n_train"]}


def zoo_rules(choices: Choices) -> list[str]:
    """The rules of the zoo (``--rules`` or :data:`RULES`) and the frozen-blocks baseline."""
    return list(dict.fromkeys([*rule_list(choices.rules, RULES), baseline_rule()]))


def configs(scale: str, *, dataset: str | None, data_dir: str | None,
            out_dir: str, choices: Choices = NO_CHOICES) -> list[RunConfig]:
    seeds = get_scale(scale).seeds
    seeds = seeds[:SEEDS_PER_SCALE.get(scale, len(seeds))]
    return [arch_config(arch, scale, dataset=dataset, data_dir=data_dir, out_dir=out_dir,
                        **_budget(scale, dataset, arch), **method_overrides(method),
                        run__seed=seed)
            for arch in zoo_archs(scale, dataset, choices.archs)
            for method in zoo_rules(choices) for seed in seeds]


def _status_quo_accepts(record: RunRecord, statuses: dict[str, str]) -> bool:
    """Strategy S1: accuracy at least the (d) margin above chance and Γ > 0."""
    return not seed_decisions(record, statuses)["walked_back"]["S1"]


def _feedback_angle(record: RunRecord) -> float | None:
    """Mean angle between B and W over the feedback layers at the last epoch (degrees; a
    diverged run's last finite one, as its other numbers)."""
    angles = record.headline_value("feedback_angle")
    if not angles:
        return None
    finite = [a for a in angles if a == a]
    return sum(finite) / len(finite) if finite else None


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    verdict_of = verdicts(records)
    order = {name: i for i, name in enumerate(zoo_rules(choices))}
    arch_order = {name: i for i, name in enumerate(choices.archs or ARCHS)}
    rows = []
    for members in group_records(records).values():
        row = group_summary(members, verdict_of)
        accepted = [_status_quo_accepts(r, verdict_of[r.run_id].statuses) for r in members]
        row["status_quo_accepts"] = sum(accepted)
        row["hidden"] = sum(a and verdict_of[r.run_id].walked_back
                            for a, r in zip(accepted, members))
        angles = [a for a in map(_feedback_angle, full_length(members)) if a is not None]
        row["feedback_angle"] = sum(angles) / len(angles) if angles else None
        # The diagnostic that fires first in the published runs: its first epoch.
        row["first_a"] = min((s["first_fired"].get(GROWTH) for s in row["seeds"]
                              if s["first_fired"].get(GROWTH) is not None), default=None)
        cls = RULES_REGISTRY.find(row["method"])
        row["feedback_kind"] = None if cls is None else cls.feedback_kind
        rows.append(row)
    rows.sort(key=lambda r: (arch_order.get(r["arch"], len(arch_order)),
                             order.get(r["method"], len(order)), r["label"]))
    d = DepthUtility.id_label()
    return {"d_rule": f"{d} = final test accuracy − mean final accuracy of the frozen runs of "
                      "the same architecture, data and budget; the other diagnostics as "
                      "recorded at the last evaluated epoch",
            "status_quo": "accuracy ≥ 2 pp above chance and Γ (samples → layers) > 0",
            "rows": rows}


def _fired(row: dict[str, Any]) -> str:
    counts = row["verdict"]["fired_counts"]
    n = row["verdict"]["n"]
    parts = [f"({i}) {counts[i]}/{n}" for i in in_order(counts) if counts[i]]
    return ", ".join(parts) if parts else "none"


def to_markdown(summary: dict[str, Any]) -> str:
    mark = TableMarks(summary)
    sections = []
    archs: dict[str, list[dict[str, Any]]] = {}
    for row in summary["rows"]:
        archs.setdefault(row["arch"], []).append(row)
    for arch, rows in archs.items():
        head = rows[0]
        frozen = next((r for r in rows if r["baseline"]), None)
        table_rows = []
        for row in rows:
            if row["baseline"]:
                continue
            table_rows.append([
                row["label"], (row["feedback_kind"] or "—").replace("_", " "),
                mark(format_aggregate(row["test_acc"]), row, ACC),
                mark(fmt(row["deep_cos"]["mean"], "+.3f"), row, DEEP_COS),
                mark(fmt(row["headline_gamma"]["mean"], "+.3f"), row, GAMMA),
                mark(fmt(row["h_L_norm"]["mean"], ".3g"), row, H_NORM),
                "—" if row["feedback_angle"] is None else f"{row['feedback_angle']:.0f}°",
                _fired(row), "—" if row["first_a"] is None else str(row["first_a"]),
                f"{row['status_quo_accepts']}/{row['verdict']['n']}",
                row["verdict"]["text"],
            ])
        baseline = (mark(format_aggregate(frozen["test_acc"]), frozen, ACC) if frozen
                    else "not run")
        title = (f"### {arch} — {head['dataset']}, {head['epochs']} epochs; frozen baseline "
                 f"{baseline}")
        table = markdown_table(
            ["rule", "feedback", "test acc", "deep cos", "Γ", "‖h_L‖", "∠(B, W)",
             "fired (seeds)", f"{ResidualStreamScale.id_label()} first epoch",
             "status quo accepts", "protocol verdict"],
            table_rows)
        hidden = [r["label"] for r in rows if r["hidden"]]
        note = ("Accepted by the status quo but walked back by the protocol in at least one "
                f"seed: {', '.join(hidden)}." if hidden else
                "No rule that the status quo accepts is walked back by the protocol here.")
        sections.append(f"{title}\n\n{table}\n\n{note}")
    return ("\n\n".join(sections) + mark.notes_text() + "\n\nStatus quo: "
            + summary["status_quo"] + ". "
            "Verdicts: " + summary["d_rule"] + ". Feedback: what carries the credit down — "
            "fixed random matrices, sign-concordant matrices, learned ones (auxiliary nets, "
            "Kolen–Pollack's B), or the forward weights themselves (symmetric: BP, EP). "
            "∠(B, W): mean angle between each feedback matrix and its forward weight at the "
            "last epoch (per-layer feedback rules).\n")


EXPERIMENT = register(Experiment(
    name="rule_zoo",
    question="What does the protocol say about every credit rule on every architecture "
             "family, where accuracy and Γ would accept it?",
    needs="bp, fa, fa-linear, usf, brsf, frsf, kp, dfa, drtp, state-bridge, credit-bridge, "
          "ep and frozen on resmlp (and vit, convmixer on image data) × 2 seeds; image "
          "architectures 10 epochs × 10 000 samples at cpu scale",
    build_configs=configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    takes={"rules": "its twelve rules (the frozen-blocks baseline is always added)",
           "arch": "resmlp, vit, convmixer: the architectures (several)"},
    one_arch=False,
))
