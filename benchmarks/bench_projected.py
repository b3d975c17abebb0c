"""What DFA's projected route saves: BP, DFA, and DFA on the dense route, per step.

DFA's credit has rank C, so a module whose output is a Linear's trains through its projected
output (``methods/projected.py``): the ResidualMLP's embedding and every block's second
Linear, and ViT-Mini's MLP output layers (the attention output, an inner skip, keeps the
dense credit). ``dense_route()`` switches that off — the step before the change, with the
same updates to rounding. Timed on one torch thread with training's fused AdamW, batch 128,
fp32:

- ResidualMLP (terminal LN) on CIFAR-shaped inputs (in_dim 3072), d=256 L=4 and d=512 L=12;
- ViT-Mini at the cpu scale (1×28×28, patch 7: 17 tokens, d=64) and at CIFAR size
  (3×32×32, patch 4: 65 tokens, d=128), 4 blocks, 4 heads, MLP ratio 4.

A round times every variant once (2 untimed + ``--steps`` timed steps), the order rotated by
one each round; ratios to BP are paired within a round, median and range over the rounds.
Run it alone: the 1-minute load average is printed at the start and the end.

Usage: python benchmarks/bench_projected.py [--rounds 9] [--steps 8] [--models resmlp-256 …]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
from torch import Tensor

from bench_steps import IN_DIM, N_CLASSES, bind_rule, make_batches, make_rule, rotated
from creditaudit.methods import CreditRule
from creditaudit.methods.projected import dense_route
from creditaudit.models import ViTMini

BATCH = 128
# name → (label, ViT sizes (d, patch, image shape) or ResidualMLP sizes (d, L))
MODELS = {
    "resmlp-256": ("ResidualMLP d=256 L=4", ("resmlp", 256, 4)),
    "resmlp-512": ("ResidualMLP d=512 L=12", ("resmlp", 512, 12)),
    "vit-cpu": ("ViT-Mini d=64, 1×28×28 patch 7 (17 tokens)", ("vit", 64, 7, (1, 28, 28))),
    "vit-cifar": ("ViT-Mini d=128, 3×32×32 patch 4 (65 tokens)", ("vit", 128, 4, (3, 32, 32))),
}
VARIANTS = ("bp", "dfa", "dfa/dense")

Rule = tuple[CreditRule, torch.optim.Optimizer]


def vit_rule(method: str, d: int, patch: int, shape: tuple[int, int, int]) -> Rule:
    torch.manual_seed(0)
    return bind_rule(method, ViTMini(n_classes=N_CLASSES, d=d, n_blocks=4, heads=4,
                                     mlp_ratio=4, patch=patch, image_shape=shape))


def setup(spec: tuple) -> tuple[dict[str, Rule], list[tuple[Tensor, Tensor]]]:
    """One rule per variant (same initial weights) and 4 batches for the model ``spec``."""
    if spec[0] == "resmlp":
        _, d, n_blocks = spec
        rules = {v: make_rule(v.split("/")[0], d, n_blocks, IN_DIM) for v in VARIANTS}
        return rules, make_batches(4, seed=0)
    _, d, patch, shape = spec
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(BATCH, *shape, generator=gen),
                torch.randint(0, N_CLASSES, (BATCH,), generator=gen)) for _ in range(4)]
    return {v: vit_rule(v.split("/")[0], d, patch, shape) for v in VARIANTS}, batches


def time_variant(variant: str, rule: Rule, batches: list[tuple[Tensor, Tensor]],
                 steps: int) -> float:
    """ms per step over ``steps`` timed steps after 2 untimed ones."""
    step_rule, optimizer = rule
    with dense_route() if variant.endswith("/dense") else contextlib.nullcontext():
        for i in range(2):
            step_rule.train_step(*batches[i % len(batches)], optimizer)
        started = time.perf_counter()
        for i in range(steps):
            step_rule.train_step(*batches[i % len(batches)], optimizer)
    return (time.perf_counter() - started) / steps * 1e3


def load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, batch {BATCH}, fp32, fused AdamW; "
          f"{args.rounds} rotated rounds × {args.steps} steps; load {load()} at the start "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("\n| model | variant | ms/step | ratio to BP (range) |\n|---|---|---:|---:|")
    for name in args.models:
        label, spec = MODELS[name]
        rules, batches = setup(spec)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for round_index in range(args.rounds):
            for variant in rotated(VARIANTS, round_index):
                times[variant].append(time_variant(variant, rules[variant], batches,
                                                   args.steps))
        for variant in VARIANTS:
            ratios = [t / b for t, b in zip(times[variant], times["bp"])]
            shown = "DFA, dense route" if variant == "dfa/dense" else variant.upper()
            print(f"| {label} | {shown} | {statistics.median(times[variant]):.1f} | "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |",
                  flush=True)
    print(f"\nload {load()} at the end ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
    main()
