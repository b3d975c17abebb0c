"""Loggers: console progress (epoch lines when piped, a bar in a terminal, -q), TensorBoard
event files and offline W&B runs read back and compared with the run record, and training
that is bit-identical with and without them."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import math
import sys
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.loggers import (
    ConsoleLogger,
    RunLogger,
    RunStart,
    end_of_run_scalars,
    epoch_scalars,
)
from creditaudit.loggers.scalars import verdict_text
from creditaudit.records import CHECKPOINT_FILE, load_checkpoint, load_record
from creditaudit.records.compare import comparable
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("single_thread")

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
needs_tensorboard = pytest.mark.skipif(
    not HAS_TENSORBOARD, reason="tensorboard is not installed (pip install -e '.[test]')")
needs_wandb = pytest.mark.skipif(
    not HAS_WANDB, reason="wandb is not installed (pip install -e '.[test]')")

EPOCHS = 2
TINY = {
    "method.name": "dfa", "data.n_train": 512, "data.n_test": 256, "data.in_dim": 8,
    "data.teacher_width": 32, "model.d": 16, "model.n_blocks": 2, "optim.epochs": EPOCHS,
    "optim.batch_size": 64, "diagnostics.eval_samples": 256, "diagnostics.rho_samples": 32,
    "diagnostics.rho_directions": 2, "diagnostics.null_draws": 2, "run.progress": False,
}
GROUPS = ("train/", "norms/", "credit/", "protocol/")


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def cli_args(out: Path, *extra: str) -> list[str]:
    sets = []
    for key, value in TINY.items():
        if key == "run.progress":
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        sets += ["--set", f"{key}={text}"]
    return ["train", *sets, "--out", str(out), *extra]


def close(a: float, b: float) -> bool:
    """TensorBoard stores float32: equal to float32 precision (NaN equals NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


# --- console -----------------------------------------------------------------------------------
def test_piped_train_prints_one_line_per_epoch(tmp_path, capsys):
    assert main(cli_args(tmp_path)) == 0
    out = capsys.readouterr().out
    record = train(tiny(tmp_path))  # the finished run, not rerun
    lines = [line for line in out.splitlines() if " epoch " in line]
    assert len(lines) == EPOCHS + 1
    for line, entry in zip(lines, record.record.log):
        assert line.startswith(f"dfa epoch {entry.epoch}/{EPOCHS} | ")
        assert f"test acc {entry.acc_eval:.3f}" in line
        measures = entry.measures
        assert measures is not None
        assert f"‖h_L‖ {measures.h_L_norm:.3g}" in line
        assert f"‖g_L‖ {measures.g_L_norm:.3g}" in line
        assert ("train loss" in line) == (entry.epoch > 0)
        assert "elapsed, ETA " in line
    assert lines[0].endswith("ETA ?") and "no verdict yet" in lines[0]  # before any training
    assert "no walk-back in (a)(b); (c)(d) not evaluated" in lines[-1]
    assert lines[-1].endswith("ETA 0m00s")
    assert f"run {record.record.run_id}: completed after" in out
    stages = [line for line in out.splitlines() if line.startswith("dfa end of run: ")]
    assert [line.split(": ")[1].split(" (")[0].split(":")[0] for line in stages] == \
        ["ρ", "nudging", "fresh-feedback null"]


def test_quiet_train_prints_no_progress(tmp_path, capsys):
    assert main(cli_args(tmp_path, "-q")) == 0
    out, err = capsys.readouterr()
    assert " epoch " not in out and "%" not in err
    assert "record:" in out  # the summary is still printed


def test_terminal_train_draws_one_run_level_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(cli_args(tmp_path)) == 0
    out, err = capsys.readouterr()
    assert " epoch " not in out
    steps = EPOCHS * 8  # 512 samples / batch 64
    assert f"{steps}/{steps}" in err  # one bar over every step of the run
    assert f"epoch {EPOCHS}/{EPOCHS}" in err


def test_console_eta_is_mean_epoch_time_times_epochs_left(monkeypatch):
    from creditaudit.loggers import console
    from creditaudit.records import EpochEntry

    clock = iter([0.0, 100.0, 110.0, 130.0, 150.0])  # init, start, epochs 0, 1, 2
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    logger = ConsoleLogger(stream, terminal=False)
    logger.start(RunStart(RunConfig(), "rid", Path("runs/rid"), first_epoch=1, epochs=5,
                          steps_per_epoch=3))
    for epoch in range(3):
        logger.log_epoch(EpochEntry(epoch=epoch, test_loss=1.0, acc_eval=0.5))
    lines = stream.getvalue().splitlines()
    assert lines[1].endswith("0m10s elapsed, ETA ?")
    assert lines[2].endswith("0m30s elapsed, ETA 1m20s")  # 20 s/epoch × 4 left
    assert lines[3].endswith("0m50s elapsed, ETA 1m00s")  # 20 s/epoch × 3 left


@pytest.mark.parametrize(("epochs", "steps", "said"), [
    (1, 1, "1 epoch of 1 step"), (2, 1, "2 epochs of 1 step"), (1, 3, "1 epoch of 3 steps")])
def test_console_start_line_counts_in_the_singular_for_one(epochs, steps, said):
    """The start line of `train` said "1 steps" (and "1 epochs") for one: it counts as
    every other count of the tool does (creditaudit.formatting.counted)."""
    stream = io.StringIO()
    ConsoleLogger(stream, terminal=False).start(RunStart(
        RunConfig(), "rid", Path("runs/rid"), first_epoch=1, epochs=epochs,
        steps_per_epoch=steps))
    assert f"run rid: {said} → " in stream.getvalue()


def test_resumed_run_elapsed_time_counts_the_earlier_epochs(monkeypatch):
    from creditaudit.loggers import console
    from creditaudit.records import EpochEntry

    clock = iter([0.0, 10.0, 15.0])  # init, start, epoch 3
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    logger = ConsoleLogger(stream, terminal=False)
    logger.start(RunStart(RunConfig(), "rid", Path("runs/rid"), first_epoch=3, epochs=5,
                          steps_per_epoch=3, elapsed_before=100.0))
    logger.log_epoch(EpochEntry(epoch=3, test_loss=1.0, acc_eval=0.5))
    lines = stream.getvalue().splitlines()
    assert "resuming at epoch 3" in lines[0]
    assert lines[1].endswith("1m45s elapsed, ETA 0m10s")  # 100 s before + 5 s now; 5 s × 2 left


def test_resumed_part_prints_the_epoch_it_resumes_after(tmp_path, capsys, monkeypatch):
    """Killed after epoch 1 was saved but before the console printed it: the resumed part's
    output starts with epoch 1's line (with the verdict so far), then epochs 2 and 3. Epoch
    1 used to be printed nowhere, and the resumed part showed 'no verdict yet'."""
    config = tiny(tmp_path, **{"run.progress": True, "optim.epochs": 3,
                               "diagnostics.end_of_run": False})
    original = ConsoleLogger.log_epoch

    def killed_before_printing(self, entry):  # noqa: ANN001, ANN202
        if entry.epoch == 1:
            raise KeyboardInterrupt
        return original(self, entry)

    with monkeypatch.context() as patch:
        patch.setattr(ConsoleLogger, "log_epoch", killed_before_printing)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    assert " epoch 1/" not in capsys.readouterr().out
    record = train(config, resume=True).record
    lines = [line for line in capsys.readouterr().out.splitlines() if " epoch " in line]
    assert "resuming at epoch 2" in lines[0]
    assert [line.split(" | ")[0] for line in lines[1:]] == \
        ["dfa epoch 1/3", "dfa epoch 2/3", "dfa epoch 3/3"]
    assert lines[1].endswith("ETA ?") and verdict_text(record.log[1], record.reference.to_dict()) \
        in lines[1]


class Calls(RunLogger):
    """Every call a logger receives, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def start(self, run):  # noqa: ANN001, ANN201 — the RunLogger interface
        self.calls.append(("start", run))

    def log_step(self, loss):  # noqa: ANN001, ANN201
        self.calls.append(("step", loss))

    def log_epoch(self, entry):  # noqa: ANN001, ANN201
        self.calls.append(("epoch", entry))

    def log_stage(self, text):  # noqa: ANN001, ANN201
        self.calls.append(("stage", text))

    def finish(self, record):  # noqa: ANN001, ANN201
        self.calls.append(("finish", record))

    def close(self):  # noqa: ANN201
        self.calls.append(("close", None))

    def of(self, kind: str) -> list:
        return [value for k, value in self.calls if k == kind]


def test_resume_tells_the_loggers_the_earlier_epochs_seconds(tmp_path, kill_run_at):
    config = tiny(tmp_path, **{"optim.epochs": 3})
    kill_run_at(config)  # epochs 0 and 1 trained
    earlier = load_record(tmp_path / run_id(config)).log
    calls = Calls()
    train(config, resume=True, loggers=[calls])
    start = calls.of("start")[0]
    assert start.first_epoch == 2 and start.resumed
    assert start.elapsed_before == sum(e.seconds for e in earlier) > 0


def test_a_finished_run_replays_its_record_into_new_loggers(tmp_path):
    live = Calls()
    first = train(tiny(tmp_path), loggers=[live])
    checkpoint = (first.run_dir / CHECKPOINT_FILE).read_bytes()
    replayed = Calls()
    again = train(tiny(tmp_path), loggers=[replayed])
    assert [kind for kind, _ in replayed.calls] == \
        ["start", *["epoch"] * (EPOCHS + 1), "finish", "close"]  # no steps: nothing trains
    start = replayed.of("start")[0]
    assert start.replayed and not live.of("start")[0].replayed
    assert (start.run_id, start.run_dir, start.first_epoch, start.epochs) == \
        (first.record.run_id, first.run_dir, 1, EPOCHS)
    assert start.config == first.record.config
    # The same epochs, protocol and end-of-run metrics the live run logged.
    for logged, again_logged in zip(live.of("epoch"), replayed.of("epoch"), strict=True):
        a, b = epoch_scalars(logged), epoch_scalars(again_logged)
        assert a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        assert (logged.protocol, logged.verdict) == (again_logged.protocol, again_logged.verdict)
    final = replayed.of("finish")[0]
    assert final.status == "completed" and final.to_dict() == again.record.to_dict()
    assert end_of_run_scalars(final).keys() == end_of_run_scalars(first.record).keys() != set()
    assert (first.run_dir / CHECKPOINT_FILE).read_bytes() == checkpoint  # not retrained


def test_stop_on_walkback_says_where_and_why(tmp_path, capsys):
    """On the console, and in TensorBoard's run/status (which said only 'completed')."""
    args = ["--frozen-acc", "1.0", "--stop-on-walkback"]
    if HAS_TENSORBOARD:
        args += ["--tensorboard", str(tmp_path / "tb")]
    assert main(cli_args(tmp_path / "runs", *args)) == 0
    out = capsys.readouterr().out
    record = load_record(next((tmp_path / "runs").glob("*/record.json")).parent)
    assert record.status == "completed" and record.stopped_early["epoch"] == 1 < EPOCHS
    said = (f"stopped early at epoch 1: {record.stopped_early['reason']}")
    assert "protocol verdict needs walk-back: (d)" in said
    finished = next(line for line in out.splitlines() if ": completed after " in line)
    assert finished.endswith(said)  # the console's last line
    assert f"dfa {said}" in out.splitlines()  # and the run summary
    if HAS_TENSORBOARD:
        from tensorboard.backend.event_processing.plugin_event_accumulator import (
            EventAccumulator,
        )

        events = EventAccumulator(str(tmp_path / "tb" / record.run_id))
        events.Reload()
        (status,) = events.Tensors("run/status/text_summary")
        assert status.step == 1
        assert status.tensor_proto.string_val[0].decode() == f"completed, {said}"
        # replayed: the folder holds the whole run, so nothing is added
        files = sorted((tmp_path / "tb" / record.run_id).iterdir())
        assert main(cli_args(tmp_path / "runs", *args, "-q")) == 0
        assert sorted((tmp_path / "tb" / record.run_id).iterdir()) == files


# --- TensorBoard -------------------------------------------------------------------------------
@needs_tensorboard
def test_tensorboard_holds_every_epoch_protocol_end_metrics_and_hparams(tmp_path):
    result = train(tiny(tmp_path / "runs", **{"run.tensorboard": str(tmp_path / "tb")}))
    assert_tensorboard_holds(tmp_path / "tb", result.record)


@needs_tensorboard
def test_tensorboard_on_a_finished_run_replays_its_record(tmp_path, capsys, caplog):
    """A finished run is not retrained; --tensorboard on it logs everything a live run logs."""
    assert main(cli_args(tmp_path / "runs", "-q")) == 0
    record = train(tiny(tmp_path / "runs")).record
    run_dir = tmp_path / "runs" / record.run_id
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    capsys.readouterr()
    with caplog.at_level("INFO"):
        assert main(cli_args(tmp_path / "runs", "--tensorboard", str(tmp_path / "tb"))) == 0
    assert "not rerun; its record is replayed into the loggers" in caplog.text
    assert " epoch " not in capsys.readouterr().out  # no console replay: nothing trained
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert_tensorboard_holds(tmp_path / "tb", record)
    # Once the folder holds the run, the same command adds nothing (no point twice).
    events = sorted((tmp_path / "tb" / record.run_id).iterdir())
    with caplog.at_level("INFO"):
        assert main(cli_args(tmp_path / "runs", "--tensorboard", str(tmp_path / "tb"))) == 0
    assert "already holds run" in caplog.text
    assert sorted((tmp_path / "tb" / record.run_id).iterdir()) == events


@needs_tensorboard
def test_tensorboard_holding_part_of_a_run_gets_the_whole_record_on_replay(tmp_path,
                                                                          kill_run_at):
    """Interrupted in epoch 2 with --tensorboard (epochs 0–1 and an 'interrupted' status
    logged), resumed to the end without it: asked for TensorBoard again, the finished run
    replays its whole record there, each point once. It used to count the partial folder as
    holding the run and leave it without epoch 2, the end-of-run metrics and the status."""
    tb = tmp_path / "tb"
    config = tiny(tmp_path / "runs", **{"run.tensorboard": str(tb)})
    kill_run_at(config, epoch=2)
    record = train(config.replace(**{"run.tensorboard": None}), resume=True).record
    assert record.status == "completed"
    assert tensorboard_points(tb / record.run_id)["norms/h_L"] == [0, 1]
    train(config)  # replayed
    points = assert_one_point_per_step(tb / record.run_id)
    assert points["norms/h_L"] == [0, 1, 2]
    assert points["run/status/text_summary"] == [EPOCHS]  # the interrupted one is dropped
    values = tensorboard_values(tb / record.run_id)
    for entry in record.log:
        for tag, value in epoch_scalars(entry).items():
            assert close(values[tag][entry.epoch], value), (tag, entry.epoch)
    end = end_of_run_scalars(record)
    assert end and all(close(values[tag][EPOCHS], value) for tag, value in end.items())
    events = sorted((tb / record.run_id).iterdir())
    train(config)  # now it holds the whole run: nothing is added
    assert sorted((tb / record.run_id).iterdir()) == events


def tensorboard_points(folder: Path) -> dict[str, list[int]]:
    """tag → the steps of its points, in order, as the TensorBoard server reads ``folder``
    (every event file, restart marks applied; its Python loader, which keeps scalars and
    text alike as tensors — the older ``event_accumulator`` drops only scalars at a mark)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [e.step for e in events.Tensors(tag)] for tag in events.Tags()["tensors"]}


def tensorboard_values(folder: Path) -> dict[str, dict[int, float]]:
    """tag → {step: value} of the scalars, as the TensorBoard server reads ``folder``."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import (
        EventAccumulator,
    )
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: {e.step: float(make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
            for tag in events.Tags()["tensors"] if not tag.endswith("text_summary")
            and not tag.startswith("_hparams_")}


def assert_one_point_per_step(folder: Path) -> dict[str, list[int]]:
    points = tensorboard_points(folder)
    twice = {tag: steps for tag, steps in points.items() if len(set(steps)) != len(steps)}
    assert not twice, f"points logged twice at one step: {twice}"
    return points


@needs_tensorboard
def test_tensorboard_first_asked_for_on_resume_gets_the_earlier_epochs(tmp_path, kill_run_at):
    """A run interrupted in epoch 2 without --tensorboard, resumed with it: the folder held
    epochs 1–2 only (the resumed part's), epoch 0 was missing. It gets every epoch of the
    record once."""
    config = tiny(tmp_path / "runs", **{"diagnostics.end_of_run": False})
    kill_run_at(config, epoch=2)
    logged = config.replace(**{"run.tensorboard": str(tmp_path / "tb")})
    record = train(logged, resume=True).record
    folder = tmp_path / "tb" / record.run_id
    assert tensorboard_values(folder)["train/test_loss"] == {
        entry.epoch: pytest.approx(entry.test_loss) for entry in record.log}
    assert sorted(assert_one_point_per_step(folder)["train/test_loss"]) == [0, 1, 2]


@needs_tensorboard
def test_tensorboard_of_a_run_started_over_holds_each_point_once(tmp_path, kill_run_at):
    """Killed in epoch 1 (epoch 0 logged), the run is started over into the same folder:
    TensorBoard shows the new run's points only, epoch 0 once."""
    config = tiny(tmp_path / "runs", **{"run.tensorboard": str(tmp_path / "tb")})
    kill_run_at(config, epoch=1)
    folder = tmp_path / "tb" / run_id(config)
    assert tensorboard_points(folder)["norms/h_L"] == [0]
    record = train(config).record  # started over: nothing trained was saved
    assert record.resumed == [] and len(list(folder.glob("events.out.tfevents.*"))) == 2
    points = assert_one_point_per_step(folder)
    assert points["norms/h_L"] == list(range(EPOCHS + 1))
    assert points["run/config/text_summary"] == [0]
    assert points["run/status/text_summary"] == [EPOCHS]  # the killed part's is dropped
    values = tensorboard_values(folder)
    for entry in record.log:
        for tag, value in epoch_scalars(entry).items():
            assert close(values[tag][entry.epoch], value), (tag, entry.epoch)


@needs_tensorboard
def test_tensorboard_of_a_run_resumed_twice_from_one_epoch_holds_each_point_once(
        tmp_path, kill_run_at, monkeypatch):
    """Killed in epoch 2, resumed and killed in epoch 2 again, resumed to the end: one
    point per tag and step, each part's config text at its first epoch, one final status."""
    config = tiny(tmp_path / "runs", **{"run.tensorboard": str(tmp_path / "tb"),
                                        "optim.epochs": 3})
    kill_run_at(config, epoch=2)
    original = Trainer.train_epoch

    def killed(self, epoch):  # noqa: ANN001, ANN202
        if epoch == 2:
            raise KeyboardInterrupt
        return original(self, epoch)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", killed)
        with pytest.raises(KeyboardInterrupt):
            train(config, resume=True)
    record = train(config, resume=True).record
    assert record.status == "completed" and record.resumed[-1].epoch == 2
    folder = tmp_path / "tb" / run_id(config)
    points = assert_one_point_per_step(folder)
    assert points["norms/h_L"] == [0, 1, 2, 3]
    # each part's config at its first step: the resumed parts' at epoch 1, logged again
    assert points["run/config/text_summary"] == [0, 1]
    assert points["run/status/text_summary"] == [3]


@needs_tensorboard
def test_tensorboard_holds_an_epoch_saved_but_not_logged_before_a_kill(tmp_path, monkeypatch):
    """Killed after epoch 1 was saved (record and checkpoint) but before TensorBoard logged
    it: the resumed part, which starts at epoch 2, logs epoch 1 again behind its restart
    mark, so TensorBoard holds every epoch once. It used to hold no epoch 1 at all. The
    record is that of the run trained without a kill."""
    from creditaudit.loggers.tensorboard import TensorBoardLogger

    config = tiny(tmp_path / "runs", **{"run.tensorboard": str(tmp_path / "tb"),
                                        "optim.epochs": 3})
    original = TensorBoardLogger.log_epoch

    def killed_before_logging(self, entry):  # noqa: ANN001, ANN202
        if entry.epoch == 1:
            raise KeyboardInterrupt  # the kill, after close_epoch saved epoch 1
        return original(self, entry)

    with monkeypatch.context() as patch:
        patch.setattr(TensorBoardLogger, "log_epoch", killed_before_logging)
        with pytest.raises(KeyboardInterrupt):
            train(config)
    folder = tmp_path / "tb" / run_id(config)
    assert load_checkpoint(tmp_path / "runs" / run_id(config) / CHECKPOINT_FILE)["epoch"] == 1
    assert tensorboard_points(folder)["norms/h_L"] == [0]
    record = train(config, resume=True).record
    assert record.status == "completed" and record.resumed[-1].epoch == 2
    points = assert_one_point_per_step(folder)
    assert points["norms/h_L"] == [0, 1, 2, 3]
    assert points["run/status/text_summary"] == [3]
    values = tensorboard_values(folder)
    for entry in record.log:
        for tag, value in epoch_scalars(entry).items():
            assert close(values[tag][entry.epoch], value), (tag, entry.epoch)
    uninterrupted = train(tiny(tmp_path / "again", **{"optim.epochs": 3})).record
    assert comparable(record) == comparable(uninterrupted)


@needs_tensorboard
@pytest.mark.parametrize("file_number", [0, 9])
def test_tensorboard_drops_a_killed_parts_points_after_the_resumed_epoch(
        tmp_path, monkeypatch, file_number):
    """A part that logged epochs 0–2 and was killed before epoch 2 was saved, then resumed
    after epoch 1: epoch 2 holds the resumed part's values, once. With ``file_number`` 9 the
    parts' event files, written by one process, end in .9 and .10: in one second their
    names would sort the resumed part first, and the killed part's mark would drop it."""
    from tensorboard.summary.writer import event_file_writer

    from creditaudit.loggers import RunStart
    from creditaudit.loggers.tensorboard import TensorBoardLogger

    monkeypatch.setattr(event_file_writer, "_global_uid",
                        event_file_writer.AtomicCounter(file_number))

    record = train(tiny(tmp_path / "runs", **{"diagnostics.end_of_run": False})).record
    entries = {entry.epoch: entry for entry in record.log}
    resumed_two = dataclasses.replace(entries[2], test_loss=123.0)

    def part(first_epoch: int, logged: list) -> None:
        logger = TensorBoardLogger(tmp_path / "tb", record.run_id)
        logger.start(RunStart(config=record.config, run_id=record.run_id,
                              run_dir=tmp_path, first_epoch=first_epoch, epochs=EPOCHS,
                              steps_per_epoch=8))
        for entry in logged:
            logger.log_epoch(entry)
        logger.close()  # killed: no finish

    part(1, [entries[0], entries[1], entries[2]])
    part(2, [resumed_two])
    folder = tmp_path / "tb" / record.run_id
    assert tensorboard_values(folder)["train/test_loss"] == \
        {0: pytest.approx(entries[0].test_loss), 1: pytest.approx(entries[1].test_loss),
         2: 123.0}
    assert assert_one_point_per_step(folder)["run/config/text_summary"] == [0, 2]


def assert_tensorboard_holds(folder: Path, record) -> None:  # noqa: ANN001 — a RunRecord
    """``folder/RUN_ID`` holds every epoch of ``record``, its protocol, end-of-run metrics,
    config text and hparams, and its final status."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(folder / record.run_id),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert tags and all(tag.startswith(GROUPS) for tag in tags), tags

    def series(tag: str) -> dict[int, float]:
        return {e.step: e.value for e in events.Scalars(tag)}

    # Every epoch, epoch 0 included, equals the record.
    for entry in record.log:
        for tag, value in epoch_scalars(entry).items():
            assert close(series(tag)[entry.epoch], value), (tag, entry.epoch)
    assert sorted(series("norms/h_L")) == list(range(EPOCHS + 1))
    assert close(series("norms/grad/l2")[0], record.log[0].value("bp_grad_norms_per_sample_med")[2])
    # The protocol: statuses and verdict at every evaluated epoch.
    for entry in record.log[1:]:
        for diagnostic, status in entry.protocol.items():
            if status != "not evaluated":
                assert series(f"protocol/{diagnostic}")[entry.epoch] == (status == "fired")
        assert series("protocol/walk_back")[entry.epoch] == (entry.verdict == "needs walk-back")
    assert "protocol/c" not in tags  # (c) needs 8 batches of 128: never evaluated here
    # End-of-run metrics at the last epoch.
    end = end_of_run_scalars(record)
    rho = record.diagnostics.perturbation_rho
    assert len([t for t in end if t.startswith("credit/rho/")]) == len(rho) == 3
    assert {"credit/null/z", "credit/nudging_0.01/l1", "credit/rho_bp/l2",
            "credit/gamma/pooled"} <= set(end)
    for tag, value in end.items():
        assert close(series(tag)[EPOCHS], value), tag
    assert close(series("credit/null/z")[EPOCHS], record.diagnostics.fresh_b_null["z"])
    # Text: config, verdicts, status.
    text = {tag: [e.tensor_proto.string_val[0].decode() for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}
    assert "[method]" in text["run/config/text_summary"][0]
    assert text["protocol/verdict/text_summary"][-1] == \
        "no walk-back in (a)(b); (c)(d) not evaluated"
    assert text["run/status/text_summary"] == ["completed"]
    # The config as hparams, with the headline metrics and the session's end.
    plugin = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["method.name"].string_value == "dfa"
    assert hparams["model.d"].number_value == 16
    assert hparams["run_id"].string_value == record.run_id
    assert hparams["diagnostics.frozen_acc"].string_value == "none"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/experiment"])
    metrics = {m.name.tag for m in experiment.experiment.metric_infos}
    assert {"train/test_acc", "credit/deep_cos", "protocol/walk_back"} <= metrics <= set(tags)
    end_info = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_end_info"])
    assert end_info.session_end_info.status == 1  # STATUS_SUCCESS


def test_missing_tensorboard_is_one_config_error_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    config = tiny(tmp_path / "runs", **{"run.tensorboard": str(tmp_path / "tb")})
    with pytest.raises(ConfigError, match=r"pip install 'creditaudit\[tensorboard\]'"):
        train(config)
    assert not (tmp_path / "runs").exists()


def test_loggers_change_no_weight_and_no_run_id(tmp_path, capsys):
    logged = tiny(tmp_path / "a", **{"run.tensorboard": str(tmp_path / "tb"),
                                     "run.progress": True})
    plain = tiny(tmp_path / "b")
    assert run_id(logged.replace(**{"run.wandb_project": "p"})) == run_id(plain)
    a, b = train(logged), train(plain)
    state_a = load_checkpoint(a.run_dir / CHECKPOINT_FILE)
    state_b = load_checkpoint(b.run_dir / CHECKPOINT_FILE)
    for key, tensor in state_a["model"].items():
        assert torch.equal(tensor, state_b["model"][key]), key
    assert torch.equal(state_a["rng"]["torch"], state_b["rng"]["torch"])
    assert [e.train_loss for e in a.record.log] == [e.train_loss for e in b.record.log]


# --- Weights & Biases --------------------------------------------------------------------------
def wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (``run-*.wandb``): W&B's 7-byte header, then
    LevelDB log format — 32 KiB blocks of chunks, each ``crc32c (4) | length (2, little
    endian) | type (1: full, 2: first, 3: middle, 4: last)``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    block, position, payloads, pending = 32768, 7, [], b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is zero padding
            position += left
            continue
        length = int.from_bytes(data[position + 4:position + 6], "little")
        kind = data[position + 6]
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    return [wandb_internal_pb2.Record.FromString(raw) for raw in payloads]


@pytest.fixture
def fresh_wandb():
    """W&B keeps its settings (e.g. the mode) in a process-wide singleton: start and end
    each test without one, so one test's WANDB_MODE does not leak into the next."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def key_of(item) -> str:  # noqa: ANN001 — a W&B record item
    """An item's key: W&B stores keys with a slash as a one-element nested key."""
    return item.key or "/".join(item.nested_key)


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch, fresh_wandb):
    """W&B offline, writing below ``tmp_path/wb``."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    return tmp_path / "wb"


@needs_wandb
def test_wandb_offline_run_holds_config_epochs_end_metrics_and_status(tmp_path, offline_wandb):
    result = train(tiny(tmp_path / "runs", **{"run.wandb_project": "creditaudit-test"}))
    assert_wandb_holds(offline_wandb, result.record)


@needs_wandb
def test_wandb_on_a_finished_run_replays_its_record(tmp_path, offline_wandb):
    record = train(tiny(tmp_path / "runs")).record
    again = train(tiny(tmp_path / "runs", **{"run.wandb_project": "creditaudit-test"}))
    assert again.record.to_dict() == record.to_dict()  # not retrained
    assert_wandb_holds(offline_wandb, record)


@needs_wandb
def test_wandb_parts_of_a_resumed_run_each_hold_their_own_epochs_once(tmp_path, offline_wandb,
                                                                      kill_run_at):
    """Each part is its own W&B run (no W&B resume): the killed part holds epochs 0–1 and
    ends non-zero, the resumed one epochs 2–3; no step is logged twice in either."""
    config = tiny(tmp_path / "runs", **{"run.wandb_project": "creditaudit-test",
                                        "optim.epochs": 3})
    kill_run_at(config, epoch=2)
    train(config, resume=True)
    assert wandb_parts(offline_wandb) == [([0, 1], 1), ([2, 3], 0)]


def wandb_parts(offline_wandb: Path) -> list[tuple[list[int], int]]:
    """(steps logged, exit code) of each offline W&B run written under ``offline_wandb``,
    sorted, once every run's files are flushed and closed."""
    import wandb

    wandb.teardown()  # flush and close the run files
    parts = []
    for path in offline_wandb.glob("wandb/offline-run-*/run-*.wandb"):
        records = wandb_records(path)
        steps = [r.history.step.num for r in records if r.WhichOneof("record_type") == "history"]
        exit_code = next(r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit")
        parts.append((steps, exit_code))
    return sorted(parts)


def killed_between_saving_and_logging(monkeypatch, config: RunConfig, epoch: int,
                                      loggers: list) -> None:
    """Train ``config`` and interrupt it (KeyboardInterrupt, as Ctrl-C or SIGTERM) after
    ``epoch`` was saved — record and checkpoint written — but before any logger got it."""
    from creditaudit.loggers import LoggerGroup

    original = LoggerGroup.log_epoch

    def killed(self, entry):  # noqa: ANN001, ANN202
        if entry.epoch == epoch:
            raise KeyboardInterrupt
        return original(self, entry)

    with monkeypatch.context() as patch:
        patch.setattr(LoggerGroup, "log_epoch", killed)
        with pytest.raises(KeyboardInterrupt):
            train(config, loggers=loggers)
    saved = load_checkpoint(Path(config.run.out_dir) / run_id(config) / CHECKPOINT_FILE)
    assert saved["epoch"] == epoch


def test_loggers_get_a_saved_epoch_before_an_interrupted_part_finishes(tmp_path,
                                                                       monkeypatch):
    """Interrupted between saving epoch 1 and logging it: the loggers get epoch 1 before
    ``finish`` (it used to reach none of them); the resumed part logs epochs 2–3 only."""
    config = tiny(tmp_path, **{"optim.epochs": 3, "diagnostics.end_of_run": False})
    killed_part = Calls()
    killed_between_saving_and_logging(monkeypatch, config, 1, [killed_part])
    kinds = [kind for kind, _ in killed_part.calls if kind != "step"]
    assert kinds == ["start", "epoch", "epoch", "finish", "close"]
    assert [entry.epoch for entry in killed_part.of("epoch")] == [0, 1]
    assert killed_part.of("finish")[0].status == "interrupted"
    resumed_part = Calls()
    record = train(config, resume=True, loggers=[resumed_part]).record
    assert [entry.epoch for entry in resumed_part.of("epoch")] == [2, 3]
    assert resumed_part.of("start")[0].resumed_after.to_dict() == record.log[1].to_dict()


@needs_wandb
def test_wandb_holds_an_epoch_saved_before_an_interrupt_once(tmp_path, offline_wandb,
                                                             monkeypatch):
    """Interrupted between saving epoch 1 and logging it: the interrupted part's W&B run
    logs it before it ends, the resumed part's starts at epoch 2 — every epoch once (W&B
    cannot drop a point: the resumed part does not log epoch 1 again). Epoch 1 used to be in
    neither."""
    config = tiny(tmp_path / "runs", **{"run.wandb_project": "creditaudit-test",
                                        "optim.epochs": 3, "diagnostics.end_of_run": False})
    killed_between_saving_and_logging(monkeypatch, config, 1, [])
    train(config, resume=True)
    assert wandb_parts(offline_wandb) == [([0, 1], 1), ([2, 3], 0)]


def session_end_statuses(folder: Path) -> list[int]:
    """The hparams session-end statuses (1 success, 2 failure) of the events under ``folder``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    return [HParamsPluginData.FromString(value.metadata.plugin_data.content)
            .session_end_info.status
            for path in sorted(folder.rglob("events.out.tfevents.*"))
            for event in EventFileLoader(str(path)).Load() for value in event.summary.value
            if value.tag == "_hparams_/session_end_info"]


@needs_wandb
@needs_tensorboard
@pytest.mark.parametrize(("status", "ended_well"), [("diverged", True), ("interrupted", False)])
def test_tensorboard_and_wandb_end_a_run_alike(tmp_path, offline_wandb, status, ended_well):
    """A diverged run is a finished run (`train` exits 0): it ended its W&B run with exit
    code 0 but its TensorBoard session as failed; an interrupted run's session end was
    never written (TensorBoard has no "aborted" status: it raised). Both loggers now end a
    finished run (completed or diverged) as a success, any other as a failure."""
    from integrity_support import nan_weights_before

    config = tiny(tmp_path / "runs", **{"run.wandb_project": "creditaudit-test",
                                        "run.tensorboard": str(tmp_path / "tb"),
                                        "diagnostics.end_of_run": False})
    original = Trainer.train_epoch

    def interrupted(self, n):  # noqa: ANN001, ANN202
        if n == 2:
            raise KeyboardInterrupt
        return original(self, n)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch",
                      nan_weights_before(1) if status == "diverged" else interrupted)
        with contextlib.suppress(KeyboardInterrupt):
            train(config)
    assert load_record(Path(config.run.out_dir) / run_id(config)).status == status
    assert [code for _, code in wandb_parts(offline_wandb)] == [0 if ended_well else 1]
    assert session_end_statuses(tmp_path / "tb") == [1 if ended_well else 2]


@needs_wandb
def test_wandb_summary_says_a_run_stopped_early(tmp_path, offline_wandb):
    """A --stop-on-walkback run's status is completed: the summary says where and why it
    stopped (it did not say it at all)."""
    import json

    import wandb

    record = train(tiny(tmp_path / "runs", **{
        "run.wandb_project": "creditaudit-test", "diagnostics.frozen_acc": 1.0,
        "diagnostics.stop_on_walkback": True})).record
    assert record.stopped_early["epoch"] == 1
    wandb.teardown()
    (path,) = offline_wandb.glob("wandb/offline-run-*/run-*.wandb")
    summary: dict = {}
    for r in wandb_records(path):
        if r.WhichOneof("record_type") == "summary":
            summary.update({key_of(item): json.loads(item.value_json)
                            for item in r.summary.update})
    assert summary["status"] == "completed"
    assert summary["stopped_early"] == ("stopped early at epoch 1: "
                                        f"{record.stopped_early['reason']}")


def assert_wandb_holds(folder: Path, record) -> None:  # noqa: ANN001 — a RunRecord
    """The one offline W&B run below ``folder`` holds ``record``'s config, every epoch, the
    end-of-run metrics, the summary and a zero exit code."""
    import json

    # W&B's service process writes the run file; shutting it down makes it flush and close
    # the file (read while the service still wrote it, under load, it lacked records)
    import wandb

    wandb.teardown()
    files = list(folder.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1
    records = wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    run = records[kinds.index("run")].run
    assert run.display_name == record.run_id and run.project == "creditaudit-test"
    config = {key_of(item): json.loads(item.value_json) for item in run.config.update}
    assert config["method"]["name"] == "dfa" and config["run_id"] == record.run_id

    history: dict[int, dict] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {key_of(item): json.loads(item.value_json) for item in r.history.item}
            history.setdefault(r.history.step.num, {}).update(row)
    assert sorted(history) == list(range(EPOCHS + 1))  # epoch 0 included
    for entry in record.log:
        for tag, value in epoch_scalars(entry).items():
            assert math.isclose(history[entry.epoch][tag], value, rel_tol=1e-12), tag
    for tag, value in end_of_run_scalars(record).items():
        assert math.isclose(history[EPOCHS][tag], value, rel_tol=1e-12), tag
    assert history[EPOCHS]["protocol/verdict"] == "no walk-back in (a)(b); (c)(d) not evaluated"

    summary: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({key_of(item): json.loads(item.value_json)
                            for item in r.summary.update})
    assert summary["status"] == "completed"
    assert math.isclose(summary["train/test_acc"], record.final.test_acc)
    assert math.isclose(summary["credit/null/z"], record.diagnostics.fresh_b_null["z"])
    exit_record = records[kinds.index("exit")].exit
    assert exit_record.exit_code == 0


@needs_wandb
def test_wandb_without_login_is_one_config_error_before_the_run(tmp_path, monkeypatch,
                                                              fresh_wandb):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.raises(ConfigError, match=r"could not start .* `wandb login`.*WANDB_MODE=offline"):
        train(tiny(tmp_path / "runs", **{"run.wandb_project": "p"}))
    assert not (tmp_path / "runs").exists()


def test_missing_wandb_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"pip install 'creditaudit\[wandb\]'"):
        train(tiny(tmp_path / "runs", **{"run.wandb_project": "p"}))


@needs_wandb
def test_wandb_refused_project_name_says_to_choose_another(tmp_path, offline_wandb, capsys):
    """W&B refuses 'a/b c' even offline; the message once said to log in or set
    WANDB_MODE=offline (already set). Now it says the name is what to change."""
    assert main(cli_args(tmp_path / "runs", "--wandb", "a/b c")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--wandb 'a/b c' is not a project name Weights & Biases accepts" in err
    assert "choose another name" in err
    assert "wandb login" not in err and "WANDB_MODE" not in err
    assert not (tmp_path / "runs").exists()


def test_project_name_refused_by_wandb_settings_is_a_name_error(tmp_path, monkeypatch):
    """The same through a stand-in wandb module (runs where wandb is not installed): any
    refusal of ``Settings(project=…)`` is about the name, before a run starts."""
    import types

    def settings(**kwargs: object) -> None:
        raise ValueError(f"Invalid project name {kwargs['project']!r}: too odd")

    fake = types.ModuleType("wandb")
    fake.Settings = settings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(ConfigError, match=r"run.wandb_project='x' is not a project name .*"
                                          r"too odd.*choose another name") as err:
        train(tiny(tmp_path / "runs", **{"run.wandb_project": "x"}))
    assert "wandb login" not in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("project", ["", " "])
def test_empty_wandb_project_is_refused(tmp_path, capsys, project):
    assert main(cli_args(tmp_path / "runs", "--wandb", project)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"run.wandb_project={project!r} is an empty name" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("raised", "status"), [(KeyboardInterrupt, "interrupted"),
                                                (RuntimeError, "failed")])
def test_a_run_stopped_while_logging_its_epoch_0_says_how_it_ended(tmp_path, monkeypatch,
                                                                  raised, status):
    """Stopped once the epoch-0 record was written — while it was checkpointed or logged — the
    record said 'running' (the start of a run was outside the code that records a stop); now
    interrupted (the command says to run it again) or failed with the error."""
    from creditaudit.loggers import LoggerGroup

    config = tiny(tmp_path, **{"optim.epochs": 2, "diagnostics.end_of_run": False})

    def stopped(self, entry):  # noqa: ANN001, ANN202
        raise raised("stopped at epoch 0")

    monkeypatch.setattr(LoggerGroup, "log_epoch", stopped)
    with pytest.raises(raised) as caught:
        train(config)
    record = load_record(Path(config.run.out_dir) / run_id(config))
    assert record.status == status and [e.epoch for e in record.log] == [0]
    if raised is KeyboardInterrupt:
        assert "stopped before its first epoch finished" in " ".join(caught.value.__notes__)
    else:
        assert "stopped at epoch 0" in record.error


def test_a_resume_stopped_while_reading_its_checkpoint_leaves_the_record(tmp_path,
                                                                        monkeypatch):
    """Stopped inside the checkpoint's reading, a resumed part writes nothing: the record
    keeps what its earlier part wrote, and the note says to resume."""
    import creditaudit.run.trainer as trainer_module

    config = tiny(tmp_path, **{"optim.epochs": 2, "diagnostics.end_of_run": False})
    killed_between_saving_and_logging(monkeypatch, config, 1, [])
    folder = Path(config.run.out_dir) / run_id(config)
    before = (folder / "record.json").read_bytes()

    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "restore", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        train(config, resume=True)
    assert (folder / "record.json").read_bytes() == before
    assert "stopped while resuming, before it trained: continue with resume=True" in " ".join(
        caught.value.__notes__)
