"""The Ray executor on a local 2-CPU Ray instance (no GPU): resource checks before any task,
the unschedulable deadline, the real number of parallel runs, training through Ray, a Ray
head that is gone, and signals that end a Ray sweep promptly."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.run.plan import run_id
from creditaudit.sweep import (
    SUMMARY_FILE,
    SWEEP_LOG_FILE,
    load_sweep,
    prepare_configs,
    run_sweep,
)
from creditaudit.sweep.ray_cluster import (
    check_one_run_fits,
    keep_signal_handlers,
    parallel_runs,
)
from integrity_support import assert_one_line_error
from sweep_files import interrupt_sweep, write_tiny_sweep

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY,
                               reason="ray is not installed (pip install 'creditaudit[ray]')")

# The end-of-run diagnostics on few samples: a run takes seconds.
DIAGNOSTICS = {"diagnostics.eval_samples": 128, "diagnostics.rho_samples": 16,
               "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2}


def sweep_file(tmp_path: Path, epochs: int = 1) -> tuple[Path, Path]:
    """(the sweep file, its output folder): BP and DFA on the tiny [base]."""
    out = tmp_path / "out"
    grid = '[grid]\n"method.name" = ["bp", "dfa"]\n'
    path = write_tiny_sweep(tmp_path / "sweep.toml", out, grid, epochs=epochs, base=DIAGNOSTICS)
    return path, out


@pytest.fixture(scope="module")
def ray_2cpu():
    """One local Ray instance with 2 CPUs and no GPU for the whole module."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'creditaudit[ray]')")
    import ray

    # ray.init installs its own SIGTERM handler and Ray's shutdown leaves it: the tests
    # after this module in the same worker get the handlers of before.
    with keep_signal_handlers():
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
def test_a_run_whose_ray_worker_dies_is_recorded_failed_with_the_cause(ray_2cpu, tmp_path):
    """A Ray worker killed under a run (the out-of-memory killer): Ray does not run the task
    again, so the run is recorded failed with the cause, its claim broken, instead of a
    record that says 'running' with nothing running it; its error names --retry-failed."""
    from creditaudit.sweep import RayExecutor

    path, out = sweep_file(tmp_path)
    config = prepare_configs(load_sweep(path).configs(), threads=1)[0]
    run_dir = out / run_id(config)

    def dies_mid_run(task: dict) -> dict:  # a worker that started the run, then was killed
        from creditaudit.config import config_from_dict
        from creditaudit.records import new_record, save_record
        from creditaudit.records.claims import try_claim

        claim, _ = try_claim(run_dir)
        assert claim is not None
        save_record(run_dir, new_record(config_from_dict(task["config"]), device="cpu",
                                        run_id=run_dir.name))
        os.kill(os.getpid(), signal.SIGKILL)
        return {}

    executor = RayExecutor(num_cpus_per_run=1, poll_seconds=0.1)
    (outcome,) = executor.map(dies_mid_run, [{"config": config.to_dict(),
                                             "run_id": run_dir.name}])
    assert outcome["status"] == "failed" and "worker died" in outcome["error"]
    assert "--retry-failed" in outcome["error"]
    record = load_record(run_dir)
    assert (record.status, record.error) == ("failed", outcome["error"])
    assert not (run_dir / "claim.json").exists()


@needs_ray
def test_what_a_ray_task_raised_is_its_outcome_in_one_line(ray_2cpu, tmp_path):
    """A run that a guest's KeyboardInterrupt stopped (recorded 'interrupted' by run_one,
    which raises it on) was reported failed with Ray's first line, 'Ray task failed:
    \x1b[36mray::_run_streaming()\x1b[39m (pid=…, ip=…)' (the progress line counting it
    failed, the summary interrupted), and so was a full disk as a run was claimed: the
    error said nothing of the disk. Now interrupted as in a local worker, and the error
    the task raised (in its own words, not its class's name)."""
    from creditaudit.sweep import RayExecutor

    def raises(task: dict) -> dict:
        from creditaudit.errors import DiskFullError

        if task["run_id"] == "a":
            raise KeyboardInterrupt
        raise DiskFullError("cannot claim the run: no space left on the device")

    tasks = [{"config": {"run": {"out_dir": str(tmp_path)}}, "run_id": name} for name in "ab"]
    outcomes = {o["run_id"]: o for o in RayExecutor(poll_seconds=0.1).map(raises, tasks)}
    assert outcomes["a"]["status"] == "interrupted"
    assert outcomes["b"]["status"] == "failed"
    assert outcomes["b"]["error"] == ("Ray task failed: cannot claim the run: no space left "
                                      "on the device")


@needs_ray
def test_an_interrupt_waits_at_most_unwind_seconds_for_a_run_that_does_not_stop(ray_2cpu,
                                                                               tmp_path):
    """Ctrl-C while a run hangs in a call that Ray's cancel does not interrupt (a guest
    blocked in C code: the cancel's KeyboardInterrupt waits for it to return): the sweep
    stops waiting after unwind_seconds, not when the task ends."""
    from creditaudit.sweep import RayExecutor

    def task(task: dict) -> dict:
        done = Path(task["quick_done"])
        if task["run_id"] == "hangs":
            while not done.exists():  # 'quick' ends first, however slow a worker starts
                time.sleep(0.05)
            time.sleep(12)  # one blocking call
        else:
            done.write_text("1")
        return {"run_id": task["run_id"], "status": "completed"}

    executor = RayExecutor(num_cpus_per_run=1, poll_seconds=0.1, unwind_seconds=2)
    marker = str(tmp_path / "quick_done")
    outcomes = executor.map(task, [{"run_id": "hangs", "quick_done": marker},
                                   {"run_id": "quick", "quick_done": marker}])
    assert next(outcomes)["run_id"] == "quick"
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        outcomes.throw(KeyboardInterrupt)
    assert time.monotonic() - started < 8


@needs_ray
def test_unschedulable_after_must_be_positive_and_is_for_ray_only(ray_2cpu, tmp_path, capsys):
    path, _ = sweep_file(tmp_path)
    assert main(["sweep", str(path), "--executor", "ray", "--unschedulable-after", "0"]) == 2
    assert_one_line_error("", capsys.readouterr().err, "--unschedulable-after")
    assert main(["sweep", str(path), "--unschedulable-after", "5"]) == 2
    assert_one_line_error("", capsys.readouterr().err, "is for --executor ray")


# --- a head that is gone, and signals ----------------------------------------------------------
CLI = [sys.executable, "-m", "creditaudit"]


def free_address() -> str:
    """host:port where nothing listens (a Ray head that ended without `ray stop`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def ray_env(tmp_path: Path, cluster_address: str | None) -> dict[str, str]:
    """The environment of a sweep whose Ray finds ``cluster_address`` in its cluster file
    (RAY_TMPDIR/ray/ray_current_cluster, where `ray start` writes it)."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path / "raytmp")
    if cluster_address is not None:
        cluster_file = tmp_path / "raytmp" / "ray" / "ray_current_cluster"
        cluster_file.parent.mkdir(parents=True)
        cluster_file.write_text(cluster_address)
    return env


@needs_ray
def test_a_ray_head_that_does_not_answer_is_one_line(tmp_path, monkeypatch):
    from creditaudit.sweep.ray_cluster import check_address_answers

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    check_address_answers(None)  # no cluster file: ray.init starts a local Ray
    dead = free_address()
    cluster_file = tmp_path / "ray" / "ray_current_cluster"
    cluster_file.parent.mkdir()
    cluster_file.write_text(dead + "\n")
    for address in (None, "auto"):
        with pytest.raises(ConfigError) as err:
            check_address_answers(address)
        message = str(err.value)
        assert f"Ray's cluster file {cluster_file} names a head at {dead} that does not " \
               "answer" in message
        assert "`ray stop`" in message and "\n" not in message
    with socket.socket() as head:  # something answers there: ray.init may join it
        head.bind(("127.0.0.1", 0))
        head.listen()
        live = f"127.0.0.1:{head.getsockname()[1]}"
        cluster_file.write_text(live)
        check_address_answers(None)
        check_address_answers(live)
    with pytest.raises(ConfigError, match=rf"the Ray cluster at {dead} does not answer .*"
                                          "--address"):
        check_address_answers(dead)
    monkeypatch.setenv("RAY_ADDRESS", dead)
    with pytest.raises(ConfigError, match=rf"RAY_ADDRESS={dead} names a Ray cluster that does "
                                          "not answer"):
        check_address_answers(None)


@needs_ray
def test_a_sweep_on_a_stale_cluster_file_stops_at_once(tmp_path):
    """A head that died without `ray stop` left its cluster file: ray.init would retry it
    for about 13 minutes, deaf to Ctrl-C; the sweep says what is wrong in one line."""
    path, out = sweep_file(tmp_path)
    env = ray_env(tmp_path, free_address())
    started = time.monotonic()
    done = subprocess.run([*CLI, "sweep", str(path), "--executor", "ray"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done.stdout, done.stderr, "ray_current_cluster", "does not answer",
                          "ray stop")
    assert time.monotonic() - started < 60
    assert not out.exists()


@needs_ray
def test_ctrl_c_ends_a_sweep_while_ray_init_hangs(tmp_path, default_ctrl_c):
    """Something answers at the cluster file's address but is no Ray head: ray.init retries
    it for minutes without reacting to signals. Ctrl-C still ends the sweep in seconds."""
    path, out = sweep_file(tmp_path)
    with socket.socket() as impostor:
        impostor.bind(("0.0.0.0", 0))
        impostor.listen(16)  # accepts connections, never speaks Ray's protocol
        env = ray_env(tmp_path, f"127.0.0.1:{impostor.getsockname()[1]}")
        process = subprocess.Popen([*CLI, "sweep", str(path), "--executor", "ray"], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 90
            while not any("Connecting to existing Ray cluster" in line for line in lines):
                assert process.poll() is None, "".join(lines)
                assert time.monotonic() < deadline, "ray.init never started: " + "".join(lines)
                time.sleep(0.1)
            time.sleep(1.0)  # inside ray.init's retries now
            process.send_signal(signal.SIGINT)
            interrupted = time.monotonic()
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join(5)
    assert code == 130, "".join(lines)
    assert time.monotonic() - interrupted < 15
    assert "creditaudit: sweep interrupted while joining the executor" in lines[-1]
    assert not out.exists()


@pytest.mark.slow
@needs_ray
def test_sigterm_ends_a_ray_sweep_with_its_runs_resumable(ray_2cpu, tmp_path):
    """SIGTERM to a sweep on a running cluster: Ray's own handler would abort the process
    (core dump, runs left 'running' with their claims); the sweep cancels its tasks, each
    run records 'interrupted' and releases its claim, and the sweep exits 143."""
    path, out = sweep_file(tmp_path, epochs=500)
    configs = prepare_configs(load_sweep(path).configs(), threads=1)
    run_dirs = [out / run_id(config) for config in configs]
    address = ray_2cpu.get_runtime_context().gcs_address
    process = subprocess.Popen([*CLI, "sweep", str(path), "--executor", "ray", "--address",
                                address, "-q"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    interrupt_sweep(process, run_dirs, signal.SIGTERM)


# --- a worker that dies: what the sweep says of its run ---------------------------------------
class _DiesWhenUnpickled:
    """A task function whose unpickling ends the process: a Ray worker that dies before it
    begins the run (as one that cannot start)."""

    def __reduce__(self) -> tuple:
        return os._exit, (3,)


@needs_ray
def test_a_ray_worker_that_dies_before_it_begins_the_run_says_not_started(ray_2cpu, tmp_path):
    """Nothing of the run ran: no record, and the outcome says not started, and that the
    next sweep trains it (it said action 'trained')."""
    from creditaudit.sweep import RayExecutor

    path, out = sweep_file(tmp_path)
    config = prepare_configs(load_sweep(path).configs(), threads=1)[0]
    executor = RayExecutor(num_cpus_per_run=1, poll_seconds=0.1)
    (outcome,) = executor.map(_DiesWhenUnpickled(), [{"config": config.to_dict(),
                                                      "run_id": run_id(config)}])
    assert (outcome["status"], outcome["action"]) == ("failed", "not started"), outcome
    assert "worker died" in outcome["error"] and "never started" in outcome["error"]
    assert not (out / run_id(config)).exists()


@needs_ray
def test_a_ray_worker_ended_by_the_run_names_itself_and_the_attempts_action(ray_2cpu,
                                                                             tmp_path):
    """A run whose code calls os._exit in a Ray worker while it resumes the run: failed with
    the action resumed (it said trained) and the worker's pid, with both usual causes —
    the run's own code, or a kill — named (it said only Ray's 'the worker died
    unexpectedly')."""
    from creditaudit.sweep import RayExecutor
    from creditaudit.sweep.worker import append_event

    path, out = sweep_file(tmp_path)
    config = prepare_configs(load_sweep(path).configs(), threads=1)[0]
    run_dir = out / run_id(config)

    def exits_while_resuming(task: dict) -> dict:
        from creditaudit.config import config_from_dict
        from creditaudit.records import new_record, save_record
        from creditaudit.records.claims import try_claim

        try_claim(run_dir)
        save_record(run_dir, new_record(config_from_dict(task["config"]), device="cpu",
                                        run_id=run_dir.name))
        append_event(out, "start", run_dir.name, action="resumed")
        (tmp_path / "pid").write_text(str(os.getpid()))
        os._exit(3)

    executor = RayExecutor(num_cpus_per_run=1, poll_seconds=0.1)
    (outcome,) = executor.map(exits_while_resuming, [{"config": config.to_dict(),
                                                      "run_id": run_dir.name}])
    assert (outcome["status"], outcome["action"]) == ("failed", "resumed"), outcome
    pid = (tmp_path / "pid").read_text()
    assert f"Ray worker process {pid} died" in outcome["error"]
    assert "os._exit" in outcome["error"] and "out-of-memory" in outcome["error"]
    assert load_record(run_dir).status == "failed"


def test_a_ray_errors_exit_detail_is_said_as_a_local_workers_death():
    from creditaudit.sweep.deaths import ray_death_cause, ray_exit_code

    assert ray_exit_code("Worker exits with an exit code 3.") == 3
    assert ray_exit_code("Worker exits unexpectedly by a signal. SIGKILL") == -9
    assert ray_exit_code("The worker died unexpectedly while executing this task.") is None
    assert ray_death_cause(12, "Worker exits with an exit code 3.") == (
        "Ray worker process 12 exited with code 3 (code the run ran — a model factory, a "
        "plugin, or a library they call — ended the process, e.g. with os._exit; a run's "
        "code must return or raise)")
    assert "killed by SIGKILL (as the kernel's out-of-memory killer does: fewer runs at " \
        "once" in ray_death_cause(12, "Worker exits unexpectedly by a signal. signal 9")
