"""Decision utility (science.md §7): how many methods does each reporting strategy walk back?

A strategy is the evidence a reader demands before accepting a method's headline numbers:

- S0: accuracy only — walked back when the test accuracy is not at least the (d) margin
  (2 pp) above chance 1/C;
- S1: S0 + Γ > 0 — also walked back when the headline Γ (samples → layers) is ≤ 0;
- S2, S3, …: S1 + one protocol diagnostic each, in protocol order ((a), (b), (c), (d), then
  any diagnostic the runs' protocol added);
- S_full: S1 + every diagnostic (the protocol).

Each seed is judged on its own; a method is walked back by a strategy when at least half
of its seeds are. The count runs over the five alternative rules (FA, DFA, EP, State
Bridge, Credit Bridge; ``--rules`` replaces them); BP and DFA + λ=1e-2 are listed but not
counted. Uses the audit
runs; (d) against the frozen baseline as in the audit table. Published reference: S1 walks back
0/5, S_full 3/5.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    Thresholds,
    default_names,
    in_order,
    labels,
    margin_pp,
)
from creditaudit.protocol.records import is_frozen_baseline
from creditaudit.records import RunRecord
from creditaudit.study.experiments.audit_table import (
    _order,
    audit_configs,
    audit_methods,
    labels_of,
)
from creditaudit.study.experiments.configs import DECISION_RULES, rule_list
from creditaudit.study.experiments.groups import (
    diagnostics_of,
    group_records,
    markdown_table,
    method_label,
    verdicts,
)
from creditaudit.study.experiments.registry import NO_CHOICES, Choices, Experiment, register

Strategy = tuple[str, str, tuple[str, ...]]  # name, evidence demanded, diagnostics


def strategies(ids: Sequence[str]) -> list[Strategy]:
    """S0 accuracy only, S1 + Γ > 0, then S1 + each of the diagnostics ``ids`` (S2, S3, …)
    and S_full: S1 + all of them."""
    return [("S0", "accuracy only", ()), ("S1", "accuracy + Γ > 0", ()),
            *((f"S{k + 2}", f"S1 + ({i})", (i,)) for k, i in enumerate(ids)),
            ("S_full", f"S1 + {''.join(f'({i})' for i in ids)}", tuple(ids))]


def seed_decisions(record: RunRecord, statuses: dict[str, str],
                   thresholds: Thresholds | None = None,
                   plan: Sequence[Strategy] | None = None) -> dict[str, Any]:
    """Which strategies (``plan``; default: over the diagnostics in ``statuses``) walk
    back one run, and why."""
    thresholds = thresholds or Thresholds()
    plan = strategies(in_order(statuses) or default_names()) if plan is None else plan
    acc, gamma = record.final_acc, record.headline_gamma
    above = None if acc is None else margin_pp(acc, record.chance, thresholds.margin_pp)
    acc_fails = above is None or above < thresholds.margin_pp
    gamma_fails = gamma is not None and not gamma > 0
    walked = {}
    for name, _, diagnostics in plan:
        reasons = ["accuracy at chance"] if acc_fails else []
        if name != "S0" and gamma_fails:
            reasons.append("Γ ≤ 0")
        reasons += [f"({i})" for i in diagnostics if statuses.get(i) == FIRED]
        walked[name] = reasons
    return {"seed": record.seed, "run_id": record.run_id, "test_acc": acc,
            "above_chance_pp": above, "headline_gamma": gamma, "statuses": statuses,
            "walked_back": {k: bool(v) for k, v in walked.items()}, "reasons": walked}


def _not_evaluated(diagnostics: Sequence[str], seeds: Sequence[dict[str, Any]]
                   ) -> dict[str, Any]:
    """The counted runs (``seeds``: :func:`seed_decisions`) where a diagnostic a strategy
    demands was not evaluated (e.g. (c) on fewer evaluation samples than it needs): such a
    diagnostic walks nothing back, which is no pass, so the table says how often."""
    missing = [i for i in diagnostics
               if any(s["statuses"].get(i, NOT_EVALUATED) == NOT_EVALUATED for s in seeds)]
    runs = sum(any(s["statuses"].get(i, NOT_EVALUATED) == NOT_EVALUATED for i in diagnostics)
               for s in seeds)
    return {"diagnostics": missing, "runs": runs, "of": len(seeds)}


def summarise(records: list[RunRecord], choices: Choices = NO_CHOICES) -> dict[str, Any]:
    verdict_of = verdicts(records)
    plan = strategies(diagnostics_of(verdict_of.values()))
    counting = rule_list(choices.rules, DECISION_RULES)
    methods = []
    for members in group_records(r for r in records if not is_frozen_baseline(r)).values():
        seeds = [seed_decisions(r, verdict_of[r.run_id].statuses, plan=plan) for r in members]
        n = len(seeds)
        label = method_label(members[0])
        counted = members[0].is_plain and members[0].method in counting
        per_strategy = {}
        for name, _, _ in plan:
            k = sum(s["walked_back"][name] for s in seeds)
            per_strategy[name] = {"seeds_walked_back": k, "n_seeds": n,
                                  "walked_back": 2 * k >= n}
        methods.append({"label": label, "counted": counted, "strategies": per_strategy,
                        "seeds": seeds})
    order = labels_of(audit_methods(choices))
    methods.sort(key=lambda m: _order(m["label"], order))
    rules = [m for m in methods if m["counted"]]
    counted_seeds = [s for m in rules for s in m["seeds"]]
    judged = []
    for name, description, diagnostics in plan:
        walked = [m["label"] for m in rules if m["strategies"][name]["walked_back"]]
        judged.append({"name": name, "description": description,
                       "diagnostics": list(diagnostics), "walked_back": walked,
                       "count": len(walked), "of": len(rules),
                       "text": f"{len(walked)}/{len(rules)}",
                       "not_evaluated": _not_evaluated(diagnostics, counted_seeds)})
    return {"rules": [m["label"] for m in rules], "strategies": judged,
            "methods": methods,
            "rule": "a method is walked back when at least half of its seeds are; S0 walks "
                    "back accuracy < chance + 2 pp"}


def _not_evaluated_text(strategy: dict[str, Any]) -> str:
    """`` ((c) not evaluated in 10/10 runs)`` where a demanded diagnostic was not evaluated
    (summaries written before this was kept say nothing)."""
    skipped = strategy.get("not_evaluated") or {}
    if not skipped.get("runs"):
        return ""
    return (f" ({labels(skipped['diagnostics'])} not evaluated in "
            f"{skipped['runs']}/{skipped['of']} runs)")


def to_markdown(summary: dict[str, Any]) -> str:
    rows = [[s["name"], s["description"], s["text"] + _not_evaluated_text(s),
             ", ".join(s["walked_back"]) or "—"] for s in summary["strategies"]]
    table = markdown_table(["strategy", "evidence demanded", "rules walked back", "which"], rows)
    names = [s["name"] for s in summary["strategies"]]
    detail = []
    for method in summary["methods"]:
        cells = [method["label"] + ("" if method["counted"] else " (not counted)")]
        for name in names:
            entry = method["strategies"][name]
            mark = "walk back" if entry["walked_back"] else "accept"
            cells.append(f"{mark} ({entry['seeds_walked_back']}/{entry['n_seeds']})")
        detail.append(cells)
    return (table + "\n\nPer method (seeds walked back):\n\n"
            + markdown_table(["method", *names], detail)
            + f"\n\nRule: {summary['rule']}. Published (science.md §7; CIFAR-10, paper scale): "
            "S1 walks back 0/5, S_full 3/5 (DFA, State Bridge, Credit Bridge).\n")


EXPERIMENT = register(Experiment(
    name="decision_utility",
    question="How many credit rules does each reporting strategy (accuracy, +Γ, +each "
             "diagnostic, full protocol) walk back?",
    needs="the audit_table runs (no new training)",
    build_configs=audit_configs,
    summarise_fn=summarise,
    markdown_fn=to_markdown,
    means=False,  # each seed's decision, counted: no mean of end-of-run values
    takes={"rules": "the audited rules, each at λ = 0, and the ones counted (the frozen-blocks "
                    "baseline is always added)",
           "arch": "the ResidualMLP: one architecture"},
))
