"""What a sweep reports of its runs: the lines under its table name the run each is about,
and a record left ``running`` by a run that ended shows how the run ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from creditaudit.cli.sweep_output import format_sweep_table
from creditaudit.config import RunConfig
from creditaudit.errors import OutputError
from creditaudit.records import load_record
from creditaudit.sweep import SUMMARY_FILE, InlineExecutor, prepare_configs, run_sweep
from sweep_files import TINY_SWEEP_BASE

TINY = {**TINY_SWEEP_BASE, "diagnostics.eval_samples": 128, "run.progress": False}


def sweep(out: Path, grid_keys: list[str], *runs: dict[str, object]):
    configs = [RunConfig().replace(**{**TINY, "run.out_dir": str(out), **run}) for run in runs]
    return run_sweep(prepare_configs(configs, threads=1), InlineExecutor(),
                     grid_keys=grid_keys)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_each_divergence_note_names_its_run(tmp_path: Path):
    """Two diverged bp runs printed "bp diverged in epoch 1 …" twice."""
    diverges = {"optim.lr": 1e8, "optim.schedule": "constant"}
    result = sweep(tmp_path, ["run.seed"], {**diverges, "run.seed": 1},
                   {**diverges, "run.seed": 2})
    assert [o["status"] for o in result.outcomes] == ["diverged", "diverged"]
    notes = [line for line in format_sweep_table(result.plans, ["run.seed"]).splitlines()
             if "diverged in epoch" in line]
    assert [note.split(" diverged")[0] for note in notes] == ["seed=1", "seed=2"], notes


def test_a_record_left_running_by_a_failed_run_is_reported_failed(tmp_path: Path,
                                                                   monkeypatch):
    """The run failed, but neither its trainer nor the worker could rewrite its record (a
    full disk): sweep_summary.json and the table said 'running', though nothing runs it."""
    import creditaudit.run.record_keeping as trainer  # where the trainer writes its record
    import creditaudit.sweep.worker as worker
    from creditaudit.run.trainer import Trainer

    real_save = trainer.save_record

    def save_running_only(run_dir: Path, record) -> None:  # noqa: ANN001
        if record.status != "running":
            raise OutputError(f"cannot write {run_dir}: no space left on device")
        real_save(run_dir, record)

    def fails(self, epoch: int) -> None:  # noqa: ANN001
        raise RuntimeError("a bad batch")

    def cannot_write(*args: object) -> None:
        raise OutputError("no space left on device")

    monkeypatch.setattr(trainer, "save_record", save_running_only)
    monkeypatch.setattr(Trainer, "train_epoch", fails)
    monkeypatch.setattr(worker, "write_failed_record", cannot_write)
    result = sweep(tmp_path, [], {})
    (plan,) = result.plans
    assert load_record(plan.run_dir).status == "running"  # the stale record
    (entry,) = json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]
    assert entry["status"] == "failed", entry
    assert "no space left on device" in entry["error"]  # the outcome's: the record has none
    assert result.summary["counts"] == {"failed": 1}
    table = format_sweep_table(result.plans, [], {entry["run_id"]: entry["status"]})
    row = table.splitlines()[2]
    assert " failed " in row and "running" not in row, table


def test_a_run_whose_ray_worker_is_shut_down_is_interrupted_not_failed(tmp_path: Path,
                                                                       monkeypatch):
    """Ray ends a worker it shuts down (a sweep interrupted past its unwind time) with a
    SystemExit under the run: recorded 'failed: SystemExit: 1', the run was skipped by the
    next sweep instead of resumed."""
    raylet = pytest.importorskip("ray._raylet")
    from creditaudit.run.trainer import Trainer
    from creditaudit.sweep.worker import run_one

    def shut_down(self, epoch: int) -> None:  # noqa: ANN001
        raylet.raise_sys_exit_with_custom_error_message("worker shut down", 1)

    monkeypatch.setattr(Trainer, "train_epoch", shut_down)
    (config,) = prepare_configs([RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path)})],
                                threads=1)
    with pytest.raises(SystemExit):
        run_one(config.to_dict())
    (run_dir,) = [path.parent for path in tmp_path.glob("*/record.json")]
    assert load_record(run_dir).status == "interrupted"
    assert not (run_dir / "claim.json").exists()


def test_a_stack_whose_ray_worker_is_shut_down_is_interrupted_not_failed(tmp_path: Path,
                                                                         monkeypatch):
    """The same for the runs of a stack (run_group): each was recorded 'failed: SystemExit'."""
    raylet = pytest.importorskip("ray._raylet")
    from creditaudit.run.steps.epochs import StackedEpochs
    from creditaudit.sweep.worker import run_group

    def shut_down(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raylet.raise_sys_exit_with_custom_error_message("worker shut down", 1)

    monkeypatch.setattr(StackedEpochs, "train_epoch", shut_down)
    configs = prepare_configs([RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                                      "run.seed": seed}) for seed in (1, 2)],
                              threads=1)
    with pytest.raises(SystemExit):
        run_group([c.to_dict() for c in configs], run_ids=[None, None])
    folders = [path.parent for path in tmp_path.glob("*/record.json")]
    assert len(folders) == 2
    assert [load_record(f).status for f in folders] == ["interrupted", "interrupted"]
    assert not any((f / "claim.json").exists() for f in folders)


def test_a_folder_holding_another_runs_record_has_no_row(tmp_path: Path):
    """A run folder copied by hand under another run's name is refused, but the table
    showed the copied record's numbers (and its 'completed') on the refused run's row."""
    import shutil

    first = sweep(tmp_path / "a", ["run.seed"], {"run.seed": 1})
    other = sweep(tmp_path / "b", ["run.seed"], {"run.seed": 2}).plans[0]
    shutil.rmtree(other.run_dir)
    shutil.copytree(first.plans[0].run_dir, tmp_path / "b" / other.run_id)
    result = sweep(tmp_path / "b", ["run.seed"], {"run.seed": 2})
    assert [o["status"] for o in result.outcomes] == ["refused"]
    assert format_sweep_table(result.plans, ["run.seed"],
                              {other.run_id: "refused"}) == "no run has a record yet"


def test_an_interrupt_while_a_run_is_begun_releases_its_claim(tmp_path: Path, monkeypatch):
    """A worker interrupted after claiming a run but before training it (the SIGTERM a
    broken pool sends its other workers, a Ctrl-C) left the run's claim.json naming itself:
    the sweep then counted the run as one whose worker died, saying its code ended the
    process, and a second such break recorded it failed."""
    from creditaudit.sweep import claiming
    from creditaudit.sweep.worker import run_one

    def interrupted(out_dir: Path, event: str, run_id: str, **fields: object) -> None:
        if event == "start":
            raise KeyboardInterrupt

    monkeypatch.setattr(claiming, "append_event", interrupted)
    (config,) = prepare_configs([RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path)})],
                                threads=1)
    with pytest.raises(KeyboardInterrupt):
        run_one(config.to_dict())
    assert list(tmp_path.glob("*/claim.json")) == []


def test_an_interrupt_while_a_stack_is_begun_releases_the_claims_taken(tmp_path: Path,
                                                                       monkeypatch):
    """run_group claims its runs one after another (each planned first: seconds): an
    interrupt while the second was begun left the first's claim behind."""
    from creditaudit.sweep import worker
    from creditaudit.sweep.worker import run_group

    begin = worker.begin_run
    calls = []

    def second_interrupted(*args, **kwargs):  # noqa: ANN002, ANN003
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return begin(*args, **kwargs)

    monkeypatch.setattr(worker, "begin_run", second_interrupted)
    configs = prepare_configs([RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path),
                                                      "run.seed": seed}) for seed in (1, 2)],
                              threads=1)
    with pytest.raises(KeyboardInterrupt):
        run_group([config.to_dict() for config in configs], run_ids=[None, None])
    assert list(tmp_path.glob("*/claim.json")) == []
