"""Sweeps: grid expansion, claims, skip/resume, failure isolation, executors, concurrency."""

from __future__ import annotations

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
import torch

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError, DataError, OutputError
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, load_record
from creditaudit.run.plan import run_id
from creditaudit.sweep import (
    CLAIM_FILE,
    SUMMARY_FILE,
    SWEEP_LOG_FILE,
    InlineExecutor,
    LocalExecutor,
    SweepState,
    claim_is_stale,
    expand_grid,
    load_sweep,
    prepare_configs,
    release_claim,
    run_sweep,
    try_claim,
)
from plugin_support import exiting_net_source
from sweep_files import TINY_SWEEP_BASE, interrupt_sweep, write_tiny_sweep

ROOT = Path(__file__).resolve().parents[1]

TINY = {**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128, "run.progress": False}


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def write_sweep(path: Path, out: Path, body: str, epochs: int = 1) -> Path:
    """The sweep file of :func:`tiny` runs: ``body`` over a [base] of TINY."""
    return write_tiny_sweep(path, out, body, epochs=epochs, base=TINY)


def events(out: Path, kind: str | None = None) -> list[dict]:
    path = out / SWEEP_LOG_FILE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if kind is None or row["event"] == kind]


def sweep(configs: list[RunConfig], executor=None, **kwargs):
    # One torch thread per run, as the sweep's workers use: tiny runs on a busy machine
    # spend most of their time in thread hand-offs otherwise.
    return run_sweep(prepare_configs(configs, threads=1), executor or InlineExecutor(),
                     **kwargs)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# --- grid expansion -------------------------------------------------------------------------
def test_expand_grid_is_the_cartesian_product_with_overrides_applied(tmp_path):
    base = tiny(tmp_path)
    grid = {"method.name": ["bp", "fa", "dfa"], "run.seed": [1, 2], "method.penalty": [0, 1e-2]}
    configs = expand_grid(base, grid)
    assert len(configs) == 12
    assert len({run_id(c) for c in configs}) == 12
    combos = [(c.method.name, c.run.seed, c.method.penalty) for c in configs]
    assert combos == [(m, s, p) for m in ("bp", "fa", "dfa") for s in (1, 2) for p in (0.0, 0.01)]
    assert all(isinstance(c.method.penalty, float) for c in configs)  # validated and coerced
    assert all(c.model.d == 16 and c.data.n_train == 256 for c in configs)  # base kept


def test_expand_grid_errors_name_the_key_or_the_combination(tmp_path):
    base = tiny(tmp_path)
    with pytest.raises(ConfigError, match=r"method\.name.*'nope'.*bp, fa, .*dfa"):
        expand_grid(base, {"method.name": ["bp", "nope"]})
    with pytest.raises(ConfigError, match=r"'method\.nam'"):
        expand_grid(base, {"method.nam": ["bp"]})
    with pytest.raises(ConfigError, match=r"'run\.seed' must map to a non-empty list"):
        expand_grid(base, {"run.seed": 42})
    # Valid on their own, invalid together: the message names the combination.
    with pytest.raises(ConfigError, match=r"grid combination \{model\.n_blocks=1, "
                                          r"method\.trainable_blocks=2\}.*exceeds"):
        expand_grid(base, {"model.n_blocks": [2, 1], "method.trainable_blocks": [2]})


def test_expand_grid_removes_duplicate_runs_keeping_order(tmp_path):
    base = tiny(tmp_path)
    # An include that repeats a grid run, and one that differs only in run.progress (which
    # does not change what a run computes): same run id, one run.
    configs = expand_grid(base, {"run.seed": [1, 2]},
                          include=[{"run.seed": 2}, {"run.seed": 3},
                                   {"run.seed": 3, "run.progress": True}])
    assert [c.run.seed for c in configs] == [1, 2, 3]


def test_load_sweep_reads_base_grid_and_include(tmp_path):
    path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
        [grid]
        "method.name" = ["bp", "dfa"]
        run.seed = [1, 2, 3]

        [[include]]
        method.name = "frozen"
    """)
    sweep_ = load_sweep(path)
    configs = sweep_.configs()
    assert len(configs) == 7
    assert sweep_.grid_keys == ["method.name", "run.seed"]
    assert configs[-1].method.name == "frozen" and configs[-1].run.seed == 42
    assert {c.model.d for c in configs} == {16}
    (tmp_path / "bad.toml").write_text("[grids]\n")
    with pytest.raises(ConfigError, match="unknown table 'grids'"):
        load_sweep(tmp_path / "bad.toml")
    (tmp_path / "typo.toml").write_text('[base.optim]\nepoch = 3\n[grid]\n"run.seed" = [1]\n')
    with pytest.raises(ConfigError, match=r"\[base\]: unknown key optim\.epoch"):
        load_sweep(tmp_path / "typo.toml")


def test_missing_data_stops_the_sweep_before_any_run(tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "no-mnist-here"
    configs = [tiny(out, **{"method.name": "dfa"}),
               RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(missing),
                                      "run.out_dir": str(out)})]
    with pytest.raises(DataError, match="no-mnist-here"):
        sweep(configs)
    assert not out.exists() or not list(out.glob("*/record.json"))


def test_base_may_be_completed_by_the_grid(tmp_path):
    # data.name = "mnist" alone lacks data.data_dir; every combination supplies one.
    base = {"data": {"name": "mnist"}, "run": {"out_dir": str(tmp_path)}}
    configs = expand_grid(base, {"data.data_dir": ["/a"], "run.seed": [1, 2]})
    assert [(c.data.data_dir, c.run.seed) for c in configs] == [("/a", 1), ("/a", 2)]


def test_shipped_example_sweep_expands(tmp_path):
    sweep_ = load_sweep(ROOT / "examples" / "sweeps" / "penalty_grid.toml")
    configs = sweep_.configs({"run.out_dir": str(tmp_path)})
    assert len(configs) == 3 * 4 * 3 + 3
    assert {c.method.name for c in configs} == {"bp", "fa", "dfa", "frozen"}


# --- skip, failures, divergence --------------------------------------------------------------
def test_second_sweep_trains_nothing(tmp_path):
    out = tmp_path / "out"
    configs = [tiny(out, **{"method.name": m}) for m in ("bp", "dfa")]
    first = sweep(configs)
    assert [o["action"] for o in first.outcomes] == ["trained", "trained"]
    records = [out / run_id(c) / RECORD_FILE for c in configs]
    mtimes = [p.stat().st_mtime_ns for p in records]
    second = sweep(configs)
    assert [o["action"] for o in second.outcomes] == ["skipped", "skipped"]
    assert [p.stat().st_mtime_ns for p in records] == mtimes
    assert len(events(out, "start")) == 2
    assert not list(out.rglob(CLAIM_FILE))


def test_failing_and_diverging_runs_do_not_stop_the_sweep(tmp_path, monkeypatch):
    from creditaudit.run.trainer import Trainer

    out = tmp_path / "out"
    configs = [
        tiny(out, **{"method.name": "fa"}),  # raises in its first epoch (below)
        tiny(out, **{"optim.lr": 1e8, "optim.schedule": "constant"}),  # diverges
        tiny(out, **{"method.name": "dfa"}),
    ]
    original = Trainer.train_epoch

    def broken(self, epoch):
        if self.config.method.name == "fa":
            raise RuntimeError("no data under /nowhere")
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", broken)
    result = sweep(configs, grid_keys=["method.name", "optim.lr"])
    summary = json.loads((out / SUMMARY_FILE).read_text())
    by_id = {run["run_id"]: run for run in summary["runs"]}
    failed, diverged, good = (by_id[run_id(c)] for c in configs)
    assert failed["status"] == "failed" and failed["error"].startswith("RuntimeError")
    assert "/nowhere" in failed["error"]
    assert diverged["status"] == "diverged"
    assert good["status"] == "completed" and good["error"] is None
    assert good["grid"] == {"method.name": "dfa", "optim.lr": 0.001}
    # The divergence is real: the record says where the loss stopped being finite.
    record = load_record(out / run_id(configs[1]))
    assert record.status == "diverged" and record.divergence["epoch"] == 1
    assert load_record(out / run_id(configs[0])).status == "failed"
    assert [o["status"] for o in result.outcomes] == ["failed", "diverged", "completed"]
    # Failed runs are skipped next time, retried with retry_failed.
    sweep(configs)
    assert len(events(out, "start")) == 3
    sweep(configs, retry_failed=True)
    assert len(events(out, "start")) == 4


def test_a_file_where_a_runs_folder_should_be_fails_that_run_only(tmp_path):
    """A plain file named like a run's folder (a stray download, a copy gone wrong) fails
    that run, named, in the summary; the sweep trains the others and the file is kept."""
    out = tmp_path / "out"
    configs = [tiny(out), tiny(out, **{"method.name": "dfa"})]
    blocked = out / run_id(configs[0])
    out.mkdir()
    blocked.write_text("not a folder")
    result = sweep(configs)
    first, second = result.outcomes
    assert first["status"] == "failed" and first["action"] == "refused"
    assert first["error"].startswith(f"{blocked}: a file stands where")  # no class name
    assert "move it away" in first["error"]
    assert second["status"] == "completed"
    assert blocked.read_text() == "not a folder"
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert [run["status"] for run in summary["runs"]] == ["failed", "completed"]


def test_worker_with_another_run_id_refuses_the_run(tmp_path):
    from creditaudit.sweep import run_one

    config = tiny(tmp_path / "out")
    outcome = run_one(config.to_dict(), run_id="bp-resmlp-synthetic-s42-0000000000")
    assert outcome["status"] == "failed" and outcome["action"] == "refused"
    assert "different creditaudit versions" in outcome["error"]
    assert not (tmp_path / "out").exists()


def test_a_worker_names_data_that_changed_since_the_sweep_planned_its_run(tmp_path):
    """A sweep plans every run first; a worker whose data folder changed meanwhile refuses
    the run naming the data and its fingerprints, not "different creditaudit versions"."""
    from creditaudit.run.plan import plan_run
    from creditaudit.sweep.runner import _tasks
    from creditaudit.sweep.worker import run_task
    from integrity_support import tiny_config, write_idx_dataset

    data = write_idx_dataset(tmp_path / "data")
    plan = plan_run(RunConfig().replace(**tiny_config(data, tmp_path / "out")))
    task, = _tasks([plan], 1)
    write_idx_dataset(data, seed=1)  # the folder changes before the worker plans the run
    outcome = run_task(task)
    assert outcome["status"] == "failed" and outcome["action"] == "refused"
    assert outcome["error"].startswith(
        f"the mnist data changed since the sweep planned this run (fingerprint "
        f"{plan.identity.fingerprint[:12]}… then, "), outcome["error"]
    assert f"no longer the data of run {plan.run_id}" in outcome["error"]
    assert not (tmp_path / "out").exists()


def test_every_outcome_has_the_typed_keys(tmp_path):
    """Workers, interrupts and dead workers all report an Outcome: its required keys, no
    other (the sweep's summary, progress line and log read them by name)."""
    from creditaudit.sweep.outcome import Outcome
    from creditaudit.sweep.worker import failed_outcome, interrupted_outcome, run_one

    required = Outcome.__required_keys__
    config = tiny(tmp_path / "out")
    outcomes = [run_one(config.to_dict()), run_one(config.to_dict()),  # trained, skipped
                interrupted_outcome({"run_id": "x"}), failed_outcome({"run_id": "x"}, "died"),
                *interrupted_outcome({"run_ids": ["x", "y"]})]
    assert [o["action"] for o in outcomes[:2]] == ["trained", "skipped"]
    for outcome in outcomes:
        assert required <= set(outcome) <= set(Outcome.__annotations__), outcome


# --- executors --------------------------------------------------------------------------
def test_local_executor_two_workers(tmp_path):
    out = tmp_path / "out"
    configs = [tiny(out, **{"method.name": m, "run.seed": s})
               for m in ("bp", "dfa") for s in (1, 2)]
    result = run_sweep(prepare_configs(configs, threads=1),
                       LocalExecutor(workers=2, threads_per_worker=1))
    assert [o["status"] for o in result.outcomes] == ["completed"] * 4
    starts = events(out, "start")
    assert sorted(e["run_id"] for e in starts) == sorted(run_id(c) for c in configs)
    pids = {e["pid"] for e in starts}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes did the work
    for config in configs:
        record = load_record(out / run_id(config))
        assert record.environment["torch_threads"] == 1
    assert not list(out.rglob(CLAIM_FILE))


def deaf_run(task: dict) -> dict:
    """A run that ignores SIGTERM and SIGINT (module level: a spawned worker imports it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Path(task["started"]).write_text(str(os.getpid()))
    time.sleep(120)
    return {"run_id": task["run_id"], "status": "completed"}


def test_an_interrupted_local_sweep_does_not_wait_for_a_worker_that_ignores_it(
        tmp_path, monkeypatch, default_ctrl_c):
    """Ctrl-C: the workers get SIGTERM and some time to record 'interrupted'; one that does
    not stop is killed after executors.UNWIND_SECONDS instead of holding the sweep."""
    from creditaudit.sweep import executors

    monkeypatch.setattr(executors, "UNWIND_SECONDS", 1.0)
    started = tmp_path / "started"
    main_thread = threading.main_thread().ident
    interrupted: list[float] = []

    def interrupt_once_started() -> None:
        deadline = time.monotonic() + 90
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        interrupted.append(time.monotonic())
        signal.pthread_kill(main_thread, signal.SIGINT)  # Ctrl-C, to the waiting thread

    interrupter = threading.Thread(target=interrupt_once_started, daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        list(LocalExecutor(workers=1).map(deaf_run, [{"run_id": "deaf",
                                                      "started": str(started)}]))
    interrupter.join()
    assert started.exists(), "the worker never started its run"
    pid = int(started.read_text())
    assert time.monotonic() - interrupted[0] < 30  # not the 120 s the run sleeps
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, not left behind


def test_ray_executor_without_ray_says_how_to_install(monkeypatch):
    from creditaudit.sweep import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(ConfigError, match=r"pip install 'creditaudit\[ray\]'"):
        RayExecutor()


# --- claims -----------------------------------------------------------------------------------
def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_claim(run_dir: Path, pid: int, host: str | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM_FILE
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                "time": "then", "token": "someone-else"}))
    return path


def test_only_one_of_many_racing_claims_wins(tmp_path):
    results = []
    barrier = threading.Barrier(8)

    def grab():
        barrier.wait()
        results.append(try_claim(tmp_path / "run"))

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [claim for claim, _ in results if claim is not None]
    assert len(winners) == 1
    # A loser sees the winner's claim, or (None) a claim file the winner is still writing.
    assert all(holder is None or holder["pid"] == os.getpid()
               for claim, holder in results if claim is None)
    release_claim(winners[0])
    assert not (tmp_path / "run" / CLAIM_FILE).exists()
    assert try_claim(tmp_path / "run")[0] is not None


def test_claim_staleness_rules():
    host = socket.gethostname()
    assert claim_is_stale({"pid": dead_pid(), "host": host}, age=0.0, stale_after=900) \
        == "dead process"
    assert claim_is_stale({"pid": os.getpid(), "host": host}, age=10.0, stale_after=900) is None
    assert claim_is_stale({"pid": os.getpid(), "host": host}, age=901.0, stale_after=900) \
        == "stale"
    # Another host's pid cannot be checked: only the age counts.
    assert claim_is_stale({"pid": dead_pid(), "host": "elsewhere"}, age=10, stale_after=900) \
        is None


def test_a_claim_of_an_impossible_pid_is_of_a_dead_process():
    """Valid JSON of a pid past any there can be ended the sweep in 'internal error:
    OverflowError' (os.kill takes a C int)."""
    host = socket.gethostname()
    for pid in (2**31, 10**30):
        assert claim_is_stale({"pid": pid, "host": host}, age=0.0, stale_after=900) \
            == "dead process"


@pytest.mark.parametrize("plant", ["named-pipe", "symlink-to-dev-zero"])
def test_a_claim_that_is_no_regular_file_reads_as_unreadable(tmp_path, plant):
    """Reading the claim used to block on a named pipe, and read /dev/zero forever."""
    from creditaudit.records.claim_files import read_claim

    path = tmp_path / CLAIM_FILE
    found: list[object] = []
    if plant == "named-pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    worker = threading.Thread(target=lambda: found.append(read_claim(path)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    blocked = worker.is_alive()
    if blocked and plant == "named-pipe":  # give the pipe a writer, so that the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked
    holder, raw, mtime = found[0]
    assert holder is None and raw == b"" and mtime is not None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_claim_of_a_killed_process_not_yet_reaped_is_of_a_dead_process():
    """A killed worker stays a zombie until its parent waits for it (a Ray worker until the
    raylet does): its claim is a dead process's, broken at once, not held for 15 minutes."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 60
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.time() < deadline, "the child never exited"
        time.sleep(0.05)
    try:
        assert claim_is_stale({"pid": zombie.pid, "host": socket.gethostname()}, age=0.0,
                              stale_after=900) == "dead process"
    finally:
        zombie.wait()


def test_stale_claim_of_a_dead_process_is_broken(tmp_path):
    out = tmp_path / "out"
    config = tiny(out)
    claim = write_claim(out / run_id(config), dead_pid())
    result = sweep([config])
    assert result.outcomes[0]["status"] == "completed"
    assert not claim.exists()
    assert [e["reason"] for e in events(out, "break_claim")] == ["dead process"]


def test_live_claim_is_respected_and_old_claim_of_another_host_is_broken(tmp_path):
    out = tmp_path / "out"
    config = tiny(out)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim = write_claim(out / run_id(config), sleeper.pid)
        result = sweep([config], wait_for_others=False)
        assert result.outcomes[0]["status"] == "busy"
        assert not (out / run_id(config) / RECORD_FILE).exists()
        assert claim.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    claim = write_claim(out / run_id(config), 1, host="elsewhere")
    old = time.time() - 3600
    os.utime(claim, (old, old))
    result = sweep([config], stale_after=60)
    assert result.outcomes[0]["status"] == "completed"
    assert [e["reason"] for e in events(out, "break_claim")] == ["stale"]


def test_a_sweep_waits_for_a_run_another_process_holds_without_starting_workers(tmp_path):
    """While another process trains a run, the sweep watches its claim from its own
    process; it used to give the run to a new pool every poll (each local worker paying
    spawn and torch import: a core burnt for as long as the other run trained). The run
    the other process completes is reported skipped, with no worker started for it."""
    from creditaudit.records.claims import release_claim, try_claim
    from creditaudit.run.trainer import train

    out = tmp_path / "out"
    config = prepare_configs([tiny(out)], threads=1)[0]
    # The other process: this one's thread, holding the claim (train() trains under it).
    claim, _ = try_claim(out / run_id(config))
    calls = []

    class Counting(InlineExecutor):
        def map(self, fn, tasks):  # noqa: ANN001, ANN202
            calls.append([task["run_id"] for task in tasks])
            yield from super().map(fn, tasks)

    def other_process_trains() -> None:
        time.sleep(0.5)
        try:
            train(config)
        finally:
            release_claim(claim)

    thread = threading.Thread(target=other_process_trains)
    thread.start()
    try:
        result = sweep([config], Counting(), poll_seconds=0.05)
    finally:
        thread.join()
    assert calls == [[run_id(config)]]  # the first look only
    assert [(o["status"], o["action"]) for o in result.outcomes] == [("completed", "skipped")]


# --- processes: concurrent sweeps, a killed sweep --------------------------------------------
CLI = [sys.executable, "-c", "import sys; from creditaudit.cli import main; sys.exit(main())"]


def test_two_concurrent_sweeps_run_every_run_exactly_once(tmp_path):
    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, """
        [grid]
        "method.name" = ["bp", "dfa"]
        "run.seed" = [1, 2]
    """, epochs=2)
    command = [*CLI, "sweep", str(path), "--workers", "0"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    configs = load_sweep(path).configs()
    starts = events(out, "start")
    assert sorted(e["run_id"] for e in starts) == sorted(run_id(c) for c in configs)
    assert all(load_record(out / run_id(c)).status == "completed" for c in configs)
    assert not list(out.rglob(CLAIM_FILE)) and not list(out.rglob("*.break"))
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["counts"] == {"completed": 4}


def test_killed_sweep_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, """
        [grid]
        "method.name" = ["bp"]
    """, epochs=30)
    config = load_sweep(path).configs()[0]
    record_path = out / run_id(config) / RECORD_FILE
    process = subprocess.Popen([*CLI, "sweep", str(path), "--workers", "0"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            if (out / run_id(config) / CHECKPOINT_FILE).exists() and record_path.exists() \
                    and len(load_record(record_path).log) >= 3:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the sweep never checkpointed")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert (out / run_id(config) / CLAIM_FILE).exists()  # left behind by the killed process
    assert load_record(record_path).status == "running"  # killed mid-run
    result = sweep([config])
    assert result.outcomes[0]["action"] == "resumed"
    record = load_record(record_path)
    assert record.status == "completed"
    assert [e.epoch for e in record.log] == list(range(31))
    starts = events(out, "start")
    assert [e["action"] for e in starts] == ["trained", "resumed"]
    assert [e["reason"] for e in events(out, "break_claim")] == ["dead process"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_sweep_promptly_with_its_runs_resumable(tmp_path, workers, signum):
    """Ctrl-C (to the whole process group, as a terminal sends it) or SIGTERM (to the sweep
    alone) while runs train, in this process or in worker processes: exit 130 (SIGINT) or
    143 (SIGTERM, which exited 130, Ctrl-C's code) within seconds, each started run
    'interrupted' with its checkpoint, no claim left."""
    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, """
        [grid]
        "method.name" = ["bp", "dfa"]
    """, epochs=500)
    run_dirs = [out / run_id(c) for c in load_sweep(path).configs()]
    started = run_dirs[:1] if workers == "0" else run_dirs
    process = subprocess.Popen([*CLI, "sweep", str(path), "--workers", workers, "-q"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    interrupt_sweep(process, started, signum, to_group=signum == signal.SIGINT)


# --- CLI ------------------------------------------------------------------------------------
def test_cli_dry_run_lists_runs_and_which_are_done(tmp_path, capsys):
    from creditaudit.cli import main

    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, """
        [grid]
        "method.name" = ["bp", "dfa"]
    """)
    configs = load_sweep(path).configs()
    sweep(configs[:1])
    assert main(["sweep", str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    text = "\n".join(lines)
    assert [line for line in lines if run_id(configs[0]) in line][0].endswith("done (completed)")
    assert [line for line in lines if run_id(configs[1]) in line][0].endswith("to run")
    assert "2 runs: 1 done or skipped, 1 to run" in text
    assert len(events(out, "start")) == 1  # the dry run trained nothing


def test_cli_dry_run_counts_a_run_another_process_trains_apart(tmp_path, capsys):
    """A run held by a live claim of another process (a second sweep on the folder) is
    waited for, not trained by this sweep: its row said "running now" while the count
    line put it among the runs to run."""
    from creditaudit.cli import main
    from creditaudit.records import CLAIM_FILE
    from test_taken_over_runs import OTHER_PID

    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, """
        [grid]
        "method.name" = ["bp", "dfa"]
    """)
    held = out / run_id(load_sweep(path).configs()[1])
    held.mkdir(parents=True)
    (held / CLAIM_FILE).write_text(json.dumps({"pid": OTHER_PID, "host": socket.gethostname(),
                                               "time": "now", "token": "the-other"}))
    assert main(["sweep", str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if held.name in line][0].endswith(f"(pid {OTHER_PID} on "
                                                                     f"{socket.gethostname()})")
    assert lines[-1].startswith("2 runs: 0 done or skipped, 1 to run, 1 running now "
                                "elsewhere (waited for)")


def test_cli_sweep_writes_table_and_summary(tmp_path, capsys):
    from creditaudit.cli import main

    path = write_sweep(tmp_path / "s.toml", tmp_path / "ignored", """
        [grid]
        "method.name" = ["bp", "dfa"]
    """)
    out = tmp_path / "elsewhere"
    assert main(["sweep", str(path), "--workers", "0", "--out", str(out)]) == 0
    text, err = capsys.readouterr()
    assert "(inline executor, 1 parallel run × 1 thread)" in text.splitlines()[0]
    assert "name=bp" in text and "name=dfa" in text and "completed" in text
    lines = err.splitlines()
    # plain lines off a terminal: the sweep's, and (a slow machine) the run watch's, indented
    assert all(line.startswith(("sweep: ", "  ")) for line in lines)
    assert any(line.startswith("sweep: ") for line in lines)
    assert sum("completed (trained" in line for line in lines) == 2  # one per run's end
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert [run["grid"]["method.name"] for run in summary["runs"]] == ["bp", "dfa"]
    assert not (tmp_path / "ignored").exists()
    # -q: the same sweep (both runs done now) prints no progress line, still the table.
    assert main(["sweep", str(path), "--workers", "0", "--out", str(out), "-q"]) == 0
    text, err = capsys.readouterr()
    assert "sweep: " not in err and "name=dfa" in text


def test_cli_errors_are_one_line(tmp_path, capsys):
    from creditaudit.cli import main

    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err
    path = write_sweep(tmp_path / "s.toml", tmp_path, '[grid]\n"method.name" = ["bp", "x"]\n')
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "method.name" in err and "'x'" in err


# --- precision ----------------------------------------------------------------------------
def test_fp16_flushes_diagnostic_sized_gradients_bf16_keeps_them():
    tiny_grad = torch.tensor(1e-9)
    assert tiny_grad.to(torch.float16).item() == 0.0
    assert tiny_grad.to(torch.bfloat16).item() == pytest.approx(1e-9, rel=1e-2)


@pytest.mark.parametrize("method", ["bp", "fa", "dfa"])
def test_bf16_training_runs_on_cpu_with_fp32_diagnostics(tmp_path, method):
    from creditaudit.run.trainer import Trainer

    out = tmp_path / "out"
    configs = [tiny(out, **{"method.name": method, "run.precision": p, "run.device": "cpu"})
               for p in ("fp32", "bf16")]
    result = sweep(configs)
    assert [o["status"] for o in result.outcomes] == ["completed", "completed"]
    fp32, bf16 = (torch.load(out / run_id(c) / CHECKPOINT_FILE, weights_only=False)["model"]
                  for c in configs)
    # bf16 autocast really changed the arithmetic of training, not the stored weights' type.
    assert any(not torch.equal(fp32[k], bf16[k]) for k in fp32)
    assert all(v.dtype == torch.float32 for v in bf16.values() if v.is_floating_point())
    # The recorded diagnostics of the bf16 run are the fp32 diagnostics of its weights.
    trainer = Trainer(prepare_configs([configs[1]], threads=1)[0])
    trainer.restore()
    recomputed = trainer.measure(1)
    recorded = load_record(out / run_id(configs[1])).log[-1]
    for key in ("g_L_norm", "h_L_norm", "cos_per_layer", "bp_grad_norms_per_sample_med"):
        assert recorded.value(key) == pytest.approx(recomputed.value(key), rel=1e-5), key


def test_progress_counts_interrupted_runs_apart_from_failures():
    from creditaudit.cli.sweep_output import SweepProgress

    state = SweepState(total=5)
    for status in ("completed", "diverged", "failed", "interrupted"):
        state.count(status)
    assert (state.done, state.failed, state.interrupted, state.left) == (2, 1, 1, 1)
    assert "failed 1, interrupted 1, left 1" in SweepProgress.status(state)


NEEDS_FASHION = pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="run ids fingerprint the Fashion-MNIST files: apt-get install dataset-fashion-mnist")


@pytest.mark.parametrize("dataset", [pytest.param("fashion-mnist", marks=NEEDS_FASHION),
                                     "synthetic"])
def test_cpu_grid_sweeps_are_the_experiments_runs(tmp_path, dataset):
    """examples/sweeps/cpu_*.toml give the run ids the cpu-scale experiments use."""
    from creditaudit.study.experiments import get_experiment

    name = "fashion" if dataset == "fashion-mnist" else dataset
    sweep_ = load_sweep(ROOT / "examples" / "sweeps" / f"cpu_{name}.toml")
    ids = {run_id(c) for c in sweep_.configs({"run.out_dir": str(tmp_path)})}
    assert len(ids) == 21
    experiment_ids = set()
    for experiment in ("capacity_cost", "temporal"):
        experiment_ids |= {run_id(c) for c in get_experiment(experiment).configs(
            "cpu", dataset=dataset, data_dir=None, out_dir=tmp_path)}
    assert ids <= experiment_ids


@NEEDS_FASHION
def test_rule_zoo_sweeps_are_the_experiments_runs(tmp_path):
    """examples/sweeps/rule_zoo_*.toml give exactly the rule_zoo experiment's run ids."""
    from creditaudit.study.experiments import get_experiment

    ids = set()
    for arch in ("resmlp", "vit", "convmixer"):
        sweep_ = load_sweep(ROOT / "examples" / "sweeps" / f"rule_zoo_{arch}.toml")
        ids |= {run_id(c) for c in sweep_.configs({"run.out_dir": str(tmp_path)})}
    experiment = get_experiment("rule_zoo").configs("cpu", dataset="fashion-mnist",
                                                    data_dir=None, out_dir=tmp_path)
    assert ids == {run_id(c) for c in experiment}
    assert len(ids) == 3 * 13 * 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_asking_for_a_missing_gpu_fails_the_sweep_up_front(tmp_path):
    configs = [tiny(tmp_path, **{"run.device": "cuda"})]
    with pytest.raises(ConfigError, match="no CUDA device"):
        run_sweep(configs, InlineExecutor(threads=1))
    assert not list(tmp_path.glob("*/record.json"))  # no run was recorded as failed


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_the_dry_run_of_a_sweep_on_a_missing_gpu_says_so(tmp_path, capsys):
    """Before, the dry run listed every run 'to run', and the sweep itself printed its
    header and made its results folder before the error."""
    from creditaudit.cli import main

    out = tmp_path / "out"
    path = write_sweep(tmp_path / "s.toml", out, "")
    for extra in (["--dry-run"], []):
        assert main(["sweep", str(path), "--device", "cuda", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "", captured.out
        assert "no CUDA device is available; use --device cpu" in captured.err
    assert not out.exists()


def test_a_tensorboard_folder_that_is_a_file_fails_the_sweep_up_front(tmp_path):
    """Before, every run started, failed on it and left a failed record (to be retried with
    --retry-failed once the folder was fixed)."""
    (tmp_path / "tb").write_text("not a folder")
    configs = [tiny(tmp_path / "out", **{"run.seed": seed,
                                         "run.tensorboard": str(tmp_path / "tb")})
               for seed in (1, 2)]
    with pytest.raises(OutputError, match="TensorBoard folder .* a file stands where a folder"):
        run_sweep(configs, InlineExecutor(threads=1))
    assert not (tmp_path / "out").exists()  # no run was recorded as failed


def test_a_sweep_asking_for_wandb_without_it_says_so_before_any_run(tmp_path, capsys,
                                                                    monkeypatch):
    """Before, the dry run listed every run 'to run', and the sweep failed each run in turn
    on the missing package, each leaving a failed record."""
    from creditaudit.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    out = tmp_path / "out"
    path = write_tiny_sweep(tmp_path / "s.toml", out, '[grid]\n"run.seed" = [1, 2]\n',
                            base={**TINY, "run.wandb_project": "p"})
    for extra in (["--dry-run"], ["--workers", "0"]):
        assert main(["sweep", str(path), *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "", captured.out
        assert captured.err.strip().splitlines() == [
            "creditaudit: error: run.wandb_project needs the wandb package: pip install "
            "'creditaudit[wandb]'"]
    assert not out.exists()


def test_a_run_whose_worker_died_does_not_count_as_a_run_of_no_seconds_in_the_eta(tmp_path):
    """A run failed because its worker died has no time of its own (0 s): counted, it made
    the status line say 'ETA 0m00s' with every other run still to train."""
    from creditaudit.sweep.worker import failed_outcome

    class DyingWorkers(InlineExecutor):
        def map(self, fn, tasks):  # noqa: ANN001, ANN202
            for task in tasks:
                yield failed_outcome(task, "its worker process died 2 times")

    etas = []
    configs = [tiny(tmp_path / "out", **{"run.seed": seed}) for seed in (1, 2)]
    sweep(configs, DyingWorkers(), on_progress=lambda state, _: etas.append(state.eta_seconds))
    assert etas and set(etas) == {None}



def test_a_factory_raising_its_own_base_exception_fails_its_run_not_the_sweep(tmp_path,
                                                                              monkeypatch):
    """A BaseException of the guest's own (neither an Exception, an interrupt nor a
    sys.exit) in one grid point's forward went past the worker's handlers and ended the
    whole sweep; that run fails, named as the factory's, and the sweep goes on."""
    (tmp_path / "aborting.py").write_text(
        "class Abort(BaseException):\n    pass\n\n\n"
        "def now():\n    raise Abort('the forward gave up')\n")
    (tmp_path / "aborting_net.py").write_text(exiting_net_source("aborting.now()", once=False))
    monkeypatch.syspath_prepend(str(tmp_path))
    base = {key: value for key, value in TINY.items() if not key.startswith("model.")}
    configs = [RunConfig().replace(**{
        **base, "optim.epochs": 2, "run.out_dir": str(tmp_path / "out"),
        "model.arch": "module", "model.factory": "aborting_net:Net",
        "model.states": ["l1", "l2"], "model.args": {"exit_at": exit_at}})
        for exit_at in (6, 0)]
    result = sweep(configs)
    assert [o["status"] for o in result.outcomes] == ["failed", "completed"]
    record = load_record(result.plans[0].run_dir)
    assert record.status == "failed" and "Abort: the forward gave up" in record.error, record.error


# An MLP whose forward calls sys.exit(3) from its exit_at-th training batch on.
EXITING_NET = exiting_net_source('sys.exit(3)', once=False)


def test_a_factory_calling_sys_exit_in_training_fails_its_run_not_the_sweep(
        tmp_path, monkeypatch):
    """sys.exit in a factory's forward, in one grid point: that run is failed, named as the
    factory's (as `train` names it), and the sweep goes on; it used to end the whole sweep
    (a worker's SystemExit reached the sweep: exit code 3, no message, no summary)."""
    (tmp_path / "exiting_net.py").write_text(EXITING_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = {key: value for key, value in TINY.items() if not key.startswith("model.")}
    configs = [RunConfig().replace(**{
        **base, "optim.epochs": 2, "run.out_dir": str(tmp_path / "out"),
        "model.arch": "module", "model.factory": "exiting_net:Net",
        "model.states": ["l1", "l2"], "model.args": {"exit_at": exit_at}})
        for exit_at in (6, 0)]
    result = sweep(configs)
    assert [o["status"] for o in result.outcomes] == ["failed", "completed"]
    record = load_record(result.plans[0].run_dir)
    assert record.status == "failed"
    assert "model factory 'exiting_net:Net' called sys.exit(3)" in record.error
    assert json.loads(result.summary_path.read_text())["counts"] == {"failed": 1,
                                                                    "completed": 1}
