"""Do training runs drift into subnormal floats, which stall x86 cores?

A float32 below 1.2e-38 in magnitude (but not zero) is *subnormal*; on x86 every operation
on one takes a slow microcode path. The plain MLP of ``bench_peers.py``, trained by
feedback rules, drifts into them and slows 2–6× (docs/benchmarks.md). This script trains
the tool's own ResidualMLP (d=256 L=4, the cpu-scale recipe) for a few epochs with each rule
and counts subnormal entries in everything a step reads or writes: parameters, AdamW's two
moments, one step's gradients, the states h_0 … h_L and the rule's credits on 512
evaluation samples.

Usage: python benchmarks/check_subnormals.py [--epochs 3] [--methods bp fa dfa state-bridge]
       [--data-dir /usr/share/datasets/fashion-mnist]   (synthetic data when it is absent)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from creditaudit.config import RunConfig
from creditaudit.run.trainer import Trainer

FASHION = Path("/usr/share/datasets/fashion-mnist")
SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def subnormal_count(tensors: Iterable[Tensor]) -> tuple[int, int]:
    """(subnormal entries, all entries) over ``tensors``."""
    found = total = 0
    for t in tensors:
        t = t.detach()
        found += int(((t != 0) & (t.abs() < SMALLEST_NORMAL)).sum())
        total += t.numel()
    return found, total


def check(method: str, args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    data = ({"data.name": "fashion-mnist", "data.data_dir": str(args.data_dir),
             "data.train_subset": 20000} if args.data_dir.exists()
            else {"data.name": "synthetic"})
    with tempfile.TemporaryDirectory() as out:
        config = RunConfig().replace(**data, **{
            "method.name": method, "optim.epochs": args.epochs, "run.out_dir": out,
            "run.progress": False, "run.threads": 1, "diagnostics.end_of_run": False})
        trainer = Trainer(config)
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        for epoch in range(1, args.epochs + 1):
            trainer.train_epoch(epoch)
        rule, x, y = trainer.rule, trainer.eval_x[:512], trainer.eval_y[:512]
        moments = [value for state in trainer.optimizer.state.values()
                   for key, value in state.items() if key in ("exp_avg", "exp_avg_sq")]
        counts = {"parameters": subnormal_count(rule.model.parameters()),
                  "AdamW moments": subnormal_count(moments)}
        # one step at learning rate 0: the gradients as training computes them
        rule.train_step(x, y, torch.optim.SGD(rule.trainable_parameters(), lr=0.0))
        counts["gradients"] = subnormal_count(p.grad for p in rule.trainable_parameters()
                                              if p.grad is not None)
        with torch.no_grad():
            states, _ = rule.model.forward_states(x)
        counts["states"] = subnormal_count(states)
        counts["credits"] = subnormal_count(rule.credits(x, y))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["bp", "fa", "dfa", "state-bridge"])
    parser.add_argument("--data-dir", type=Path, default=FASHION)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = (f"Fashion-MNIST ({args.data_dir}, first 20 000)" if args.data_dir.exists()
               else "synthetic")
    print(f"torch {torch.__version__}; {dataset}; ResidualMLP d=256 L=4; {args.epochs} "
          f"epochs; load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("| rule | parameters | AdamW moments | gradients | states | credits | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for method in args.methods:
        started = time.perf_counter()
        counts = check(method, args)
        cells = " | ".join(f"{found}/{total}" for found, total in counts.values())
        print(f"| {method} | {cells} | {time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
