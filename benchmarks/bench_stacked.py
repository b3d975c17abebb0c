"""Runs trained alone against K runs stacked in one model, and (on CUDA) captured steps.

1. ``steps``: ms per step and run of a ResidualMLP (in_dim 3072, d=256, L=4, terminal LN,
   batch 128, fp32) — alone: ``rule.train_step`` with training's fused AdamW; stacked K:
   one :class:`~creditaudit.methods.stacked.StackedStep` (vmapped forward, one backward)
   plus the K runs' AdamW steps, divided by K. Each round times alone, then every K (order rotated
   by one each round, so drifting load hits all alike); ratios stacked/alone are paired
   within a round; median and range over ``--rounds``.
2. ``trainer``: seconds of one training epoch (the loop of the real Trainer: its loader,
   optimiser, schedule; no evaluation) per run — alone eager (``run.cuda_graphs = off``),
   alone captured (CUDA only), K stacked eager, K stacked captured (CUDA only) — after one
   untimed epoch. Data: synthetic features (``--data synthetic``) or a random CIFAR-10
   folder through the real CIFAR loader with crop + flip (``--data cifar``, the paper
   scale's data path; 50 000 images by default).

Other processes distort CPU timings: the load average is printed at the start, after every
round and at the end; trust runs whose load stayed below the cores minus the threads.

Usage: python benchmarks/bench_stacked.py [--device cpu|cuda] [--methods bp dfa]
       [--runs 4 8] [--rounds 5] [--steps 10] [--threads 1] [--parts steps trainer]
       [--data synthetic|cifar] [--n-train N] [--out-json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from creditaudit.config import MethodConfig, RunConfig
from creditaudit.methods import build_rule
from creditaudit.methods.stacked import StackedStep
from creditaudit.models import ResidualMLP
from creditaudit.optim import make_adamw
from creditaudit.run.plan import plan_run
from creditaudit.run.stacked import epoch_runner
from creditaudit.run.trainer import Trainer

IN_DIM, D, BLOCKS, N_CLASSES, BATCH = 3072, 256, 4, 10, 128


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average (1, 5, 15 min): {one:.2f}, {five:.2f}, {fifteen:.2f}"


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --- part 1: steps --------------------------------------------------------------------------
class StepRun:
    """One run for the step timings: its rule, model, optimiser (a stack member)."""

    def __init__(self, method: str, seed: int, device: str) -> None:
        torch.manual_seed(seed)
        self.model = ResidualMLP(IN_DIM, D, N_CLASSES, BLOCKS, out_ln=True).to(device)
        self.rule = build_rule(self.model, MethodConfig(name=method), n_classes=N_CLASSES,
                               seed=seed).to(torch.device(device))
        self.rule.set_precision("fp32", device)
        self.optimizer = make_adamw(self.rule.trainable_parameters(), lr=1e-3,
                                    weight_decay=0.01)
        self.device = torch.device(device)


def batches(k: int, device: str, n: int = 4) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(k, BATCH, IN_DIM, generator=gen).to(device),
             torch.randint(0, N_CLASSES, (k, BATCH), generator=gen).to(device))
            for _ in range(n)]


def time_alone(run: StepRun, data: list[tuple[Tensor, Tensor]], steps: int, device: str
               ) -> float:
    """ms per ``rule.train_step`` (one run)."""
    def step(i: int) -> None:
        x, y = data[i % len(data)]
        run.rule.train_step(x[0], y[0], run.optimizer)

    step(0)
    synchronize(device)
    started = time.perf_counter()
    for i in range(steps):
        step(i)
    synchronize(device)
    return (time.perf_counter() - started) / steps * 1e3


def time_stacked(step: StackedStep, data: list[tuple[Tensor, Tensor]], steps: int,
                 device: str) -> float:
    """ms per stacked step of K runs, divided by K (per run)."""
    runs = range(step.size)

    def one(i: int) -> None:
        x, y = data[i % len(data)]
        step.forward_backward(x, y)
        step.optimize(runs)

    step.stack()
    one(0)
    synchronize(device)
    started = time.perf_counter()
    for i in range(steps):
        one(i)
    synchronize(device)
    step.unstack()
    return (time.perf_counter() - started) / steps * 1e3 / step.size


def bench_steps(method: str, sizes: list[int], args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    alone = StepRun(method, 0, device)
    stacks = {k: StackedStep([StepRun(method, s, device) for s in range(k)]) for k in sizes}
    data = {k: batches(k, device) for k in [1, *sizes]}
    variants = ["alone", *[f"stacked {k}" for k in sizes]]
    ms: dict[str, list[float]] = {v: [] for v in variants}
    loads = []
    for index in range(args.rounds):
        for variant in variants[index % len(variants):] + variants[:index % len(variants)]:
            if variant == "alone":
                ms[variant].append(time_alone(alone, data[1], args.steps, device))
            else:
                k = int(variant.split()[1])
                ms[variant].append(time_stacked(stacks[k], data[k], args.steps, device))
        loads.append(os.getloadavg()[0])
        print(f"  {method} round {index + 1}/{args.rounds}: "
              + ", ".join(f"{v} {ms[v][-1]:.2f}" for v in variants)
              + f" ms per run and step; 1-min load {loads[-1]:.2f}", flush=True)
    rows = {}
    for variant in variants:
        ratios = [t / a for t, a in zip(ms[variant], ms["alone"], strict=True)]
        rows[variant] = {"ms_median": statistics.median(ms[variant]),
                         "ratio_median": statistics.median(ratios),
                         "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return {"method": method, "rows": rows, "loads": loads}


# --- part 2: the Trainer's epoch --------------------------------------------------------------
def trainer_config(method: str, args: argparse.Namespace, data_dir: Path | None, out: str,
                   seed: int, graphs: str) -> RunConfig:
    overrides: dict[str, Any] = {
        "method.name": method, "model.d": D, "model.n_blocks": BLOCKS, "optim.epochs": 2,
        "optim.batch_size": BATCH, "run.seed": seed, "run.out_dir": out,
        "run.device": args.device, "run.cuda_graphs": graphs, "run.progress": False,
        "diagnostics.end_of_run": False}
    if data_dir is None:
        overrides.update({"data.name": "synthetic", "data.n_train": args.n_train,
                          "data.n_test": 1280, "data.in_dim": IN_DIM, "data.data_seed": 0})
    else:
        overrides.update({"data.name": "cifar10", "data.data_dir": str(data_dir)})
    return RunConfig().replace(**overrides)


def epoch_seconds(trainers: list[Trainer], stacked: bool) -> float:
    """Seconds of the second of two training epochs, per run."""
    device = trainers[0].device.type
    if stacked:
        runner = epoch_runner(trainers)
        runner.train_epoch(1)
        synchronize(device)
        started = time.perf_counter()
        stats = runner.train_epoch(2)
    else:
        trainers[0].train_epoch(1)
        synchronize(device)
        started = time.perf_counter()
        stats = [trainers[0].train_epoch(2)]
    synchronize(device)
    if any(s is None for s in stats):
        raise RuntimeError("a run diverged; the timing would be of a shorter epoch")
    return (time.perf_counter() - started) / len(trainers)


def bench_trainer(method: str, sizes: list[int], args: argparse.Namespace,
                  data_dir: Path | None) -> dict[str, float]:
    graphs = ["off", "auto"] if args.device == "cuda" else ["off"]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # Loaded once: every run reads the same data (synthetic: a fixed data seed).
        data = plan_run(trainer_config(method, args, data_dir, tmp, 0, "off")).load_data()
        for graph in graphs:
            label = "captured" if graph == "auto" else "eager"
            alone = Trainer(trainer_config(method, args, data_dir, tmp, 0, graph), dataset=data)
            out[f"alone {label}"] = epoch_seconds([alone], stacked=False)
            for k in sizes:
                trainers = [Trainer(trainer_config(method, args, data_dir, tmp, s, graph),
                                    dataset=data) for s in range(k)]
                out[f"stacked {k} {label}"] = epoch_seconds(trainers, stacked=True)
            print(f"  {method}: " + ", ".join(f"{v} {t:.3f}" for v, t in out.items())
                  + f" s per run and epoch; 1-min load {os.getloadavg()[0]:.2f}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--methods", nargs="+", default=["bp", "dfa"])
    parser.add_argument("--runs", type=int, nargs="+", default=[4, 8],
                        help="stack sizes K to time")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--parts", nargs="+", default=["steps", "trainer"],
                        choices=("steps", "trainer"))
    parser.add_argument("--data", default="synthetic", choices=("synthetic", "cifar"))
    parser.add_argument("--n-train", type=int, default=None,
                        help="training samples (default: 2560 synthetic, 50000 cifar)")
    parser.add_argument("--out-json", default=None, help="also write the results here")
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.steps, args.n_train = [2], 1, 1, 256
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_stacked: no CUDA device (use --device cpu)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    if args.n_train is None:
        args.n_train = 50_000 if args.data == "cifar" else 2560
    name = (torch.cuda.get_device_name(0) if args.device == "cuda"
            else platform.processor() or platform.machine())
    print(f"{name}, torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} torch "
          f"thread(s); {load_text()}", flush=True)
    results: dict[str, Any] = {"device": name, "torch": torch.__version__,
                               "threads": args.threads, "steps": [], "trainer": []}
    if "steps" in args.parts:
        print(f"\nsteps: ResidualMLP in_dim {IN_DIM} d={D} L={BLOCKS}, batch {BATCH}, fp32; "
              f"{args.rounds} rounds × {args.steps} steps")
        for method in args.methods:
            results["steps"].append(bench_steps(method, args.runs, args))
        print("\n| rule | variant | ms per step and run | vs alone (median, range) |")
        print("|---|---|---:|---|")
        for entry in results["steps"]:
            for variant, row in entry["rows"].items():
                print(f"| {entry['method']} | {variant} | {row['ms_median']:.2f} | "
                      f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}–"
                      f"{row['ratio_max']:.2f}) |")
    if "trainer" in args.parts:
        data_dir = None
        if args.data == "cifar":
            from bench_gpu import write_random_cifar

            data_dir = write_random_cifar(Path(tempfile.mkdtemp(prefix="bench_stacked_")),
                                          n_train=args.n_train)
        print(f"\ntrainer: one training epoch of {args.n_train} {args.data} samples, batch "
              f"{BATCH}, through the Trainer (after one untimed epoch)")
        for method in args.methods:
            results["trainer"].append({"method": method, **bench_trainer(
                method, args.runs, args, data_dir)})
        steps = -(-args.n_train // BATCH)  # the loader keeps a last partial batch
        print("\n| rule | variant | s per epoch and run | ms per step and run | vs alone eager |")
        print("|---|---|---:|---:|---:|")
        for entry in results["trainer"]:
            base = entry["alone eager"]
            for variant, seconds in entry.items():
                if variant != "method":
                    print(f"| {entry['method']} | {variant} | {seconds:.3f} | "
                          f"{seconds / steps * 1e3:.2f} | {seconds / base:.2f} |")
    print(f"\n{load_text()}")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(results, indent=1))
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
