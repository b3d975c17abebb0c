"""The "Measured on the synthetic task" table of docs/protocol.md, from fresh runs.

Trains (or finds, in OUT) the runs of the table — BP, DFA, DFA without the terminal LN and
frozen blocks, 8 epochs, at 20 000 and 50 000 samples per epoch, plus an untrained network —
as 2 single-thread worker processes, then prints the table rows: every number from the run
records, (d) against the frozen run of the same data size — then, for each row whose (b)
fired, the cause (b) names.

    python scripts/protocol_table.py [OUT]          (default runs/protocol_table; ~10 min)
"""

from __future__ import annotations

import argparse
import sys

from creditaudit.config import RunConfig
from creditaudit.protocol import FIRED, default_names
from creditaudit.protocol.records import record_report, record_verdict
from creditaudit.records import RunRecord, load_record
from creditaudit.run.plan import run_id
from creditaudit.sweep import LocalExecutor, prepare_configs, run_sweep

# (row label, overrides) per data size; the frozen run is the (d) baseline of its size.
METHODS = [("bp", {"method.name": "bp"}), ("dfa", {"method.name": "dfa"}),
           ("dfa, no out_ln", {"method.name": "dfa", "model.out_ln": False}),
           ("frozen", {"method.name": "frozen"})]
SIZES = (20000, 50000)
# The end-of-run metrics change no number of the table (diagnostics never change training).
BASE = {"optim.epochs": 8, "run.threads": 1, "run.progress": False,
        "diagnostics.end_of_run": False}


def rows_to_run(out: str) -> list[tuple[str, str, RunConfig]]:
    rows = []
    for n in SIZES:
        for label, overrides in METHODS:
            rows.append((f"{n // 1000}k", label, RunConfig().replace(**{
                **BASE, **overrides, "data.n_train": n, "run.out_dir": out})))
    rows.append(("20k", "random init (0 epochs)", RunConfig().replace(**{
        **BASE, "optim.epochs": 0, "data.n_train": 20000, "run.out_dir": out})))
    return rows


def first_fired(record: RunRecord) -> str:
    fired = [f"({i}) {e}" for i, e in record.first_fired().items() if e is not None]
    return ", ".join(fired) or "none"


def verdict_text(record: RunRecord, frozen_acc: float | None) -> str:
    verdict = record_verdict(record, frozen_acc=frozen_acc)
    fired = "".join(f"({i})" for i in default_names() if verdict.statuses[i] == FIRED
                    and (frozen_acc is not None or i != "d"))
    return f"needs walk-back {fired}" if fired else "trustworthy"


def row(size: str, label: str, record: RunRecord, frozen: RunRecord) -> str:
    last = record.log[-1].measures
    assert last is not None, record.run_id
    if record is frozen:
        margin = "— (the baseline itself)"
    else:
        verdict = record_verdict(record, frozen_acc=frozen.final_acc)
        margin = ("(d) not evaluated (untrained network)" if verdict.margin_pp is None else
                  f"{verdict.margin_pp:+.1f} pp → {verdict_text(record, frozen.final_acc)}")
    cells = [size, label, f"{record.final_acc:.3f}", f"{last.h_L_norm:.3g}",
             f"{last.max_block_growth:.3g}", f"{last.g_L_norm:.2g}",
             f"{last.g_L_zero_fraction:.2f}", f"{record.recorded_value('c'):.3f}",
             first_fired(record), verdict_text(record, None), margin]
    return "| " + " | ".join(cells) + " |"


def main(out: str = "runs/protocol_table") -> None:
    rows = rows_to_run(out)
    result = run_sweep(prepare_configs([c for _, _, c in rows], threads=1),
                       LocalExecutor(workers=2))
    failed = [o for o in result.outcomes if o["status"] != "completed"]
    if failed:
        sys.exit(f"runs did not complete: {failed}")
    records = {id(c): load_record(f"{out}/{run_id(c)}") for _, _, c in rows}
    frozen = {size: records[id(c)] for size, label, c in rows if label == "frozen"}
    for size, label, config in rows:
        print(row(size, label, records[id(config)], frozen[size]))
    print()
    for size, label, config in rows:
        b = next(r for r in record_report(records[id(config)]).diagnostics if r.id == "b")
        if b.status == FIRED:
            print(f"{size} {label}: (b) {b.details.get('cause')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="runs/protocol_table",
                        help="results folder of the runs (default runs/protocol_table)")
    main(parser.parse_args().out)
