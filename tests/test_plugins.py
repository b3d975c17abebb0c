"""A credit rule from another package: registered through the creditaudit.rules entry point,
it passes the conformance suite and trains, audits, sweeps and draws through the CLI — with
no change to creditaudit. The example is docs/examples/noisy_bp.py (docs/extending.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from creditaudit.methods import registry

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--epochs", "1", "--set", "data.n_train=256", "--set", "data.n_test=256",
        "--set", "data.in_dim=8", "--set", "model.d=16", "--set", "model.n_blocks=2",
        "--set", "optim.batch_size=64", "--set", "diagnostics.eval_samples=256",
        "--set", "diagnostics.rho_samples=32", "--set", "diagnostics.rho_directions=2",
        "--no-progress"]


def install(site: Path, name: str, entry: str, module: Path | None = None) -> None:
    """What `pip install` leaves for an entry point: a dist-info folder on sys.path."""
    site.mkdir(parents=True, exist_ok=True)
    if module is not None:
        shutil.copy(module, site / module.name)
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[creditaudit.rules]\n{entry}\n")


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install(site, "noisy-bp-rule", "noisy-bp = noisy_bp:NoisyBP",
            ROOT / "docs" / "examples" / "noisy_bp.py")
    monkeypatch.syspath_prepend(str(site))
    registry.reload_plugins()
    yield site
    monkeypatch.undo()
    sys.modules.pop("noisy_bp", None)
    registry.reload_plugins()


def cli(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The plugin's site first, then whatever the suite runs with (a checkout's src/).
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "creditaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_an_installed_rule_passes_the_conformance_suite(plugin_site):
    from creditaudit.testing import check_rule

    assert "noisy-bp" in registry.rule_names()
    rule = registry.rule_class("noisy-bp")
    assert rule.label == "Noisy BP"
    check_rule(rule)


def test_an_installed_rule_trains_audits_sweeps_and_draws_through_the_cli(plugin_site,
                                                                           tmp_path):
    out = tmp_path / "runs"
    done = cli(plugin_site, "train", "--method", "noisy-bp", *TINY, "--out", str(out),
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = next(out.glob("noisy-bp-*"))
    audited = cli(plugin_site, "audit", str(run_dir), "-q", "--format", "md", cwd=tmp_path)
    assert audited.returncode == 0, audited.stderr
    assert "a_l = g_l + σ·RMS(g_l)·ξ_l" in audited.stdout  # the rule's own formula
    sweep_file = tmp_path / "grid.toml"
    sweep_file.write_text(f'[base.run]\nout_dir = "{out}"\n[base.optim]\nepochs = 1\n'
                          '[base.data]\nn_train = 256\nn_test = 256\nin_dim = 8\n'
                          '[base.model]\nd = 16\nn_blocks = 2\n'
                          '[base.diagnostics]\neval_samples = 256\nrho_samples = 32\n'
                          '[grid]\n"method.name" = ["noisy-bp", "bp"]\n')
    swept = cli(plugin_site, "sweep", str(sweep_file), "--workers", "0", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    drawn = cli(plugin_site, "figures", str(out), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert "drew" in drawn.stdout
    listed = cli(plugin_site, "train", "--help", cwd=tmp_path)
    assert "noisy-bp" in listed.stdout


def test_a_broken_plugin_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install(site, "broken-rule", "broken = no_such_module:Rule")
    done = cli(site, "train", "--set", "method.name=broken", *TINY, "--out",
               str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("creditaudit: error: credit rule plugin 'no_such_module:Rule'")
    assert "Traceback" not in done.stderr
    # The other rules keep working: a run of a built-in never imports the broken plugin.
    fine = cli(site, "train", "--method", "bp", *TINY, "--out", str(tmp_path / "o"),
               cwd=tmp_path)
    assert fine.returncode == 0, fine.stderr
    assert "no_such_module" not in fine.stderr and "Traceback" not in fine.stderr


def test_figures_and_report_read_a_plugin_rule_run_after_the_plugin_is_gone(plugin_site,
                                                                            tmp_path):
    """A folder where a plugin rule ran beside BP, FA and DFA, read where the plugin is not
    installed (a colleague's machine, or after `pip uninstall`): `figures` and `report`
    stopped with "method.name='noisy-bp' is not a known credit rule" (Figure 1 asked the
    rule for its default options) although a record of a plugin not installed is still
    read. Now both draw and tabulate the plugin's runs from what they recorded."""
    out = tmp_path / "runs"
    sweep_file = tmp_path / "grid.toml"
    sweep_file.write_text(f'[base.run]\nout_dir = "{out}"\n[base.optim]\nepochs = 1\n'
                          '[base.data]\nn_train = 256\nn_test = 256\nin_dim = 8\n'
                          '[base.model]\nd = 16\nn_blocks = 2\n'
                          '[base.diagnostics]\neval_samples = 256\nrho_samples = 32\n'
                          '[grid]\n"method.name" = ["bp", "fa", "dfa", "noisy-bp"]\n')
    swept = cli(plugin_site, "sweep", str(sweep_file), "--workers", "0", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    gone = tmp_path / "empty-site"  # nothing installed there: the plugin is not found
    gone.mkdir()
    drawn = cli(gone, "figures", str(out), "--out", str(tmp_path / "figures"), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert "drew Figure 1 — audit hero" in drawn.stdout
    reported = cli(gone, "report", str(out), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    rows = [line for line in (tmp_path / "report" / "report.md").read_text().splitlines()
            if line.startswith("| noisy-bp-")]
    assert len(rows) == 1 and "| completed |" in rows[0]
