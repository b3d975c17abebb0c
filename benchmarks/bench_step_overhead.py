"""Where a local rule's step loses to BP outside the matmul FLOP count.

1. **Fixed cost per step**: every rule's ``train_step`` on a model so small (d=16, in_dim 16,
   batch 8) that no kernel does real work — what remains is Python, autograd bookkeeping
   and dispatch, paid by every step at every size. Reported per rule and as the excess over
   BP's, for L=4 and L=12 blocks.
2. **The LayerNorm → Linear parameter gradients of one block** on a detached input, the
   two ways a local step can compute them from G (the gradient at the Linear's output) and
   n̂ (the normalised input): *plain* — autograd's route, the input-gradient product P = G·W
   then the LayerNorm's γ, β gradients from P, and ∂W = Gᵀ·LN(h); *fused* — what
   ``models/fused.py`` does, one product M = Gᵀn̂ and then d×d elementwise passes
   (∂γ = Σ_k W∘M, ∂β = Wᵀ(Gᵀ1), ∂W = M·diag(γ) + (Gᵀ1)βᵀ). The fused form saves a
   B·d² product and pays about five memory-bound passes over d×d matrices, so which one
   is faster depends on B, d and how the machine's caches hold the d×d matrices.

3. **Ablations inside a real step** (``--ablate``, d=512 L=12, in_dim 3072, batch 128):
   DFA's step as it is, against the same step with ∂γ = Σ_k W∘M replaced by zeros — a
   wrong gradient, for timing only (the library's backward is swapped for the run and
   restored); the reduction reads every block's W from memory after the forward has moved
   on, so in a step it costs more than in isolation. And the State Bridge's step with its
   predictor's AdamW fused (as shipped) against torch's per-tensor loop.

Rounds rotate the order of the variants; the median over rounds is reported with the
1-minute load average. Run it alone: other jobs change memory-bound passes more than
matmuls.

Usage: python benchmarks/bench_step_overhead.py [--rounds 15] [--steps 60]
       [--sizes 256x128 512x128 ...] [--blocks 12] [--ablate [--ablate-rounds 11]]
       [--only-ablate]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

import bench_steps
from bench_steps import make_batches, make_rule, rotated, run_steps, time_steps
from creditaudit.models import fused

TINY = 16  # d and in_dim of the overhead model
TINY_BATCH = 8
RULES = ("bp", "dfa", "fa", "state-bridge")


def load() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def fixed_cost(n_blocks: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """ms per step of every rule on the tiny model, per round."""
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(TINY_BATCH, TINY, generator=gen),
                torch.randint(0, bench_steps.N_CLASSES, (TINY_BATCH,), generator=gen))
               for _ in range(8)]
    rules = {name: make_rule(name, TINY, n_blocks, in_dim=TINY) for name in RULES}
    for rule, optimizer in rules.values():
        run_steps(rule, optimizer, batches, 20)
    ms: dict[str, list[float]] = {name: [] for name in RULES}
    for index in range(rounds):
        for name in rotated(RULES, index):
            started = time.perf_counter()
            run_steps(*rules[name], batches, steps)
            ms[name].append((time.perf_counter() - started) / steps * 1e3)
    return ms


def block_operands(d: int, rows: int, n_blocks: int, gen: torch.Generator
                   ) -> list[dict[str, Tensor]]:
    """Per block: W (d×d), G and n̂ (rows×d), γ, β, LN(h) = n̂·γ + β (float32)."""
    blocks = []
    for _ in range(n_blocks):
        n_hat = torch.randn(rows, d, generator=gen)
        gamma = 1 + 0.1 * torch.randn(d, generator=gen)
        beta = 0.1 * torch.randn(d, generator=gen)
        blocks.append({"w": torch.randn(d, d, generator=gen) / d ** 0.5,
                       "g": torch.randn(rows, d, generator=gen), "n_hat": n_hat,
                       "gamma": gamma, "beta": beta, "ln": n_hat * gamma + beta})
    return blocks


def plain_gradients(b: dict[str, Tensor]) -> tuple[Tensor, ...]:
    """Autograd's route: P = G·W, ∂γ = Σ_rows P∘n̂, ∂β = Σ_rows P, ∂W = Gᵀ·LN(h), ∂b."""
    p = b["g"].mm(b["w"])
    return (p.mul(b["n_hat"]).sum(0), p.sum(0), b["g"].t().mm(b["ln"]), b["g"].sum(0))


def fused_gradients(b: dict[str, Tensor]) -> tuple[Tensor, ...]:
    """models/fused.py's route: one product M = Gᵀn̂, then d×d passes."""
    m = b["g"].t().mm(b["n_hat"])
    s = b["g"].sum(0)
    d_gamma = torch.linalg.vecdot(b["w"], m, dim=0)
    return d_gamma, s @ b["w"], m.mul_(b["gamma"]).addr_(s, b["beta"]), s


def block_costs(sizes: list[tuple[int, int]], n_blocks: int, rounds: int
                ) -> dict[tuple[int, int], dict[str, list[float]]]:
    """ms per block of each route, per round, for every (d, rows) size."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for d, rows in sizes:
        blocks = block_operands(d, rows, n_blocks, gen)
        for b in blocks[:1]:  # the two routes agree (checked once per size)
            for got, want in zip(fused_gradients(dict(b)), plain_gradients(b), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        routes: dict[str, Callable[[dict[str, Tensor]], tuple[Tensor, ...]]] = {
            "plain": plain_gradients, "fused": fused_gradients}
        times: dict[str, list[float]] = {name: [] for name in routes}
        for index in range(rounds):
            for name in rotated(tuple(routes), index):
                routes[name](blocks[0])
                started = time.perf_counter()
                for _ in range(5):
                    for b in blocks:
                        routes[name](b)
                times[name].append((time.perf_counter() - started) / 5 / n_blocks * 1e3)
        out[(d, rows)] = times
    return out


def backward_without_d_gamma(ctx, grad_z: Tensor) -> tuple:  # noqa: ANN001 - autograd ctx
    """``fused._DetachedLayerNormLinear.backward`` with ∂γ = 0 (timing only: wrong)."""
    rows, mean, rstd, gamma, beta, weight = ctx.saved_tensors
    g = grad_z.reshape(-1, weight.shape[0])
    m = g.t().mm((rows - mean) * rstd)
    s = g.sum(dim=0)
    return None, torch.zeros_like(gamma), s @ weight, m.mul_(gamma).addr_(s, beta), s, None


def ablations(rounds: int, d: int = 512, n_blocks: int = 12) -> dict[str, list[float]]:
    """ms per step, per rotated round: BP; DFA with and without the ∂γ reduction; the
    State Bridge with its predictor's AdamW fused and as torch's per-tensor loop."""
    batches = make_batches(bench_steps.N_BATCHES, seed=0)
    exact = fused._DetachedLayerNormLinear.__dict__["backward"]  # the staticmethod itself
    ablated = staticmethod(torch.autograd.function.once_differentiable(
        backward_without_d_gamma))
    variants = {"BP": ("bp", exact), "DFA": ("dfa", exact),
                "DFA, ∂γ skipped": ("dfa", ablated),
                "State Bridge (predictor: fused AdamW)": ("state-bridge", exact),
                "State Bridge (predictor: per-tensor AdamW)": ("state-bridge", exact)}
    rules = {name: make_rule(rule, d, n_blocks) for name, (rule, _) in variants.items()}
    looped = rules["State Bridge (predictor: per-tensor AdamW)"][0]
    predictor_params = [p for group in looped.predictor_optimizer.param_groups
                        for p in group["params"]]
    looped.predictor_optimizer = torch.optim.AdamW(  # torch's CPU default: a per-tensor loop
        predictor_params, lr=looped.config.bridge_lr, weight_decay=0.01)
    ms: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for index in range(-1, rounds):  # round -1 warms up
            for name in rotated(tuple(variants), max(index, 0)):
                fused._DetachedLayerNormLinear.backward = variants[name][1]
                elapsed = time_steps(name, *rules[name], batches, 10)
                if index >= 0:
                    ms[name].append(elapsed)
    finally:
        fused._DetachedLayerNormLinear.backward = exact
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=60, help="steps per rule per round")
    parser.add_argument("--sizes", nargs="+", default=["256x128", "512x128", "768x128",
                                                      "512x512", "256x2176"],
                        help="d×rows of the block benchmark (rows = batch·tokens)")
    parser.add_argument("--blocks", type=int, default=12,
                        help="distinct blocks cycled in the block benchmark")
    parser.add_argument("--ablate", action="store_true",
                        help="also time the ablations at d=512 L=12 (part 3)")
    parser.add_argument("--only-ablate", action="store_true", help="part 3 only")
    parser.add_argument("--ablate-rounds", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; load average at start: {load()}")
    if not args.only_ablate:
        fixed_and_block_tables(args)
    if args.ablate or args.only_ablate:
        ms = ablations(args.ablate_rounds)
        print(f"\nSteps at d=512 L=12 (in_dim 3072, batch 128), median of "
              f"{args.ablate_rounds} rotated rounds × 10 steps:\n")
        print("| variant | ms/step | ratio to BP (range) |")
        print("|---|---:|---:|")
        for name, values in ms.items():
            ratios = [a / b for a, b in zip(values, ms["BP"], strict=True)]
            print(f"| {name} | {statistics.median(values):.1f} | "
                  f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |")
    print(f"\nload average at end: {load()}")


def fixed_and_block_tables(args: argparse.Namespace) -> None:
    """Parts 1 and 2, printed as Markdown tables."""
    print(f"\nFixed cost per step (d={TINY}, in_dim {TINY}, batch {TINY_BATCH}), "
          f"median of {args.rounds} rotated rounds × {args.steps} steps:\n")
    print("| blocks | " + " | ".join(RULES) + " |")
    print("|---:|" + "---:|" * len(RULES))
    for n_blocks in (4, 12):
        ms = fixed_cost(n_blocks, args.rounds, args.steps)
        cells = []
        for name in RULES:
            excess = statistics.median(a - b for a, b in zip(ms[name], ms["bp"], strict=True))
            cells.append(f"{statistics.median(ms[name]):.2f}"
                         + ("" if name == "bp" else f" (+{excess:.2f})"))
        print(f"| {n_blocks} | " + " | ".join(cells) + " |")
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes]
    print(f"\nLayerNorm → Linear parameter gradients of one block, ms (median of "
          f"{args.rounds} rotated rounds, {args.blocks} distinct blocks cycled):\n")
    print("| d | rows | plain (two products) | fused (one product + d×d passes) | "
          "fused / plain |")
    print("|---:|---:|---:|---:|---:|")
    for (d, rows), times in block_costs(sizes, args.blocks, args.rounds).items():
        plain_ms, fused_ms = statistics.median(times["plain"]), statistics.median(times["fused"])
        print(f"| {d} | {rows} | {plain_ms:.3f} | {fused_ms:.3f} | {fused_ms / plain_ms:.2f} |")


if __name__ == "__main__":
    main()
