"""What the sweep tests (test_sweep.py, test_sweep_plan.py, test_sweep_ray.py) share: the tiny
sweep file they start from, and the check that a sweep process ends as an interrupted sweep
must."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from creditaudit.config import RunConfig
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, load_record
from creditaudit.sweep import CLAIM_FILE
from integrity_support import sweep_toml

# The [base] run, as dotted keys: 256 synthetic samples of 8 features, 2 blocks of width 16,
# trained in about a second per epoch.
TINY_SWEEP_BASE: dict[str, object] = {
    "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "model.d": 16,
    "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
}


def tiny_sweep_run(out: Path, **overrides: object) -> RunConfig:
    """The tiny run of :data:`TINY_SWEEP_BASE` as a RunConfig writing into ``out`` (128
    evaluation samples, no progress line), with the dotted keys of ``overrides``."""
    return RunConfig().replace(**{**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128,
                                  "run.progress": False, "run.out_dir": str(out),
                                  **overrides})


def write_tiny_sweep(path: Path, out: Path, body: str = "", *, epochs: int = 1,
                     base: Mapping[str, object] | None = None) -> Path:
    """Write a sweep file to ``path`` and return ``path``: its [base] is the tiny run of
    :data:`TINY_SWEEP_BASE` with the dotted keys of ``base`` added, trained for ``epochs``
    epochs, writing its runs to ``out``; ``body`` (dedented: [grid], [[include]]) follows."""
    keys = {**TINY_SWEEP_BASE, **(base or {}), "optim.epochs": epochs, "run.out_dir": str(out)}
    path.write_text(sweep_toml(keys, textwrap.dedent(body)))
    return path


def interrupt_sweep(process: subprocess.Popen, run_dirs: Sequence[Path], signum: int, *,
                    to_group: bool = False) -> None:
    """Send ``signum`` to the sweep ``process`` once each of ``run_dirs`` holds a checkpoint
    and a record (at most 120 s), to its whole process group with ``to_group`` (as a
    terminal sends Ctrl-C), and check that it ends as an interrupted sweep must: exit code
    128 + ``signum`` (130 for SIGINT, 143 for SIGTERM) within 45 s, a last line that says
    so, each run recorded 'interrupted' with its checkpoint kept and its claim released, and
    so listed in its summary. The process must run in a session of its own
    (``start_new_session=True``) with text pipes; its group is killed if anything fails."""
    try:
        deadline = time.monotonic() + 120
        while not all((d / CHECKPOINT_FILE).exists() and (d / RECORD_FILE).exists()
                      for d in run_dirs):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the runs never checkpointed"
            time.sleep(0.1)
        if to_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        interrupted = time.monotonic()
        _, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 128 + signum, err
    assert time.monotonic() - interrupted < 45
    assert err.strip().splitlines()[-1].startswith("creditaudit: sweep interrupted")
    summary = json.loads((run_dirs[0].parent / "sweep_summary.json").read_text())
    said = {entry["run_id"]: (entry["status"], entry["action"]) for entry in summary["runs"]}
    for run_dir in run_dirs:
        assert load_record(run_dir).status == "interrupted"  # resumes from its checkpoint
        assert (run_dir / CHECKPOINT_FILE).exists() and not (run_dir / CLAIM_FILE).exists()
        assert said[run_dir.name] == ("interrupted", "interrupted")  # the summary says so
