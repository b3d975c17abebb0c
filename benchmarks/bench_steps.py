"""Training-step cost of every local rule against BP, and the cost of the diagnostics.

1. ms per ``rule.train_step`` (fused AdamW as in training, lr 1e-3, wd 0.01; batch 128,
   fp32) of BP, FA, DFA, State Bridge and Credit Bridge on a terminal-LN ResidualMLP with
   CIFAR-like flattened inputs (in_dim 3072) at d=256 L=4 and d=512 L=12. Credit Bridge is
   timed after its warm-up (``warmup_fraction=0``: value-gradient credits; during warm-up
   its step is DFA's plus the value fit). A *round* times every rule once (one untimed step,
   then ``--steps`` timed steps) and then a (128×d)@(d×d) matmul loop; the rule order is
   rotated by one every round, so drifting load and cache effects of the predecessor hit
   every rule alike. Ratios to BP are paired (taken within a round); the median and range
   over ``--rounds`` (≥ 9) rounds are reported, beside each rule's matmul FLOP floor
   (benchmarks/step_flops.py). FA, DFA and State Bridge are also timed with every block's
   LayerNorm → Linear run by plain autograd (``plain_autograd()``: the step without the
   single-product backward), which shows what that change alone saves. ``fa/no-dxd`` is a
   timing floor, not a rule: FA with the single-product backward's d×d work skipped (the
   γ-gradient Σ_k W_kj M_kj, M·diag(γ) + (Gᵀ1)βᵀ and Wᵀ(Gᵀ1); its updates are wrong),
   which shows what FA would cost if that work were free. ``fa/compiled-epilogue``
   (``--compiled-epilogue``; needs a C++ compiler for torch.compile) is FA with that d×d work
   done by one kernel torch.compile generates (same updates to rounding; checked before the
   rounds): how much a fused elementwise pass, short of fusing it into the product, saves.
   Targets at 1
   thread: DFA/BP ≤ 0.97 at d=512 L=12 and ≤ 1.00 at d=256 L=4; FA/BP ≤ 1.09 and State
   Bridge/BP ≤ 1.7 at d=512 L=12.
2. ``epoch_diagnostics`` on the default 1280 evaluation samples (BP and DFA, d=256 L=4)
   against one training epoch of 50 000 samples (391 steps of the measured step time);
   target ≤ 5% of an epoch. The end-of-run ``credit_quality`` block (ρ 1024 × 32, 20 fresh-B
   null draws, nudging at η 0.01 and 0.1) is timed once and expressed in epochs.

Other processes on the machine distort the ratios (memory-bound kernels suffer more than
matmuls): the load average (``os.getloadavg()``) is printed at the start, after every
round and at the end. Trust only runs whose 1-minute load stayed below the core count
minus the torch threads.

Usage: python benchmarks/bench_steps.py [--threads 1 [2]] [--rounds 9] [--steps 10]
       [--no-plain-ln] [--no-diagnostics] [--compiled-epilogue] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from creditaudit.config import RunConfig
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.measures.quality import credit_quality
from creditaudit.methods import CreditRule, build_rule
from creditaudit.models import ResidualMLP
from creditaudit.models.fused import _DetachedLayerNormLinear, plain_autograd
from creditaudit.optim import make_adamw
from step_flops import step_flops

IN_DIM = 3072
N_CLASSES = 10
BATCH = 128
CONFIGS = ((256, 4), (512, 12))
METHODS = ("bp", "fa", "dfa", "state-bridge", "credit-bridge")
# the same rules with every block's LayerNorm → Linear run by plain autograd (the step
# before the fused backward), to show what that change alone saves
PLAIN_LN = ("fa/plain-ln", "dfa/plain-ln", "state-bridge/plain-ln")
# FA with the single-product backward's d×d work skipped: a timing floor (wrong updates)
NO_DXD = "fa/no-dxd"
LABELS = {"bp": "BP", "fa": "FA", "dfa": "DFA", "state-bridge": "State Bridge",
          "credit-bridge": "Credit Bridge"}
LABELS |= {v: f"{LABELS[v.split('/')[0]]}, plain-autograd LN" for v in PLAIN_LN}
LABELS[NO_DXD] = "FA without its d×d passes (floor, wrong updates)"
# FA with those passes as one compiled kernel (--compiled-epilogue)
COMPILED = "fa/compiled-epilogue"
LABELS[COMPILED] = "FA, its d×d passes as one compiled kernel"
DIAG_CONFIG = (256, 4)
DIAG_METHODS = ("bp", "dfa")
EVAL_SAMPLES = 1280
EPOCH_SAMPLES = 50_000
STEPS_PER_EPOCH = math.ceil(EPOCH_SAMPLES / BATCH)  # 391
N_BATCHES = 8  # distinct pre-generated batches, cycled
WARMUP_STEPS = 5  # per rule, before the first round
MIN_ROUNDS = 9
# (method, d, L) → the largest acceptable median ratio to BP at 1 thread
TARGETS = {("dfa", 512, 12): 0.97, ("dfa", 256, 4): 1.00, ("fa", 512, 12): 1.09,
           ("state-bridge", 512, 12): 1.7}
TARGET_DIAG_PERCENT = 5.0


@dataclass
class StepTimes:
    """Per-round ms/step of each rule, GFLOP/s of the matmul reference, 1-min loads."""

    ms: dict[str, list[float]] = field(default_factory=dict)
    matmul_gflops: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def median_ms(self, method: str) -> float:
        return statistics.median(self.ms[method])

    def ratios(self, method: str) -> list[float]:
        """method/BP within each round (paired)."""
        return [t / b for t, b in zip(self.ms[method], self.ms["bp"], strict=True)]


# Another job holds a core when the 1-min load, read after a round, exceeds this benchmark's
# own threads (they ran all round, so the load counts them) by more than this.
CONTENTION_SLACK = 0.5


def is_contended(loads: list[float], threads: int) -> bool:
    """True when the machine ran other work beside the rounds (``loads``: the 1-min load
    average after each round; ``threads``: this benchmark's torch threads)."""
    return max(loads) - threads > CONTENTION_SLACK


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average (1, 5, 15 min): {one:.2f}, {five:.2f}, {fifteen:.2f}"


def make_rule(variant: str, d: int, n_blocks: int, in_dim: int = IN_DIM
              ) -> tuple[CreditRule, torch.optim.Optimizer]:
    """A fresh ResidualMLP (same init for every rule), the rule and training's AdamW."""
    torch.manual_seed(0)
    return bind_rule(variant.split("/")[0], ResidualMLP(in_dim, d, N_CLASSES, n_blocks,
                                                        out_ln=True))


def bind_rule(name: str, model: torch.nn.Module) -> tuple[CreditRule, torch.optim.Optimizer]:
    """Rule ``name`` on ``model`` (fp32; Credit Bridge past its warm-up) and training's
    fused AdamW."""
    # Only the Credit Bridge has a warm-up (its own option since rules own their options).
    warmup = {"method.warmup_fraction": 0.0} if name == "credit-bridge" else {}
    config = RunConfig().replace(**{"method.name": name, **warmup}).method
    rule = build_rule(model, config, n_classes=N_CLASSES, seed=0)
    rule.set_precision("fp32", "cpu")
    return rule, make_adamw(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)


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


@once_differentiable
def _backward_without_dxd(ctx: FunctionCtx, grad_z: Tensor) -> tuple[Tensor | None, ...]:
    """The single-product backward with its d×d passes left out: M = Gᵀn̂ is returned as
    ∂W unscaled, ∂γ and ∂β are zeros (wrong updates; the ``fa/no-dxd`` timing floor)."""
    rows, mean, rstd, gamma, beta, weight = ctx.saved_tensors
    g = grad_z.reshape(-1, weight.shape[0])
    m = g.t().mm((rows - mean) * rstd)
    return (None, torch.zeros_like(gamma), torch.zeros_like(beta), m,
            g.sum(dim=0) if ctx.has_bias else None, None)


def _epilogue(weight: Tensor, m: Tensor, s: Tensor, gamma: Tensor, beta: Tensor
              ) -> tuple[Tensor, Tensor, Tensor]:
    """(∂W, ∂γ, ∂β) from M = Gᵀn̂ and s = Gᵀ1 (models/fused.py's d×d work, written for
    torch.compile to generate as one kernel)."""
    return m * gamma + s[:, None] * beta[None, :], (weight * m).sum(dim=0), s @ weight


_compiled_epilogue = None


@once_differentiable
def _backward_compiled_epilogue(ctx: FunctionCtx, grad_z: Tensor
                                ) -> tuple[Tensor | None, ...]:
    """The single-product backward with its d×d work done by the compiled :func:`_epilogue`."""
    rows, mean, rstd, gamma, beta, weight = ctx.saved_tensors
    g = grad_z.reshape(-1, weight.shape[0])
    m = g.t().mm((rows - mean) * rstd)
    s = g.sum(dim=0)
    d_weight, d_gamma, d_beta = _compiled_epilogue(weight, m, s, gamma, beta)
    return None, d_gamma, d_beta, d_weight, s if ctx.has_bias else None, None


@contextlib.contextmanager
def fused_backward(backward) -> Iterator[None]:
    """Within the block, the fused LayerNorm → Linear runs ``backward``."""
    function = _DetachedLayerNormLinear
    kept = function.backward
    function.backward = staticmethod(backward)  # type: ignore[method-assign]
    try:
        yield
    finally:
        function.backward = kept  # type: ignore[method-assign]


def check_compiled_epilogue(d: int, n_blocks: int, batches: list[tuple[Tensor, Tensor]]) -> None:
    """Compile the epilogue (torch.compile; a C++ compiler is needed) and check that one FA
    step with it takes FA's gradients to fp32 rounding, so the rounds time the same step."""
    global _compiled_epilogue
    _compiled_epilogue = torch.compile(_epilogue, dynamic=False)
    grads = []
    for variant in ("fa", COMPILED):
        rule, optimizer = make_rule(variant, d, n_blocks)
        with variant_context(variant):
            run_steps(rule, optimizer, batches, 1)  # the step leaves its gradients in .grad
        grads.append([p.grad.clone() for p in rule.model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def variant_context(variant: str) -> contextlib.AbstractContextManager:
    """How ``variant`` runs: plain-autograd LayerNorm → Linear, without the d×d passes, with
    them compiled, or as it is."""
    if variant in PLAIN_LN:
        return plain_autograd()
    if variant == NO_DXD:
        return fused_backward(_backward_without_dxd)
    if variant == COMPILED:
        return fused_backward(_backward_compiled_epilogue)
    return contextlib.nullcontext()


def time_steps(variant: str, rule: CreditRule, optimizer: torch.optim.Optimizer,
               batches: list[tuple[Tensor, Tensor]], steps: int) -> float:
    """ms per step over ``steps`` timed steps, after one untimed step (caches, allocator)."""
    with variant_context(variant):
        run_steps(rule, optimizer, batches, 1)
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


def rotated(items: tuple[str, ...], shift: int) -> list[str]:
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def bench_steps(d: int, n_blocks: int, rounds: int, steps: int,
                batches: list[tuple[Tensor, Tensor]], variants: tuple[str, ...]
                ) -> tuple[StepTimes, dict[str, tuple[CreditRule, torch.optim.Optimizer]]]:
    """Rotated, paired timings of every variant (and the matmul reference) over ``rounds``."""
    rules = {v: make_rule(v, d, n_blocks) for v in variants}
    for variant, (rule, optimizer) in rules.items():
        with variant_context(variant):
            run_steps(rule, optimizer, batches, WARMUP_STEPS)
    gen = torch.Generator().manual_seed(1)
    a, w = torch.randn(BATCH, d, generator=gen), torch.randn(d, d, generator=gen)
    out = torch.empty(BATCH, d)
    times = StepTimes(ms={v: [] for v in variants})
    for index in range(rounds):
        for variant in rotated(variants, index):
            times.ms[variant].append(time_steps(variant, *rules[variant], batches, steps))
        # About as long as BP's timed block, so it sees the same load.
        times.matmul_gflops.append(matmul_gflops(a, w, out, times.ms["bp"][-1] * steps / 1e3))
        times.loads.append(os.getloadavg()[0])
        print(f"  d={d} L={n_blocks} round {index + 1}/{rounds}: "
              + ", ".join(f"{v} {times.ms[v][-1]:.1f}" for v in variants)
              + f" ms; 1-min load {times.loads[-1]:.2f}", flush=True)
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


def ratio_text(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def step_table(threads: int, d: int, n_blocks: int, times: StepTimes) -> list[str]:
    """Rows: ms/step, paired ratio to BP (median, range), FLOP floor, per rule."""
    bp_flops = step_flops("bp", d, n_blocks)
    rows = []
    for variant in times.ms:
        method = variant.split("/")[0]
        ratio = "1" if method == "bp" else ratio_text(times.ratios(variant))
        flops = (step_flops(method, d, n_blocks, fused=variant not in PLAIN_LN)
                 if method != "credit-bridge" else None)
        floor = "–" if flops is None else f"{flops / bp_flops:.3f}"
        rows.append(f"| {threads} | d={d} L={n_blocks} | {LABELS[variant]} | "
                    f"{times.median_ms(variant):.1f} | {ratio} | {floor} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="torch CPU thread counts to measure (default: 1)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"rotated rounds per configuration (at least {MIN_ROUNDS})")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per rule per round")
    parser.add_argument("--no-plain-ln", action="store_true",
                        help="skip the FA/DFA/State Bridge variants with plain-autograd "
                             "LayerNorm (what the fused backward saves)")
    parser.add_argument("--no-diagnostics", action="store_true",
                        help="skip the epoch_diagnostics / credit_quality timings")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 rounds of 2 steps at d=64 L=2, no diagnostics "
                             "timings (ratios meaningless; what the docs tests run)")
    parser.add_argument("--compiled-epilogue", action="store_true",
                        help="also time FA with its d×d passes as one torch.compile kernel "
                             "(needs a C++ compiler; compiles for about 20 s)")
    parser.add_argument("--out", default=None, help="also write the Markdown report here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.no_diagnostics = 2, 2, True
    elif args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds must be at least {MIN_ROUNDS} (paired ratios need them); "
                     "use --quick for a smoke test")
    quality_options = (dict(rho_samples=64, rho_directions=4, null_draws=2) if args.quick else
                       dict(rho_samples=1024, rho_directions=32, null_draws=20))

    load_start = load_text()
    print(f"start: {load_start}", flush=True)
    started = time.perf_counter()
    batches = make_batches(N_BATCHES, seed=0)
    gen = torch.Generator().manual_seed(2)
    x_eval = torch.randn(EVAL_SAMPLES, IN_DIM, generator=gen)
    y_eval = torch.randint(0, N_CLASSES, (EVAL_SAMPLES,), generator=gen)

    step_rows, flops_rows, diag_rows, verdicts, round_loads = [], [], [], [], []
    ratio_verdicts: list[tuple[str, bool]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for d, n_blocks in (((64, 2),) if args.quick else CONFIGS):
            variants = (METHODS if args.no_plain_ln else METHODS + PLAIN_LN) + (NO_DXD,)
            if args.compiled_epilogue:
                check_compiled_epilogue(d, n_blocks, batches)
                variants += (COMPILED,)
            times, rules = bench_steps(d, n_blocks, args.rounds, args.steps, batches, variants)
            round_loads += times.loads
            step_rows += step_table(threads, d, n_blocks, times)
            bp_gflop = step_flops("bp", d, n_blocks) / 1e9
            step_gflops = bp_gflop / (times.median_ms("bp") / 1e3)
            mm_gflops = statistics.median(times.matmul_gflops)
            flops_rows.append(f"| {threads} | d={d} L={n_blocks} | {bp_gflop:.2f} | "
                              f"{step_gflops:.1f} | {mm_gflops:.1f} | "
                              f"{step_gflops / mm_gflops:.2f} |")
            for (method, td, tl), target in TARGETS.items():
                if (td, tl) == (d, n_blocks) and threads == 1:
                    ratio = statistics.median(times.ratios(method))
                    ratio_verdicts.append((f"- {LABELS[method]}/BP at d={d} L={n_blocks}, "
                                           f"1 thread: {ratio:.3f} (target ≤ {target})",
                                           ratio <= target))
            if args.no_diagnostics or (d, n_blocks) != DIAG_CONFIG:
                continue
            for method in DIAG_METHODS:
                rule = rules[method][0]
                epoch_s = STEPS_PER_EPOCH * times.median_ms(method) / 1e3
                diag_s = timed(lambda rule=rule: epoch_diagnostics(rule, x_eval, y_eval), 5)
                q_started = time.perf_counter()
                credit_quality(rule, x_eval, y_eval, etas=(0.01, 0.1), seed=0,
                               **quality_options)
                quality_s = time.perf_counter() - q_started
                percent = 100 * diag_s / epoch_s
                diag_rows.append(
                    f"| {threads} | {LABELS[method]} | {times.median_ms(method):.1f} | "
                    f"{epoch_s:.2f} | {diag_s * 1e3:.0f} | {percent:.1f}% | {quality_s:.1f} | "
                    f"{quality_s / epoch_s:.2f} |")
                verdicts.append(f"- {threads} thread(s), {LABELS[method]} d={d} L={n_blocks}: "
                                f"epoch_diagnostics {percent:.1f}% of an epoch (target ≤ "
                                f"{TARGET_DIAG_PERCENT:.0f}%) "
                                f"{met(percent <= TARGET_DIAG_PERCENT)}")
    load_end = load_text()
    elapsed = time.perf_counter() - started
    busiest = max(round_loads)
    contended = is_contended(round_loads, max(args.threads))
    # A ratio from a smoke test or a contended machine is no verdict on a target.
    unjudged = ("not judged: --quick" if args.quick else
                "not judged: contended run" if contended else None)
    verdicts = [f"{text} {unjudged if unjudged else met(ok)}"
                for text, ok in ratio_verdicts] + verdicts

    cpu = platform.processor() or platform.machine()
    quality_text = ("ρ {rho_samples}×{rho_directions}, {null_draws} fresh-B null draws"
                    .format(**quality_options))
    lines = [
        f"torch {torch.__version__}, {cpu}, nproc {os.cpu_count()}, torch threads "
        f"{', '.join(map(str, args.threads))}; fused AdamW; {args.rounds} rotated rounds × "
        f"{args.steps} timed steps per rule (ms: median over rounds; ratio to BP: paired "
        f"within each round, median and range); run took {elapsed:.0f} s",
        f"start: {load_start}",
        f"end: {load_end}",
        f"1-min load average after each round: {min(round_loads):.2f}–{busiest:.2f}",
        *(["note: the 1-min load exceeded this benchmark's own threads by more than "
           f"{CONTENTION_SLACK} during the rounds (another job ran beside it): the "
           "timings are contended; rerun on an idle machine"] if contended else []),
        "",
        "| threads | model | rule | ms/step | ratio to BP (range) | FLOP floor |",
        "|---|---|---|---:|---:|---:|",
        *step_rows,
        "",
        "| threads | model | BP GFLOP/step | BP step GFLOP/s | matmul GFLOP/s | step / matmul |",
        "|---|---|---:|---:|---:|---:|",
        *flops_rows,
    ]
    if diag_rows:
        lines += [
            "",
            f"Diagnostics at d={DIAG_CONFIG[0]} L={DIAG_CONFIG[1]}: one epoch = "
            f"{STEPS_PER_EPOCH} steps × the rule's measured ms/step; epoch_diagnostics on "
            f"{EVAL_SAMPLES} samples (median of 5); credit_quality timed once ({quality_text}, "
            "nudging η 0.01, 0.1).",
            "",
            "| threads | rule | ms/step | epoch s | epoch_diagnostics ms | % of epoch | "
            "credit_quality s | credit_quality epochs |",
            "|---|---|---|---|---|---|---|---|",
            *diag_rows,
        ]
    lines += ["", "Targets:", *verdicts]
    report = "\n".join(lines)
    print()
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report + "\n")


if __name__ == "__main__":
    main()
