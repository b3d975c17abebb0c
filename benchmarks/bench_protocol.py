"""Cost of the protocol and of the perturbation correlation ρ.

1. ``diagnose()`` on a d=256 L=4 terminal-LN ResidualMLP with the default evaluation set
   (1280 samples = 10 batches of 128): the four diagnostics alone, and with the
   credit-quality metrics (ρ on 1024 samples × 32 directions in float64 with its BP and
   random controls, nudging, fresh-B null with 20 draws for DFA) — against one BP training
   epoch of 50k synthetic samples at batch 128. Target: the four diagnostics cost a small
   fraction of an epoch.
2. ρ at state 0 (the most expensive: the perturbed forward runs all L blocks): all
   directions batched into one forward (the implementation) against (i) a Python loop over
   the M directions (each forward still batches every sample) and (ii) a loop over
   (sample, direction) pairs, one row per forward. Target: batched >= 10x faster than a
   per-direction loop.
3. The whole ρ table (every state, BP and random controls, 1024 samples × 32 directions,
   float64) with the perturbed tensor of one forward capped at 64 MB (the old chunking) and
   at 4 MB (``perturbation.MAX_ELEMENTS``, the default), alternating, with the minor page
   faults each run took: large tensors are handed back to the OS when freed and faulted
   in afresh by the next forward.

Usage: python benchmarks/bench_protocol.py --threads 1 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from creditaudit import diagnose
from creditaudit.config import MethodConfig
from creditaudit.data import make_teacher_student
from creditaudit.measures import perturbation
from creditaudit.measures.perturbation import pearson, perturbation_rho, rho_table
from creditaudit.measures.working import model_copy
from creditaudit.methods import bp_state_gradients, build_rule
from creditaudit.models import ResidualMLP

# The state width d of the timed ResidualMLPs (L=4); --quick shrinks it.
WIDTH = 256


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Fastest wall-clock seconds of ``repeats`` calls (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def train_epoch(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
    """One BP epoch (AdamW, shuffled batches) on a fresh d=256 L=4 ResidualMLP."""
    torch.manual_seed(0)
    model = ResidualMLP(x.shape[1], WIDTH, 10, 4)
    rule = build_rule(model, MethodConfig(name="bp"), n_classes=10, seed=0)
    rule.set_precision("fp32", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    for start in range(0, x.shape[0], batch_size):
        index = order[start:start + batch_size]
        rule.train_step(x[index], y[index], optimizer)


def rho_chunking(model: ResidualMLP, x: torch.Tensor, y: torch.Tensor, credits: list,
                 repeats: int) -> list[tuple[str, float, float]]:
    """(cap, median seconds, median minor page faults) of the full ρ table per tensor cap,
    the caps alternating within each repeat; the default cap is restored afterwards."""
    default = perturbation.MAX_ELEMENTS
    caps = {"64 MB per perturbed tensor (before)": 1 << 23,
            "4 MB per perturbed tensor (default)": default}
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in caps}
    try:
        for _ in range(repeats):
            for name, cap in caps.items():
                perturbation.MAX_ELEMENTS = cap
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                started = time.perf_counter()
                rho_table(model, x, y, credits)
                runs[name].append((time.perf_counter() - started,
                                   resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
    finally:
        perturbation.MAX_ELEMENTS = default
    return [(name, statistics.median(t for t, _ in v), statistics.median(f for _, f in v))
            for name, v in runs.items()]


@torch.no_grad()
def rho_direction_loop(model: ResidualMLP, x: torch.Tensor, y: torch.Tensor,
                       credit: torch.Tensor, layer: int, m: int, eps: float) -> float:
    """ρ with one forward per direction (every sample batched inside it)."""
    work = model_copy(model, torch.float64)
    h = work.forward_states(x.double())[0][layer]
    base = F.cross_entropy(work.forward_from(layer, h), y, reduction="none")
    gen = torch.Generator().manual_seed(0)
    predicted, true = [], []
    for _ in range(m):
        v = torch.randn(h.shape, generator=gen, dtype=torch.float64)
        v = v / v.norm(dim=1, keepdim=True)
        ce = F.cross_entropy(work.forward_from(layer, h + eps * v), y, reduction="none")
        true.append(ce - base)
        predicted.append(eps * (credit.double() * v).sum(dim=1))
    return pearson(torch.cat(predicted), torch.cat(true))


@torch.no_grad()
def rho_pair_loop(model: ResidualMLP, x: torch.Tensor, y: torch.Tensor,
                  credit: torch.Tensor, layer: int, m: int, eps: float) -> float:
    """ρ with one single-row forward per (sample, direction) pair."""
    work = model_copy(model, torch.float64)
    h = work.forward_states(x.double())[0][layer]
    gen = torch.Generator().manual_seed(0)
    predicted, true = [], []
    for i in range(h.shape[0]):
        row, label = h[i:i + 1], y[i:i + 1]
        base = F.cross_entropy(work.forward_from(layer, row), label)
        for _ in range(m):
            v = torch.randn(row.shape, generator=gen, dtype=torch.float64)
            v = v / v.norm()
            true.append(float(F.cross_entropy(work.forward_from(layer, row + eps * v), label)
                              - base))
            predicted.append(eps * float((credit[i].double() * v[0]).sum()))
    return pearson(torch.tensor(predicted), torch.tensor(true))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=3, help="best of N timings")
    parser.add_argument("--train-samples", type=int, default=50000,
                        help="samples in the timed training epoch (default 50000)")
    parser.add_argument("--pair-samples", type=int, default=64,
                        help="samples for the (sample, direction) loop (default 64)")
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args()
    global WIDTH
    if args.quick:
        WIDTH, args.train_samples, args.repeats, args.pair_samples = 16, 512, 1, 4
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")

    train_x, train_y, eval_x, eval_y = make_teacher_student(
        n_train=args.train_samples, n_test=1280, in_dim=256, alpha=1.0, seed=42)
    torch.manual_seed(1)
    model = ResidualMLP(256, WIDTH, 10, 4)
    model.eval()
    bp = build_rule(model, MethodConfig(name="bp"), n_classes=10, seed=1)
    dfa = build_rule(model, MethodConfig(name="dfa"), n_classes=10, seed=1)

    rows: list[tuple[str, float]] = []
    # Warm-up: the first optimiser step and autograd call pay one-off imports.
    train_epoch(train_x[:256], train_y[:256], 128)
    diagnose(model, eval_x[:256], eval_y[:256], credit=bp, metrics=True,
             metric_options={"rho_samples": 8, "rho_directions": 2})
    epoch = best_of(lambda: train_epoch(train_x, train_y, 128), args.repeats)
    rows.append((f"one BP training epoch ({args.train_samples} samples, batch 128)", epoch))
    rows.append(("diagnose(): four diagnostics, 1280 samples",
                 best_of(lambda: diagnose(model, eval_x, eval_y, headline_acc=0.5),
                         args.repeats)))
    rows.append(("diagnose(): + per-layer cos/Γ of a DFA credit",
                 best_of(lambda: diagnose(model, eval_x, eval_y, credit=dfa, headline_acc=0.5),
                         args.repeats)))
    rows.append(("diagnose(metrics=True), BP credit (ρ 1024×32 fp64 + controls, nudging)",
                 best_of(lambda: diagnose(model, eval_x, eval_y, credit=bp, headline_acc=0.5,
                                          metrics=True), args.repeats)))
    rows.append(("diagnose(metrics=True), DFA credit (… + fresh-B null, 20 draws)",
                 best_of(lambda: diagnose(model, eval_x, eval_y, credit=dfa, headline_acc=0.5,
                                          metrics=True), args.repeats)))

    credit = bp_state_gradients(model, eval_x[:1024], eval_y[:1024])
    x, y = eval_x[:1024], eval_y[:1024]
    batched = best_of(lambda: perturbation_rho(model, x, y, credit, 0), args.repeats)
    loop = best_of(lambda: rho_direction_loop(model, x, y, credit[0], 0, 32, 1e-3),
                   args.repeats)
    n_pair = args.pair_samples
    batched_small = best_of(lambda: perturbation_rho(model, x[:n_pair], y[:n_pair], credit, 0),
                            args.repeats)
    pairs = best_of(lambda: rho_pair_loop(model, x[:n_pair], y[:n_pair], credit[0][:n_pair],
                                          0, 32, 1e-3), 1)
    rho_rows = [
        ("ρ_0 batched: all 32 directions in one forward (1024 samples)", batched, 1.0),
        ("ρ_0 loop over the 32 directions (1024 samples each)", loop, loop / batched),
        (f"ρ_0 batched ({n_pair} samples)", batched_small, 1.0),
        (f"ρ_0 loop over (sample, direction) pairs ({n_pair}×32 forwards)", pairs,
         pairs / batched_small),
    ]

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, best of "
          f"{args.repeats}")
    print()
    print("| what | seconds | vs one training epoch |")
    print("|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} | {seconds / epoch:.3f}× |")
    print()
    print("| ρ implementation (d=256 L=4, float64, state 0) | seconds | slower than batched |")
    print("|---|---|---|")
    for name, seconds, ratio in rho_rows:
        print(f"| {name} | {seconds:.3f} | {ratio:.1f}× |")
    print()
    print(f"| ρ table, every state + controls (1024 × 32, float64), median of {args.repeats} "
          "| seconds | minor page faults |")
    print("|---|---|---|")
    for name, seconds, faults in rho_chunking(model, x, y, credit, args.repeats):
        print(f"| {name} | {seconds:.3f} | {faults:.0f} |")
    print(f"\nload average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
