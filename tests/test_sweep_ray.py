"""The Ray executor on a local 2-CPU Ray instance (no GPU): resource checks before any task,
the unschedulable deadline, the real number of parallel runs, and training through Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.run_ids import run_id
from creditaudit.sweep import SUMMARY_FILE, SWEEP_LOG_FILE, load_sweep, prepare_configs, run_sweep
from creditaudit.sweep.ray_cluster import check_one_run_fits, parallel_runs
from integrity_support import assert_one_line_error

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY,
                               reason="ray is not installed (pip install 'creditaudit[ray]')")

SWEEP = """
[base.data]
n_train = 256
n_test = 128
in_dim = 8
[base.model]
d = 16
n_blocks = 2
[base.optim]
epochs = 1
batch_size = 64
[base.diagnostics]
eval_samples = 128
rho_samples = 16
rho_directions = 2
null_draws = 2
[base.run]
out_dir = "{out}"
[grid]
"method.name" = ["bp", "dfa"]
"""


def sweep_file(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(out=out))
    return path, out


@pytest.fixture(scope="module")
def ray_2cpu():
    """One local Ray instance with 2 CPUs and no GPU for the whole module."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'creditaudit[ray]')")
    import ray

    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# --- pure helpers ----------------------------------------------------------------------------
def test_parallel_runs_is_the_tightest_resource():
    assert parallel_runs({"CPU": 32.0, "GPU": 4.0}, 2, 0) == 16
    assert parallel_runs({"CPU": 32.0, "GPU": 4.0}, 2, 1) == 4
    assert parallel_runs({"CPU": 32.0, "GPU": 1.0}, 1, 0.25) == 4  # fractions, no rounding loss
    assert parallel_runs({"CPU": 3.0}, 2, 0) == 1
    assert parallel_runs({"CPU": 2.0}, 4, 0) == 0
    assert parallel_runs({"CPU": 8.0}, 1, 1) == 0  # no GPU key at all


def test_one_run_must_fit_the_whole_cluster():
    check_one_run_fits({"CPU": 2.0, "GPU": 1.0}, 2, 0.5, " at auto")  # fits: no error
    with pytest.raises(ConfigError,
                       match=r"asks for 1 GPU .* cluster at auto has 0 GPU \(2 CPU, 0 GPU\)"):
        check_one_run_fits({"CPU": 2.0}, 1, 1, " at auto")
    with pytest.raises(ConfigError, match=r"asks for 4 CPU .* has 2 CPU .*--threads-per-worker"):
        check_one_run_fits({"CPU": 2.0}, 4, 0, "")


# --- against a live local Ray ----------------------------------------------------------------
@needs_ray
def test_cuda_sweep_on_a_cluster_without_gpu_stops_before_any_task(ray_2cpu, tmp_path, capsys):
    path, out = sweep_file(tmp_path)
    started = time.perf_counter()
    code = main(["sweep", str(path), "--executor", "ray", "--device", "cuda"])
    _, err = capsys.readouterr()
    assert code == 2
    line = assert_one_line_error("", err, "asks for 1 GPU", "has 0 GPU", "--device cpu")
    assert "2 CPU" in line
    assert time.perf_counter() - started < 60  # an answer, not a wait
    assert not out.exists()  # nothing submitted, no folder, no log
    assert ray_2cpu.is_initialized()  # a Ray the sweep did not start is left running


@needs_ray
def test_more_cpus_per_run_than_the_cluster_has_is_one_line(ray_2cpu, tmp_path, capsys):
    path, out = sweep_file(tmp_path)
    code = main(["sweep", str(path), "--executor", "ray", "--threads-per-worker", "4"])
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_line_error("", err, "asks for 4 CPU", "has 2 CPU", "--threads-per-worker")
    assert not out.exists()


@needs_ray
def test_unschedulable_runs_fail_with_the_reason_then_train_next_time(ray_2cpu, tmp_path,
                                                                       capsys):
    """Another job holds both CPUs: the sweep's runs never start, and after the (tiny)
    deadline each fails with why. Once the CPUs are free the same sweep trains them, two at
    a time, as its header says."""
    from creditaudit.sweep import RayExecutor

    ray = ray_2cpu
    path, out = sweep_file(tmp_path)
    configs = prepare_configs(load_sweep(path).configs(), threads=1)

    @ray.remote(num_cpus=2)
    def hold() -> None:
        time.sleep(300)

    blocker = hold.remote()
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0.0) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert ray.available_resources().get("CPU", 0.0) == 0, "the blocker never started"
        executor = RayExecutor(num_cpus_per_run=1, unschedulable_after=0.5, poll_seconds=0.1)
        result = run_sweep(configs, executor)
    finally:
        ray.cancel(blocker, force=True)
    assert [o["status"] for o in result.outcomes] == ["failed", "failed"]
    for outcome in result.outcomes:
        assert outcome["action"] == "not started" and "unschedulable" in outcome["error"]
        assert "each run asks for 1 CPU, 0 GPU" in outcome["error"]
        assert "2 CPU, 0 GPU in all and 0 CPU, 0 GPU free" in outcome["error"]
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert [run["status"] for run in summary["runs"]] == ["failed", "failed"]
    assert "unschedulable" in summary["runs"][0]["error"]
    for config in configs:  # never started: no record, no start event, no claim
        assert not (out / run_id(config) / RECORD_FILE).exists()
    assert not (out / SWEEP_LOG_FILE).exists()

    capsys.readouterr()
    code = main(["sweep", str(path), "--executor", "ray"])
    stdout, _ = capsys.readouterr()
    assert code == 0, stdout
    header = stdout.splitlines()[0]
    assert "ray executor on 2 CPU, 0 GPU, 2 parallel runs × 1 thread" in header, header
    for config in configs:
        assert load_record(out / run_id(config)).status == "completed"
    starts = [json.loads(line) for line in (out / SWEEP_LOG_FILE).read_text().splitlines()
              if json.loads(line)["event"] == "start"]
    assert len(starts) == 2 and os.getpid() not in {e["pid"] for e in starts}


@needs_ray
def test_unschedulable_after_must_be_positive_and_is_for_ray_only(ray_2cpu, tmp_path, capsys):
    path, _ = sweep_file(tmp_path)
    assert main(["sweep", str(path), "--executor", "ray", "--unschedulable-after", "0"]) == 2
    assert_one_line_error("", capsys.readouterr().err, "--unschedulable-after")
    assert main(["sweep", str(path), "--unschedulable-after", "5"]) == 2
    assert_one_line_error("", capsys.readouterr().err, "is for --executor ray")
