"""EP's training step on a run's checkpoint: ms per step against BP's, and how many energy
evaluations its relaxations take.

A relaxation stops early once every sample of the batch has settled (``ep_steps`` is a
maximum), so what an EP step costs depends on the model it trains, not only on its shape.
This loads RUN_DIR's last checkpoint and the first ``--batches`` × 128 samples of the run's
training split, and times ``rule.train_step`` of EP (the run's β, steps, step size and
solver) and of BP on that model: fused AdamW at learning rate 0, so every step sees the
checkpoint's model (at the end of the cosine schedule training's own steps barely move it
either), 1 torch thread, the order of the two rotated every round. EP/BP is taken
within each round; the median and range over rounds are printed with the load average.

Energy evaluations (one forward and one backward pass through the blocks each) are counted
by wrapping the two energies' evaluation methods — measurement only. To compare two
versions of the code on the same checkpoint, run this script under each, one after the
other, on an otherwise idle machine (``PYTHONPATH=OTHER_CHECKOUT/src:benchmarks``).

Usage: python benchmarks/bench_ep_step.py RUN_DIR [--batches 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch

from bench_ep_trained import run_model
from bench_steps import load_text
from creditaudit.config import MethodConfig
from creditaudit.data import load_dataset
from creditaudit.methods import build_rule
from creditaudit.methods.ep_energy import NudgedEnergy, ResidualEnergy
from creditaudit.optim import make_adamw
from creditaudit.run.plan import plan_run

BATCH = 128


class EvaluationCounter:
    """Counts calls of the energies' evaluations while installed (a context manager)."""

    WRAPPED = ((ResidualEnergy, "evaluate"), (NudgedEnergy, "gradient"))

    def __init__(self) -> None:
        self.count = 0
        self._saved: list[tuple[type, str, object]] = []

    def __enter__(self) -> EvaluationCounter:
        for owner, name in self.WRAPPED:
            original = getattr(owner, name)
            self._saved.append((owner, name, original))

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            setattr(owner, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config, model, _, _, label = run_model(args.run, 1)
    if config.method.name != "ep":
        raise SystemExit(f"{args.run} is a {config.method.name} run; this times EP's step")
    dataset = load_dataset(config.data, seed=config.run.seed)
    n = args.batches * BATCH
    x = dataset.prepare(dataset.train_x[:n], flatten=plan_run(config).flatten)
    y = dataset.train_y[:n]
    batches = [(x[s:s + BATCH], y[s:s + BATCH]) for s in range(0, n, BATCH)]
    weights = copy.deepcopy(model.state_dict())
    n_classes = int(model.n_classes)
    methods = {"ep": config.method, "bp": MethodConfig(name="bp")}
    rules = {}
    for name, method in methods.items():
        rule = build_rule(model, method, n_classes=n_classes, seed=config.run.seed)
        rule.set_precision("fp32", "cpu")
        rules[name] = rule
    print(label)
    print(f"EP: β {config.method.ep_beta}, at most {config.method.ep_steps} steps, solver "
          f"{config.method.ep_solver}; {args.batches} training batches of {BATCH}, "
          f"torch {torch.__version__}, 1 thread")
    ms: dict[str, list[float]] = {name: [] for name in rules}
    evaluations = []
    for index in range(args.rounds):
        order = list(rules) if index % 2 == 0 else list(reversed(rules))
        for name in order:
            rule = rules[name]
            # lr 0: the steps leave the checkpoint's weights as they are (a fresh AdamW at
            # the recipe's lr would move every weight by about lr in its first steps, and
            # the samples with them), while AdamW still does all its arithmetic.
            optimizer = make_adamw(rule.trainable_parameters(), lr=0.0,
                                   weight_decay=config.optim.weight_decay)
            rule.train_step(*batches[0], optimizer)  # untimed: caches, allocator
            with EvaluationCounter() as counter:
                started = time.perf_counter()
                for xb, yb in batches:
                    rule.train_step(xb, yb, optimizer)
                ms[name].append((time.perf_counter() - started) / len(batches) * 1e3)
            if name == "ep":
                evaluations.append(counter.count / len(batches))
        print(f"  round {index + 1}: EP {ms['ep'][-1]:.1f} ms, BP {ms['bp'][-1]:.1f} ms, "
              f"EP/BP {ms['ep'][-1] / ms['bp'][-1]:.2f}; 1-min load {os.getloadavg()[0]:.2f}",
              flush=True)
    if any(not torch.equal(value, weights[key]) for key, value in model.state_dict().items()):
        raise SystemExit("the timed steps changed the checkpoint's weights")
    ratios = [e / b for e, b in zip(ms["ep"], ms["bp"])]
    print(f"EP/BP per step: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}–"
          f"{max(ratios):.2f}); EP {statistics.median(ms['ep']):.1f} ms, BP "
          f"{statistics.median(ms['bp']):.1f} ms; energy evaluations per EP step "
          f"{statistics.median(evaluations):.2f}; {load_text()}")


if __name__ == "__main__":
    main()
