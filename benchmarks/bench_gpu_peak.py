"""How far a small model's training step is from the GPU's peak, and what closes the gap.

The study's model — ResidualMLP d=256 L=4, in_dim 3072, terminal LN, batch 128, fp32 — does
~1 GFLOP per step: far too little work to fill a GPU, so a step's time is set by kernel
launches and host synchronisation, not by arithmetic. This script measures, per step:

1. FLOPs of one BP and one DFA step (``torch.utils.flop_counter.FlopCounterMode``).
2. ms per step (median of ``--repeats`` blocks of ``--steps`` steps, synchronised around
   each block) and the achieved TFLOP/s, as a fraction of ``--peak-tflops`` (default 67:
   the fp32 non-tensor-core peak of an H100/H200 SXM; matmuls run in true fp32 as torch's
   default ``allow_tf32 = False`` asks):

   - ``eager``: ``rule.train_step`` as creditaudit runs it (it reads the loss and checks it
     is finite: two host synchronisations per step);
   - ``no sync``: the same step with the loss kept on the device;
   - ``CUDA graph``: that step captured once and replayed (AdamW ``capturable=True``);
   - ``torch.compile`` (BP): the model compiled (default mode), compile time reported;
   - ``batch 1024``: eager, eight times the work per step (how the GPU scales with work);
   - ``K runs, one process``: K BP runs as one model stacked with ``torch.func`` (vmap over
     the weights: one kernel serves K runs), per-run ms = step ms / K;
   - ``K processes``: K independent eager BP runs in K processes on the one GPU (what
     ``sweep --device cuda --workers K`` does), per-run ms = wall / (K · steps).

Usage: python benchmarks/bench_gpu_peak.py [--repeats 5] [--steps 50] [--runs 8]
       [--peak-tflops 67] [--device cuda] [--skip-compile] [--skip-processes]
(``--device cpu`` dry-runs everything but the CUDA graph.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import multiprocessing as mp
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import creditaudit.methods.base as rule_base
import creditaudit.methods.cross_entropy as cross_entropy
from creditaudit.config import MethodConfig
from creditaudit.methods import CreditRule, build_rule
from creditaudit.models import ResidualMLP
from creditaudit.models.fused import plain_autograd

IN_DIM, D, BLOCKS, N_CLASSES, BATCH = 3072, 256, 4, 10, 128


def build(method: str, device: str, *, capturable: bool = False
          ) -> tuple[CreditRule, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = ResidualMLP(IN_DIM, D, N_CLASSES, BLOCKS, out_ln=True).to(device)
    rule = build_rule(model, MethodConfig(name=method), n_classes=N_CLASSES, seed=0)
    rule.to(torch.device(device))
    optimizer = torch.optim.AdamW(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01,
                                  capturable=capturable, foreach=True)
    return rule, optimizer


def batch(device: str, size: int = BATCH, seed: int = 1) -> tuple[Tensor, Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(size, IN_DIM, device=device, generator=gen),
            torch.randint(0, N_CLASSES, (size,), device=device, generator=gen))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def ms_per_call(fn: Callable[[], Any], device: str, repeats: int, steps: int,
                warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(steps):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - started) / steps * 1e3)
    return statistics.median(times)


class _NoSync:
    """``step_result`` without host synchronisation, patched into the rules' modules: the
    loss stays on the device (what a capturable step must do)."""

    def __enter__(self) -> None:
        self.saved = rule_base.step_result

        def device_only(loss: Tensor, logits: Tensor, y: Tensor, *extra: Tensor
                        ) -> rule_base.StepResult:
            return rule_base.StepResult(loss=0.0, correct=0, n=int(y.shape[0]), finite=True)

        self.modules = [m for m in _rule_modules() if hasattr(m, "step_result")]
        for module in self.modules:
            module.step_result = device_only

    def __exit__(self, *exc: object) -> None:
        for module in self.modules:
            module.step_result = self.saved


class _OneHotSync:
    """The output error's one-hot rows from ``F.one_hot`` again (as before 2026-11-27), which
    reads the labels' range back to the host: one device sync per DFA step."""

    def __enter__(self) -> None:
        self.saved = cross_entropy.one_hot  # what output_error calls

        def synced(y: Tensor, n_classes: int, dtype: torch.dtype) -> Tensor:
            return torch.nn.functional.one_hot(y, n_classes).to(dtype)

        cross_entropy.one_hot = synced

    def __exit__(self, *exc: object) -> None:
        cross_entropy.one_hot = self.saved


def _rule_modules() -> list[Any]:
    import creditaudit.methods.bp as bp
    import creditaudit.methods.dfa as dfa
    return [rule_base, bp, dfa]


def step_flops(method: str, device: str) -> int:
    rule, optimizer = build(method, device)
    x, y = batch(device)
    rule.train_step(x, y, optimizer)
    with FlopCounterMode(display=False) as counter:
        rule.train_step(x, y, optimizer)
    return int(counter.get_total_flops())


def eager(method: str, device: str, args: argparse.Namespace, size: int = BATCH,
          patch: contextlib.AbstractContextManager | None = None) -> float:
    """ms per ``rule.train_step``, with the library patched by ``patch`` while it runs."""
    rule, optimizer = build(method, device)
    x, y = batch(device, size)
    with patch or contextlib.nullcontext():
        return ms_per_call(lambda: rule.train_step(x, y, optimizer), device, args.repeats,
                           args.steps)


def cuda_graph(method: str, args: argparse.Namespace) -> float:
    rule, optimizer = build(method, "cuda", capturable=True)
    x, y = batch("cuda")
    with _NoSync():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm up on a side stream, as the CUDA-graph docs ask
                rule.train_step(x, y, optimizer)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            rule.train_step(x, y, optimizer)
    return ms_per_call(graph.replay, "cuda", args.repeats, args.steps)


def compiled_bp(device: str, args: argparse.Namespace) -> tuple[float, float]:
    """(ms per step, compile seconds) of BP with the model under torch.compile."""
    rule, optimizer = build("bp", device)
    model = torch.compile(rule.model)
    x, y = batch(device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    started = time.perf_counter()
    with plain_autograd():
        step()
        synchronize(device)
        compile_s = time.perf_counter() - started
        return ms_per_call(step, device, args.repeats, args.steps), compile_s


def stacked_bp(device: str, runs: int, args: argparse.Namespace) -> float:
    """ms per step of ``runs`` BP runs trained as one vmapped model (all runs per step)."""
    torch.manual_seed(0)
    models = [ResidualMLP(IN_DIM, D, N_CLASSES, BLOCKS, out_ln=True).to(device)
              for _ in range(runs)]
    params, buffers = torch.func.stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    leaves = [p.requires_grad_() for p in params.values()]
    optimizer = torch.optim.AdamW(leaves, lr=1e-3, weight_decay=0.01, foreach=True)
    gen = torch.Generator(device=device).manual_seed(1)
    xs = torch.randn(runs, BATCH, IN_DIM, device=device, generator=gen)
    ys = torch.randint(0, N_CLASSES, (runs, BATCH), device=device, generator=gen)

    def one(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor) -> Tensor:
        return torch.func.functional_call(base, (p, b), (x,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = torch.vmap(one)(params, buffers, xs)  # (runs, B, C)
        # Σ over runs of each run's mean CE: every run gets exactly its own gradient.
        F.cross_entropy(logits.flatten(0, 1), ys.flatten(), reduction="sum").div(
            BATCH).backward()
        optimizer.step()

    with plain_autograd():
        return ms_per_call(step, device, args.repeats, args.steps)


def _process_worker(device: str, steps: int, barrier: Any, out: Any) -> None:
    torch.set_num_threads(1)
    rule, optimizer = build("bp", device)
    x, y = batch(device)
    for _ in range(5):
        rule.train_step(x, y, optimizer)
    synchronize(device)
    barrier.wait()
    started = time.perf_counter()
    for _ in range(steps):
        rule.train_step(x, y, optimizer)
    synchronize(device)
    out.put(time.perf_counter() - started)


def processes_bp(device: str, runs: int, steps: int) -> float:
    """Per-run ms per step with ``runs`` processes each training BP on the same device."""
    context = mp.get_context("spawn")
    barrier, out = context.Barrier(runs), context.Queue()
    workers = [context.Process(target=_process_worker, args=(device, steps, barrier, out))
               for _ in range(runs)]
    for worker in workers:
        worker.start()
    walls = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    return max(walls) / (runs * steps) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=67.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-processes", action="store_true")
    args = parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu_peak: no CUDA device (use --device cpu for a dry run)")
        return 1
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
    print(f"{name}, torch {torch.__version__}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; ResidualMLP d={D} L={BLOCKS} in_dim {IN_DIM}, batch "
          f"{BATCH}, fp32 (allow_tf32={torch.backends.cuda.matmul.allow_tf32})", flush=True)
    flops = {m: step_flops(m, device) for m in ("bp", "dfa")}
    print(f"FLOPs per step: BP {flops['bp'] / 1e9:.2f} G, DFA {flops['dfa'] / 1e9:.2f} G")
    print("\n| variant | rule | ms per step (per run) | TFLOP/s | % of peak |")
    print("|---|---|---:|---:|---:|")

    def row(variant: str, method: str, ms: float) -> None:
        tflops = flops[method] / (ms * 1e-3) / 1e12
        print(f"| {variant} | {method} | {ms:.3f} | {tflops:.2f} | "
              f"{100 * tflops / args.peak_tflops:.1f} |", flush=True)

    for method in ("bp", "dfa"):
        row("eager (creditaudit's step)", method, eager(method, device, args))
        row("no host sync", method, eager(method, device, args, patch=_NoSync()))
        if method == "dfa":
            row("output error through F.one_hot (one more sync; before)", method,
                eager(method, device, args, patch=_OneHotSync()))
        if device == "cuda":
            row("CUDA graph of the step", method, cuda_graph(method, args))
        row("batch 1024, per 128 samples", method, eager(method, device, args, size=1024) / 8)
    if not args.skip_compile:
        ms, compile_s = compiled_bp(device, args)
        row(f"torch.compile (compile {compile_s:.0f} s)", "bp", ms)
    row(f"{args.runs} runs stacked in one process (vmap)", "bp",
        stacked_bp(device, args.runs, args) / args.runs)
    if not args.skip_processes:
        for runs in (4, args.runs):
            row(f"{runs} processes on one device", "bp", processes_bp(device, runs, args.steps))
    print(f"\nload average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
