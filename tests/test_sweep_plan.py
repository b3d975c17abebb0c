"""What a sweep would run, said before anything runs: one key spelled twice, grid axes that
cannot add runs, the run cap counted without expanding, executor flags that do not apply,
and the --dry-run plan that explains every run that collapses into another."""

from __future__ import annotations

import os
import textwrap
import types
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.run.plan import run_id
from creditaudit.sweep import count_runs, expand_grid, load_sweep
from creditaudit.sweep import grid as grid_module
from integrity_support import assert_one_line_error, write_idx_dataset
from sweep_files import write_tiny_sweep


def sweep_file(tmp_path: Path, body: str) -> Path:
    """``tmp_path``/s.toml: ``body`` over the tiny [base], its runs in ``tmp_path``/out."""
    return write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", body)


# --- one key, two spellings ----------------------------------------------------------------
def test_one_key_spelled_twice_is_an_error_naming_both(tmp_path):
    # TOML keeps both: the quoted key "method.name" and the key name of table [grid.method].
    path = sweep_file(tmp_path, """
        [grid]
        "method.name" = ["fa"]
        [grid.method]
        name = ["bp"]
    """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    message = str(err.value)
    assert "[grid]" in message and "method.name is given twice" in message
    assert 'as "method.name" and as method.name' in message
    path = sweep_file(tmp_path, """
        [grid]
        "run.seed" = [1, 2]
        [[include]]
        "method.name" = "fa"
        method.name = "bp"
    """)
    with pytest.raises(ConfigError, match=r"\[\[include\]\] 1: key method\.name is given twice"):
        load_sweep(path)
    with pytest.raises(ConfigError, match="given twice"):  # the Python API as well
        expand_grid(RunConfig(), {"method.name": ["fa"], "method": {"name": ["bp"]}})


def test_one_key_spelled_twice_is_one_line_on_the_command_line(tmp_path, capsys):
    path = sweep_file(tmp_path, """
        [grid]
        "method.name" = ["fa"]
        [grid.method]
        name = ["bp"]
    """)
    assert main(["sweep", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, '"method.name"', "method.name", "keep one")
    assert "bp-" not in out and "fa-" not in out  # no plan printed


def test_a_train_subset_larger_than_generated_data_stops_the_plan_before_any_run(tmp_path,
                                                                                 capsys):
    """Generated data declare their sizes: a subset past them cannot start, so the sweep
    (and its dry run) stops at planning, naming the run, instead of training the others and
    recording this one failed."""
    path = sweep_file(tmp_path, """
        [grid]
        "data.train_subset" = [100, 500]
    """)
    assert main(["sweep", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "run train_subset=500: data.train_subset=500 exceeds the "
                          "256 training samples of synthetic; use at most 256")
    assert "to run" not in out


# --- axes that cannot add runs -------------------------------------------------------------
@pytest.mark.parametrize(("axis", "fragment"), [
    ('"run.out_dir" = ["a", "b"]',
     "grid axis run.out_dir does not change what a run computes (it is not part of the run "
     "id): its 2 values give 1 run"),
    ('"diagnostics.frozen_acc" = [0.1, 0.9]',
     "grid axis diagnostics.frozen_acc does not change what a run computes"),
    ('"method.penalty" = [0, 0.01, 0.0]',
     "grid axis method.penalty lists one value twice (0 and 0.0): its 3 values give 2 runs"),
])
def test_a_grid_axis_that_cannot_add_runs_is_an_error(tmp_path, axis, fragment):
    path = sweep_file(tmp_path, f"""
        [grid]
        "method.name" = ["bp", "dfa"]
        {axis}
    """)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert fragment in str(err.value)


def _one_folder_three_ways(tmp_path: Path, monkeypatch, body: str) -> Path:
    """A sweep file over MNIST-layout files in ``tmp_path``/x, run from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    write_idx_dataset(tmp_path / "x")
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(f"""
        [base.data]
        name = "mnist"
        data_dir = "x"
        [base.run]
        out_dir = "{tmp_path / 'out'}"
    """) + textwrap.dedent(body))
    return path


def test_one_data_folder_spelled_three_ways_is_one_value(tmp_path, monkeypatch):
    """``x``, its absolute path and ``./x/`` are one folder: an axis of them is one value
    listed three times, refused as a repeated value is (it said 3 runs, and ran 1)."""
    path = _one_folder_three_ways(tmp_path, monkeypatch, f"""
        [grid]
        "data.data_dir" = ["x", "{tmp_path / 'x'}", "./x/"]
    """)
    with pytest.raises(ConfigError, match=r"grid axis data\.data_dir lists one value 3 times "
                                          r"\('x' and '.*' and '\./x/'\): its 3 values give 1 "
                                          r"run; list each value once"):
        load_sweep(path)


def test_a_dry_run_header_counts_each_folder_once(tmp_path, monkeypatch, capsys):
    """An [[include]] run that names the [base] folder another way is the [base] run: the
    dry run's first line counts one run, as its last does."""
    path = _one_folder_three_ways(tmp_path, monkeypatch, """
        [[include]]
        "data.data_dir" = "./x/"
    """)
    assert main(["sweep", str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"sweep {path}: the [base] run + 1 [[include]] run → 1 run in "
                        f"{tmp_path / 'out'}")
    assert "1 run: 0 done or skipped, 1 to run" in lines[-1]


def test_a_command_line_override_of_an_axis_is_a_named_warning(tmp_path, capsys):
    """--precision bf16 over a run.precision axis: the user asked for it, so the sweep runs,
    and says that the axis collapsed."""
    path = sweep_file(tmp_path, """
        [grid]
        "method.name" = ["bp", "dfa"]
        "run.precision" = ["fp32", "bf16"]
    """)
    expansion = load_sweep(path).expand({"run.precision": "bf16"})
    assert [c.run.precision for c in expansion.configs] == ["bf16", "bf16"]
    assert expansion.warnings == [
        "grid axis run.precision is set for every run by the command line "
        "(run.precision='bf16'): its 2 values give 1 run"]
    assert main(["sweep", str(path), "--precision", "bf16", "--dry-run"]) == 0
    assert "warning: grid axis run.precision is set for every run" in capsys.readouterr().out


# --- the run cap -----------------------------------------------------------------------------
def test_the_run_count_is_capped_before_anything_is_expanded(tmp_path, monkeypatch):
    """30^7 combinations: counted and refused; itertools.product is never called."""
    def product(*_: object) -> None:
        raise AssertionError("the grid was expanded")

    monkeypatch.setattr(grid_module, "itertools", types.SimpleNamespace(product=product))
    axes = ["run.seed", "method.penalty", "optim.lr", "model.d", "optim.epochs",
            "data.n_train", "data.n_test"]
    body = "[grid]\n" + "".join(f'"{key}" = [{", ".join(str(i + 1) for i in range(30))}]\n'
                                for key in axes)
    path = sweep_file(tmp_path, body + '[[include]]\n"run.seed" = 99\n')
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert "the sweep has 21,870,000,001 runs (30 × 30 × 30 × 30 × 30 × 30 × 30 grid " \
           "combinations + 1 [[include]] runs), more than --max-runs 10,000" in str(err.value)
    assert count_runs({"a": [1, 2], "b": [1, 2, 3]}, [{}]) == 7
    assert count_runs({}) == 1  # no grid: the [base] run


def test_max_runs_sets_the_cap(tmp_path, capsys):
    path = sweep_file(tmp_path, """
        [grid]
        "method.name" = ["bp", "dfa", "fa"]
        "run.seed" = [1, 2, 3]
    """)
    assert main(["sweep", str(path), "--dry-run", "--max-runs", "8"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "has 9 runs (3 × 3 grid combinations + 0 [[include]] runs)",
                          "more than --max-runs 8")
    assert main(["sweep", str(path), "--dry-run", "--max-runs", "9"]) == 0
    assert "9 runs: 0 done or skipped, 9 to run" in capsys.readouterr().out


# --- executor flags --------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "fragments"), [
    (["--gpus-per-run", "1"], ["--gpus-per-run is for --executor ray", "local executor"]),
    (["--workers", "0", "--gpus-per-run", "0.5"], ["--gpus-per-run is for --executor ray"]),
    (["--address", "auto"], ["--address is for --executor ray"]),
    (["--unschedulable-after", "5"], ["--unschedulable-after is for --executor ray"]),
    (["--executor", "ray", "--unschedulable-after", "-5"],
     ["--unschedulable-after must be a positive number of seconds, got -5"]),
    (["--executor", "ray", "--gpus-per-run", "-1"], ["--gpus-per-run must be >= 0, got -1"]),
    (["--executor", "ray", "--workers", "2"], ["--workers is for --executor local"]),
    (["--workers", "-1"], ["--workers must be >= 0"]),
    (["--threads-per-worker", "0"], ["--threads-per-worker must be >= 1"]),
    (["--max-runs", "0"], ["--max-runs must be >= 1"]),
])
def test_flags_that_do_not_apply_are_refused_even_in_a_dry_run(tmp_path, capsys, flags,
                                                               fragments):
    path = sweep_file(tmp_path, '[grid]\n"method.name" = ["bp"]\n')
    for dry_run in (["--dry-run"], []):
        assert main(["sweep", str(path), *flags, *dry_run]) == 2, (flags, dry_run)
        out, err = capsys.readouterr()
        assert_one_line_error(out, err, *fragments)
        assert not (tmp_path / "out").exists()  # refused before anything was written


# --- the dry run -----------------------------------------------------------------------------
def test_dry_run_says_what_would_run_and_why_runs_collapse(tmp_path, capsys):
    # Two folders holding the same MNIST-layout files: one data fingerprint, one run id.
    for folder in ("one", "two"):
        write_idx_dataset(tmp_path / folder)
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(f"""
        [base.data]
        name = "mnist"
        data_dir = "{tmp_path / 'one'}"
        [base.run]
        out_dir = "{tmp_path / 'out'}"

        [grid]
        "method.name" = ["bp", "dfa"]
        "data.data_dir" = ["{tmp_path / 'one'}", "{tmp_path / 'two'}"]

        [[include]]
        "method.name" = "dfa"
        "data.data_dir" = "{tmp_path / 'one'}"

        [[include]]
        "method.name" = "frozen"
    """))
    assert main(["sweep", str(path), "--dry-run", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (f"sweep {path}: 2 × 2 grid combinations (method.name × data.data_dir)"
                        f" + 2 [[include]] runs → 5 configs, 3 runs in {tmp_path / 'out'}")
    assert lines[1] == "executor: local executor, 2 worker processes × 1 thread"
    # An include that repeats a grid combination.
    one = tmp_path / "one"
    assert (f"note: [[include]] run 1 {{method.name='dfa', data.data_dir='{one}'}} is the run "
            f"of grid combination {{method.name='dfa', data.data_dir='{one}'}}: it runs "
            "once") in lines
    # The same data in another folder: one run id.
    configs = load_sweep(path).configs()
    assert len(configs) == 5 and run_id(configs[0]) == run_id(configs[1])
    second = next(line for line in lines if line.startswith("name=bp ") and "two" in line)
    assert second.endswith("(the same data in another folder): runs once")
    assert "3 runs: 0 done or skipped, 3 to run" in out
    assert not (tmp_path / "out").exists()  # nothing ran


def test_dry_run_names_the_ray_executor_without_contacting_it(tmp_path, capsys):
    path = sweep_file(tmp_path, '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(path), "--dry-run", "--executor", "ray", "--address",
                 "10.0.0.1:6379", "--threads-per-worker", "2", "--gpus-per-run", "0.25"]) == 0
    assert ("executor: ray executor on the Ray cluster at 10.0.0.1:6379, each run asking for 2 "
            "CPU, 0.25 GPU (--dry-run does not contact Ray)") in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_the_default_workers_fill_the_cpus_this_process_may_use(tmp_path, capsys, monkeypatch):
    """Without --workers, a local sweep starts as many workers as the CPUs this process may
    run on (its affinity: taskset, a Slurm job's cpuset) hold with --threads-per-worker
    threads each. It counted every CPU of the machine (os.cpu_count): in a 2-CPU job on a
    64-CPU node it started 64 workers, each importing torch, on 2 CPUs."""
    from creditaudit.sweep import LocalExecutor

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5})
    path = sweep_file(tmp_path, '[grid]\n"run.seed" = [1, 2, 3, 4]\n')
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert "executor: local executor, 2 worker processes × 1 thread" in capsys.readouterr().out
    assert main(["sweep", str(path), "--dry-run", "--threads-per-worker", "2"]) == 0
    assert "executor: local executor, 1 worker process × 2 threads" in capsys.readouterr().out
    assert LocalExecutor().workers == 2
    assert LocalExecutor(threads_per_worker=2).workers == 1
    assert LocalExecutor(threads_per_worker=4).workers == 1  # at least one
    assert LocalExecutor(workers=8).workers == 8  # as asked


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_the_default_workers_stay_within_the_cpu_quota(tmp_path, monkeypatch):
    """A container's CPU quota (docker run --cpus 2, a Kubernetes limit) caps the default
    workers as the affinity does: with 64 CPUs in its affinity a 2-CPU container started
    64 workers, each importing torch. cgroup v2 and v1, the smallest limit on the path."""
    from creditaudit.sweep import LocalExecutor, executors

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    root, proc = tmp_path / "cgroup", tmp_path / "proc_cgroup"
    monkeypatch.setattr(executors, "CGROUP_ROOT", root)
    monkeypatch.setattr(executors, "PROC_CGROUP", proc)
    job = root / "jobs" / "one"
    job.mkdir(parents=True)
    proc.write_text("0::/jobs/one\n")
    (root / "cpu.max").write_text("max 100000\n")
    assert executors.cpu_quota(root, proc) is None and LocalExecutor().workers == 64
    (root / "jobs" / "cpu.max").write_text("800000 100000\n")
    (job / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2 workers, rounded up
    assert executors.cpu_quota(root, proc) == 1.5 and LocalExecutor().workers == 2
    v1 = root / "cpu,cpuacct"
    v1.mkdir()
    proc.write_text("4:memory:/x\n2:cpu,cpuacct:/\n")
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert LocalExecutor().workers == 3
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert LocalExecutor().workers == 64
    proc.unlink()  # no cgroups to read (not Linux): the affinity alone
    assert LocalExecutor().workers == 64


def test_a_grid_varies_a_factory_argument_as_set_does(tmp_path):
    """``model.args.d`` is a grid key as it is a --set key: each run gets its own value in
    the factory's arguments (and its own id), and the sweep's labels say which."""
    from creditaudit.sweep.plans import plan_runs, run_labels

    base = {"data": {"name": "synthetic", "n_train": 64, "n_test": 32},
            "model": {"arch": "module", "factory": "creditaudit.testing.zoo:TransformerClassifier",
                      "states": ["encoder.layers.0", "encoder.layers.1"],
                      "args": {"image_shape": [1, 16, 16], "patch": [4, 4], "d": 16,
                               "depth": 2, "heads": 2}},
            "run": {"out_dir": str(tmp_path)}}
    configs = expand_grid(base, {"model.args.d": [16, 32]})
    assert [c.model.args["d"] for c in configs] == [16, 32]
    assert all(c.model.args["depth"] == 2 for c in configs)  # the rest of the table kept
    plans = plan_runs(configs, ["model.args.d"])
    assert len({plan.run_id for plan in plans}) == 2
    assert run_labels(plans, ["model.args.d"]) == ["d=16", "d=32"]
    with pytest.raises(ConfigError, match="sweep key 'model.argz.d' is not a config field"):
        expand_grid(base, {"model.argz.d": [16]})
