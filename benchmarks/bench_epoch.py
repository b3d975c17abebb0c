"""What one epoch costs besides training, and what the end-of-run block costs, in epochs.

Trains a terminal-LN ResidualMLP on CIFAR-shaped synthetic data (in_dim 3072, 10k test
samples, 1280 evaluation samples) with the real :class:`~creditaudit.run.trainer.Trainer`, and
times, per epoch, each piece of the loop: the training steps, the per-epoch measurement
(:meth:`Trainer.measure`: the test evaluation, which reuses the diagnostics' forward pass over
the evaluation subset, the diagnostics and the protocol), the checkpoint and the record
write; the evaluation alone (a full pass over the test split) is timed for reference. The
overhead is everything but training as a fraction of training. Then the end-of-run
credit-quality block (ρ in float64 on 1024 samples × 32 directions, nudging at two step sizes,
the fresh-feedback null with 20 draws, drift) is timed once and expressed in epochs.

Usage: python benchmarks/bench_epoch.py [--d 256 --blocks 4] [--n-train 50000] [--epochs 3]
       [--methods bp dfa] [--threads 1]
Targets: per-epoch overhead ≤ 4 % of an epoch; end-of-run block ≤ 0.5 epoch (d=256 L=4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from creditaudit.config import RunConfig
from creditaudit.measures.quality import credit_quality
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.run.evaluation import evaluate
from creditaudit.run.results import NUDGING_ETAS
from creditaudit.run.trainer import Trainer


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def config_for(method: str, args: argparse.Namespace, out: str) -> RunConfig:
    return RunConfig().replace(**{
        "method.name": method, "model.d": args.d, "model.n_blocks": args.blocks,
        "data.name": "synthetic", "data.in_dim": 3072, "data.n_train": args.n_train,
        "data.n_test": args.n_test, "optim.epochs": args.epochs, "run.out_dir": out,
        "run.progress": False, "run.threads": args.threads})


def measure(method: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(config_for(method, args, out))
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        parts: dict[str, list[float]] = {k: [] for k in
                                         ("train", "evaluate", "measure", "checkpoint",
                                          "record")}
        for epoch in range(1, args.epochs + 1):
            seconds, stats = timed(lambda e=epoch: trainer.train_epoch(e))
            parts["train"].append(seconds)
            evaluate_s, _ = timed(lambda: evaluate(trainer.model, trainer.dataset,
                                                   trainer.device, flatten=trainer.flatten))
            measure_s, entry = timed(lambda e=epoch: trainer.measure(e))
            parts["evaluate"].append(evaluate_s)
            parts["measure"].append(measure_s)
            trainer.record.log.append(entry)
            parts["checkpoint"].append(timed(lambda e=epoch: trainer.checkpoint(e))[0])
            parts["record"].append(timed(trainer._write)[0])
        assert (trainer.run_dir / CHECKPOINT_FILE).exists()
        settings = trainer.config.diagnostics
        quality_s, _ = timed(lambda: credit_quality(
            trainer.rule, trainer.eval_x, trainer.eval_y, rho_samples=settings.rho_samples,
            rho_directions=settings.rho_directions, null_draws=settings.null_draws,
            etas=NUDGING_ETAS, seed=0))
    out = {k: statistics.median(v) for k, v in parts.items()}
    out["end_of_run"] = quality_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--n-train", type=int, default=50000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["bp", "dfa"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-test", type=int, default=10000)
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args()
    if args.quick:
        args.d, args.blocks, args.n_train, args.n_test, args.epochs = 16, 2, 512, 256, 1
    torch.set_num_threads(args.threads)
    print(f"load average at start: {os.getloadavg()}")
    print(f"ResidualMLP in_dim 3072 d={args.d} L={args.blocks}, {args.n_train} training "
          f"samples, {args.threads} thread(s); medians over {args.epochs} epochs (seconds)\n")
    print("| rule | train | evaluation alone | evaluation + diagnostics + protocol | "
          "checkpoint | record | overhead % of train | end-of-run block | in epochs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        t = measure(method, args)
        overhead = t["measure"] + t["checkpoint"] + t["record"]
        print(f"| {method} | {t['train']:.2f} | {t['evaluate']:.3f} | {t['measure']:.3f} | "
              f"{t['checkpoint']:.3f} | {t['record']:.4f} | {100 * overhead / t['train']:.1f} | "
              f"{t['end_of_run']:.2f} | {t['end_of_run'] / t['train']:.2f} |", flush=True)
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
