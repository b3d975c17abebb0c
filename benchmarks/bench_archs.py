"""What one cpu-scale run of each rule costs on each architecture (Fashion-MNIST, 1 thread).

For every architecture (the cpu scale's ResidualMLP, ViT-Mini and ConvMixer as the
cross-architecture experiments build them) and every rule, on one torch thread:

- ``train``: one training epoch (``Trainer.train_epoch``, 20 000 samples, batch 128), timed
  in full for the rules in ``--full`` (default BP and DFA); for the others the first
  ``--steps`` steps are timed and scaled to the epoch's step count (marked "~");
- ``measure``: one epoch's evaluation on the 10 000 test samples, per-epoch diagnostics and
  the protocol (``Trainer.measure``, eval mode);
- ``end``: the end-of-run credit-quality block (ρ, nudging, fresh-feedback null), once per
  run, measured with ``--end-of-run`` (it is the same for every epoch count).

Rows timed over a full epoch also print the test accuracy after that one epoch.

A run of E epochs then costs about E·(train + measure) + end. The 1-minute load average is
printed before and after: other work on the machine inflates every number.

Usage: python benchmarks/bench_archs.py [--archs resmlp vit convmixer] [--methods bp dfa …]
       [--full bp dfa] [--steps 20] [--end-of-run] [--data-dir /usr/share/datasets/fashion-mnist]
       [--set convmixer:model.patch=4 …]   (other sizes than the cpu scale's, per arch)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from creditaudit.config import parse_override
from creditaudit.data import load_dataset
from creditaudit.measures.quality import credit_quality
from creditaudit.methods import rule_names
from creditaudit.run.results import NUDGING_ETAS
from creditaudit.run.trainer import Trainer
from creditaudit.study.experiments.configs import arch_config, method_overrides


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def sizes(config) -> str:
    model = config.model
    if model.arch == "resmlp":
        return f"d={model.d} L={model.n_blocks}"
    extra = f" k={model.kernel}" if model.arch == "convmixer" else f" heads={model.heads}"
    return f"d={model.d} L={model.n_blocks} patch={model.patch}{extra}"


def time_steps(trainer: Trainer, steps: int) -> tuple[float, int]:
    """(seconds per step over ``steps`` steps after one untimed step, steps per epoch)."""
    trainer.model.train()
    batches = iter(trainer.train_loader)
    x, y = next(batches)
    trainer.rule.train_step(x, y, trainer.optimizer)
    started = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        trainer.rule.train_step(x, y, trainer.optimizer)
    return (time.perf_counter() - started) / steps, len(trainer.train_loader)


def bench(arch: str, method: str, *, data_dir: str, full: bool, steps: int,
          end_of_run: bool, dataset, overrides: dict[str, object]) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        config = arch_config(arch, "cpu", dataset=None, data_dir=data_dir, out_dir=out,
                             **method_overrides(method), run__threads=1).replace(**overrides)
        trainer = Trainer(config, dataset=dataset)
        n_steps = len(trainer.train_loader)
        if full:
            started = time.perf_counter()
            trainer.train_epoch(1)
            train_s, per_step = time.perf_counter() - started, None
        else:
            per_step, n_steps = time_steps(trainer, steps)
            train_s = per_step * n_steps
        started = time.perf_counter()
        entry = trainer.measure(1)
        measure_s = time.perf_counter() - started
        end_s = None
        if end_of_run:
            settings = config.diagnostics
            started = time.perf_counter()
            credit_quality(trainer.rule, trainer.eval_x, trainer.eval_y,
                           rho_samples=settings.rho_samples,
                           rho_directions=settings.rho_directions,
                           null_draws=settings.null_draws, etas=NUDGING_ETAS,
                           seed=config.run.seed)
            end_s = time.perf_counter() - started
    return {"arch": arch, "sizes": sizes(config), "method": method, "full": full,
            "ms_step": 1000 * (per_step if per_step is not None else train_s / n_steps),
            "train_s": train_s, "measure_s": measure_s, "end_s": end_s,
            "epochs": config.optim.epochs, "acc": entry.acc_eval if full else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=["resmlp", "vit", "convmixer"])
    parser.add_argument("--methods", nargs="+", default=rule_names())
    parser.add_argument("--full", nargs="*", default=["bp", "dfa"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--end-of-run", action="store_true")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--set", nargs="*", default=[], metavar="ARCH:KEY=VALUE",
                        help="override a config key for one architecture")
    args = parser.parse_args()
    overrides: dict[str, dict[str, object]] = {}
    for item in args.set:
        arch, _, assignment = item.partition(":")
        key, value = parse_override(assignment)
        overrides.setdefault(arch, {})[key] = value
    torch.set_num_threads(1)
    first = arch_config("resmlp", "cpu", dataset=None, data_dir=args.data_dir, out_dir="x")
    dataset = load_dataset(first.data, seed=first.run.seed)
    print(f"torch {torch.__version__}, 1 thread, Fashion-MNIST {dataset.train_x.shape[0]} "
          f"train / {dataset.test_x.shape[0]} test; load {load()} at start "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("| arch | sizes | rule | ms/step | train s/epoch | measure s/epoch | end-of-run s "
          "| est. run s | test acc after 1 epoch |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for arch in args.archs:
        for method in args.methods:
            row = bench(arch, method, data_dir=args.data_dir, full=method in args.full,
                        steps=args.steps, end_of_run=args.end_of_run, dataset=dataset,
                        overrides=overrides.get(arch, {}))
            mark = "" if row["full"] else "~"
            end = "–" if row["end_s"] is None else f"{row['end_s']:.1f}"
            total = row["epochs"] * (row["train_s"] + row["measure_s"]) + (row["end_s"] or 0)
            acc = "–" if row["acc"] is None else f"{row['acc']:.3f}"
            print(f"| {arch} | {row['sizes']} | {method} | {row['ms_step']:.1f} | "
                  f"{mark}{row['train_s']:.1f} | {row['measure_s']:.1f} | {end} | "
                  f"{mark}{total:.0f} | {acc} |", flush=True)
    print(f"load {load()} at the end ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
    main()
