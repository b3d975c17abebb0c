"""``creditaudit demo``: BP, FA, DFA and the frozen baseline on the synthetic task."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from creditaudit.cli.common import add_device_options
from creditaudit.config import RunConfig, device_overrides
from creditaudit.formatting import duration
from creditaudit.report import format_run_summary

DEMO_METHODS = ("bp", "fa", "dfa", "frozen")


def demo_config(method: str, *, epochs: int, n_train: int, out_dir: str, seed: int,
                device: str | None = None, precision: str | None = None) -> RunConfig:
    """The demo's run: a d=256 L=4 terminal-LN ResidualMLP on the teacher–student task."""
    overrides = {"method.name": method, "optim.epochs": epochs, "data.n_train": n_train,
                 "data.n_test": 2000, "run.out_dir": out_dir, "run.seed": seed,
                 "run.progress": False}
    overrides.update(device_overrides(device, precision))
    return RunConfig().replace(**overrides)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo", help="BP, FA, DFA and frozen blocks on the synthetic task (~1 min on 2 idle cores)",
        description="Train BP, FA, DFA and the frozen-blocks baseline on the embedded "
                    "teacher–student task (d=256, L=4 ResidualMLP with terminal LN), then "
                    "print accuracy, ‖h_L‖, ‖g_L‖ and deep cosine per method. No download.")
    parser.add_argument("--out", default="runs/demo", help="results folder (default runs/demo)")
    parser.add_argument("--epochs", type=int, default=8, help="epochs per method (default 8)")
    parser.add_argument("--n-train", type=int, default=20000,
                        help="synthetic training samples (default 20000)")
    parser.add_argument("--seed", type=int, default=42, help="seed (default 42)")
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel single-thread runs (default: number of cores, at most 4)")
    add_device_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines; only the final table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from creditaudit.records import RECORD_FILE, load_record
    from creditaudit.run_ids import run_id
    from creditaudit.sweep import LocalExecutor, run_sweep

    started = time.perf_counter()
    configs = [demo_config(method, epochs=args.epochs, n_train=args.n_train,
                           out_dir=args.out, seed=args.seed, device=args.device,
                           precision=args.precision) for method in DEMO_METHODS]
    # One single-thread process per run: on two cores, two 1-thread runs beat one 2-thread.
    workers = args.workers or min(len(configs), os.cpu_count() or 1)
    if not args.quiet:
        print(f"training {', '.join(DEMO_METHODS)} ({args.epochs} epochs each, {workers} "
              f"parallel runs) on the synthetic teacher–student task …", flush=True)

    def progress(state, outcome) -> None:  # noqa: ANN001 - sweep callback
        if outcome is not None:
            print(f"  {outcome['run_id']}: {outcome['status']} ({state.ended}/{state.total}"
                  f", {duration(time.perf_counter() - started)} elapsed)", flush=True)

    result = run_sweep(configs, LocalExecutor(workers=workers),
                       on_progress=None if args.quiet else progress)
    records = []
    for config in configs:
        path = Path(args.out) / run_id(config)
        if (path / RECORD_FILE).exists():
            records.append(load_record(path))
    if not args.quiet:
        print()
    print(format_run_summary(records))
    failed = [o for o in result.outcomes if o["status"] not in ("completed", "diverged")]
    for outcome in failed:
        print(f"{outcome['run_id']} {outcome['status']}: {outcome.get('error')}")
    print(f"\nrecords: {args.out}/<run id>/record.json  "
          f"({time.perf_counter() - started:.0f} s); audit one with "
          f"`creditaudit audit {args.out}/<run id>`")
    return 1 if failed else 0
