"""Training-step cost of BP, FA and DFA, achieved FLOP/s, and the cost of the diagnostics.

1. ms per ``rule.train_step`` (AdamW, batch 128, fp32) of BP, FA and DFA on a terminal-LN
   ResidualMLP with CIFAR-like flattened inputs (in_dim 3072) at d=256 L=4 and d=512 L=12.
   The methods are interleaved within every repeat (BP, FA, DFA, BP, FA, DFA, ...) so that
   drifting machine load hits all of them alike; FA/BP and DFA/BP are taken within each
   repeat and the median over repeats is reported. Targets: DFA <= 1.0x BP (<= 0.9x at
   d=512 L=12), FA <= 1.05x BP.
2. Achieved FLOP/s of the BP step, counted analytically (2*B*in*out per Linear forward, x3
   for forward + backward, LayerNorm/GELU/optimiser ignored), against a plain
   (128 x d) @ (d x d) matmul loop timed in the same repeats.
3. ``epoch_diagnostics`` on the default 1280 evaluation samples (BP and DFA, d=256 L=4)
   against one training epoch of 50 000 samples (391 steps of the measured step time);
   target <= 5% of an epoch. The end-of-run ``credit_quality`` block (rho 1024 x 32, 20
   fresh-B null draws, nudging at eta 0.01 and 0.1) is timed once and expressed in epochs.

Usage: python benchmarks/bench_steps.py [--threads N] [--repeats 5] [--steps 15] [--quick]
       [--out FILE]   (without --threads, 1 and 2 threads are both measured)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from creditaudit.config import MethodConfig
from creditaudit.diagnostics.epoch import epoch_diagnostics
from creditaudit.diagnostics.quality import credit_quality
from creditaudit.methods import CreditRule, build_rule
from creditaudit.models import ResidualMLP

IN_DIM = 3072
N_CLASSES = 10
BATCH = 128
CONFIGS = ((256, 4), (512, 12))
METHODS = ("bp", "fa", "dfa")
DIAG_CONFIG = (256, 4)
DIAG_METHODS = ("bp", "dfa")
EVAL_SAMPLES = 1280
EPOCH_SAMPLES = 50_000
STEPS_PER_EPOCH = math.ceil(EPOCH_SAMPLES / BATCH)  # 391
N_BATCHES = 8  # distinct pre-generated batches, cycled
WARMUP_STEPS = 5  # per rule, before the first repeat
BLOCK_WARMUP = 1  # untimed steps at the start of each timed block (after switching model)
TARGET_FA = 1.05
TARGET_DFA = {(256, 4): 1.0, (512, 12): 0.9}
TARGET_DIAG_PERCENT = 5.0


@dataclass
class StepTimes:
    """Per-repeat ms/step of each method and GFLOP/s of the matmul reference."""

    ms: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METHODS})
    matmul_gflops: list[float] = field(default_factory=list)

    def median_ms(self, method: str) -> float:
        return statistics.median(self.ms[method])

    def ratios(self, method: str) -> list[float]:
        """method/BP within each repeat."""
        return [t / b for t, b in zip(self.ms[method], self.ms["bp"])]


def load_text() -> str:
    """`uptime` output (load averages over 1, 5, 15 min), or os.getloadavg() without it."""
    try:
        out = subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout
        return "load average" + out.strip().split("load average", 1)[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        one, five, fifteen = os.getloadavg()
        return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def bp_step_flops(d: int, n_blocks: int) -> float:
    """Forward + backward FLOPs of a BP step: 3 x sum of 2*B*in*out over every Linear."""
    macs = IN_DIM * d + 2 * n_blocks * d * d + d * N_CLASSES
    return 3 * 2 * BATCH * macs


def make_rule(name: str, d: int, n_blocks: int) -> tuple[CreditRule, torch.optim.Optimizer]:
    """A fresh ResidualMLP (same init for every method), the rule and its AdamW."""
    torch.manual_seed(0)
    model = ResidualMLP(IN_DIM, d, N_CLASSES, n_blocks, out_ln=True)
    rule = build_rule(model, MethodConfig(name=name), n_classes=N_CLASSES, seed=0)
    rule.set_precision("fp32", "cpu")
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)
    return rule, optimizer


def make_batches(n: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    """``n`` random CIFAR-shaped (standardised, flattened) batches with labels."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, IN_DIM, generator=gen),
             torch.randint(0, N_CLASSES, (BATCH,), generator=gen)) for _ in range(n)]


def run_steps(rule: CreditRule, optimizer: torch.optim.Optimizer,
              batches: list[tuple[Tensor, Tensor]], steps: int) -> None:
    for step in range(steps):
        x, y = batches[step % len(batches)]
        if not rule.train_step(x, y, optimizer).finite:
            raise RuntimeError(f"{rule.name}: non-finite step; the timing would skip backward")


def time_steps(rule: CreditRule, optimizer: torch.optim.Optimizer,
               batches: list[tuple[Tensor, Tensor]], steps: int) -> float:
    """ms per step over ``steps`` timed steps (after ``BLOCK_WARMUP`` untimed ones)."""
    run_steps(rule, optimizer, batches, BLOCK_WARMUP)
    started = time.perf_counter()
    run_steps(rule, optimizer, batches, steps)
    return (time.perf_counter() - started) / steps * 1e3


def matmul_gflops(a: Tensor, w: Tensor, out: Tensor, seconds: float) -> float:
    """GFLOP/s of (128 x d) @ (d x d) repeated for about ``seconds``."""
    torch.mm(a, w, out=out)
    flops = 2 * a.shape[0] * a.shape[1] * w.shape[1]
    n, elapsed = 0, 0.0
    started = time.perf_counter()
    while elapsed < seconds or n < 10:
        for _ in range(10):
            torch.mm(a, w, out=out)
        n += 10
        elapsed = time.perf_counter() - started
    return flops * n / elapsed / 1e9


def bench_steps(d: int, n_blocks: int, repeats: int, steps: int,
                batches: list[tuple[Tensor, Tensor]]
                ) -> tuple[StepTimes, dict[str, tuple[CreditRule, torch.optim.Optimizer]]]:
    """Interleaved timings of the methods (and the matmul reference) over ``repeats``."""
    rules = {m: make_rule(m, d, n_blocks) for m in METHODS}
    for rule, optimizer in rules.values():
        run_steps(rule, optimizer, batches, WARMUP_STEPS)
    gen = torch.Generator().manual_seed(1)
    a, w = torch.randn(BATCH, d, generator=gen), torch.randn(d, d, generator=gen)
    out = torch.empty(BATCH, d)
    matmul_gflops(a, w, out, 0.05)
    times = StepTimes()
    for _ in range(repeats):
        for method in METHODS:
            times.ms[method].append(time_steps(*rules[method], batches, steps))
        # About as long as one method's timed block, so it sees the same load.
        times.matmul_gflops.append(matmul_gflops(a, w, out, times.ms["bp"][-1] * steps / 1e3))
    return times, rules


def timed(fn, repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls (after one untimed warm-up call)."""
    fn()
    values = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        values.append(time.perf_counter() - started)
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: measure 1 and 2)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved repeats per configuration (median reported)")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per method per repeat")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 repeats of 3 steps, 1 thread, small credit-quality "
                             "settings")
    parser.add_argument("--out", default=None, help="also write the Markdown report here")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 3
    thread_counts = ([args.threads] if args.threads is not None
                     else [1] if args.quick else [1, 2])
    quality_options = (dict(rho_samples=64, rho_directions=4, null_draws=2) if args.quick else
                       dict(rho_samples=1024, rho_directions=32, null_draws=20))

    load_start = load_text()
    oversubscribed = os.getloadavg()[0] + max(thread_counts) > (os.cpu_count() or 1)
    started = time.perf_counter()
    batches = make_batches(N_BATCHES, seed=0)
    gen = torch.Generator().manual_seed(2)
    x_eval = torch.randn(EVAL_SAMPLES, IN_DIM, generator=gen)
    y_eval = torch.randint(0, N_CLASSES, (EVAL_SAMPLES,), generator=gen)

    step_rows, diag_rows, verdicts = [], [], []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for d, n_blocks in CONFIGS:
            times, rules = bench_steps(d, n_blocks, args.repeats, args.steps, batches)
            bp_ms = times.median_ms("bp")
            fa_ratio = statistics.median(times.ratios("fa"))
            dfa_ratio = statistics.median(times.ratios("dfa"))
            step_gflops = bp_step_flops(d, n_blocks) / (bp_ms / 1e3) / 1e9
            mm_gflops = statistics.median(times.matmul_gflops)
            step_rows.append(
                f"| {threads} | d={d} L={n_blocks} | {bp_ms:.1f} | {times.median_ms('fa'):.1f} | "
                f"{times.median_ms('dfa'):.1f} | {fa_ratio:.2f} ({spread(times.ratios('fa'))}) | "
                f"{dfa_ratio:.2f} ({spread(times.ratios('dfa'))}) | "
                f"{bp_step_flops(d, n_blocks) / 1e9:.2f} | {step_gflops:.1f} | "
                f"{mm_gflops:.1f} | {step_gflops / mm_gflops:.2f} |")
            dfa_target = TARGET_DFA[(d, n_blocks)]
            verdicts.append(f"- {threads} thread(s), d={d} L={n_blocks}: DFA/BP {dfa_ratio:.2f} "
                            f"(target ≤ {dfa_target}) {met(dfa_ratio <= dfa_target)}; FA/BP "
                            f"{fa_ratio:.2f} (target ≤ {TARGET_FA}) {met(fa_ratio <= TARGET_FA)}")
            print(step_rows[-1], flush=True)
            if (d, n_blocks) != DIAG_CONFIG:
                continue
            for method in DIAG_METHODS:
                rule = rules[method][0]
                epoch_s = STEPS_PER_EPOCH * times.median_ms(method) / 1e3
                diag_s = timed(lambda rule=rule: epoch_diagnostics(rule, x_eval, y_eval),
                               args.repeats)
                q_started = time.perf_counter()
                credit_quality(rule, x_eval, y_eval, etas=(0.01, 0.1), seed=0,
                               **quality_options)
                quality_s = time.perf_counter() - q_started
                percent = 100 * diag_s / epoch_s
                diag_rows.append(
                    f"| {threads} | {method.upper()} | {times.median_ms(method):.1f} | "
                    f"{epoch_s:.2f} | {diag_s * 1e3:.0f} | {percent:.1f}% | {quality_s:.1f} | "
                    f"{quality_s / epoch_s:.2f} |")
                verdicts.append(f"- {threads} thread(s), {method.upper()} d={d} L={n_blocks}: "
                                f"epoch_diagnostics {percent:.1f}% of an epoch (target ≤ "
                                f"{TARGET_DIAG_PERCENT:.0f}%) "
                                f"{met(percent <= TARGET_DIAG_PERCENT)}")
                print(diag_rows[-1], flush=True)
    load_end = load_text()
    elapsed = time.perf_counter() - started

    cpu = platform.processor() or platform.machine()
    quality_text = ("rho {rho_samples}×{rho_directions}, {null_draws} fresh-B null draws"
                    .format(**quality_options))
    lines = [
        f"torch {torch.__version__}, {cpu}, nproc {os.cpu_count()}, torch threads "
        f"{', '.join(map(str, thread_counts))}; {args.repeats} interleaved repeats × "
        f"{args.steps} timed steps per method (median; ratios per repeat, median and range); "
        f"run took {elapsed:.0f} s",
        f"load at start: {load_start}",
        f"load at end: {load_end}",
        *(["note: at the start the 1-min load average plus the torch threads exceeded nproc; "
            "the timings are contended (multi-thread runs most of all)"]
          if oversubscribed else []),
        "",
        "| threads | model | BP ms/step | FA ms/step | DFA ms/step | FA/BP (range) | "
        "DFA/BP (range) | BP GFLOP/step | BP step GFLOP/s | matmul GFLOP/s | step / matmul |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *step_rows,
        "",
        f"Diagnostics at d={DIAG_CONFIG[0]} L={DIAG_CONFIG[1]}: one epoch = {STEPS_PER_EPOCH} "
        f"steps × the rule's measured ms/step; epoch_diagnostics on {EVAL_SAMPLES} samples "
        f"(median of {args.repeats}); credit_quality timed once ({quality_text}, nudging "
        "η 0.01, 0.1).",
        "",
        "| threads | rule | ms/step | epoch s | epoch_diagnostics ms | % of epoch | "
        "credit_quality s | credit_quality epochs |",
        "|---|---|---|---|---|---|---|---|",
        *diag_rows,
        "",
        "Targets:",
        *verdicts,
    ]
    report = "\n".join(lines)
    print()
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report + "\n")


if __name__ == "__main__":
    main()
