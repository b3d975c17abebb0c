"""A local sweep's worker processes, for real: a sweep killed while its workers start leaves
none running, and one worker killed (as by the out-of-memory killer) does not end the sweep;
a run whose worker dies twice is recorded failed, with the cause, and resumes later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from creditaudit.records import RECORD_FILE, load_record
from creditaudit.records.claims import read_claim
from creditaudit.sweep import CLAIM_FILE, SUMMARY_FILE, SWEEP_LOG_FILE
from integrity_support import alive, children, sweep_toml, tiny_config, write_idx_dataset

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

EPOCHS = 200  # ≈ 10 s a run on one thread: long enough to kill a worker mid-run


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_idx_dataset(tmp_path_factory.mktemp("workers") / "mnist")


def _sweep(tmp_path: Path, data: Path, grid: str, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(tiny_config(data, out, **{"optim.epochs": EPOCHS}), grid))
    command = [sys.executable, "-m", "creditaudit", "sweep", str(sweep), *args]
    with (tmp_path / "stderr.txt").open("w") as err:  # a file: a full pipe would block it
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True)
    return process, out


def _end(sweep: subprocess.Popen, tmp_path: Path) -> str:
    """The sweep's stderr once it has ended."""
    sweep.wait(timeout=300)
    return (tmp_path / "stderr.txt").read_text()


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids this test started (sweeps and their workers), killed at the end if still alive."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _wait(condition: Callable[[], object], seconds: float, what: str,
          sweep: subprocess.Popen | None = None) -> object:
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        if sweep is not None and sweep.poll() is not None:
            pytest.fail(f"the sweep ended (exit {sweep.returncode}) before {what}")
        time.sleep(0.05)
    pytest.fail(f"waited {seconds} s for {what}")


def _spawned_workers(pid: int) -> list[int]:
    """The multiprocessing workers among ``pid``'s children (not its resource tracker)."""
    found = []
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


def _training(out: Path) -> dict[str, tuple[int, int]]:
    """run id → (epochs logged, pid of the live worker holding it) for runs under way."""
    runs = {}
    for claim in out.glob(f"*/{CLAIM_FILE}"):
        holder, _, _ = read_claim(claim)
        try:
            record = load_record(claim.parent)
        except Exception:  # noqa: BLE001 — not written yet, or being replaced right now
            continue
        if holder and alive(holder.get("pid", -1)) and record.status == "running":
            runs[claim.parent.name] = (len(record.log), holder["pid"])
    return runs


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / SWEEP_LOG_FILE).read_text().splitlines()]


# --- a sweep killed while its workers start ---------------------------------------------
def test_a_worker_whose_sweep_is_gone_exits_in_its_initializer(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    script = ("import sys; from creditaudit.sweep.worker_process import init_worker; "
              "init_worker(1, int(sys.argv[1])); print('went on')")
    orphan = subprocess.run([sys.executable, "-c", script, str(gone.pid)],
                            capture_output=True, text=True, timeout=120)
    assert (orphan.returncode, orphan.stdout, orphan.stderr) == (0, "", "")
    # Its parent alive, the same initializer returns (the worker goes on to take tasks).
    child = subprocess.run([sys.executable, "-c", script, str(os.getpid())],
                           capture_output=True, text=True, timeout=120)
    assert (child.returncode, child.stdout) == (0, "went on\n"), child.stderr


def test_killing_the_sweep_while_its_workers_start_leaves_nothing_running(
        data, tmp_path, started):
    sweep, out = _sweep(tmp_path, data, '[grid]\n"run.seed" = [1, 2]\n', "--workers", "2")
    started.append(sweep.pid)
    workers = _wait(lambda: len(_spawned_workers(sweep.pid)) == 2 and
                    _spawned_workers(sweep.pid), 60, "two workers were spawned", sweep)
    started.extend(workers)
    time.sleep(0.5)  # the workers are importing (seconds): none has run its initializer
    assert not list(out.glob(f"*/{RECORD_FILE}")), "a run started before the kill"
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    deadline = time.time() + 60  # a worker on a busy 2-core machine imports torch slowly
    while any(map(alive, workers)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, workers)), "workers of a dead sweep still run after 60 s"
    assert not list(out.glob("*/*")), "a worker of the dead sweep claimed or trained a run"


def test_ctrl_c_while_the_workers_start_prints_no_traceback(data, tmp_path, started):
    """Ctrl-C reaches the sweep and its workers (one process group); a worker still
    importing creditaudit printed a KeyboardInterrupt traceback out of multiprocessing's
    spawn_main under the sweep's one line. It now leaves quietly once it has started. The
    SIGINT goes to the workers alone: the sweep's own share of a Ctrl-C SIGTERMs them at
    once, which decides the race only sometimes."""
    sweep, out = _sweep(tmp_path, data, '[grid]\n"run.seed" = [1, 2]\n', "--workers", "2")
    started.append(sweep.pid)
    workers = _wait(lambda: len(_spawned_workers(sweep.pid)) == 2 and
                    _spawned_workers(sweep.pid), 60, "two workers were spawned", sweep)
    started.extend(workers)
    time.sleep(0.2)  # the workers are importing (seconds): none has run its initializer
    assert not list(out.glob(f"*/{RECORD_FILE}")), "a run started before the Ctrl-C"
    for worker in workers:
        os.kill(worker, signal.SIGINT)
    _wait(lambda: not any(map(alive, workers)), 60, "the workers ended")
    os.killpg(sweep.pid, signal.SIGKILL)
    err = _end(sweep, tmp_path)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not list(out.glob(f"*/{RECORD_FILE}")), "a worker trained after its Ctrl-C"


# --- a worker that dies -----------------------------------------------------------------
def test_one_dead_worker_does_not_end_the_sweep(data, tmp_path, started):
    sweep, out = _sweep(tmp_path, data, '[grid]\n"method.name" = ["bp", "dfa"]\n'
                        '"run.seed" = [1, 2]\n', "--workers", "2")
    started.append(sweep.pid)
    runs = _wait(lambda: (lambda r: len(r) == 2 and min(n for n, _ in r.values()) >= 2
                          and r)(_training(out)), 120, "two runs were under way", sweep)
    (killed, (_, pid)), (other, _) = sorted(runs.items())
    started.extend(_spawned_workers(sweep.pid))
    os.kill(pid, signal.SIGKILL)  # as the out-of-memory killer does
    err = _end(sweep, tmp_path)
    assert sweep.returncode == 0, err
    assert "SIGKILL" in err and killed in err
    run_dirs = sorted(path.parent for path in out.glob(f"*/{RECORD_FILE}"))
    assert len(run_dirs) == 4
    for run_dir in run_dirs:
        record = load_record(run_dir)
        assert record.status == "completed", (run_dir.name, record.error)
        assert [e.epoch for e in record.log] == list(range(EPOCHS + 1))
        assert not (run_dir / CLAIM_FILE).exists()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["counts"] == {"completed": 4}
    events = _log(out)
    died = [e for e in events if e["event"] == "worker_died"]
    assert [(e["run_id"], e["deaths"]) for e in died] == [(killed, 1)]
    assert f"worker process {pid} was killed by SIGKILL" in died[0]["cause"]
    starts: dict[str, list[str]] = {}
    for event in events:
        if event["event"] == "start":
            starts.setdefault(event["run_id"], []).append(event["action"])
    assert starts.pop(killed) == ["trained", "resumed"]
    assert starts.pop(other) == ["trained", "resumed"]  # interrupted by the pool, goes on
    assert sorted(starts.values()) == [["trained"], ["trained"]]  # not started: once


def test_a_run_whose_worker_dies_twice_is_failed_with_the_cause(data, tmp_path, started,
                                                                 capsys):
    from creditaudit.cli import main

    sweep, out = _sweep(tmp_path, data, '[grid]\n"run.seed" = [1, 2]\n', "--workers", "1")
    started.append(sweep.pid)
    runs = _wait(lambda: (lambda r: r and min(n for n, _ in r.values()) >= 2 and r)(
        _training(out)), 120, "a run was under way", sweep)
    ((victim, (epochs, pid)),) = runs.items()
    os.kill(pid, signal.SIGKILL)
    again = _wait(lambda: (lambda r: victim in r and r[victim][1] != pid
                           and r[victim][0] > epochs and r)(_training(out)),
                  120, "the run went on in a new worker", sweep)
    second = again[victim][1]
    started.extend([pid, second])
    os.kill(second, signal.SIGKILL)
    err = _end(sweep, tmp_path)
    assert sweep.returncode == 1, err  # a failed run: the sweep says so
    record = load_record(out / victim)
    assert record.status == "failed"
    assert "died 2 times" in record.error
    assert f"worker process {pid} was killed by SIGKILL" in record.error
    assert f"worker process {second} was killed by SIGKILL" in record.error
    assert not (out / victim / CLAIM_FILE).exists()
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["counts"] == {"completed": 1, "failed": 1}
    assert [r["error"] for r in summary["runs"] if r["run_id"] == victim] == [record.error]
    # --retry-failed resumes it from its last checkpoint, to the end.
    status = main(["sweep", str(tmp_path / "s.toml"), "--workers", "0", "--retry-failed", "-q"])
    capsys.readouterr()
    assert status == 0
    record = load_record(out / victim)
    assert record.status == "completed"
    assert [e.epoch for e in record.log] == list(range(EPOCHS + 1))
    assert [e["action"] for e in _log(out) if e["event"] == "start"
            and e["run_id"] == victim] == ["trained", "resumed", "resumed"]


def _die(task: dict) -> None:
    """A task whose worker dies before it claims anything (as at start-up)."""
    (Path(task["config"]["run"]["out_dir"]) / f"{task['run_id']}.{os.getpid()}").touch()
    os.kill(os.getpid(), signal.SIGKILL)


def test_workers_that_die_before_any_run_end_the_sweep_after_one_new_pool(tmp_path):
    from creditaudit.sweep import LocalExecutor

    tasks = [{"config": {"run": {"out_dir": str(tmp_path)}}, "run_id": name}
             for name in ("a", "b")]
    outcomes = list(LocalExecutor(workers=1).map(_die, tasks))
    assert sorted(o["run_id"] for o in outcomes) == ["a", "b"]
    for outcome in outcomes:
        assert (outcome["status"], outcome["action"]) == ("failed", "not started")
        assert "was killed by SIGKILL" in outcome["error"]
        assert "never started" in outcome["error"]
    # Two pools (the first broken one, then one new one), a worker each: two deaths.
    assert len(list(tmp_path.glob("a.*"))) == 2


def test_a_ctrl_c_while_a_broken_pool_unwinds_stops_the_sweep(tmp_path, monkeypatch):
    """A Ctrl-C that arrives while the sweep waits for the workers of a pool a dead worker
    broke is the sweep's first interrupt: the sweep stops there (no new pool trains on)."""
    from creditaudit.sweep import LocalExecutor, executors

    waits: list[bool] = []

    def interrupted_while_waiting(pool, processes, seconds, *, patient=False):  # noqa: ANN001
        waits.append(patient)
        pool.shutdown(wait=True)
        return KeyboardInterrupt()  # one arrived meanwhile: the sweep raises it

    monkeypatch.setattr(executors, "_shut_down", interrupted_while_waiting)
    tasks = [{"config": {"run": {"out_dir": str(tmp_path)}}, "run_id": name}
             for name in ("a", "b")]
    with pytest.raises(KeyboardInterrupt):
        list(LocalExecutor(workers=1).map(_die, tasks))
    assert waits == [True]
    assert len(list(tmp_path.glob("a.*"))) == 1  # one pool only: no new one was started


class _SlowPool:
    """A pool whose shutdown (its workers recording their interrupt) ends ``seconds`` after
    ``sent`` is set: the interrupt was sent, however late a loaded machine sent it."""

    def __init__(self, sent: threading.Event, seconds: float) -> None:
        self.sent, self.seconds, self.done = sent, seconds, False

    def shutdown(self, wait: bool, cancel_futures: bool) -> None:
        self.sent.wait(60)
        time.sleep(self.seconds)
        self.done = True


class _Process:
    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


@pytest.mark.parametrize("patient", [True, False])
def test_shutting_down_a_pool_says_whether_it_was_interrupted(patient, default_ctrl_c):
    """Waiting for a broken pool (patient), a first Ctrl-C lets the workers finish recording
    it; unwinding after an interrupt, a Ctrl-C is the second one and kills them. Either way
    the caller gets the interrupt that arrived (to raise: Ctrl-C and SIGTERM exit apart)."""
    from creditaudit.sweep.executors import _shut_down

    sent = threading.Event()

    def interrupt() -> None:  # to the main thread, which waits: no other thread takes it
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        sent.set()

    pool, process = _SlowPool(sent, 1.0), _Process()
    threading.Timer(0.2, interrupt).start()
    assert isinstance(_shut_down(pool, [process], 30, patient=patient), KeyboardInterrupt)
    assert process.killed is not patient
    sent.wait(60)
    time.sleep(1.5)
    assert pool.done


def _claim_and_exit(task: dict) -> None:
    """A task whose run's code ends its worker with ``os._exit(0)`` while it holds the run
    (as a model factory's forward calling it would)."""
    from creditaudit.records.claims import try_claim

    try_claim(Path(task["config"]["run"]["out_dir"]) / task["run_id"])
    os._exit(0)


def test_a_run_whose_worker_exits_with_code_0_is_failed_as_a_death(tmp_path):
    """Exit code 0 is a death too when the worker held a run: not retried for ever, not
    reported as never started (its next sweep runs it only with --retry-failed), its claim
    not left behind; it died before it began training: action "not started"."""
    from creditaudit.sweep import LocalExecutor

    tasks = [{"config": {"run": {"out_dir": str(tmp_path)}}, "run_id": "a"}]
    (outcome,) = list(LocalExecutor(workers=1).map(_claim_and_exit, tasks))
    assert (outcome["status"], outcome["action"]) == ("failed", "not started")
    assert "died 2 times" in outcome["error"] and "never started" not in outcome["error"]
    assert "exited with code 0" in outcome["error"] and "os._exit" in outcome["error"]
    assert not (tmp_path / "a" / CLAIM_FILE).exists()
    assert load_record(tmp_path / "a").status == "failed"
    assert [e["deaths"] for e in _log(tmp_path) if e["event"] == "worker_died"] == [1, 2]


def _stopped_once(task: dict) -> dict:
    """Run 'a' is interrupted by a SIGTERM to its worker alone (``kill PID``); the others
    complete."""
    from creditaudit.sweep.outcome import new_outcome

    if task["run_id"] == "a":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises KeyboardInterrupt here
    return new_outcome(task["run_id"], status="completed", action="trained")


def test_a_worker_told_to_stop_starts_no_run_and_the_sweep_goes_on(monkeypatch):
    """A worker that got SIGTERM (a signal to it alone) answered every task it took after
    its run as 'interrupted' without starting it: the sweep, going on with its other
    workers, reported runs it never started as interrupted and trained none of them. The
    worker now leaves at its next task, which a new worker takes."""
    from creditaudit.sweep import worker

    left = []
    monkeypatch.setitem(worker.WORKER_STATE, "terminating", True)
    monkeypatch.setattr(os, "_exit", lambda code: left.append(code) or sys.exit(code))
    with pytest.raises(SystemExit):
        worker.pool_call(lambda task: pytest.fail("started a run"), {"run_id": "b"})
    assert left == [0]


@pytest.mark.slow
def test_runs_queued_behind_a_worker_told_to_stop_are_trained(tmp_path):
    from creditaudit.sweep import LocalExecutor

    tasks = [{"config": {"run": {"out_dir": str(tmp_path)}}, "run_id": name}
             for name in ("a", "b", "c")]
    outcomes = {o["run_id"]: o for o in LocalExecutor(workers=1).map(_stopped_once, tasks)}
    assert outcomes["a"]["status"] == "interrupted"
    assert [outcomes[run]["status"] for run in "bc"] == ["completed", "completed"]


def _first_ends_then_exit(task: dict) -> None:
    """A stacked group's task whose first run ends (completed, its claim held until the
    group ends) before the second run's code ends the worker with ``os._exit``."""
    from creditaudit.config import config_from_dict
    from creditaudit.records import new_record, save_record
    from creditaudit.records.claims import try_claim

    for run_id, config in zip(task["run_ids"], task["configs"], strict=True):
        run_dir = Path(config["run"]["out_dir"]) / run_id
        try_claim(run_dir)
        if run_id == "a" and not (run_dir / RECORD_FILE).exists():
            record = new_record(config_from_dict(config), device="cpu", run_id=run_id)
            record.status = "completed"
            save_record(run_dir, record)
    os._exit(3)


def test_a_run_that_ended_before_its_worker_died_is_not_its_death(tmp_path):
    """The completed first run of a stack whose second run's code ended the worker was
    counted as a run whose worker died under it: a 'worker_died' event and a warning
    that it 'goes on in a new worker from its last checkpoint', its claim left behind."""
    from creditaudit.config import RunConfig
    from creditaudit.sweep import LocalExecutor

    config = RunConfig().replace(**{"run.out_dir": str(tmp_path)}).to_dict()
    task = {"configs": [config, config], "run_ids": ["a", "b"]}
    outcomes = {o["run_id"]: o for o in LocalExecutor(workers=1).map(_first_ends_then_exit,
                                                                       [task])}
    assert (outcomes["a"]["status"], outcomes["b"]["status"]) == ("completed", "failed")
    assert {e["run_id"] for e in _log(tmp_path) if e["event"] == "worker_died"} == {"b"}
    assert not (tmp_path / "a" / CLAIM_FILE).exists()
