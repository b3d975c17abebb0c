"""Summarise a results folder per condition across seeds, as Markdown (for docs/results.md).

A condition is every config field except the seed that changes a result: dataset,
architecture, terminal LN, method, penalty, trainable blocks and epochs. Untrained
(0-epoch) runs belong to the random-init experiment and are left out. Two tables: the
protocol view at the last epoch, and the end-of-run credit-quality block (deep ρ and
nudging with their BP and random controls). Every number comes from the run records.

    python scripts/results_summary.py results/cpu > /tmp/summary.md
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from typing import Any

from creditaudit.deep_layers import deep_mean
from creditaudit.experiments.aggregate import aggregate
from creditaudit.records import find_records, load_record


def condition(config: dict[str, Any]) -> tuple[str, str, str, int]:
    """(dataset, architecture label, method label, epochs) of a run."""
    method, model = config["method"], config["model"]
    arch = model["arch"] + ("" if model["out_ln"] else "-noLN")
    name = method["name"]
    if method["penalty"]:
        name += f" + λ={method['penalty']:g}"
    if method.get("trainable_blocks") is not None:
        name += f" (k={method['trainable_blocks']})"
    return config["data"]["name"], arch, name, int(config["optim"]["epochs"])


def fmt(values: list[float], spec: str) -> str:
    stat = aggregate(values)
    if stat["n"] == 0:
        return "—"
    std = "" if math.isnan(stat["std"]) else f" ± {format(stat['std'], spec)}"
    return f"{format(stat['mean'], spec)}{std}"


def nudge_mean(block: dict[str, Any] | None, eta: str = "0.01") -> float:
    """Mean over the deep states of the loss change at step size ``eta``."""
    values = (block or {}).get(eta)
    return statistics.fmean(values) if values else math.nan


def protocol_table(groups: dict[tuple, list[dict[str, Any]]]) -> None:
    frozen = {(data, arch, epochs): statistics.fmean(r["log"][-1]["acc_eval"] for r in runs)
              for (data, arch, name, epochs), runs in groups.items() if name == "frozen"}
    print("| dataset | arch | method | epochs | seeds | test acc | ‖h_L‖ | max growth | ‖g_L‖ | "
          "zero-grad fraction | deep cos | first fired (a) / (b) / (c) | fired at end | "
          "(d) margin pp |")
    print("|" + "---|" * 14)
    for (data, arch, name, epochs), runs in sorted(groups.items()):
        last = [r["log"][-1] for r in runs]
        accs = [e["acc_eval"] for e in last]
        first = [r["protocol"].get("first_fired", {}) for r in runs]
        firsts = " / ".join(
            ",".join(str(f.get(k)) if f.get(k) is not None else "–" for f in first)
            for k in ("a", "b", "c"))
        ends = ",".join("".join(f"({i})" for i in r["protocol"].get("fired", [])) or "none"
                        for r in runs)
        base = frozen.get((data, arch, epochs))
        margin = "—" if base is None else f"{100 * (statistics.fmean(accs) - base):+.1f}"
        print(f"| {data} | {arch} | {name} | {epochs} | {len(runs)} | {fmt(accs, '.3f')} | "
              f"{fmt([e['h_L_norm'] for e in last], '.3g')} | "
              f"{fmt([e['max_block_growth'] for e in last], '.3g')} | "
              f"{fmt([e['g_L_norm'] for e in last], '.2g')} | "
              f"{fmt([e.get('g_L_zero_fraction', math.nan) for e in last], '.2f')} | "
              f"{fmt([e['deep_cos'] for e in last], '+.3f')} | {firsts} | {ends} | {margin} |")


def quality_table(groups: dict[tuple, list[dict[str, Any]]]) -> None:
    print("| dataset | arch | method | epochs | seeds | deep cos | deep ρ | ρ BP control (min l) | "
          "ρ random (max abs) | nudge Δloss η=0.01 | nudge BP control | nudge random |")
    print("|" + "---|" * 12)
    for (data, arch, name, epochs), runs in sorted(groups.items()):
        blocks = [r.get("diagnostics") or {} for r in runs]
        blocks = [b for b in blocks if "perturbation_rho" in b]
        if not blocks or name == "frozen":
            continue
        controls = [b["rho_controls"] for b in blocks]
        nudge_bp = [nudge_mean((b.get("nudging_controls") or {}).get("bp")) for b in blocks]
        nudge_random = [nudge_mean((b.get("nudging_controls") or {}).get("random"))
                        for b in blocks]
        print(f"| {data} | {arch} | {name} | {epochs} | {len(blocks)} | "
              f"{fmt([b['deep_cos'] for b in blocks], '+.3f')} | "
              f"{fmt([deep_mean(b['perturbation_rho']) for b in blocks], '+.3f')} | "
              f"{fmt([min(c['bp']) for c in controls], '.4f')} | "
              f"{fmt([max(abs(v) for v in c['random']) for c in controls], '.3f')} | "
              f"{fmt([nudge_mean(b.get('nudging')) for b in blocks], '+.2e')} | "
              f"{fmt(nudge_bp, '+.2e')} | {fmt(nudge_random, '+.1e')} |")


def main(root: str) -> None:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for path in find_records(root):
        record = load_record(path).to_dict()
        if record["status"] not in ("completed", "diverged") \
                or record["config"]["optim"]["epochs"] == 0:
            continue
        groups[condition(record["config"])].append(record)
    protocol_table(groups)
    print()
    quality_table(groups)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/cpu")
