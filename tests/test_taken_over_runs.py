"""A holder stopped past another process's ``--stale-after`` (Ctrl-Z, SIGSTOP, a suspended
laptop, a stalled file system) finds its run taken over when it goes on: its heartbeat never
touches the other process's claim, and ``train``, a stack, a ``Recorder`` and a sweep's
worker stop at their next write with one line naming the new holder, writing nothing more
to the run's folder (before: the heartbeat refreshed the other's claim, and both processes
wrote ``checkpoint.pt`` and ``record.json`` of one run).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from creditaudit import Recorder, rule
from creditaudit.config import RunConfig, config_to_toml
from creditaudit.errors import RunBusyError
from creditaudit.records import CLAIM_FILE, RECORD_FILE, claims, load_record
from creditaudit.records.claim_files import DEFAULT_STALE_AFTER
from creditaudit.records.claims import beat_every, heartbeat, release_claim, try_claim
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import Trainer, train
from creditaudit.sweep.worker import run_group, run_one
from integrity_support import tiny_own_loop
from sweep_files import TINY_SWEEP_BASE

TINY = {**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128, "run.progress": False,
        "run.threads": 1, "diagnostics.end_of_run": False, "optim.epochs": 3}
OTHER_PID = os.getppid()  # a live process of this host that is not this one


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def take_over(run_dir: Path) -> Path:
    """Break the claim on ``run_dir`` and claim the run for process :data:`OTHER_PID`, as a
    sweep with a short ``--stale-after`` does (the old claim removed, a new one created)."""
    path = run_dir / CLAIM_FILE
    path.unlink()
    path.write_text(json.dumps({"pid": OTHER_PID, "host": socket.gethostname(),
                                "time": "now", "token": "the-other-process"}))
    return path


def folder_state(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and mtime (ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


# --- the heartbeat ------------------------------------------------------------------------
def test_the_heartbeat_never_touches_another_process_claim(tmp_path):
    """Before: ``os.utime`` refreshed whatever claim stood in the folder, keeping the other
    process's claim fresh for it, and the claim was never known lost."""
    claim, _ = try_claim(tmp_path / "run")
    try:
        other = take_over(tmp_path / "run")
        os.utime(other, (1_000_000, 1_000_000))
        with heartbeat(claim, every=0.02):
            time.sleep(0.2)
        assert other.stat().st_mtime == 1_000_000
        assert claim.lost
        release_claim(claim)
        assert json.loads(other.read_text())["token"] == "the-other-process"
    finally:
        release_claim(claim)


def test_the_heartbeat_never_brings_back_a_removed_claim(tmp_path):
    claim, _ = try_claim(tmp_path / "run")
    try:
        claim.path.unlink()
        with heartbeat(claim, every=0.02):
            wait_until(lambda: claim.lost)
        assert claim.lost
        assert not claim.path.exists()
    finally:
        release_claim(claim)


def test_the_heartbeat_refreshes_its_own_claim(tmp_path):
    claim, _ = try_claim(tmp_path / "run")
    try:
        os.utime(claim.path, (1_000_000, 1_000_000))
        with heartbeat(claim, every=0.02):
            wait_until(lambda: claim.path.stat().st_mtime > 1_000_000)
        assert claim.path.stat().st_mtime > time.time() - 60
        assert not claim.lost
    finally:
        release_claim(claim)
    assert not claim.path.exists()


# --- the writers --------------------------------------------------------------------------
def taken_over_in_epoch(monkeypatch, run_dirs: list[Path], epoch: int = 2
                        ) -> dict[Path, dict[str, tuple[bytes, int]]]:
    """Patch the trainer so that the claims on ``run_dirs`` are taken over once ``epoch``
    trained, before it is recorded; returns, filled then, each folder's state just after
    the take-over."""
    seen: dict[Path, dict[str, tuple[bytes, int]]] = {}
    original = Trainer.measure_epoch

    def measure_epoch(self, current, *args):
        if current == epoch and self.run_dir in run_dirs and self.run_dir not in seen:
            take_over(self.run_dir)
            seen[self.run_dir] = folder_state(self.run_dir)
        return original(self, current, *args)

    monkeypatch.setattr(Trainer, "measure_epoch", measure_epoch)
    return seen


def test_train_taken_over_stops_at_its_next_write_and_writes_nothing(tmp_path, monkeypatch):
    config = tiny(tmp_path / "out")
    run_dir = plan_run(config).run_dir
    seen = taken_over_in_epoch(monkeypatch, [run_dir])
    with pytest.raises(RunBusyError) as raised:
        train(config)
    message = str(raised.value)
    assert "\n" not in message
    assert f"trained by pid {OTHER_PID} on {socket.gethostname()}" in message
    assert "wrote nothing more to the run" in message
    assert folder_state(run_dir) == seen[run_dir]


def test_a_recorder_taken_over_writes_nothing_more(tmp_path):
    net, x, y = tiny_own_loop()
    with pytest.raises(RunBusyError, match=f"pid {OTHER_PID}"), Recorder(  # noqa: PT012
            rule("bp", net), x, y, out=tmp_path, name="mine", progress=False,
            checkpoint=True, config={"diagnostics.end_of_run": False}) as rec:
        rec.epoch(0)
        take_over(tmp_path / "mine")
        before = folder_state(tmp_path / "mine")
        rec.epoch(1)
    assert folder_state(tmp_path / "mine") == before  # nor a failed record on the way out


def test_a_sweep_worker_taken_over_reports_busy_and_writes_nothing(tmp_path, monkeypatch):
    config = tiny(tmp_path / "out")
    run_dir = plan_run(config).run_dir
    seen = taken_over_in_epoch(monkeypatch, [run_dir])
    outcome = run_one(config.to_dict(), run_id=run_dir.name)
    assert outcome["status"] == "busy"
    assert outcome["holder"]["pid"] == OTHER_PID
    assert f"trained by pid {OTHER_PID}" in outcome["error"]
    assert folder_state(run_dir) == seen[run_dir]  # no failed record


def test_a_stacked_run_taken_over_stops_alone(tmp_path, monkeypatch):
    """In a stack (a sweep's ``--stack``), the run taken over stops writing; the other one
    trains on, alone once the other left (its step then, bit for bit, is its own: the last
    bits differ from a stacked step's)."""
    configs = [tiny(tmp_path / "out", **{"run.seed": seed}) for seed in (1, 2)]
    lost, kept = (plan_run(c).run_dir for c in configs)
    seen = taken_over_in_epoch(monkeypatch, [lost])
    outcomes = run_group([c.to_dict() for c in configs], run_ids=[lost.name, kept.name])
    assert [o["status"] for o in outcomes] == ["busy", "completed"]
    assert f"trained by pid {OTHER_PID}" in outcomes[0]["error"]
    assert folder_state(lost) == seen[lost]
    monkeypatch.undo()
    alone = train(tiny(tmp_path / "alone", **{"run.seed": 2})).record
    assert [e.test_loss for e in load_record(kept).log] == pytest.approx(
        [e.test_loss for e in alone.log], rel=1e-6)



@pytest.mark.parametrize("resume", [False, True])
def test_a_run_taken_over_while_it_started_opens_no_logger(tmp_path, monkeypatch, kill_run_at,
                                                           resume):
    """Taken over while it started (its checkpoint read, say), the run stops before its
    loggers start: it used to start them first — a new TensorBoard event file in the other
    process's folder, whose restart mark (at epoch 0, or the epoch resumed after) drops
    that process's points — and only then find the run taken over."""
    pytest.importorskip("tensorboard")
    config = tiny(tmp_path / "out", **{"run.tensorboard": str(tmp_path / "tb")})
    run_dir = plan_run(config).run_dir
    if resume:
        kill_run_at(config, epoch=2)
        original = Trainer.restore

        def restore(self):
            original(self)
            take_over(self.run_dir)

        monkeypatch.setattr(Trainer, "restore", restore)
    else:
        monkeypatch.setattr(Trainer, "restore", lambda self: None)
        original_start = Trainer.start

        def start(self, resuming):
            take_over(self.run_dir)
            original_start(self, resuming)

        monkeypatch.setattr(Trainer, "start", start)
    tb = tmp_path / "tb" / run_dir.name
    before = sorted(tb.glob("*"))
    with pytest.raises(RunBusyError, match=f"pid {OTHER_PID}"):
        train(config, resume=resume)
    assert sorted(tb.glob("*")) == before

def test_a_run_refused_before_its_loggers_start_leaves_no_tensorboard_folder(tmp_path,
                                                                            monkeypatch):
    """A run taken over while it started is refused before its loggers start, and its
    TensorBoard logger made no ``DIR/RUN_ID`` folder for it: the constructor used to."""
    pytest.importorskip("tensorboard")
    config = tiny(tmp_path / "out", **{"run.tensorboard": str(tmp_path / "tb")})
    original_start = Trainer.start

    def start(self, resuming):
        take_over(self.run_dir)
        original_start(self, resuming)

    monkeypatch.setattr(Trainer, "start", start)
    with pytest.raises(RunBusyError, match=f"pid {OTHER_PID}"):
        train(config)
    assert not (tmp_path / "tb").exists()

# --- real processes -----------------------------------------------------------------------
PAUSED_IN_EPOCH_2 = """
import sys, time
from pathlib import Path
from creditaudit.cli import main
from creditaudit.run.trainer import Trainer
original = Trainer.train_epoch
def paused(self, epoch):
    if epoch == 2:
        Path(sys.argv[2]).touch()
        while not Path(sys.argv[3]).exists():
            time.sleep(0.02)
    return original(self, epoch)
Trainer.train_epoch = paused
sys.exit(main(["train", "--config", sys.argv[1]]))
"""


@pytest.mark.slow
def test_a_stopped_train_whose_run_was_taken_over_stops_without_writing(tmp_path):
    """``creditaudit train`` SIGSTOPped in its epoch 2 past another process's stale-after:
    that process breaks its claim and finishes the run; SIGCONT, the first one stops with
    one line naming it (exit 2, as for a busy run), and the run equals an uninterrupted
    one. Before: the stopped process refreshed the other's claim and wrote its epochs
    2 and 3 over the other's files."""
    config = tiny(tmp_path / "out")
    run_dir = plan_run(config).run_dir
    config_file = tmp_path / "run.toml"
    config_file.write_text(config_to_toml(config))
    ready, go = tmp_path / "in-epoch-2", tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", PAUSED_IN_EPOCH_2, str(config_file),
                              str(ready), str(go)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    claim = None
    try:
        wait_until(lambda: ready.exists() or child.poll() is not None, seconds=120)
        assert ready.exists(), child.communicate()
        child.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # its claim now older than the other process's stale-after
        claim, holder = try_claim(run_dir, stale_after=1.0)  # as a sweep's worker breaks it
        assert claim is not None, holder
        taken = folder_state(run_dir)
        go.touch()
        child.send_signal(signal.SIGCONT)
        out, err = child.communicate(timeout=120)
        assert child.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("creditaudit: error: "), err
        assert f"trained by pid {os.getpid()} on {socket.gethostname()}" in lines[0]
        assert "wrote nothing more to the run" in lines[0]
        assert folder_state(run_dir) == taken  # its claim's mtime included
        resumed = train(config, resume=True).record  # under the claim this process took
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        if claim is not None:
            release_claim(claim)
    assert not (run_dir / CLAIM_FILE).exists()
    assert load_record(run_dir / RECORD_FILE).status == "completed"
    whole = train(tiny(tmp_path / "whole")).record
    assert [(e.test_loss, e.train_loss) for e in resumed.log] == \
        [(e.test_loss, e.train_loss) for e in whole.log]


def test_a_sweep_workers_claim_beats_as_often_as_a_trains(tmp_path, monkeypatch):
    """A sweep's worker (default --stale-after 900) refreshed its claim every 60 s, so a
    second sweep on the folder with --stale-after 30 broke the live worker's claim and
    trained its run beside it; now every holder beats at least every HOLD_BEAT seconds."""
    monkeypatch.setattr(claims, "HOLD_BEAT", 1.0)
    claim, _ = try_claim(tmp_path / "run")
    old = time.time() - 100
    os.utime(claim.path, (old, old))
    with heartbeat(claim, every=beat_every(DEFAULT_STALE_AFTER)):
        wait_until(lambda: claim.path.stat().st_mtime > old + 50, seconds=3.0)
    assert claim.path.stat().st_mtime > old + 50
    release_claim(claim)
