"""EP's nudged relaxation: how close each solver gets to BP's weight update, and at what cost.

1. Agreement. On a terminal-LN ResidualMLP d=256 L=4 with Fashion-MNIST inputs (in_dim 784),
   the cosine between EP's weight update and BP's (gradient of the batch-mean CE w.r.t. every
   embed and block parameter; the readout is exact in both) on the run's evaluation set
   (default 1280 held-out samples), in float64, for a grid of (solver, steps, step size η, β):
   :func:`creditaudit.methods.ep.update_agreement`, the number a run records at its end.
   Models: freshly initialised (seed 42), trained 3 epochs by BP (stiffer blocks), and trained
   3 epochs by EP itself (default settings), each with the project's recipe (AdamW 1e-3,
   cosine schedule, batch 128). Besides the library's solvers (residual-cg, cg, gd), two
   measurement-only baselines are registered here: heavy-ball momentum (μ = 0.8) and
   per-sample Anderson mixing (type II, window 8) of the gradient-descent map.
2. Cost. ms per ``rule.train_step`` (fused AdamW, batch 128, fp32, 1 torch thread) of EP with
   each solver against BP on the same model shape, for in_dim 784 and 3072 (CIFAR-shaped);
   the rules are timed in blocks whose order rotates every repeat, EP/BP is taken within each
   repeat and the median over repeats is reported with its range. ``--baseline-ep FILE``
   times another version's EP rule as well, e.g. the one before the CG solver:
   ``git show 9b2032e:src/creditaudit/methods/ep.py > /tmp/ep_before.py``.

Usage: python benchmarks/bench_ep.py [--data-dir DIR] [--repeats 7] [--epochs 3]
       [--quick] [--out FILE] [--baseline-ep FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from creditaudit.config import DataConfig, MethodConfig, RunConfig
from creditaudit.data import load_dataset
from creditaudit.formatting import fmt
from creditaudit.methods import build_rule
from creditaudit.methods.ep import update_agreement
from creditaudit.methods.ep_energy import NudgedEnergy
from creditaudit.methods.ep_relax import SOLVERS, Trajectory, residual_gradient_norms
from creditaudit.models import ResidualMLP
from creditaudit.optim import make_adamw
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.records.checkpoint import load_checkpoint
from creditaudit.run.trainer import train

D, BLOCKS, N_CLASSES, BATCH = 256, 4, 10, 128
# (solver, steps, η, β) rows of the agreement table: the old default (gd 20 at β = 0.1), the
# new one (cg 20 at β = 0.01), and around them
GRID = [
    ("gd", 20, 0.25, 0.1), ("cg", 20, 0.25, 0.1), ("cg", 200, 0.25, 0.1),
    ("gd", 20, 0.25, 0.01), ("gd", 40, 0.25, 0.01),
    ("heavy-ball", 20, 0.25, 0.01), ("anderson", 20, 0.25, 0.01),
    ("cg", 10, 0.25, 0.01), ("cg", 15, 0.25, 0.01), ("cg", 20, 0.25, 0.01),
    ("cg", 30, 0.25, 0.01), ("cg", 20, 0.05, 0.01), ("cg", 20, 1.0, 0.01),
    ("cg", 200, 0.25, 0.01),
    ("residual-cg", 5, 0.25, 0.01), ("residual-cg", 10, 0.25, 0.01),
    ("residual-cg", 20, 0.25, 0.01), ("residual-cg", 40, 0.25, 0.01),
]
QUICK_GRID = [("gd", 20, 0.25, 0.1), ("cg", 20, 0.25, 0.01), ("residual-cg", 20, 0.25, 0.01)]
TIMED = [("gd", 20), ("cg", 20), ("residual-cg", 20), ("residual-cg", 40)]
HEAVY_BALL_MOMENTUM = 0.8
ANDERSON_WINDOW = 8


# --- measurement-only baselines ---------------------------------------------------------------
def heavy_ball(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """v ← μv − η∇F, x ← x + v (no back-off: μ, η fixed as a user would tune them)."""
    x, grad = energy.zeros(), energy.start_gradient()
    velocity = torch.zeros_like(x)
    residuals: list[Tensor] = []
    for _ in range(steps):
        velocity = HEAVY_BALL_MOMENTUM * velocity - step_size * grad
        x = x + velocity
        grad, residuals = energy.gradient(x)
    return x, residuals, residual_gradient_norms(energy, residuals), step_size, 0


def anderson(energy: NudgedEnergy, steps: int, step_size: float) -> Trajectory:
    """Type-II Anderson mixing of x ↦ x − η∇F(x), least squares per sample (window 8)."""
    x, grad = energy.zeros(), energy.start_gradient()
    residuals: list[Tensor] = []
    xs, fs = [], []
    for _ in range(steps):
        f = -step_size * grad
        xs, fs = (xs + [x])[-ANDERSON_WINDOW - 1:], (fs + [f])[-ANDERSON_WINDOW - 1:]
        if len(xs) == 1:
            x = x + f
        else:
            dx = torch.stack([b - a for a, b in zip(xs, xs[1:])], 1)  # (B, k, N)
            df = torch.stack([b - a for a, b in zip(fs, fs[1:])], 1)
            gram = (df @ df.transpose(1, 2)).double()
            ridge = 1e-10 * gram.diagonal(dim1=1, dim2=2).mean(1).clamp_min(1e-300)
            eye = torch.eye(gram.shape[-1], dtype=torch.float64)
            gamma = torch.linalg.solve(gram + ridge.view(-1, 1, 1) * eye,
                                       (df @ f.unsqueeze(2)).double()).to(x.dtype)
            x = x + f - ((dx + df).transpose(1, 2) @ gamma).squeeze(2)
        grad, residuals = energy.gradient(x)
    return x, residuals, residual_gradient_norms(energy, residuals), step_size, 0


SOLVERS.update({"heavy-ball": heavy_ball, "anderson": anderson})


# --- models -----------------------------------------------------------------------------------
def fashion_config(data_dir: str, out: str, method: str, epochs: int,
                   train_subset: int | None = None) -> RunConfig:
    return RunConfig().replace(**{
        "data.train_subset": train_subset,
        "data.name": "fashion-mnist", "data.data_dir": data_dir, "model.d": D,
        "model.n_blocks": BLOCKS, "method.name": method, "optim.epochs": epochs,
        "diagnostics.every": 1000, "diagnostics.protocol_every": 0,
        "diagnostics.end_of_run": False, "run.out_dir": out, "run.progress": False,
        "run.threads": 1, "run.seed": 42})


def trained_model(data_dir: str, method: str, epochs: int, train_subset: int | None = None
                  ) -> tuple[ResidualMLP, str]:
    """A d=256 L=4 ResidualMLP trained ``epochs`` by ``method`` with default settings, and a
    line on its run (test accuracy; for EP the per-epoch ‖∇_ρF‖ end/start of the relaxation)."""
    with tempfile.TemporaryDirectory() as out:
        config = fashion_config(data_dir, out, method, epochs, train_subset)
        result = train(config)
        state = load_checkpoint(result.run_dir / CHECKPOINT_FILE)["model"]
    model = ResidualMLP(784, D, N_CLASSES, BLOCKS)
    model.load_state_dict(state)
    record = result.record.to_dict()
    line = f"{method} test acc {record['final']['test_acc']:.3f}"
    ratios = [e["ep_relax_grad_ratio"] for e in record["log"] if "ep_relax_grad_ratio" in e]
    if ratios:
        line += (f" (training relaxations with solver {config.method.ep_solver}, β "
                 f"{config.method.ep_beta:g}: ‖∇_ρF‖ end/start by epoch " +
                 ", ".join(f"{r:.3g}" for r in ratios) + ")")
    return model, line


def fresh_model() -> ResidualMLP:
    torch.manual_seed(42)
    return ResidualMLP(784, D, N_CLASSES, BLOCKS)


# --- 1. agreement -----------------------------------------------------------------------------
def agreement_rows(models: dict[str, ResidualMLP], x: Tensor, y: Tensor,
                   grid: list[tuple[str, int, float, float]]) -> list[str]:
    names = list(models)
    rows = ["| solver | steps | η | β | " + " | ".join(
        f"cos {n} (per module)" for n in names) + " | " + " | ".join(
        f"‖∇_ρF‖ end/start {n}" for n in names) + " |",
        "|---|---|---|---|" + "---|" * (2 * len(names))]
    for solver, steps, eta, beta in grid:
        cells, ratios = [], []
        for name in names:
            started = time.perf_counter()
            out = update_agreement(models[name], x, y, beta=beta, steps=steps, step_size=eta,
                                   solver=solver)
            layers = ", ".join(fmt(v, ".3f") for v in out["ep_update_cos_layers"])
            cells.append(f"**{fmt(out['ep_update_cos'], '.4f')}** ({layers})")
            ratios.append(f"{out['ep_eval_relax_grad_ratio']:.2g}")
            cos = fmt(out["ep_update_cos"], ".4f")
            print(f"  {solver} {steps} η={eta} β={beta} {name}: cos {cos} "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)
        rows.append(f"| {solver} | {steps} | {eta:g} | {beta:g} | " + " | ".join(cells) +
                    " | " + " | ".join(ratios) + " |")
    return rows


# --- 2. cost ----------------------------------------------------------------------------------
def baseline_rule_class(path: str | None) -> type | None:
    """The ``EP`` class of another version of methods/ep.py (e.g. ``git show REV:…`` saved
    to a file), timed with its own defaults next to this one."""
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("ep_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline-ep {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ep_baseline"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.EP


def timed_rules(in_dim: int, baseline: type | None
                ) -> dict[str, tuple[Callable[[Tensor, Tensor], object], int]]:
    """Step functions of BP and of EP per timed solver, each on its own copy of one init."""
    rules = {}
    configs = [("bp", MethodConfig(name="bp"))] + [
        (f"ep {s} {n}", MethodConfig(name="ep", ep_solver=s, ep_steps=n)) for s, n in TIMED]
    if baseline is not None:
        configs.append(("ep baseline file", MethodConfig(name="ep")))
    for name, config in configs:
        torch.manual_seed(0)
        model = ResidualMLP(in_dim, D, N_CLASSES, BLOCKS)
        if name == "ep baseline file":
            rule = baseline(model, config, n_classes=N_CLASSES,
                            generator=torch.Generator().manual_seed(0))
        else:
            rule = build_rule(model, config, n_classes=N_CLASSES, seed=0)
        optimizer = make_adamw(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)
        steps = 20 if name == "bp" else 3  # blocks of comparable wall time

        def step(x: Tensor, y: Tensor, rule=rule, optimizer=optimizer) -> object:
            if not rule.train_step(x, y, optimizer).finite:
                raise RuntimeError(f"{rule.name}: non-finite step; the timing would be wrong")
            return None

        rules[name] = (step, steps)
    return rules


def cost_rows(in_dims: list[int], repeats: int, baseline: type | None) -> list[str]:
    rows = ["| in_dim | rule | ms/step | ratio to BP (range over repeats) |", "|---|---|---|---|"]
    for in_dim in in_dims:
        gen = torch.Generator().manual_seed(0)
        batches = [(torch.randn(BATCH, in_dim, generator=gen),
                    torch.randint(0, N_CLASSES, (BATCH,), generator=gen)) for _ in range(4)]
        rules = timed_rules(in_dim, baseline)
        for step, _ in rules.values():  # warm-up
            for x, y in batches[:2]:
                step(x, y)
        times: dict[str, list[float]] = {name: [] for name in rules}
        names = list(rules)
        for repeat in range(repeats):
            order = names[repeat % len(names):] + names[:repeat % len(names)]
            for name in order:
                step, n = rules[name]
                started = time.perf_counter()
                for i in range(n):
                    step(*batches[i % len(batches)])
                times[name].append((time.perf_counter() - started) / n * 1e3)
        for name in names:
            ratios = [t / b for t, b in zip(times[name], times["bp"])]
            rows.append(f"| {in_dim} | {name} | {statistics.median(times[name]):.1f} | "
                        f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–"
                        f"{max(ratios):.2f}) |")
        print(f"  cost at in_dim {in_dim} done", flush=True)
    return rows


def load_average() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3, help="training epochs of the trained "
                        "models")
    parser.add_argument("--eval-samples", type=int, default=1280)
    parser.add_argument("--quick", action="store_true", help="two grid rows, fresh and "
                        "BP-trained (1 epoch of 512 samples) models, 2 timing repeats at "
                        "in_dim 784, 128 evaluation samples (what the docs tests run)")
    parser.add_argument("--out", default=None, help="also write the tables to this file")
    parser.add_argument("--baseline-ep", default=None, metavar="FILE",
                        help="another version of src/creditaudit/methods/ep.py whose EP rule "
                        "is timed too (with its own defaults)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load_start = time.perf_counter(), load_average()
    epochs = 1 if args.quick else args.epochs
    print("training the comparison models …", flush=True)
    models = {"fresh": fresh_model()}
    runs = {}
    models["BP-trained"], runs["BP-trained"] = trained_model(
        args.data_dir, "bp", epochs, 512 if args.quick else None)
    if not args.quick:
        models["EP-trained"], runs["EP-trained"] = trained_model(args.data_dir, "ep", epochs)
    dataset = load_dataset(DataConfig(name="fashion-mnist", data_dir=args.data_dir), seed=42)
    x, y = dataset.eval_subset(128 if args.quick else args.eval_samples, flatten=True)
    print("agreement …", flush=True)
    lines = [f"torch {torch.__version__}, 1 thread, load average {load_start} at the start",
             f"models: ResidualMLP(784, {D}, 10, {BLOCKS}, out_ln=True); trained "
             f"{epochs} epochs on Fashion-MNIST: " + "; ".join(
                 f"{k}: {v}" for k, v in runs.items()),
             f"agreement on {x.shape[0]} evaluation samples, float64", ""]
    lines += agreement_rows(models, x, y, QUICK_GRID if args.quick else GRID)
    print("cost …", flush=True)
    baseline = baseline_rule_class(args.baseline_ep)
    lines += ["", *cost_rows([784] if args.quick else [784, 3072],
                             2 if args.quick else args.repeats, baseline)]
    write_report(lines, started, args.out)


def write_report(lines: list[str], started: float, out: str | None) -> None:
    """Print ``lines`` with the load average and minutes since ``started`` (perf_counter)
    appended, and write them to ``out`` when given."""
    lines = [*lines, "", f"load average {load_average()} at the end; "
             f"{(time.perf_counter() - started) / 60:.1f} min"]
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
