"""Compare the run records of two results folders, run by run: how far their numbers are apart.

For every run id in both folders (``A/RUN_ID/record.json``), the numbers of the per-epoch
log, the final block and the end-of-run diagnostics are paired leaf by leaf; the script
prints, per run, the largest absolute and relative difference and where it is, and every
leaf that is not a number and differs (a verdict, a status). What differs between any two
runs (timings, dates, the environment) is left out as
:func:`creditaudit.records.comparable` leaves it out. Used to compare a run captured in a
CUDA graph or stacked with the same run trained eager, or on the GPU with the CPU
(``scripts/gpu_checks.sh`` part 4).

Usage: python scripts/compare_records.py A B [--tolerance 1e-4]
Exit 0 when every paired number is within ``--tolerance`` (relative, or absolute below 1)
and every other leaf is equal; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from creditaudit.records import comparable

COMPARED = ("status", "log", "final", "diagnostics", "protocol")


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) of a record's JSON."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}[{index}]")
    else:
        yield path, value


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str, list[str]]:
    """(largest scaled difference, where, other differing leaves) of two records."""
    a, b = comparable(a), comparable(b)
    left = dict(leaves({key: a.get(key) for key in COMPARED}))
    right = dict(leaves({key: b.get(key) for key in COMPARED}))
    worst, where, others = 0.0, "", []
    for path in sorted(left.keys() | right.keys()):
        x, y = left.get(path), right.get(path)
        if is_number(x) and is_number(y):
            scaled = abs(x - y) / max(1.0, abs(x), abs(y))
            if scaled > worst or math.isnan(scaled):
                worst, where = scaled, f"{path}: {x!r} vs {y!r}"
        elif x != y:
            others.append(f"{path}: {x!r} vs {y!r}")
    return worst, where, others


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest accepted difference, relative (absolute below 1)")
    args = parser.parse_args()
    runs_a = {p.parent.name: p for p in args.a.glob("*/record.json")}
    runs_b = {p.parent.name: p for p in args.b.glob("*/record.json")}
    common = sorted(runs_a.keys() & runs_b.keys())
    for name in sorted(runs_a.keys() ^ runs_b.keys()):
        print(f"only in {'A' if name in runs_a else 'B'}: {name}")
    if not common:
        print("no run id in both folders")
        return 1
    ok = True
    print(f"{'run':40} {'largest difference':>18}  where")
    for name in common:
        worst, where, others = compare(json.loads(runs_a[name].read_text()),
                                       json.loads(runs_b[name].read_text()))
        ok = ok and worst <= args.tolerance and not others
        print(f"{name[:40]:40} {worst:18.3g}  {where}")
        for line in others[:5]:
            print(f"{'':40} {'differs':>18}  {line}")
        if len(others) > 5:
            print(f"{'':40} {'':>18}  … and {len(others) - 5} more")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
