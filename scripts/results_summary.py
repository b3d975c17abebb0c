"""Summarise a results folder per (dataset, variant) across seeds, as Markdown.

Used to write docs/results.md: every number comes from the run records.

    python scripts/results_summary.py results/cpu > /tmp/summary.md
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict

from creditaudit.experiments.aggregate import aggregate
from creditaudit.runs import find_records, load_record


def variant(config: dict) -> str:
    method = config["method"]
    name = method["name"]
    if method["penalty"]:
        name += f" + λ={method['penalty']:g}"
    if not config["model"]["out_ln"]:
        name += " (no out_ln)"
    return name


def fmt(stat: dict, spec: str) -> str:
    if stat["n"] == 0:
        return "—"
    std = "" if math.isnan(stat["std"]) else f" ± {format(stat['std'], spec)}"
    return f"{format(stat['mean'], spec)}{std}"


def main(root: str) -> None:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in find_records(root):
        record = load_record(path)
        if record["status"] not in ("completed", "diverged"):
            continue
        groups[(record["config"]["data"]["name"], variant(record["config"]))].append(record)
    frozen = {data: aggregate([r["log"][-1]["acc_eval"] for r in runs])["mean"]
              for (data, name), runs in groups.items() if name == "frozen"}
    print("| dataset | method | seeds | test acc | ‖h_L‖ | max growth | ‖g_L‖ | zero-grad "
          "fraction | deep cos | first fired (a) / (b) / (c) | fired at end | (d) margin pp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (data, name), runs in sorted(groups.items()):
        last = [r["log"][-1] for r in runs]
        acc = aggregate([e["acc_eval"] for e in last])
        first = [r["protocol"].get("first_fired", {}) for r in runs]
        firsts = " / ".join(
            ",".join(str(f.get(k)) if f.get(k) is not None else "–" for f in first)
            for k in ("a", "b", "c"))
        ends = ",".join("".join(f"({i})" for i in r["protocol"].get("fired", [])) or "none"
                        for r in runs)
        margin = "—" if data not in frozen else f"{100 * (acc['mean'] - frozen[data]):+.1f}"
        print(f"| {data} | {name} | {len(runs)} | {fmt(acc, '.3f')} | "
              f"{fmt(aggregate([e['h_L_norm'] for e in last]), '.3g')} | "
              f"{fmt(aggregate([e['max_block_growth'] for e in last]), '.3g')} | "
              f"{fmt(aggregate([e['g_L_norm'] for e in last]), '.2g')} | "
              f"{fmt(aggregate([e['g_L_zero_fraction'] for e in last]), '.2f')} | "
              f"{fmt(aggregate([e['deep_cos'] for e in last]), '+.3f')} | {firsts} | {ends} | "
              f"{margin} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/cpu")
