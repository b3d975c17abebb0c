"""EP's relaxation on trained runs: how close each solver and β get to BP's weight update.

For each run folder given, the model of its last checkpoint and the first ``--eval-samples``
samples of its evaluation set: the cosine between EP's weight update (step size of the
run's config) and BP's, in float64, for each (solver, steps[, β]) of ``--grid`` (β: the
run's when not given), with the relaxation's ‖∇_ρF‖ end/start in brackets
(:func:`creditaudit.methods.ep.update_agreement`, the number a run records at its end).
Trained blocks are stiff where fresh ones are not, so this is where solvers part ways
(``bench_ep.py`` measures fresh and briefly trained models). ``--fresh ARCH …`` adds the
cpu scale's models of those architectures at initialisation (seed 42, Fashion-MNIST),
where a β too large for the architecture shows: the nudged equilibrium leaves the linear
regime, and even a converged relaxation's update points elsewhere than BP's.

A grid entry ``lbfgs:ITERS[:β]`` is the reference: the nudged equilibrium itself, found by
L-BFGS (strong Wolfe line search) on F over the residuals in float64 for up to ITERS
iterations. Where a solver's update disagrees with BP's, it tells whether the solver missed
the equilibrium or the equilibrium — EP's own estimate at that β — is off.

Usage: python benchmarks/bench_ep_trained.py [RUN_DIR …] [--fresh resmlp vit convmixer]
       [--eval-samples 512] [--grid residual-cg:20,cg:20,residual-cg:20:1e-4,lbfgs:500]
       [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench_ep import load_average, write_report
from creditaudit.config import RunConfig, load_config
from creditaudit.data import load_dataset
from creditaudit.formatting import fmt
from creditaudit.methods.ep import update_agreement
from creditaudit.methods.ep_energy import NudgedEnergy, ResidualEnergy
from creditaudit.methods.ep_relax import Relaxation
from creditaudit.models import build_model
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.records.checkpoint import load_checkpoint
from creditaudit.run.plan import plan_run
from creditaudit.study.experiments.configs import arch_config, method_overrides

DEFAULT_GRID = "residual-cg:10,residual-cg:20,residual-cg:40,cg:20,cg:200,gd:20"


def model_and_samples(config: RunConfig, n: int, *, seed: int | None = None
                      ) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """``config``'s model (initialised from ``seed`` when given) and the first ``n`` samples
    of its evaluation set with their labels."""
    dataset = load_dataset(config.data, seed=config.run.seed)
    x, y = dataset.eval_subset(n, flatten=plan_run(config).flatten)
    if seed is not None:
        torch.manual_seed(seed)
    model = build_model(config.model, input_shape=dataset.input_shape,
                        n_classes=dataset.n_classes)
    return model, x, y


def run_model(run_dir: Path, n: int
              ) -> tuple[RunConfig, torch.nn.Module, torch.Tensor, torch.Tensor, str]:
    """(the run's config, its model at the last checkpoint, the first ``n`` samples of its
    evaluation set, their labels, a label for the table)."""
    config = load_config(run_dir / "config.toml")
    model, x, y = model_and_samples(config, n)
    state = load_checkpoint(run_dir / CHECKPOINT_FILE)
    model.load_state_dict(state["model"])
    solver = config.method.ep_solver if config.method.name == "ep" else "-"
    label = (f"{run_dir.name} ({config.method.name}, trained with solver {solver}, "
             f"epoch {state['epoch']})")
    return config, model, x, y, label


def fresh_model(arch: str, n: int, data_dir: str
                ) -> tuple[RunConfig, torch.nn.Module, torch.Tensor, torch.Tensor, str]:
    """:func:`run_model`'s tuple for the cpu scale's ``arch`` at initialisation (seed 42)."""
    config = arch_config(arch, "cpu", dataset=None, data_dir=data_dir, out_dir="unused",
                         **method_overrides("ep"), run__seed=42)
    model, x, y = model_and_samples(config, n, seed=config.run.seed)
    return config, model, x, y, f"{arch} at initialisation (cpu scale, seed 42)"


def lbfgs_relax(model: torch.nn.Module, states: list[torch.Tensor], y: torch.Tensor, *,
                beta: float, iters: int) -> Relaxation:
    """The nudged equilibrium by L-BFGS over the residuals (``relax``'s result type)."""
    energy = ResidualEnergy(NudgedEnergy(model, [h.detach() for h in states], y, beta))
    start = float(torch.linalg.vector_norm(energy.start()[0]))
    rho = torch.nn.Parameter(energy.zeros())
    optimizer = torch.optim.LBFGS([rho], lr=1, max_iter=iters, tolerance_grad=1e-14,
                                  tolerance_change=1e-20, history_size=50,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        grad, _, values = energy.evaluate(rho.detach())
        rho.grad = grad
        return values.sum()

    optimizer.step(closure)
    grad, deltas, _ = energy.evaluate(rho.detach())
    return Relaxation(states=energy.energy.free, deltas=deltas,
                      residuals=energy.energy.unflatten(rho.detach().clone()),
                      grad_norms=[start, float(torch.linalg.vector_norm(grad))],
                      final_step_size=1.0, backoffs=0)


def lbfgs_relaxer(iters: int) -> Callable[..., Relaxation]:
    """:func:`lbfgs_relax` with :func:`~creditaudit.methods.ep_relax.relax`'s arguments, for
    ``update_agreement(relaxer=…)``."""
    def relaxer(model, states, y, *, beta, steps, step_size, solver):  # noqa: ANN001, ANN202, ARG001
        return lbfgs_relax(model, states, y, beta=beta, iters=iters)
    return relaxer


def parse_grid(text: str) -> list[tuple[str, int, float | None]]:
    """``solver:steps[:beta],…`` → [(solver, steps, β or None for the run's)]."""
    out = []
    for item in text.split(","):
        solver, steps, *beta = item.split(":")
        out.append((solver, int(steps), float(beta[0]) if beta else None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--fresh", nargs="*", default=[], choices=["resmlp", "vit",
                                                                  "convmixer"])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                        help="Fashion-MNIST folder of the --fresh models")
    parser.add_argument("--eval-samples", type=int, default=512)
    parser.add_argument("--grid", default=DEFAULT_GRID, help="solver:steps[:beta],…")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    if not args.runs and not args.fresh:
        parser.error("give run folders, --fresh architectures, or both")
    torch.set_num_threads(1)
    grid = parse_grid(args.grid)
    started = time.perf_counter()
    lines = [f"torch {torch.__version__}, 1 thread, load average {load_average()}; float64, "
             f"{args.eval_samples} evaluation samples per model", "",
             "| model | " + " | ".join(f"{s} {n}" + ("" if b is None else f", β={b:g}")
                                       for s, n, b in grid) + " |",
             "|---|" + "---|" * len(grid)]
    models = [lambda r=r: run_model(r, args.eval_samples) for r in args.runs] + [
        lambda a=a: fresh_model(a, args.eval_samples, args.data_dir) for a in args.fresh]
    for load in models:
        config, model, x, y, label = load()
        cells = []
        for solver, steps, beta in grid:
            reference = {"solver": "residual-cg", "relaxer": lbfgs_relaxer(steps)}
            out = update_agreement(model, x, y, steps=steps,
                                   beta=config.method.ep_beta if beta is None else beta,
                                   step_size=config.method.ep_step_size,
                                   **(reference if solver == "lbfgs" else {"solver": solver}))
            cells.append(f"{fmt(out['ep_update_cos'], '.4f')} "
                         f"({out['ep_eval_relax_grad_ratio']:.2g})"
                         if "ep_update_cos" in out else out.get("ep_update_error", "-"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    write_report(lines, started, args.out)


if __name__ == "__main__":
    main()
