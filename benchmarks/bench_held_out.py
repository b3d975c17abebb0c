"""Cost of the held-out check every load runs: is the test split held out from the training
split (``creditaudit.data.rows.held_out_problem``: exact copies over the whole test split,
then near copies of a sample of it against every training row)?

On Fashion-MNIST's files as ``load_dataset`` reads them (uint8 images, 60 000 training and
10 000 test), the two parts timed apart and together, median of ``--repeats``, on one
thread and on torch's default threads. Printed: the machine, the load average before and
after, and the command. ``--quick``: random images at a tiny size (checks the script runs;
its numbers mean nothing).

Usage: PYTHONPATH=src python benchmarks/bench_held_out.py [--data-dir DIR] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from bench_steps import load_text
from creditaudit.data.idx import FASHION_MNIST_DIR, load_idx_dataset
from creditaudit.data.rows import held_out_problem, near_copies, shared_samples


def median_seconds(call: Callable[[], Any], repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``call`` (after one untimed)."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=FASHION_MNIST_DIR,
                        help="a folder of the four IDX files (default: Fashion-MNIST's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        generator = torch.Generator().manual_seed(0)
        arrays = (torch.randint(0, 256, (600, 1, 28, 28), dtype=torch.uint8,
                                generator=generator),
                  torch.randint(0, 10, (600,), generator=generator),
                  torch.randint(0, 256, (100, 1, 28, 28), dtype=torch.uint8,
                                generator=generator),
                  torch.randint(0, 10, (100,), generator=generator))
        args.repeats, source = 1, "random images (--quick)"
    else:
        start = time.perf_counter()
        arrays = load_idx_dataset(args.data_dir, name="fashion-mnist")
        source = f"{args.data_dir} (read in {time.perf_counter() - start:.2f} s)"
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; {load_text()} at the start")
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"data: {source}: {arrays[0].shape[0]} training, {arrays[2].shape[0]} test "
          f"samples of {tuple(arrays[0].shape[1:])} {arrays[0].dtype}")
    default = torch.get_num_threads()
    parts = {"exact copies (shared_samples)": lambda: shared_samples(*arrays),
             "near copies (near_copies)": lambda: near_copies(*arrays),
             "the check (held_out_problem)": lambda: held_out_problem(*arrays)}
    print(f"{'median of ' + str(args.repeats):<32} {'1 thread s':>11} "
          f"{f'{default} threads s':>11}")
    for label, call in parts.items():
        seconds = []
        for threads in (1, default):
            torch.set_num_threads(threads)
            seconds.append(median_seconds(call, args.repeats))
        print(f"{label:<32} {seconds[0]:>11.3f} {seconds[1]:>11.3f}")
    torch.set_num_threads(default)
    print(f"{load_text()} at the end")


if __name__ == "__main__":
    main()
