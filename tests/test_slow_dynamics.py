"""Slow check of the failure mode the project exists to detect (SPEC §1 mode 1, §9).

On the synthetic teacher–student task with a terminal-LN ResidualMLP (d=256, L=4), DFA lets
the residual stream explode while the terminal LN makes the loss insensitive to its scale, so
the true gradient at h_L collapses toward the 1e-7 floor; BP keeps the stream bounded.

Run with ``pytest -m slow tests/test_slow_dynamics.py -s`` (prints the trajectories).
"""

from __future__ import annotations

import pytest

from creditaudit.config import RunConfig
from creditaudit.run.trainer import train

EPOCHS = 10


def trajectory(tmp_path, method: str) -> tuple[list[float], list[float]]:
    config = RunConfig().replace(**{
        "method.name": method, "optim.epochs": EPOCHS, "data.n_train": 20000,
        "run.out_dir": str(tmp_path),
        "run.progress": False, "diagnostics.end_of_run": False,
    })
    assert (config.model.arch, config.model.d, config.model.n_blocks) == ("resmlp", 256, 4)
    assert config.model.out_ln and config.data.name == "synthetic"
    assert config.data.n_train == 20000
    result = train(config)
    assert result.status == "completed"
    log = result.record.log
    assert [e.epoch for e in log] == list(range(EPOCHS + 1))
    h = [e.value("h_L_norm") for e in log]
    g = [e.value("g_L_norm") for e in log]
    acc = [e.acc_eval for e in log]
    print(f"\n{method}: epoch  h_L_norm  g_L_norm  acc")
    for epoch, (hn, gn, a) in enumerate(zip(h, g, acc)):
        print(f"{method}: {epoch:5d}  {hn:9.3g}  {gn:9.3g}  {a:.3f}")
    return h, g


@pytest.mark.slow
def test_dfa_explodes_residual_stream_while_bp_stays_bounded(tmp_path):
    bp_h, bp_g = trajectory(tmp_path, "bp")
    dfa_h, dfa_g = trajectory(tmp_path, "dfa")
    # same init: both runs start from the same model and evaluation set
    assert bp_h[0] == dfa_h[0] and bp_g[0] == dfa_g[0]
    assert max(bp_h) < 10 * bp_h[0]
    assert min(bp_g) > 1e-6
    assert dfa_h[-1] >= 100 * dfa_h[0]
    assert dfa_g[-1] < 1e-6
