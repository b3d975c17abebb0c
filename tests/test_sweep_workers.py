"""A local sweep's worker processes, for real: a sweep killed while its workers start leaves
none running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from creditaudit.records import RECORD_FILE, load_record
from creditaudit.sweep import CLAIM_FILE, SWEEP_LOG_FILE
from creditaudit.sweep.claims import read_claim
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
    script = ("import sys; from creditaudit.sweep.worker import init_worker; "
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
