"""A run's checkpoint and init file are checked before they are used, each refusal one line
naming the file. A probe found: an optimiser state with param 0's Adam moment replaced by a
3×3 tensor resumed into a segfault, an out-of-memory kill or an internal error, and one
transposed resumed silently into another run; a checkpoint copied from another run was
audited and served as this run's; after a failed record write, audit paired the epoch-2
model with epoch 1's accuracy; init.pt was never checked on resume (an extra tensor, a
missing file, another run's init.pt surfaced after all epochs trained, or never); and
checkpoints of unknown formats were loaded."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from creditaudit import train
from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import RunRecordError
from creditaudit.records import CHECKPOINT_FILE, INIT_FILE, load_record
from creditaudit.run.trainer import Trainer
from integrity_support import toml_of
from test_interrupt_text import TINY, interrupted_at

pytestmark = pytest.mark.usefixtures("single_thread")


def config_file(tmp_path: Path, name: str = "run", **overrides: object) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "runs"), **overrides}))
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def stopped_after_epoch_1(tmp_path: Path, capsys, monkeypatch, name: str = "run",
                          **overrides: object) -> tuple[Path, Path]:
    """(config file, run folder) of a run interrupted after epoch 1, checkpointed."""
    config = config_file(tmp_path, name, **overrides)
    with monkeypatch.context() as patch:
        interrupted_at(patch, 2)
        assert cli(capsys, "train", "-q", "--config", str(config))[0] == 130
    (folder,) = [d for d in (tmp_path / "runs").iterdir()
                 if load_record(d).config.run.seed == overrides.get("run.seed", 42)]
    return config, folder


def edit_checkpoint(folder: Path, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """Apply ``edit`` to the folder's checkpoint; the bytes written."""
    path = folder / CHECKPOINT_FILE
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    return path.read_bytes()


def assert_refused(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("creditaudit: error: "), err
    for word in words:
        assert word in err, (word, err)


# --- 1. a damaged optimiser state ---------------------------------------------------------
def first_moments(state: dict[str, Any]) -> dict[str, Any]:
    """The Adam state of the model's first parameter (embed.weight, (16, 8))."""
    moments = state["optimizer"]["state"]
    return moments[sorted(moments)[0]]


DAMAGES = {
    "moment-3x3": (lambda m: m.__setitem__("exp_avg", torch.zeros(3, 3)),
                   ".exp_avg has shape (3, 3), its parameter (16, 8)"),
    "moment-transposed": (lambda m: m.__setitem__("exp_avg", m["exp_avg"].t().contiguous()),
                          ".exp_avg has shape (8, 16), its parameter (16, 8)"),
    "step-not-scalar": (lambda m: m.__setitem__("step", torch.ones(16, 8)),
                        ".step is a torch.float32 tensor of shape (16, 8), not a floating "
                        "scalar"),
    "moment-integer": (lambda m: m.__setitem__("exp_avg_sq", m["exp_avg_sq"].long()),
                       ".exp_avg_sq is a torch.int64 tensor, not floating"),
    "moment-missing": (lambda m: m.pop("exp_avg_sq"), " lacks 'exp_avg_sq', which other "
                       "parameters' states hold"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_optimiser_state_is_refused_before_it_is_loaded(tmp_path, capsys,
                                                                  monkeypatch, damage):
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch)
    edit, words = DAMAGES[damage]
    written = edit_checkpoint(folder, lambda state: edit(first_moments(state)))
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert_refused(code, err, f"checkpoint {folder / CHECKPOINT_FILE} holds a damaged "
                   "optimiser state", f"optimizer.state[0]{words}", "--force")
    assert load_record(folder).status == "interrupted"  # nothing trained, nothing written
    assert (folder / CHECKPOINT_FILE).read_bytes() == written


def test_a_damaged_state_of_a_rules_own_optimiser_is_refused(tmp_path, capsys, monkeypatch):
    """local-ce trains its classifiers with an optimiser of its own, saved in the rule's
    state: the same checks hold there, for resume and for audit."""
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch,
                                           **{"method.name": "local-ce"})

    def transpose(state: dict[str, Any]) -> None:
        moments = state["rule"]["optimizer"]["state"]
        first = moments[sorted(moments)[0]]
        assert first["exp_avg"].ndim == 2 and first["exp_avg"].shape[0] != \
            first["exp_avg"].shape[1]
        first["exp_avg"] = first["exp_avg"].t().contiguous()

    edit_checkpoint(folder, transpose)
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert_refused(code, err, "holds a damaged optimiser state", "rule.optimizer.state[0]"
                   ".exp_avg has shape")
    code, _, err = cli(capsys, "audit", str(folder), "--no-metrics", "-q")
    assert_refused(code, err, "holds a damaged optimiser state", "rule.optimizer.state[0]")
    assert load_record(folder).status == "interrupted"


def test_an_undamaged_optimiser_state_resumes(tmp_path, capsys, monkeypatch):
    """The control: the same run resumed from its own checkpoint completes."""
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch,
                                           **{"method.name": "local-ce"})
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert code == 0, err
    assert load_record(folder).status == "completed"


# --- 2. a checkpoint copied from another run ----------------------------------------------
@pytest.mark.parametrize("other", [{"optim.lr": 3e-3}, {"model.residual": False}],
                         ids=["other-lr", "not-residual"])
def test_a_checkpoint_copied_from_another_run_is_neither_audited_nor_served(tmp_path, capsys,
                                                                           other):
    """Both runs have the same parameter shapes; B's weights were audited as A's."""
    a, b = config_file(tmp_path, "a"), config_file(tmp_path, "b", **other)
    for config in (a, b):
        assert cli(capsys, "train", "-q", "--config", str(config))[0] == 0
    (run_a,) = [d for d in (tmp_path / "runs").iterdir()
                if load_record(d).config.optim.lr == 1e-3 and load_record(d).config.model.residual]
    (run_b,) = [d for d in (tmp_path / "runs").iterdir() if d != run_a]
    code, _, err = cli(capsys, "audit", str(run_a), "--no-metrics", "-q")
    assert code == 0, err  # the control: its own checkpoint is audited
    (run_a / CHECKPOINT_FILE).write_bytes((run_b / CHECKPOINT_FILE).read_bytes())
    code, _, err = cli(capsys, "audit", str(run_a), "--no-metrics", "-q")
    assert_refused(code, err, f"{run_a / CHECKPOINT_FILE} holds the record of run "
                   f"{run_b.name}, not of {run_a.name}")
    served = train(RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path / "runs")}))
    assert served.run_dir == run_a and served.status == "completed"
    with pytest.raises(RunRecordError, match=f"holds the record of run {run_b.name}"):
        served.model  # noqa: B018


@pytest.mark.parametrize("frozen_acc", [None, 0.5], ids=["seed", "seed-and-frozen-acc"])
def test_a_checkpoint_of_another_seed_is_named_as_another_runs(tmp_path, capsys, monkeypatch,
                                                               frozen_acc):
    """The synthetic data is drawn from the seed: the seed-7 run's checkpoint was refused as
    the data having changed, with the advice to point data.data_dir at the run's data (and,
    had it another frozen_acc, as resumed with another value of it)."""
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch)
    frozen = {} if frozen_acc is None else {"diagnostics.frozen_acc": frozen_acc}
    _, other = stopped_after_epoch_1(tmp_path, capsys, monkeypatch, "other",
                                     **{"run.seed": 7, **frozen})
    (folder / CHECKPOINT_FILE).write_bytes((other / CHECKPOINT_FILE).read_bytes())
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert_refused(code, err, f"{folder / CHECKPOINT_FILE} holds the record of run "
                   f"{other.name}, not of {folder.name}", "--force")
    assert "data_dir" not in err and "frozen_acc" not in err


# --- 3. record.json an epoch behind the checkpoint ----------------------------------------
def record_write_fails_after(monkeypatch, epoch: int) -> None:
    """The record write after ``epoch`` fails with a full disk (the checkpoint of that
    epoch is already written): the state §1 of docs/reliability.md calls resumable."""
    import creditaudit.run.record_keeping as trainer  # where the trainer writes its record

    real = trainer.save_record

    def save_record(run_dir, record):  # noqa: ANN001
        if record.log and record.log[-1].epoch == epoch:
            raise OSError(errno.ENOSPC, "No space left on device", str(run_dir))
        return real(run_dir, record)

    monkeypatch.setattr(trainer, "save_record", save_record)


def test_audit_of_a_record_behind_its_checkpoint_reads_the_checkpointed_epoch(tmp_path, capsys,
                                                                              monkeypatch,
                                                                              caplog):
    learns = {"optim.lr": 3e-2}  # the accuracy moves between epochs 1 and 2
    reference = config_file(tmp_path, "ref", **learns, **{"run.out_dir": str(tmp_path / "ref")})
    assert cli(capsys, "train", "-q", "--config", str(reference))[0] == 0
    (ref,) = (tmp_path / "ref").iterdir()
    accuracy = {e.epoch: e.acc_eval for e in load_record(ref).log}
    assert accuracy[1] != accuracy[2]  # else the test could not tell the epochs apart
    config = config_file(tmp_path, **learns)
    with monkeypatch.context() as patch:
        record_write_fails_after(patch, 2)
        assert cli(capsys, "train", "-q", "--config", str(config))[0] == 2
    (folder,) = (tmp_path / "runs").iterdir()
    assert [e.epoch for e in load_record(folder).log] == [0, 1]
    assert torch.load(folder / CHECKPOINT_FILE, weights_only=True)["epoch"] == 2
    caplog.clear()
    code, out, err = cli(capsys, "audit", str(folder), "--no-metrics", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["metadata"]["epoch"] == 2
    assert report["metadata"]["headline_acc"] == accuracy[2]  # was epoch 1's
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "logs epochs up to 1, but the checkpoint is of epoch 2" in warning, warning
    assert "--resume" in warning
    # a checkpoint whose own record lacks its epoch too is refused, naming it
    edit_checkpoint(folder, lambda state: state["record"]["log"].pop())
    code, _, err = cli(capsys, "audit", str(folder), "--no-metrics", "-q")
    assert_refused(code, err, f"{folder / CHECKPOINT_FILE} is of epoch 2, but neither "
                   "record.json nor the record it holds logs that epoch", "--force")


def test_audit_of_a_completed_run_with_an_older_checkpoint_warns(tmp_path, capsys, monkeypatch,
                                                                  caplog):
    """A completed run's checkpoint of an earlier epoch (an older file copied over it) was
    audited at that epoch, said only as metadata.epoch in the JSON."""
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch)
    older = (folder / CHECKPOINT_FILE).read_bytes()
    assert cli(capsys, "train", "-q", "--config", str(config), "--resume")[0] == 0
    assert load_record(folder).status == "completed"
    (folder / CHECKPOINT_FILE).write_bytes(older)
    caplog.clear()
    code, out, err = cli(capsys, "audit", str(folder), "--no-metrics", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["metadata"]["epoch"] == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "logs a completed run up to epoch 2, but its checkpoint is of epoch 1" in warning


def test_a_run_whose_record_is_behind_its_first_trained_checkpoint_resumes_from_it(
        tmp_path, capsys, monkeypatch, caplog):
    """Stopped between writing checkpoint(1) and rewriting record.json (which still logs only
    epoch 0), the run was started over as one that "stopped before its first checkpoint"."""
    import logging

    reference = config_file(tmp_path, "ref", **{"run.out_dir": str(tmp_path / "ref")})
    assert cli(capsys, "train", "-q", "--config", str(reference))[0] == 0
    (ref,) = (tmp_path / "ref").iterdir()
    config = config_file(tmp_path)
    with monkeypatch.context() as patch:
        record_write_fails_after(patch, 1)
        assert cli(capsys, "train", "-q", "--config", str(config))[0] == 2
    (folder,) = (tmp_path / "runs").iterdir()
    assert [e.epoch for e in load_record(folder).log] == [0]
    assert load_record(folder).status == "running"
    assert torch.load(folder / CHECKPOINT_FILE, weights_only=True)["epoch"] == 1
    # without --resume it is refused as any run with a trained epoch is, not started over
    code, _, err = cli(capsys, "train", "-q", "--config", str(config))
    assert_refused(code, err, "exists with status 'running'", "--resume")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="creditaudit"):
        assert cli(capsys, "train", "-q", "--config", str(config), "--resume")[0] == 0
    assert not any("starting it over" in r.getMessage() for r in caplog.records)
    record = load_record(folder)
    assert [part.epoch for part in record.resumed] == [2]  # went on from checkpoint(1)
    assert [e.acc_eval for e in record.log] == [e.acc_eval for e in load_record(ref).log]


# --- 4. init.pt, checked when the run resumes ---------------------------------------------
def other_runs_init(tmp_path: Path, capsys, monkeypatch) -> bytes:
    _, other = stopped_after_epoch_1(tmp_path, capsys, monkeypatch, "other",
                                     **{"run.seed": 7, "diagnostics.end_of_run": True})
    return (other / INIT_FILE).read_bytes()


def with_extra_tensor(folder: Path) -> None:
    state = torch.load(folder / INIT_FILE, weights_only=True)
    torch.save({**state, "extra": torch.zeros(3)}, folder / INIT_FILE)


def in_float64(folder: Path) -> None:
    state = torch.load(folder / INIT_FILE, weights_only=True)
    torch.save({name: t.double() for name, t in state.items()}, folder / INIT_FILE)


INIT_DAMAGES = {
    "extra-tensor": (with_extra_tensor, "holds 'extra', which is no parameter of this run's "
                     "model"),
    "missing": (lambda folder: (folder / INIT_FILE).unlink(), "is missing, and the end-of-run "
                "drift compares the trained weights with it"),
    "a-folder": (lambda folder: (folder / INIT_FILE).unlink() or (folder / INIT_FILE).mkdir(),
                 "is not a regular file, and the end-of-run drift compares the trained weights "
                 "with it"),
    "other-dtype": (in_float64, "holds embed.weight of shape (16, 8) and torch.float64, but "
                    "the model's is (16, 8) and torch.float32"),
    "another-runs": (None, "is not this run's initial weights"),
}


@pytest.mark.parametrize("damage", list(INIT_DAMAGES))
def test_init_pt_is_checked_when_the_run_resumes_before_training(tmp_path, capsys, monkeypatch,
                                                                damage):
    trained = []
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch,
                                           **{"diagnostics.end_of_run": True})
    edit, words = INIT_DAMAGES[damage]
    if edit is None:  # another run of the same shapes (seed 7)
        (folder / INIT_FILE).write_bytes(other_runs_init(tmp_path, capsys, monkeypatch))
    else:
        edit(folder)
    original = Trainer.train_epoch
    monkeypatch.setattr(Trainer, "train_epoch",
                        lambda self, epoch: trained.append(epoch) or original(self, epoch))
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert_refused(code, err, f"cannot resume: {folder / INIT_FILE} {words}",
                   "restore the run's own init.pt, or start the run over with --force")
    assert trained == []  # refused before training, not after every epoch
    assert load_record(folder).status == "interrupted"


def test_init_pt_replaced_while_the_run_trains_gives_no_drift(tmp_path, capsys, monkeypatch):
    """The drift read init.pt unchecked at the end: another run's file copied over it during
    training gave a drift of the wrong weights in a completed record."""
    other = other_runs_init(tmp_path, capsys, monkeypatch)
    config = config_file(tmp_path, **{"diagnostics.end_of_run": True})
    original = Trainer.train_epoch

    def replaced(self, epoch):  # noqa: ANN001, ANN202
        if epoch == 2:
            (self.run_dir / INIT_FILE).write_bytes(other)
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", replaced)
    code, _, err = cli(capsys, "train", "-q", "--config", str(config))
    assert_refused(code, err, "cannot compute the end-of-run drift",
                   "is not this run's initial weights")
    (folder,) = [d for d in (tmp_path / "runs").iterdir()
                 if load_record(d).config.run.seed == 42]
    assert load_record(folder).status == "failed"
    assert not load_record(folder).diagnostics.drift


def test_a_run_without_an_init_digest_or_without_end_of_run_metrics_resumes(tmp_path, capsys,
                                                                           monkeypatch):
    """Checkpoints written before init.pt's digest was kept resume as before (init.pt's
    names, shapes and dtypes are still checked); a run that never reads init.pt (no
    end-of-run metrics) resumes without one."""
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch,
                                           **{"diagnostics.end_of_run": True})
    edit_checkpoint(folder, lambda state: state.pop("init_sha256"))
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert code == 0, err
    assert load_record(folder).diagnostics.drift  # read from init.pt at the end
    config, folder = stopped_after_epoch_1(tmp_path / "plain", capsys, monkeypatch)
    digest = torch.load(folder / CHECKPOINT_FILE, weights_only=True)["init_sha256"]
    (folder / INIT_FILE).unlink()
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert code == 0, err
    # the resumed part's checkpoints keep the digest
    assert torch.load(folder / CHECKPOINT_FILE, weights_only=True)["init_sha256"] == digest


# --- 5. a checkpoint of an unknown format -------------------------------------------------
def test_a_checkpoint_of_an_unknown_format_is_refused(tmp_path, capsys, monkeypatch):
    config, folder = stopped_after_epoch_1(tmp_path, capsys, monkeypatch)
    edit_checkpoint(folder, lambda state: state.__setitem__("format",
                                                            "creditaudit.checkpoint/99"))
    words = (f"checkpoint {folder / CHECKPOINT_FILE} is of format 'creditaudit.checkpoint/99', "
             "which this creditaudit does not read (it reads 'creditaudit.checkpoint/1')")
    code, _, err = cli(capsys, "train", "-q", "--config", str(config), "--resume")
    assert_refused(code, err, words, "--force")
    code, _, err = cli(capsys, "audit", str(folder), "--no-metrics", "-q")
    assert_refused(code, err, words)
    assert load_record(folder).status == "interrupted"


# --- 6. a checkpoint that is no regular file ----------------------------------------------
@pytest.mark.parametrize("plant", ["named-pipe", "symlink-to-dev-zero"])
def test_a_checkpoint_that_is_no_regular_file_is_not_called_missing(tmp_path, plant):
    from creditaudit.records import load_checkpoint

    path = tmp_path / CHECKPOINT_FILE
    if plant == "named-pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(RunRecordError, match="is not a regular file") as refused:
        load_checkpoint(path)
    assert "missing" not in str(refused.value)


# --- 7. a payload calling into a module torch blocks (os, sys, posix, nt) ------------------
class _BlockedPayload:
    """Unpickling calls ``os.remove(path)`` (torch's weights-only reader blocks the os
    module outright, with another message than for a class it does not allow)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # noqa: ANN204 - pickle protocol
        return (os.remove, (self.path,))


@pytest.mark.parametrize("name", [CHECKPOINT_FILE, INIT_FILE])
def test_a_payload_of_a_blocked_module_is_named_as_objects_not_as_a_corrupt_file(tmp_path,
                                                                                 name):
    from creditaudit.records import load_checkpoint
    from creditaudit.records.checkpoint import load_parameters

    victim = tmp_path / "victim"
    victim.write_text("kept")
    path = tmp_path / name
    torch.save({"model": _BlockedPayload(victim)}, path)
    load = load_checkpoint if name == CHECKPOINT_FILE else load_parameters
    with pytest.raises(RunRecordError, match="never unpickles") as refused:
        load(path)
    assert "not a file torch.save wrote" not in str(refused.value)
    assert victim.exists()
