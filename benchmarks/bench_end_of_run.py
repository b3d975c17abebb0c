"""Cost of the end-of-run credit-quality block on trained runs: time, samples, ρ ± SE, memory.

For each run folder it rebuilds the model from its checkpoint (``creditaudit.audit.load_run``)
and reruns ``credit_quality`` exactly as the training loop calls it at the end of a run (the
run's own ``[diagnostics]`` settings, seed and evaluation subset), in a fresh process so that
the peak resident memory is the run's own. Printed per run: seconds per stage (cosines, ρ,
nudging, fresh-feedback null), ρ's samples against those asked for with its compute budget
and one sample's FLOPs, ρ ± its standard error per state, and the peak resident memory
before and after the block. The block's CPU seconds are printed beside its wall-clock
seconds: with one thread on a shared machine they stay near what an idle machine's wall
clock would show, while the wall clock grows with the load.

With ``--reference FILE`` (a record.json, or a JSON object holding the block's fields, from
another version of the code on the same checkpoint) it also compares: every number of the
block bit for bit, and each ρ's distance from the reference in units of its standard error.

Usage (the runs: the README's commands with ``--set diagnostics.end_of_run=false``)::

    python benchmarks/bench_end_of_run.py --threads 1 RUN_DIR [RUN_DIR ...]
    python benchmarks/bench_end_of_run.py --threads 1 RUN_DIR --reference OLD.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench_steps import load_text
from creditaudit.audit import load_run
from creditaudit.measures.quality import credit_quality
from creditaudit.run.results import NUDGING_ETAS

STAGES = {"ρ (": "ρ", "nudging: η": "nudging", "fresh-feedback null: deep": "null"}


def peak_gb() -> float:
    """The process's peak resident memory so far, GB (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def measure(run_dir: str, threads: int) -> dict[str, Any]:
    """The block on one run, as the training loop computes it, with its costs."""
    torch.set_num_threads(threads)
    run = load_run(run_dir)
    config = run.record.config
    settings = config.diagnostics
    x, y = run.data.eval_subset(settings.eval_samples, flatten=run.plan.flatten)
    before = peak_gb()
    marks: list[tuple[float, str]] = []

    def progress(text: str) -> None:
        stage = next((name for prefix, name in STAGES.items() if text.startswith(prefix)), None)
        if stage is not None:
            marks.append((time.perf_counter(), stage))
        print(f"  {run.record.run_id}: {text}", file=sys.stderr, flush=True)

    started, cpu_started = time.perf_counter(), time.process_time()
    block = credit_quality(run.rule, x, y, rho_samples=settings.rho_samples,
                           rho_directions=settings.rho_directions,
                           null_draws=settings.null_draws, etas=NUDGING_ETAS,
                           seed=config.run.seed, rho_flops=settings.rho_flops,
                           memory_gb=settings.end_of_run_memory_gb, progress=progress)
    ended, cpu = time.perf_counter(), time.process_time() - cpu_started
    stages, previous = {}, (started, "cosines")
    for mark in [*marks, (ended, "")]:
        stages[previous[1]] = mark[0] - previous[0]
        previous = mark
    model = config.model
    return {"run": run.record.run_id, "arch": model.arch, "method": config.method.name,
            "size": f"d={model.d} L={model.n_blocks}" + (
                f" patch={model.patch}" if model.arch != "resmlp" else ""),
            "eval_samples": int(x.shape[0]), "rho_asked": min(settings.rho_samples,
                                                              int(x.shape[0])),
            "rho_flops": settings.rho_flops, "seconds": ended - started, "cpu_seconds": cpu,
            "stages": stages, "peak_gb_before": before, "peak_gb": peak_gb(), "block": block}


def reference_block(path: str) -> dict[str, Any]:
    raw = json.loads(Path(path).read_text())
    return raw.get("diagnostics", raw) if isinstance(raw, dict) else {}


def differing(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two nested blocks differ (bit for bit; NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in a if k in b for p in differing(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [path]
        return [p for i, (u, v) in enumerate(zip(a, b)) for p in differing(u, v, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [path]


def report(result: dict[str, Any], reference: dict[str, Any] | None) -> None:
    block = result["block"]
    stages = ", ".join(f"{name} {seconds:.1f}" for name, seconds in result["stages"].items())
    print(f"{result['run']} ({result['arch']} {result['size']}, {result['method']}): "
          f"{result['seconds']:.1f} s ({result['cpu_seconds']:.1f} s CPU) [{stages}], ρ on "
          f"{block['rho_samples']} of {result['rho_asked']} samples (budget "
          f"{result['rho_flops']:.3g} FLOPs, {block['rho_sample_flops']:.3g} per sample), "
          "nudging on "
          f"{block['nudging_samples']} of {result['eval_samples']}, peak memory "
          f"{result['peak_gb_before']:.2f} → {result['peak_gb']:.2f} GB")
    rho, se = block["perturbation_rho"], block["rho_se"]
    print("  ρ ± SE per state: " + ", ".join(f"{r:+.4f} ± {s:.4f}" for r, s in zip(rho, se)))
    print("  BP control: " + ", ".join(f"{v:.6f}" for v in block["rho_controls"]["bp"]))
    if reference is None:
        return
    shared = [k for k in block if k in reference]
    diffs = [p for k in shared for p in differing(reference[k], block[k], k)]
    print(f"  against the reference: {len(shared)} fields compared, "
          + ("every number bit-identical" if not diffs else
             f"{len(diffs)} numbers differ (first: {', '.join(diffs[:3])})"))
    if "perturbation_rho" in reference:
        units = [abs(r - o) / s for r, o, s in zip(rho, reference["perturbation_rho"], se)]
        print("  |ρ − reference ρ| / SE per state: " + ", ".join(f"{u:.2f}" for u in units))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with a checkpoint")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reference", help="the block from another code version (JSON); "
                        "default: the run's own record.json when it holds one")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # the child process: one run, its result as JSON on stdout
        print(json.dumps(measure(args.runs[0], args.threads)))
        return
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} thread(s); {load_text()} at the start")
    for run_dir in args.runs:
        child = subprocess.run([sys.executable, __file__, "--one", "--threads",
                                str(args.threads), run_dir], check=True, text=True,
                               stdout=subprocess.PIPE)
        result = json.loads(child.stdout.splitlines()[-1])
        own = Path(run_dir) / "record.json"
        if args.reference:
            reference: dict[str, Any] | None = reference_block(args.reference)
        else:
            reference = reference_block(str(own)) if own.exists() else None
        report(result, reference or None)
    print(f"{load_text()} at the end")


if __name__ == "__main__":
    main()
