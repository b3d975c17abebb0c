"""Tiny runs that every figure can be drawn from (shared by the figure test modules)."""

from __future__ import annotations

from pathlib import Path

import torch

from creditaudit.config import RunConfig
from creditaudit.run.trainer import train

SEEDS = (42, 123)
SMOKE = {
    "data.n_train": 512, "data.n_test": 1024, "data.in_dim": 16, "model.d": 16,
    "model.n_blocks": 2, "optim.batch_size": 64, "optim.epochs": 2,
    "diagnostics.eval_samples": 1024, "diagnostics.rho_samples": 64,
    "diagnostics.rho_directions": 4, "diagnostics.null_draws": 3, "run.progress": False,
    "run.threads": 1,
}
# (method, penalty, arch, seeds): two seeds where a figure draws error bars worth checking.
RUNS = [(m, 0.0, "resmlp", SEEDS) for m in ("bp", "dfa", "frozen")]
RUNS += [(m, 0.0, "resmlp", SEEDS[:1]) for m in ("fa", "state-bridge", "credit-bridge")]
RUNS += [("dfa", 0.01, "resmlp", SEEDS), ("bp", 0.01, "resmlp", SEEDS[:1])]
RUNS += [(m, 0.0, "student", SEEDS[:1]) for m in ("bp", "fa", "dfa")]
RUNS += [("kp", 0.0, "resmlp", SEEDS), ("fa-linear", 0.0, "resmlp", SEEDS[:1])]
RUNS += [(m, 0.0, "convmixer", SEEDS[:1]) for m in ("bp", "fa", "dfa")]
# The image architectures read the synthetic task as 3×32×32 images.
ARCH_SETTINGS = {"convmixer": {"data.in_dim": 3072, "model.patch": 8, "model.kernel": 3}}


def smoke_runs(out: Path, runs=RUNS) -> Path:
    previous = torch.get_num_threads()
    try:
        for method, lam, arch, seeds in runs:
            for seed in seeds:
                # The architecture is switched after the sizes: StudentNet, a preset, does not
                # read model.d or model.n_blocks.
                config = RunConfig().replace(**SMOKE).replace(**{
                    **ARCH_SETTINGS.get(arch, {}), "method.name": method,
                    "method.penalty": lam, "model.arch": arch, "run.seed": seed,
                    "run.out_dir": str(out)})
                train(config)
    finally:
        torch.set_num_threads(previous)
    return out


def collapse_g_l_norms(monkeypatch) -> None:
    """Make every record read ‖g_L‖ = 0 at every epoch (what diagnostic (b) looks for),
    which a log axis cannot show."""
    from creditaudit.records import RunRecord

    logged = RunRecord.series

    def collapsed(self, key, index=None):
        epochs, values = logged(self, key, index)
        return (epochs, [0.0] * len(values)) if key == "g_L_norm" else (epochs, values)

    monkeypatch.setattr(RunRecord, "series", collapsed)
