"""Cost of the reference-gradient check a run makes when it starts.

``Trainer`` and ``Recorder`` check, once, that the model's backward is the gradient of its
forward (:func:`creditaudit.run.results.reference_at_start`: float64 central differences on
four evaluation samples, state by state, or module by module where the states cannot be).
Timed here on the models as a run builds them — the built-in ResidualMLP d=256 L=4 (CIFAR
shape, flattened), ViT-Mini and ConvMixer at their default sizes, and the zoo's ResNet-20
adapted at its stem and nine block outputs — beside one BP training step of a batch of 128
on the same model, for scale. Prints the median over ``--repeats`` of the CPU seconds (with
one thread on a shared machine they stay near an idle machine's wall clock, which grows
with the load; the wall clock is printed too) and how each was checked.

Usage: python benchmarks/bench_reference_check.py --threads 1 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from torch.nn import functional as F

from creditaudit import adapt
from creditaudit.config import RunConfig
from creditaudit.models import build_model
from creditaudit.run.results import reference_at_start
from creditaudit.testing.zoo import resnet20

IMAGE = (3, 32, 32)
RESNET_STATES = ["stem", *(f"layer{s}.{b}" for s in (1, 2, 3) for b in range(3))]


def models() -> dict[str, tuple[torch.nn.Module, tuple[int, ...]]]:
    """name → (the model as a run builds it, its input shape)."""
    out = {}
    for arch, shape, sizes in (("resmlp", (3072,), {"model.d": 256, "model.n_blocks": 4}),
                               ("vit", IMAGE, {}), ("convmixer", IMAGE, {})):
        config = RunConfig().replace(**{"model.arch": arch, **sizes})
        torch.manual_seed(0)
        model = build_model(config.model, input_shape=shape, n_classes=10)
        out[model.describe().label] = (model, shape)
    torch.manual_seed(0)
    out["ResNet-20 (zoo, adapted)"] = (adapt(resnet20(), RESNET_STATES, input_shape=IMAGE),
                                       IMAGE)
    return out


def seconds(fn, repeats: int) -> tuple[float, float]:
    """Median (CPU seconds, wall-clock seconds) of ``repeats`` calls."""
    cpu, wall = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"{'model':<28}{'parameters':>12}{'check CPU s':>13}{'(wall)':>8}{'how':>9}"
          f"{'BP step 128 CPU s':>19}{'(wall)':>8}{'ratio':>7}")
    for name, (model, shape) in models().items():
        check_s, check_w, how, step_s, step_w = measure(model, shape, args.repeats)
        parameters = sum(p.numel() for p in model.parameters())
        print(f"{name:<28}{parameters:>12,}{check_s:>13.3f}{check_w:>8.2f}{how:>9}"
              f"{step_s:>19.3f}{step_w:>8.2f}{check_s / step_s:>7.1f}")


def measure(model: torch.nn.Module, shape: tuple[int, ...], repeats: int
            ) -> tuple[float, float, str, float, float]:
    """(check CPU s, wall s, how it was checked, BP step CPU s, wall s) on 1280 random
    inputs (the check reads the first 32, as a run's does)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1280, *shape, generator=generator)
    y = torch.randint(0, 10, (1280,), generator=generator)
    found = []

    def check() -> None:
        found.append(reference_at_start(model, x, y, allow=False, fix=""))

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[:128]), y[:128]).backward()
        optimizer.step()

    (check_s, check_w), (step_s, step_w) = seconds(check, repeats), seconds(step, repeats)
    return check_s, check_w, found[-1].how, step_s, step_w

if __name__ == "__main__":
    main()
