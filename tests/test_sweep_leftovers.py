"""What a local sweep says of runs its workers died on: a run failed after deaths keeps the
action its last attempt took (resumed, not trained), and when workers keep dying at
start-up, a run another worker had started and the broken pool interrupted is said to
resume, not to be "never started"."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from creditaudit.config import RunConfig
from creditaudit.records import CHECKPOINT_FILE, load_record
from creditaudit.run.plan import run_id
from creditaudit.sweep import LocalExecutor, prepare_configs, run_sweep
from creditaudit.sweep.worker import append_event
from plugin_support import exiting_net_source
from sweep_files import TINY_SWEEP_BASE

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# An MLP whose forward ends its process (os._exit) at its exit_at-th training batch of
# the process: every attempt dies, each after one more epoch.
EXITING_NET = exiting_net_source('os._exit(0)', once=True)


def _config(out: Path, **overrides: object) -> RunConfig:
    base = {key: value for key, value in TINY_SWEEP_BASE.items()
            if not key.startswith("model.")}
    return RunConfig().replace(**{**base, "run.progress": False, "run.out_dir": str(out),
                                  "diagnostics.eval_samples": 64, **overrides})


@pytest.mark.slow
def test_a_run_failed_after_its_workers_died_resuming_it_says_resumed(tmp_path, monkeypatch):
    """A factory whose forward calls os._exit: the first worker trains the run and dies
    after its first checkpoint, the second resumes it and dies: failed, action resumed
    (it said trained, the default of a dead worker's outcome)."""
    (tmp_path / "exiting_net.py").write_text(EXITING_NET)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get this sys.path
    batches = TINY_SWEEP_BASE["data.n_train"] // TINY_SWEEP_BASE["optim.batch_size"]
    config = _config(tmp_path / "out", **{
        "optim.epochs": 3, "model.arch": "module", "model.factory": "exiting_net:Net",
        "model.states": ["l1", "l2"], "model.args": {"exit_at": batches + 1}})
    result = run_sweep(prepare_configs([config], threads=1), LocalExecutor(workers=1))
    (outcome,) = result.outcomes
    assert (outcome["status"], outcome["action"]) == ("failed", "resumed"), outcome
    assert "died 2 times" in outcome["error"] and "os._exit" in outcome["error"]
    (run,) = json.loads(result.summary_path.read_text())["runs"]
    assert (run["status"], run["action"]) == ("failed", "resumed")
    assert load_record(result.plans[0].run_dir).status == "failed"


def _started_then_broken(task: dict) -> None:
    """Run "a" is started (its record says interrupted, with a checkpoint: as a run the pool
    interrupted leaves it) and goes on until the pool stops it; the worker given any other
    run dies at once (as at start-up), once "a" is under way in this pool."""
    from creditaudit.config import config_from_dict
    from creditaudit.records import new_record, save_record

    out = Path(task["config"]["run"]["out_dir"])
    if task["run_id"] != "b":
        run_dir = out / task["run_id"]
        first = not (run_dir / CHECKPOINT_FILE).exists()
        record = new_record(config_from_dict(task["config"]), device="cpu",
                            run_id=task["run_id"])
        record.status = "interrupted"
        save_record(run_dir, record)
        (run_dir / CHECKPOINT_FILE).touch()
        append_event(out, "start", task["run_id"], action="trained" if first else "resumed")
        (out / f"a.{os.getpid()}").touch()
        time.sleep(120)  # until the broken pool stops this worker
        return
    deadline = time.monotonic() + 60
    while len(list(out.glob("a.*"))) <= len(list(out.glob("b.*"))) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    (out / f"b.{os.getpid()}").touch()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_when_workers_die_at_start_up_a_run_they_interrupted_is_said_to_resume(tmp_path):
    """Two pools in a row break with no run to blame (a worker dies before it takes a run):
    the run the other worker had started, which the breaks interrupted, resumes next time;
    it was said "never started, so the next sweep trains it", like the run never begun."""
    config = _config(tmp_path)
    started = run_id(config)
    tasks = [{"config": config.to_dict(), "run_id": started},
             {"config": config.to_dict(), "run_id": "b"}]
    outcomes = {o["run_id"]: o for o in LocalExecutor(workers=2).map(_started_then_broken,
                                                                     tasks)}
    assert (outcomes["b"]["status"], outcomes["b"]["action"]) == ("failed", "not started")
    assert "never started" in outcomes["b"]["error"]
    resumed = outcomes[started]
    assert (resumed["status"], resumed["action"]) == ("interrupted", "resumed"), resumed
    assert "never started" not in resumed["error"]
    assert "resumes it from its last checkpoint" in resumed["error"]
    assert "was killed by SIGKILL" in resumed["error"]
    assert len(list(tmp_path.glob("b.*"))) == 2  # two pools, a death each
