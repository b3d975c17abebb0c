"""EP's relaxation on trained runs: how close each solver gets to BP's weight update there.

For each run folder given, the model of its last checkpoint and the first ``--eval-samples``
samples of its evaluation set: the cosine between EP's weight update (β and step size of the
run's config) and BP's, in float64, for each (solver, steps) of ``--grid``, with the
relaxation's ‖∇_ρF‖ end/start in brackets (:func:`creditaudit.methods.ep.update_agreement`,
the number a run records at its end). Trained blocks are stiff where fresh ones are not, so
this is where solvers part ways (``bench_ep.py`` measures fresh and briefly trained models).

Usage: python benchmarks/bench_ep_trained.py RUN_DIR [RUN_DIR …] [--eval-samples 512]
       [--grid residual-cg:20,cg:20,gd:20] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench_ep import load_average, write_report
from creditaudit.config import RunConfig, load_config
from creditaudit.data import load_dataset
from creditaudit.methods.ep import update_agreement
from creditaudit.models import build_model
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.records.checkpoint import load_checkpoint
from creditaudit.run_setup import flatten_inputs

DEFAULT_GRID = "residual-cg:10,residual-cg:20,residual-cg:40,cg:20,cg:200,gd:20"


def run_model(run_dir: Path, n: int
              ) -> tuple[RunConfig, torch.nn.Module, torch.Tensor, torch.Tensor, str]:
    """(the run's config, its model at the last checkpoint, the first ``n`` samples of its
    evaluation set, their labels, a label for the table)."""
    config = load_config(run_dir / "config.toml")
    dataset = load_dataset(config.data, seed=config.run.seed)
    x, y = dataset.eval_subset(n, flatten=flatten_inputs(config))
    model = build_model(config.model, input_shape=dataset.input_shape,
                        n_classes=dataset.n_classes)
    state = load_checkpoint(run_dir / CHECKPOINT_FILE)
    model.load_state_dict(state["model"])
    solver = config.method.ep_solver if config.method.name == "ep" else "-"
    label = (f"{run_dir.name} ({config.method.name}, trained with solver {solver}, "
             f"epoch {state['epoch']})")
    return config, model, x, y, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--eval-samples", type=int, default=512)
    parser.add_argument("--grid", default=DEFAULT_GRID, help="solver:steps,…")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    grid = [(s, int(n)) for s, n in (item.split(":") for item in args.grid.split(","))]
    started = time.perf_counter()
    lines = [f"torch {torch.__version__}, 1 thread, load average {load_average()}; float64, "
             f"{args.eval_samples} evaluation samples per run", "",
             "| run | " + " | ".join(f"{s} {n}" for s, n in grid) + " |",
             "|---|" + "---|" * len(grid)]
    for run_dir in args.runs:
        config, model, x, y, label = run_model(run_dir, args.eval_samples)
        cells = []
        for solver, steps in grid:
            out = update_agreement(model, x, y, beta=config.method.ep_beta, steps=steps,
                                   step_size=config.method.ep_step_size, solver=solver)
            cells.append(f"{out['ep_update_cos']:.4f} ({out['ep_eval_relax_grad_ratio']:.2g})"
                         if "ep_update_cos" in out else out.get("ep_update_error", "-"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    write_report(lines, started, args.out)


if __name__ == "__main__":
    main()
