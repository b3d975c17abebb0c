"""Throughput of InMemoryLoader (augment + normalise + flatten) vs. a BP training step.

The loader must never be the bottleneck: target >= 100k samples/s and >= 10x the samples/s a
ResidualMLP-sized backprop step consumes on the same CPU.

Usage: python benchmarks/bench_loader.py --samples 50000 --batch-size 128 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from torch import Tensor, nn

from creditaudit.data.loader import InMemoryLoader
from creditaudit.data.transforms import CIFAR10_MEAN, CIFAR10_STD


class _Block(nn.Module):
    """Pre-norm residual block: h + W2·GELU(W1·LN(h))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.fc2(nn.functional.gelu(self.fc1(self.norm(h))))


def residual_mlp_standin(in_dim: int = 3072, width: int = 256, depth: int = 4) -> nn.Module:
    """Linear in→width, depth residual blocks, LayerNorm, Linear width→10."""
    return nn.Sequential(
        nn.Linear(in_dim, width),
        *[_Block(width) for _ in range(depth)],
        nn.LayerNorm(width),
        nn.Linear(width, 10),
    )


def loader_samples_per_s(x: Tensor, y: Tensor, batch_size: int, repeats: int) -> float:
    """Best-of-``repeats`` samples/s of one full epoch (shuffle, augment, normalise, flatten)."""
    loader = InMemoryLoader(
        x,
        y,
        batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        augment=True,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        flatten=True,
    )
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        width = 0
        for xb, _yb in loader:
            width = xb.shape[1]
        best = min(best, time.perf_counter() - start)
    if width != x[0].numel():
        raise RuntimeError(f"loader yielded width {width}, expected flattened {x[0].numel()}")
    return loader.n_samples / best


def step_samples_per_s(batch_size: int, repeats: int, steps: int = 30) -> float:
    """Best-of-``repeats`` samples/s of forward + backward + AdamW on the stand-in model."""
    gen = torch.Generator().manual_seed(0)
    model = residual_mlp_standin()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xb = torch.randn(batch_size, 3072, generator=gen)
    yb = torch.randint(0, 10, (batch_size,), generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    for _ in range(5):  # warm-up: allocator and kernel selection
        step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, time.perf_counter() - start)
    return steps * batch_size / best


def _n_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats = 1024, 1

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.samples, 3, 32, 32), generator=gen, dtype=torch.uint8)
    y = torch.randint(0, 10, (args.samples,), generator=gen)

    default_threads = torch.get_num_threads()
    rows = []
    for label, threads in (("1 thread", 1), (f"default ({default_threads} threads)", None)):
        torch.set_num_threads(threads or default_threads)
        loader_rate = loader_samples_per_s(x, y, args.batch_size, args.repeats)
        step_rate = step_samples_per_s(args.batch_size, args.repeats)
        rows.append((label, loader_rate, step_rate))
    torch.set_num_threads(default_threads)

    print(
        f"machine: nproc={_n_cpus()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}; N={args.samples}, batch={args.batch_size}, "
        f"best of {args.repeats}"
    )
    print()
    print("| threads | loader samples/s | BP step samples/s | loader / step |")
    print("|---|---:|---:|---:|")
    for label, loader_rate, step_rate in rows:
        print(
            f"| {label} | {loader_rate:,.0f} | {step_rate:,.0f} | {loader_rate / step_rate:.1f}x |"
        )


if __name__ == "__main__":
    main()
