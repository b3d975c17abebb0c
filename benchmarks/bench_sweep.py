"""Wall time of a 4-run sweep under each executor layout, and Ray's per-task overhead.

The sweep: synthetic task, d=256 L=4 ResidualMLP, data.n_train=10000, 2 epochs, BP and DFA
× 2 seeds. Layouts: (i) LocalExecutor 2 workers × 1 thread, (ii) LocalExecutor 1 worker ×
2 threads, (iii) sequential in this process (InlineExecutor, 2 threads). Ray: ray.init
time, a trivial task's round trip, and one smoke run through RayExecutor vs LocalExecutor.
Each measurement trains into a fresh folder (nothing is skipped). The 1-minute load average
before and after each measurement is reported: other work on the machine inflates the times,
most of all for layouts with 2 threads per process (OpenMP threads wait for each other when
one of them is descheduled).

Usage: python benchmarks/bench_sweep.py [--epochs 2] [--n-train 10000] [--repeats 2]
       [--skip-ray]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from creditaudit.config import RunConfig
from creditaudit.sweep import (
    InlineExecutor,
    LocalExecutor,
    RayExecutor,
    expand_grid,
    prepare_configs,
    run_sweep,
)

SMOKE = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "model.d": 16,
    "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
    "diagnostics.eval_samples": 128,
}


def _load() -> float:
    return os.getloadavg()[0]


def sweep_configs(out: Path, *, epochs: int, n_train: int, smoke: bool = False
                  ) -> list[RunConfig]:
    base = RunConfig().replace(**{
        "data.n_train": n_train, "model.d": 256, "model.n_blocks": 4, "optim.epochs": epochs,
        "run.out_dir": str(out), "run.device": "cpu", **(SMOKE if smoke else {}),
    })
    return expand_grid(base, {"method.name": ["bp", "dfa"], "run.seed": [42, 123]})


def timed_sweep(configs: list[RunConfig], executor, threads: int) -> tuple[float, float, float]:
    """(wall seconds, load before, load after) of one sweep; every run must complete."""
    before = _load()
    started = time.perf_counter()
    result = run_sweep(prepare_configs(configs, threads=threads), executor)
    seconds = time.perf_counter() - started
    statuses = {o["status"] for o in result.outcomes}
    if statuses != {"completed"}:
        raise RuntimeError(f"benchmark sweep did not complete: {result.outcomes}")
    return seconds, before, _load()


def ray_overhead(tmp: Path, n_trivial: int) -> dict[str, float]:
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - started
    try:
        @ray.remote
        def trivial(x: int) -> int:
            return x + 1

        ray.get(trivial.remote(0))  # first call starts a worker
        started = time.perf_counter()
        for i in range(n_trivial):
            ray.get(trivial.remote(i))
        round_trip = (time.perf_counter() - started) / n_trivial
        smoke = [RunConfig().replace(**{**SMOKE, "run.out_dir": str(tmp / "ray-smoke")})]
        ray_s, _, _ = timed_sweep(smoke, RayExecutor(num_cpus_per_run=1), threads=1)
        smoke2 = [smoke[0].replace(**{"run.out_dir": str(tmp / "ray-smoke-2")})]
        ray_warm_s, _, _ = timed_sweep(smoke2, RayExecutor(num_cpus_per_run=1), threads=1)
    finally:
        ray.shutdown()
    return {"init": init_s, "round_trip": round_trip, "smoke": ray_s, "smoke_warm": ray_warm_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=2,
                        help="repeats of each sweep layout (the best is reported)")
    parser.add_argument("--trivial-tasks", type=int, default=200,
                        help="trivial Ray tasks timed for the round trip")
    parser.add_argument("--skip-ray", action="store_true", help="leave out the Ray rows")
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:  # the sweeps at the smoke run's size, once, without Ray
        args.repeats, args.skip_ray = 1, True

    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp_name:
        tmp = Path(tmp_name)
        layouts = [
            ("(i) local, 2 workers × 1 thread", LocalExecutor(2, 1), 1),
            ("(ii) local, 1 worker × 2 threads", LocalExecutor(1, 2), 2),
            ("(iii) sequential in-process, 2 threads", InlineExecutor(threads=2), 2),
        ]
        # Layouts alternate between repeats, so a burst of other work on the machine hits
        # one repeat of each rather than every repeat of one; the best repeat is reported.
        if args.quick:  # one layout is enough to show the script works
            layouts = layouts[:1]
        times: dict[int, list[tuple[float, float, float]]] = {i: [] for i in
                                                              range(len(layouts))}
        for repeat in range(args.repeats):
            for index, (label, executor, threads) in enumerate(layouts):
                configs = sweep_configs(tmp / f"layout{index}-{repeat}", epochs=args.epochs,
                                        n_train=args.n_train, smoke=args.quick)
                times[index].append(timed_sweep(configs, executor, threads))
                print(f"{label}, repeat {repeat + 1}: {times[index][-1][0]:.1f} s "
                      f"(load {times[index][-1][1]:.1f})", flush=True)
        for index, (label, _, _) in enumerate(layouts):
            seconds, before, after = min(times[index])
            every = ", ".join(f"{t[0]:.0f}" for t in times[index])
            rows.append((f"4-run sweep, {label} (best of {args.repeats}: {every} s)",
                         f"{seconds:.1f} s", f"{before:.1f} → {after:.1f}"))

        before = _load()
        smoke = [RunConfig().replace(**{**SMOKE, "run.out_dir": str(tmp / "local-smoke")})]
        local_s, _, _ = timed_sweep(smoke, LocalExecutor(1, 1), threads=1)
        rows.append(("1 smoke run, LocalExecutor(1 worker) incl. spawn", f"{local_s:.2f} s",
                     f"{before:.1f} → {_load():.1f}"))
        smoke = [smoke[0].replace(**{"run.out_dir": str(tmp / "inline-smoke")})]
        inline_s, _, _ = timed_sweep(smoke, InlineExecutor(threads=1), threads=1)
        rows.append(("1 smoke run, in-process (warm)", f"{inline_s:.2f} s", f"{_load():.1f}"))

        if not args.skip_ray and importlib.util.find_spec("ray") is not None:
            before = _load()
            ray_s = ray_overhead(tmp, args.trivial_tasks)
            load = f"{before:.1f} → {_load():.1f}"
            rows += [
                ("ray.init (local, 2 CPUs)", f"{ray_s['init']:.1f} s", load),
                (f"Ray trivial task round trip (mean of {args.trivial_tasks})",
                 f"{ray_s['round_trip'] * 1e3:.2f} ms", load),
                ("1 smoke run, RayExecutor (first task: worker imports torch)",
                 f"{ray_s['smoke']:.2f} s", load),
                ("1 smoke run, RayExecutor (second sweep)", f"{ray_s['smoke_warm']:.2f} s", load),
            ]

    ray_version = "not installed"
    if importlib.util.find_spec("ray") is not None:
        import ray

        ray_version = ray.__version__
    print()
    print(f"machine: nproc={_n_cpus()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, torch {torch.__version__}, ray {ray_version}; "
          f"sweep: synthetic d=256 L=4, n_train={args.n_train}, {args.epochs} epochs, "
          "BP/DFA × seeds 42, 123")
    print()
    print("| measurement | wall time | load avg (1 min) |")
    print("|---|---:|---:|")
    for label, value, load in rows:
        print(f"| {label} | {value} | {load} |")


def _n_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


if __name__ == "__main__":
    main()
