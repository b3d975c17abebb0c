"""One process at a time writes a run's folder: ``train`` (and ``--resume``, ``--force``),
stacked runs and a ``Recorder`` hold its claim (``claim.json``, as a sweep's worker does)
while the run trains, refuse a folder another live process holds with one line naming it,
release it however they end, and break the claim of a holder killed with ``kill -9``.
Readers say a run its process holds is running, and one whose process is gone interrupted.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from creditaudit import Recorder, rule
from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError, RunBusyError
from creditaudit.records import CLAIM_FILE, RECORD_FILE, load_record, save_record
from creditaudit.records.claim_files import claim_state, process_start_ticks
from creditaudit.records.claims import release_claim, try_claim
from creditaudit.report.runs import status_text
from creditaudit.run.plan import plan_run
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import Trainer, train
from integrity_support import assert_one_line_error, tiny_own_loop
from sweep_files import TINY_SWEEP_BASE

TINY = {**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128, "run.progress": False,
        "run.threads": 1, "diagnostics.end_of_run": False}


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def write_claim(run_dir: Path, pid: int) -> Path:
    """A claim of process ``pid`` of this host, as another process's train() writes it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM_FILE
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "time": "then",
                                "token": "someone-else"}))
    return path


def folder_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


@pytest.fixture
def interrupted(tmp_path, kill_run_at) -> RunConfig:
    """A 2-epoch run interrupted when its epoch 2 starts (epoch 1 checkpointed)."""
    config = tiny(tmp_path / "out", **{"optim.epochs": 2})
    kill_run_at(config, epoch=2)
    return config


def test_a_run_another_live_process_holds_is_refused_and_left_untouched(interrupted,
                                                                        capsys):
    """Before: a second ``train`` of the run (plain, ``--resume`` or ``--force``, alone or
    in a stack) trained it into the same folder beside the first, with no word."""
    run_dir = plan_run(interrupted).run_dir
    other = os.getppid()  # a live process of this host that is not this one
    write_claim(run_dir, other)
    before = folder_bytes(run_dir)
    for call in (lambda: train(interrupted), lambda: train(interrupted, resume=True),
                 lambda: train(interrupted, force=True),
                 lambda: train_stacked([interrupted], force=True)):
        with pytest.raises(RunBusyError, match=f"being trained by pid {other} on "):
            call()
        assert folder_bytes(run_dir) == before
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / "config.toml"), "--resume"]) != 0
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, f"pid {other}", "wait for it to finish or stop that "
                          "process", str(run_dir / CLAIM_FILE))
    assert folder_bytes(run_dir) == before


def test_a_dead_holders_claim_is_broken_and_train_releases_its_own(interrupted, caplog):
    """A claim left by a process killed with kill -9 blocks nothing; the run's own claim is
    gone once it ends (before: the dead claim stayed, and reports read the run as held). The
    warning names the dead process in words (it printed the claim's raw dict)."""
    run_dir = plan_run(interrupted).run_dir
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_claim(run_dir, dead.pid)
    with caplog.at_level(logging.WARNING, logger="creditaudit.records.claims"):
        assert train(interrupted, resume=True).status == "completed"
    assert not (run_dir / CLAIM_FILE).exists()
    [said] = [r.getMessage() for r in caplog.records if "broke the" in r.getMessage()]
    assert f"(pid {dead.pid} on " in said and "{" not in said, said


def test_a_claim_whose_pid_now_belongs_to_a_later_process_is_broken(interrupted):
    """A claim of a process killed with kill -9 whose pid another process took since (a
    restarted container, a reboot) blocks nothing either: that process started after the
    claim was written (before: the run read as held, and train --resume was refused until
    the claim went stale, 15 minutes)."""
    run_dir = plan_run(interrupted).run_dir
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = write_claim(run_dir, later.pid)
        claim = json.loads(path.read_text())
        path.write_text(json.dumps({**claim, "unix_time": time.time() - 60}))
        assert claim_state(run_dir).stale == "dead process"
        assert train(interrupted, resume=True).status == "completed"
    finally:
        later.kill()
        later.wait()
    assert not (run_dir / CLAIM_FILE).exists()


def test_a_claim_whose_time_is_no_number_is_not_read_as_a_reused_pid(tmp_path):
    """unix_time true (a bool is an int to isinstance) read as 1 s after 1970: a live
    holder, started long after, was a 'dead process' and its claim broken."""
    path = write_claim(tmp_path / "run", os.getpid())
    claim = json.loads(path.read_text())
    path.write_text(json.dumps({**claim, "unix_time": True}))
    assert claim_state(tmp_path / "run").stale is None


def test_a_folder_named_claim_json_is_no_claim_and_no_crash(interrupted, capsys):
    """A folder where a run's claim.json should be: reading it raised IsADirectoryError
    ("3: it is a folder, not a file", the descriptor for a path) in train --resume, a
    sweep's worker and a report of the whole results folder; now it reads as an unreadable
    claim (stale once old) and train says, in one line, to remove it."""
    run_dir = plan_run(interrupted).run_dir
    (run_dir / CLAIM_FILE).mkdir()
    old = time.time() - 3600
    os.utime(run_dir / CLAIM_FILE, (old, old))
    assert claim_state(run_dir).stale == "stale"
    record = load_record(run_dir / RECORD_FILE)
    record.status = "running"  # as a run killed mid-epoch leaves it
    save_record(run_dir, record)
    assert status_text(record, run_dir).startswith("running (no process holds it")
    capsys.readouterr()
    assert main(["train", "--config", str(run_dir / "config.toml"), "--resume"]) != 0
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, str(run_dir / CLAIM_FILE), "it is a folder",
                          "remove it by hand")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_live_holders_claim_holds_after_the_wall_clock_stepped_forward(tmp_path, monkeypatch):
    """The wall clock stepped forward after a process took its claim (NTP correcting a
    drifted clock, a VM or WSL resumed) moves /proc/stat's btime with it, so the holder's
    start time read from /proc moves past the claim's unix_time: its live claim read as a
    reused pid's ('dead process') and a second sweep or train --resume broke it and
    trained the run beside it. The holder's start in clock ticks since boot, which no clock
    step moves, tells a reused pid."""
    run_dir = tmp_path / "run"
    claim, _ = try_claim(run_dir)
    assert claim is not None
    real = Path.read_text

    def clock_stepped(self: Path, *args: object, **kwargs: object) -> str:
        text = real(self, *args, **kwargs)
        if str(self) == "/proc/stat":  # btime = the clock now − the time since boot
            text = re.sub(r"^btime (\d+)", lambda m: f"btime {int(m[1]) + 600}", text,
                          flags=re.MULTILINE)
        return text

    try:
        monkeypatch.setattr(Path, "read_text", clock_stepped)
        assert claim_state(run_dir).stale is None
    finally:
        monkeypatch.undo()
        release_claim(claim)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_claim_whose_pid_started_at_another_tick_is_a_dead_process(tmp_path):
    """A claim that says its process's start (clock ticks since boot) names a pid reused
    when the live process there started at another tick, whatever the claim's time."""
    run_dir = tmp_path / "run"
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    path = write_claim(run_dir, os.getpid())
    claim = json.loads(path.read_text())
    path.write_text(json.dumps({**claim, "unix_time": time.time(), "start_ticks": ticks + 1}))
    assert claim_state(run_dir).stale == "dead process"
    path.write_text(json.dumps({**claim, "unix_time": 0.0, "start_ticks": ticks}))
    assert claim_state(run_dir).stale is None


def test_a_run_killed_before_its_first_file_starts_over_with_resume(tmp_path, capsys):
    """kill -9 while ``train`` loaded the data or checked the model, before it wrote any
    file of the run, leaves only its claim: ``train --resume`` starts the run over, as
    for a kill before the first record (before: "cannot resume: no run at …", exit 2)."""
    straight = train(tiny(tmp_path / "straight"))
    config = tiny(tmp_path / "out")
    run_dir = plan_run(config).run_dir
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_claim(run_dir, dead.pid)
    (run_dir / ".config.toml.k3naa1x_.tmp").write_text("half a file")
    capsys.readouterr()
    assert main(["train", "--config", str(straight.run_dir / "config.toml"), "--resume",
                 "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    record = load_record(run_dir)
    assert record.status == "completed" and not record.resumed
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        p.name for p in straight.run_dir.iterdir())
    # No claim broken: a folder the run never wrote to still holds no run to resume.
    (tmp_path / "none" / run_dir.name).mkdir(parents=True)
    assert main(["train", "--config", str(straight.run_dir / "config.toml"), "--resume",
                 "--out", str(tmp_path / "none")]) == 2
    assert "cannot resume: no run at" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_train_holds_the_run_while_it_trains_and_releases_it_however_it_ends(
        tmp_path, monkeypatch, stop):
    config = tiny(tmp_path / "out")
    run_dir = plan_run(config).run_dir
    seen = {}

    def stopped(self, epoch):
        seen["claim"] = json.loads((run_dir / CLAIM_FILE).read_text())
        seen["status"] = status_text(load_record(run_dir), run_dir)
        raise stop("stopped in its epoch")

    monkeypatch.setattr(Trainer, "train_epoch", stopped)
    with pytest.raises(stop):
        train(config)
    assert seen["claim"]["pid"] == os.getpid()
    assert seen["status"] == f"running (held by pid {os.getpid()} on {socket.gethostname()})"
    assert not (run_dir / CLAIM_FILE).exists()
    # Refused before any file was written (the model's reference check): no folder left.
    def refused(self, config):
        raise ConfigError("refused as the model is built")

    monkeypatch.setattr(Trainer, "__init__", refused)
    with pytest.raises(ConfigError):
        train(tiny(tmp_path / "refused"))
    assert not plan_run(tiny(tmp_path / "refused")).run_dir.exists()


def test_a_recorder_holds_its_folder_until_its_run_ends(tmp_path):
    net, x, y = tiny_own_loop()
    write_claim(tmp_path / "held", os.getppid())
    with pytest.raises(RunBusyError, match=f"pid {os.getppid()}"):
        Recorder(rule("bp", net), x, y, out=tmp_path, name="held", progress=False)
    assert not (tmp_path / "held" / RECORD_FILE).exists()
    with Recorder(rule("bp", net), x, y, out=tmp_path, name="mine", progress=False,
                  config={"diagnostics.end_of_run": False}) as rec:
        claim = json.loads((tmp_path / "mine" / CLAIM_FILE).read_text())
        assert claim["pid"] == os.getpid()
        rec.epoch(0)
    assert not (tmp_path / "mine" / CLAIM_FILE).exists()
    with pytest.raises(ValueError), Recorder(rule("bp", net), x, y, out=tmp_path,  # noqa: PT012
                                             name="raised", progress=False):
        raise ValueError("the loop failed")
    assert load_record(tmp_path / "raised").status == "failed"
    assert not (tmp_path / "raised" / CLAIM_FILE).exists()


@pytest.mark.parametrize(("raised", "status"), [(torch.OutOfMemoryError, "failed"),
                                                 (KeyboardInterrupt, "interrupted")])
def test_a_with_block_whose_end_of_run_block_raises_records_why(tmp_path, monkeypatch,
                                                                raised, status):
    """The block finish() runs at a with-block's clean end (minutes, a float64 copy: out of
    memory, Ctrl-C) left the record 'running' with no error, read as still running; and a
    finish() that raised left the record 'completed' in memory, written so by a later
    epoch() while the run went on."""
    import creditaudit.run.recorder_finish as finishing

    def block(*args: object, **kwargs: object) -> dict:
        raise raised("the end-of-run block's own error")

    monkeypatch.setattr(finishing, "end_of_run_metrics", block)
    net, x, y = tiny_own_loop()
    with pytest.raises(raised), Recorder(  # noqa: PT012
            rule("bp", net), x, y, out=tmp_path, name="ended", progress=False,
            config={"optim.epochs": 3}) as rec:
        rec.epoch(0)
        rec.epoch(1, test_acc=0.5)
    record = load_record(tmp_path / "ended")
    assert (record.status, record.error) == (
        status, f"{raised.__name__}: the end-of-run block's own error")
    assert record.stopped_early is None
    assert not (tmp_path / "ended" / CLAIM_FILE).exists()
    rec = Recorder(rule("bp", net), x, y, out=tmp_path, name="went-on", progress=False)
    rec.epoch(0)
    with pytest.raises(raised):
        rec.finish()
    rec.epoch(1, test_acc=0.5)
    assert load_record(tmp_path / "went-on").status == "running"


def test_a_recorder_created_again_on_its_folder_with_overwrite_holds_it_alone(tmp_path):
    """A notebook cell run again (``rec = Recorder(…, overwrite=True)`` while the first
    Recorder is unfinished): the claim was the first one's, released when it was collected,
    so the new run went on unclaimed; and the first, kept alive, wrote its epochs over the
    new run's record (its failed record at its with-block's end too)."""
    net, x, y = tiny_own_loop()
    first = Recorder(rule("bp", net), x, y, out=tmp_path, name="again", progress=False,
                     config={"diagnostics.end_of_run": False})
    first.epoch(0)
    first.epoch(1, test_acc=0.5)
    second = Recorder(rule("bp", net), x, y, out=tmp_path, name="again", progress=False,
                      config={"diagnostics.end_of_run": False}, overwrite=True)
    with pytest.raises(ConfigError, match="overwrite=True replaced this one's run in "):
        first.epoch(2)
    with pytest.raises(ConfigError, match="overwrite=True replaced this one's run in "):
        first.finish()
    with pytest.raises(ValueError), first:
        raise ValueError("the first loop's end")
    assert load_record(tmp_path / "again").log == []
    del first
    gc.collect()
    claim = json.loads((tmp_path / "again" / CLAIM_FILE).read_text())
    assert claim["pid"] == os.getpid()
    second.epoch(0)
    assert second.finish().status == "completed"
    assert [e.epoch for e in load_record(tmp_path / "again").log] == [0]
    assert not (tmp_path / "again" / CLAIM_FILE).exists()


def test_a_child_forked_while_a_recorder_holds_its_run_leaves_the_claim_alone(tmp_path):
    """A child forked by the loop (os.fork) that ends normally runs the Recorder's release
    at its exit: it removed the parent's claim, and the parent's next epoch stopped as
    taken over, the run lost."""
    net, x, y = tiny_own_loop()
    rec = Recorder(rule("bp", net), x, y, out=tmp_path, name="forked", progress=False,
                   config={"diagnostics.end_of_run": False})
    rec.epoch(0)
    child = os.fork()
    if child == 0:  # what the child's exit does (weakref.finalize at atexit), then gone
        try:
            rec._held.close()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    assert (tmp_path / "forked" / CLAIM_FILE).exists()
    rec.epoch(1, test_acc=0.5)
    assert rec.finish().status == "completed"
    assert not (tmp_path / "forked" / CLAIM_FILE).exists()


LEFT_UNFINISHED = """
import sys
from creditaudit import Recorder, rule
from integrity_support import tiny_own_loop
net, x, y = tiny_own_loop()
rec = Recorder(rule("bp", net), x, y, out=sys.argv[1], name="left", progress=False,
               config={"diagnostics.end_of_run": False})
rec.epoch(0)
"""


def test_a_recorder_left_unfinished_releases_its_claim_quietly_at_exit(tmp_path):
    """A script that never calls finish(): its claim was released from the claim's
    generator finalised at interpreter shutdown, which failed there ("Exception ignored …
    holding_run … sys.meta_path is None") and left the claim behind."""
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [os.environ.get("PYTHONPATH"), tests]))}
    done = subprocess.run([sys.executable, "-c", LEFT_UNFINISHED, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert (tmp_path / "left" / RECORD_FILE).exists()
    assert not (tmp_path / "left" / CLAIM_FILE).exists()


IN_EPOCH_2 = """
import json, sys, time
from pathlib import Path
from creditaudit.config import config_from_dict
from creditaudit.run.trainer import Trainer, train
config = config_from_dict(json.loads(sys.argv[1]))
original = Trainer.train_epoch
def slow(self, epoch):
    if epoch == 2:
        Path(sys.argv[2]).touch()
        time.sleep(float(sys.argv[3]))
    return original(self, epoch)
Trainer.train_epoch = slow
train(config)
"""


def train_in_subprocess(config: RunConfig, ready: Path, sleep: float) -> subprocess.Popen:
    """``train(config)`` in a child process that sleeps ``sleep`` s once its epoch 2 starts;
    returned when it is there (``ready`` exists)."""
    child = subprocess.Popen([sys.executable, "-c", IN_EPOCH_2, json.dumps(config.to_dict()),
                              str(ready), str(sleep)])
    deadline = time.monotonic() + 60
    while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not ready.exists():
        child.kill()
        child.wait()
        pytest.fail("the run never reached its epoch 2")
    return child


@pytest.mark.slow
def test_a_sweep_with_a_short_stale_after_leaves_a_live_train_alone(tmp_path):
    """A sweep breaks claims older than its ``--stale-after``: the claim of a training
    ``creditaudit train`` is refreshed often enough for one of a few seconds (before: the
    run had no claim, and the sweep trained it beside the other process)."""
    from creditaudit.sweep import InlineExecutor, prepare_configs, run_sweep

    config = tiny(tmp_path / "out", **{"optim.epochs": 3})
    child = train_in_subprocess(config, tmp_path / "in-epoch-2", sleep=12)
    try:
        time.sleep(7)
        result = run_sweep(prepare_configs([config], threads=1), InlineExecutor(),
                           stale_after=6, wait_for_others=False)
        assert [o["status"] for o in result.outcomes] == ["busy"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_a_run_killed_mid_epoch_reads_running_then_interrupted_and_resumes(tmp_path):
    """kill -9 of ``creditaudit train`` in its epoch 2: while it lived, readers said the
    run was held by it; after, that its process is gone; ``--resume`` then breaks its
    claim and finishes the run as an uninterrupted run of the same config would."""
    config = tiny(tmp_path / "out", **{"optim.epochs": 3})
    run_dir = plan_run(config).run_dir
    ready = tmp_path / "in-epoch-2"
    child = train_in_subprocess(config, ready, sleep=60)
    try:
        assert status_text(load_record(run_dir), run_dir).startswith(
            f"running (held by pid {child.pid} ")
        with pytest.raises(RunBusyError):
            train(config, resume=True)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert status_text(load_record(run_dir), run_dir).startswith(
        f"running (no process holds it: interrupted? pid {child.pid} ")
    resumed = train(config, resume=True).record
    whole = train(tiny(tmp_path / "whole", **{"optim.epochs": 3})).record
    assert [e.test_loss for e in resumed.log] == [e.test_loss for e in whole.log]
    assert not (run_dir / CLAIM_FILE).exists()


def test_an_audit_between_a_training_runs_checkpoint_and_record_writes_says_it_trains(
        interrupted, capsys, caplog):
    """Read while its run trains, a folder's checkpoint may be an epoch ahead of its record
    (written a moment later). Before: the audit warned that the record write had failed and
    told to ``--resume`` the run another process was training."""
    run_dir = plan_run(interrupted).run_dir
    record = load_record(run_dir)
    record.log = record.log[:-1]  # epoch 1 checkpointed, its record not yet written
    record.status = "running"
    save_record(run_dir, record)
    write_claim(run_dir, os.getppid())
    capsys.readouterr()
    assert main(["audit", str(run_dir), "--no-metrics"]) == 0
    out, err = capsys.readouterr()
    said = out + err + caplog.text
    assert "--resume" not in said and "write failed" not in said
    assert "audited at its last checkpoint, epoch 1" in out


def test_an_audit_of_a_killed_run_says_no_process_holds_it(interrupted, capsys):
    """A run killed with kill -9 keeps ``running`` in its record and a claim of a process
    that is gone. Before: its audit said ``run status running`` as of a run still training
    (report says ``running (no process holds it: …)``); a live holder is named too."""
    run_dir = plan_run(interrupted).run_dir
    record = load_record(run_dir)
    record.status = "running"  # as kill -9 leaves it
    save_record(run_dir, record)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    for pid, said in [(gone.pid, f"running (no process holds it: interrupted? pid {gone.pid} "
                                 f"on {host} is gone)"),
                      (os.getppid(), f"running (held by pid {os.getppid()} on {host})")]:
        write_claim(run_dir, pid)
        capsys.readouterr()
        for form in ("text", "md"):
            assert main(["audit", str(run_dir), "--no-metrics", "-q", "--format", form]) == 0
            assert (f"run status {said}: audited at its last checkpoint, epoch 1"
                    in capsys.readouterr().out.splitlines())
        assert main(["audit", str(run_dir), "--no-metrics", "-q", "--format", "json"]) == 0
        metadata = json.loads(capsys.readouterr().out)["metadata"]
        assert (metadata["status"], metadata["status_text"]) == ("running", said)


def test_a_finished_run_in_a_folder_that_cannot_be_written_is_served_unfinished_not(
        tmp_path, monkeypatch):
    """A read-only copy of a lab's results: its finished run is served (nothing is written
    there); an unfinished run, or --force, still needs the claim and says why not. The tests
    run as root, where permission bits do not stop a write: the claim's write fails as on a
    read-only file system."""
    config = tiny(tmp_path / "out")
    done = train(config)
    real_open = os.open

    def read_only(path, flags, *args):
        if Path(path).name == CLAIM_FILE and flags & os.O_CREAT:
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    served = train(config)
    assert served.record.to_dict() == done.record.to_dict()
    assert not (done.run_dir / CLAIM_FILE).exists()
    with pytest.raises(Exception, match="cannot claim the run.*read-only"):
        train(config, force=True)
    other = tiny(tmp_path / "out", **{"optim.epochs": 2})
    with pytest.raises(Exception, match="cannot claim the run.*read-only"):
        train(other)
