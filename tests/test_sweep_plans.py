"""A sweep plans every run before any trains, once: a base value a run's component does not
read and a rule that cannot train a run's model stop the sweep (and its dry run) in one
line; the parent plans each run once and each worker once more, from the config it
receives, and trains that plan."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import creditaudit.run.plan as plan_module
from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.sweep import LocalExecutor, load_sweep, plan_runs, prepare_configs, run_sweep
from integrity_support import assert_one_line_error
from plugin_support import PLUGINS, cli
from sweep_files import write_tiny_sweep

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]
# A two-layer encoder of PyTorch's own layers on 8 synthetic features, under bp and fa.
MODULE_SWEEP = """
[base.data]
n_train = 256
n_test = 128
in_dim = 8

[base.model]
arch = "module"
factory = "creditaudit.testing.zoo:TransformerClassifier"
args = {{ image_shape = [1, 1, 8], patch = [1, 4], d = 8, depth = 2, heads = 2, mlp_ratio = 2 }}
states = ["encoder.layers.0", "encoder.layers.1"]

[base.optim]
epochs = 1
batch_size = 64

[base.run]
out_dir = "{out}"

[grid]
"method.name" = ["bp", "fa"]
"""


def tiny_sweep(tmp_path: Path, body: str, **base: object) -> Path:
    return write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", body, base=base)


# --- a [base] value a run's component does not read ------------------------------------------
def test_a_base_value_a_component_does_not_read_is_refused(tmp_path, capsys):
    """[base] model.d = 16 over a grid of resmlp and student (a preset width): the student
    run would train at its own width without a word; the sweep names the key and the
    component instead, at load, in its dry run and from Python."""
    path = tiny_sweep(tmp_path, '[grid]\n"model.arch" = ["resmlp", "student"]\n')
    fragments = ("[base] model.d=16 is not read by student (model.arch), which grid "
                 "combination {model.arch='student'} selects", "drop it from [base]")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert all(f in str(err.value) for f in fragments) and "\n" not in str(err.value)
    for flags in (["--dry-run"], ["--workers", "0"]):
        assert main(["sweep", str(path), *flags]) == 2
        out, err_text = capsys.readouterr()
        assert_one_line_error(out, err_text, *fragments)
    assert not (tmp_path / "out").exists()  # nothing planned, nothing trained


def test_a_value_the_grid_gives_to_some_runs_only_stays_a_warning(tmp_path):
    """A grid axis read by some runs' rules only collapses there by design (named in a
    warning): only what [base] sets for every run must be read by every run."""
    path = tiny_sweep(tmp_path, """
        [grid]
        "method.name" = ["bp", "ep"]
        "method.ep_beta" = [0.1, 0.2]
    """)
    assert len(load_sweep(path).configs()) == 3  # bp once, ep twice


def test_the_plugin_architecture_of_the_issue_is_refused_in_one_line(tmp_path):
    """The report's case: [base] model.d = 16 with a grid over resmlp and the outside
    plugin plain-mlp (whose width is model.width)."""
    site = PLUGINS.install(tmp_path / "site")
    path = tiny_sweep(tmp_path, '[grid]\n"model.arch" = ["resmlp", "plain-mlp"]\n')
    for flags in (["--dry-run"], ["--workers", "0"]):
        done = cli(site, "sweep", str(path), *flags, cwd=tmp_path)
        assert done.returncode == 2
        assert_one_line_error(done.stdout, done.stderr,
                              "[base] model.d=16 is not read by plain-mlp (model.arch)",
                              "it is an option of resmlp")
    assert not (tmp_path / "out").exists()



def test_a_base_value_only_own_loop_reads_offers_no_architecture(tmp_path, capsys):
    """own-loop builds nothing (a Recorder's run), yet a [base] key only it has
    (model.module) was refused with '(it is an option of own-loop): set it only for the
    runs that read it' — runs no sweep can train; model.states named 'module, own-loop'."""
    grid = '[grid]\n"model.arch" = ["resmlp", "student"]\n'
    path = tiny_sweep(tmp_path, grid, **{"model.module": "x"})
    assert main(["sweep", str(path), "--dry-run"]) == 2
    line = assert_one_line_error(*capsys.readouterr(), "[base] model.module='x' is not read "
                                 "by resmlp", "nor by any architecture a run can select: drop "
                                 "it from [base]")
    assert "own-loop" not in line
    path = tiny_sweep(tmp_path, grid, **{"model.states": ["a"]})
    assert main(["sweep", str(path), "--dry-run"]) == 2
    line = assert_one_line_error(*capsys.readouterr(), "(it is an option of module): set it")
    assert "own-loop" not in line

# --- a rule that cannot train a run's model -----------------------------------------------------
def test_a_rule_that_cannot_bind_to_a_module_model_is_refused_before_any_run_trains(
        tmp_path, capsys):
    """bp trains adapted models, block-level fa does not: the fa run is refused while the
    sweep plans, before the bp run before it trains — and by the dry run alike."""
    path = tmp_path / "s.toml"
    path.write_text(MODULE_SWEEP.format(out=tmp_path / "out"))
    fragments = ("run name=fa: method.name='fa' cannot train model.arch='module': fa needs "
                 "a residual network", "adapted models support bp")
    for flags in (["--dry-run"], ["--workers", "0"]):
        assert main(["sweep", str(path), *flags]) == 2
        out, err = capsys.readouterr()
        assert_one_line_error(out, err, *fragments)
    assert not (tmp_path / "out").exists()  # the bp run never started
    configs = prepare_configs(load_sweep(path).configs(), threads=1)
    with pytest.raises(ConfigError, match="run name=fa: method.name='fa' cannot train"):
        plan_runs(configs, ["method.name"])


# --- one plan per run -------------------------------------------------------------------------
COUNTER = """
import os
import creditaudit.run.plan
import creditaudit.records.run_ids

_original = creditaudit.records.run_ids.compute_run_id


def _counted(*args, **kwargs):
    with open(os.environ["CREDITAUDIT_TEST_ID_COUNTS"], "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    return _original(*args, **kwargs)


creditaudit.records.run_ids.compute_run_id = creditaudit.run.plan.compute_run_id = _counted
"""


def _count_in_this_process(monkeypatch, counts: Path) -> None:
    original = plan_module.compute_run_id

    def counted(*args, **kwargs):
        with counts.open("a") as handle:
            handle.write(f"{os.getpid()}\n")
        return original(*args, **kwargs)

    monkeypatch.setattr(plan_module, "compute_run_id", counted)


def _pids(counts: Path) -> list[int]:
    return [int(line) for line in counts.read_text().split()] if counts.exists() else []


def test_a_sweep_in_this_process_computes_each_run_id_twice_at_most(tmp_path, monkeypatch,
                                                                    capsys):
    """`creditaudit sweep --workers 0` of 2 runs: the parent plans each run once (dry run,
    summary and table read those plans), its worker — the same process here — once more."""
    counts = tmp_path / "counts"
    _count_in_this_process(monkeypatch, counts)
    path = tiny_sweep(tmp_path, '[grid]\n"method.name" = ["bp", "dfa"]\n')
    assert main(["sweep", str(path), "--workers", "0", "-q"]) == 0
    assert "2 runs (2 completed)" in capsys.readouterr().out
    assert len(_pids(counts)) <= 4
    counts.unlink()
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert len(_pids(counts)) == 2  # one plan per run


def test_a_sweep_of_two_workers_computes_four_run_ids_in_all(tmp_path, monkeypatch):
    """Two spawned workers, counted through a sitecustomize module they import at start-up:
    2 in the parent, 1 in each worker per run it trained."""
    counts = tmp_path / "counts"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(COUNTER))
    monkeypatch.setenv("CREDITAUDIT_TEST_ID_COUNTS", str(counts))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(hook), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]).rstrip(os.pathsep))
    _count_in_this_process(monkeypatch, counts)
    path = tiny_sweep(tmp_path, '[grid]\n"method.name" = ["bp", "dfa"]\n')
    configs = prepare_configs(load_sweep(path).configs(), threads=1)
    result = run_sweep(configs, LocalExecutor(workers=2), grid_keys=["method.name"])
    assert [o["status"] for o in result.outcomes] == ["completed", "completed"]
    pids = _pids(counts)
    assert pids.count(os.getpid()) == 2, pids
    workers = {pid for pid in pids if pid != os.getpid()}
    assert workers and len(workers) <= 2
    trained = {o["pid"] for o in result.outcomes}
    assert workers <= trained and len(pids) == 4, (pids, trained)
    assert sys.modules["creditaudit.run.plan"] is plan_module
