"""The demo's four runs (BP, FA, DFA, frozen) at several (epochs, n_train) settings.

For each setting: the data are generated (or read from the cache) first, outside the timing;
then the four demo runs train as 2 parallel single-thread worker processes into a fresh
folder, exactly as ``creditaudit demo`` runs them. Prints per run: final test (and train)
accuracy, the last epoch's median ‖h_L‖, largest block growth and median ‖g_L‖, the protocol
statuses (a)–(c) of the last epoch, (d) against the frozen run, and the run's wall seconds;
per setting the wall time of all four runs and their CPU time (user + system, summed over
the worker processes). The 1-minute load average is printed before and after each setting:
other work on the machine inflates the wall times; a single-thread run's CPU time is close to
its wall time on an idle core, so CPU / workers estimates the idle wall time.

Usage: python benchmarks/bench_demo.py [--dataset mnist1d] [--settings 8x32000 8x48000]
       [--n-test 4000] [--workers 2] [--seed 42]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from creditaudit.cli.demo import DEMO_METHODS, DEMO_TASKS, demo_config
from creditaudit.data import load_dataset
from creditaudit.protocol import Thresholds, depth_utility_diagnostic
from creditaudit.records import load_record
from creditaudit.run.plan import run_id
from creditaudit.sweep import LocalExecutor, run_sweep


def parse_setting(text: str) -> tuple[int, int]:
    epochs, _, n_train = text.partition("x")
    return int(epochs), int(n_train)


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench(dataset: str, epochs: int, n_train: int, n_test: int, workers: int,
          seed: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        configs = [demo_config(m, dataset=dataset, epochs=epochs, n_train=n_train,
                               n_test=n_test, out_dir=out, seed=seed) for m in DEMO_METHODS]
        load_dataset(configs[0].data, seed=seed)  # fill the cache outside the timing
        before = load()
        cpu_before = cpu_seconds()
        started = time.perf_counter()
        result = run_sweep(configs, LocalExecutor(workers=workers))
        wall = time.perf_counter() - started
        cpu = cpu_seconds() - cpu_before
        seconds = {o["run_id"]: o["seconds"] for o in result.outcomes}
        records = [load_record(Path(out) / run_id(c)) for c in configs]
    frozen = records[-1].log[-1].acc_eval
    print(f"\n{dataset} {epochs} epochs × {n_train} train / {n_test} test: {wall:.1f} s wall "
          f"for 4 runs on {workers} workers, {cpu:.1f} CPU s (load {before} → {load()})")
    print("| method | test acc | train acc | ‖h_L‖ | max growth | ‖g_L‖ | (a) (b) (c) | "
          "(d) margin | run s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for record in records:  # read through the record's classes: each number is stored once
        last = record.log[-1]
        status = last.protocol or {}
        abc = " ".join(status.get(i, "—") for i in ("a", "b", "c"))
        method = record.config.method.name
        margin = depth_utility_diagnostic(last.acc_eval, frozen, Thresholds())
        d = "—" if method == "frozen" else f"{margin.value:+.1f} pp {margin.status}"
        train_acc = float("nan") if last.train_acc is None else last.train_acc
        print(f"| {method} | {last.acc_eval:.3f} | {train_acc:.3f} "
              f"| {last.h_L_norm:.3g} | {last.max_block_growth:.3g} "
              f"| {last.g_L_norm:.3g} | {abc} | {d} | {seconds[record.run_id]:.1f} |")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=tuple(DEMO_TASKS), default="mnist1d")
    parser.add_argument("--settings", nargs="+", default=["8x32000"],
                        help="EPOCHSxN_TRAIN settings (default 8x32000, the demo's)")
    parser.add_argument("--n-test", type=int, default=None,
                        help="test samples (default: the demo's for the dataset)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    n_test = DEMO_TASKS[args.dataset].n_test if args.n_test is None else args.n_test
    for setting in args.settings:
        epochs, n_train = parse_setting(setting)
        bench(args.dataset, epochs, n_train, n_test, args.workers, args.seed)


if __name__ == "__main__":
    main()
