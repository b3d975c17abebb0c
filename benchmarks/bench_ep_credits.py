"""EP's credits on a trained run, sample by sample: length, zero credits, and what ρ sees.

For a run folder's last checkpoint and the first ``--eval-samples`` samples of its
evaluation set, EP's credits (the run's β, steps and solver, float32 as in training, and a
float64 relaxation of the first 128 samples) against BP's state gradients:

- the credits that are exactly zero (a relaxation that returned the sample to its free
  state) and how many of those samples the model classifies correctly;
- each credit's length relative to BP's, median over correct and misclassified samples
  (1.0: the length BP's gradient has; EP's credit is −r/β, on the scale of the gradient of
  the summed CE), and its cosine with BP's (median and 10th percentile);
- ρ (the perturbation correlation, float64) of the credits as they are and rescaled to BP's
  per-sample length: ρ pools samples, so a per-sample length error lowers it where a
  cosine cannot see it.

Usage: python benchmarks/bench_ep_credits.py RUN_DIR [--eval-samples 1024]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import Tensor
from torch.nn import functional as F

from bench_ep_trained import run_model
from creditaudit.measures.perturbation import rho_table
from creditaudit.methods import CreditRule, build_rule
from creditaudit.methods.bp import bp_state_gradients


def ep_credits(rule: CreditRule, x: Tensor, y: Tensor) -> list[Tensor]:
    """−r_{l−1}/β for every state: the rule's credits (−r/(β·B)) in chunks of 128, times
    each chunk's B (the scale of the gradient of the summed CE)."""
    parts = [[a * ys.shape[0] for a in rule.credits(x[s:s + 128], ys)]
             for s, ys in ((s, y[s:s + 128]) for s in range(0, x.shape[0], 128))]
    return [torch.cat([p[layer] for p in parts]) for layer in range(len(parts[0]))]


def report(label: str, credits: list[Tensor], grads: list[Tensor], correct: Tensor) -> None:
    """Zero credits and per-sample lengths relative to BP's (grads: of the summed CE)."""
    deep = credits[len(credits) // 2]
    reference = grads[len(grads) // 2]
    zero = deep.flatten(1).norm(dim=1) == 0
    length = deep.flatten(1).norm(dim=1) / reference.flatten(1).norm(dim=1)
    cos = F.cosine_similarity(deep.flatten(1).double(), reference.flatten(1).double(), dim=1)
    print(f"{label}: {int(zero.sum())} of {len(zero)} credits exactly zero "
          f"({int((zero & correct).sum())} of them correctly classified); credit length / "
          f"BP's, median: correct {float(length[correct].median()):.3f}, misclassified "
          f"{float(length[~correct].median()):.3f}; cosine with BP's, median (10th "
          f"percentile): correct {_median_low(cos[correct])}, misclassified "
          f"{_median_low(cos[~correct])} (state {len(credits) // 2})")


def _median_low(values: Tensor) -> str:
    return (f"{float(values.median()):.4f} "
            f"({float(values.quantile(0.1)):.4f})" if values.numel() else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--eval-samples", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config, model, x, y, label = run_model(args.run, args.eval_samples)
    model.eval()
    print(label)
    with torch.no_grad():
        correct = model(x).argmax(dim=1) == y
    grads = [g * x.shape[0] for g in bp_state_gradients(model, x, y)]
    rule = build_rule(model, config.method, n_classes=int(model.n_classes),
                      seed=config.run.seed)
    credits = ep_credits(rule, x, y)
    report("float32", credits, grads, correct)
    first = slice(0, 128)
    model.double()  # in place: the rule relaxes the float64 model now
    grads64 = [g * 128 for g in bp_state_gradients(model, x[first].double(), y[first])]
    report("float64", ep_credits(rule, x[first].double(), y[first]), grads64,
           correct[first])
    model.float()
    rescaled = [a * (g.flatten(1).norm(dim=1) / a.flatten(1).norm(dim=1).clamp_min(1e-30)
                     ).view(-1, *[1] * (a.dim() - 1)) for a, g in zip(credits, grads)]
    as_is = rho_table(model, x, y, credits, n_samples=args.eval_samples)
    scaled = rho_table(model, x, y, rescaled, n_samples=args.eval_samples, controls=False)
    print("ρ per state, credits as they are: "
          + ", ".join(f"{v:+.3f}" for v in as_is["rho"])
          + "; rescaled to BP's per-sample length: "
          + ", ".join(f"{v:+.3f}" for v in scaled["rho"])
          + "; BP control: " + ", ".join(f"{v:.4f}" for v in as_is["bp"]))


if __name__ == "__main__":
    main()
