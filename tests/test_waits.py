"""No silent waits: every stage that takes seconds names itself where the user looks.

- ``creditaudit demo`` trains in worker processes that say nothing until a run ends: the
  command reads the runs' records and says how far each is (RunWatch);
- a terminal that reports no size (``script -qfc``, stdin not a terminal) still gets the bar;
- in a terminal the end-of-run stages are lines of their own, not a postfix cut off at the
  end of a full bar, and the bar names the evaluation while it sits at an epoch's end;
- ``Recorder`` says what it measures (``progress=``), and nudging says how far it is within
  one chunk of samples.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import sys
import time
from pathlib import Path

import pytest
import torch

from creditaudit import Recorder, adapt, rule
from creditaudit.cli import main
from creditaudit.cli.run_watch import RunWatch, epochs_done
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.loggers import ConsoleLogger, RunStart
from creditaudit.measures.nudging import nudging_table
from creditaudit.measures.perturbation import BP_CREDIT
from creditaudit.models import ResidualMLP
from creditaudit.testing.zoo import TransformerClassifier

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["--set", "method.name=dfa", "--set", "data.n_train=256", "--set", "data.n_test=256",
        "--set", "data.in_dim=8", "--set", "model.d=16", "--set", "model.n_blocks=2",
        "--set", "optim.epochs=1", "--set", "optim.batch_size=64",
        "--set", "diagnostics.eval_samples=256", "--set", "diagnostics.rho_samples=16",
        "--set", "diagnostics.rho_directions=2", "--set", "diagnostics.null_draws=2"]


# --- the demo's workers ----------------------------------------------------------------------
def write_record(path: Path, epochs: int, status: str = "running") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status,
                                "log": [{"epoch": e} for e in range(epochs + 1)]}))


def test_run_watch_says_each_runs_epochs_as_they_change_and_at_least_every_few_seconds(
        tmp_path):
    now = [0.0]
    lines: list[str] = []
    runs = {name: tmp_path / name / "progress.json" for name in ("bp", "dfa")}
    watch = RunWatch(runs, epochs=4, say=lines.append, quiet_seconds=8.0, clock=lambda: now[0])
    now[0] = 2.0
    assert watch.poll() == "  bp – · dfa – | 0m02s elapsed, ETA ?"  # none started yet
    now[0] = 4.0
    assert watch.poll() is None  # nothing changed, and it said so 2 s ago
    now[0] = 10.0
    assert watch.poll() is not None  # 8 s without a line: it speaks anyway
    write_record(runs["bp"], 2)
    now[0] = 20.0
    assert watch.poll() == "  bp 2/4 · dfa – | 0m20s elapsed, ETA 1m00s"  # 10 s/epoch × 6
    write_record(runs["bp"], 4)  # its epochs done, its end-of-run block running
    now[0] = 20.5
    assert watch.poll() == "  bp 4/4 end of run · dfa – | 0m20s elapsed, ETA 0m20s"
    write_record(runs["bp"], 4, "completed")
    runs["dfa"].parent.mkdir()
    runs["dfa"].write_text("{not json")  # a record being replaced: read as not started
    now[0] = 21.0
    assert watch.poll() == "  bp 4/4 · dfa – | 0m21s elapsed, ETA 0m21s"


def test_a_finished_run_counts_in_full_and_a_missing_record_as_not_started(tmp_path):
    write_record(tmp_path / "a.json", 3, "completed")
    assert epochs_done(tmp_path / "a.json") == (3, "completed")
    assert epochs_done(tmp_path / "missing.json") is None
    watch = RunWatch({"a": tmp_path / "a.json"}, epochs=8, say=print)
    assert watch.counts() == {"a": 8}  # stopped early by the protocol, yet finished


def test_a_record_that_is_no_json_file_reads_as_not_started(tmp_path):
    """The watch reads the sweep's record files from the command's own thread when it
    starts: a named pipe there blocked the sweep, /dev/zero filled memory (MemoryError,
    an internal error), and deep nesting ended in RecursionError."""
    import threading

    deep, pipe, zero = tmp_path / "deep.json", tmp_path / "pipe.json", tmp_path / "zero.json"
    deep.write_text("[" * 200_000)
    os.mkfifo(pipe)
    zero.symlink_to("/dev/zero")
    assert epochs_done(deep) is None
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(epochs_done(pipe)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    blocked = worker.is_alive()
    if blocked:  # give the pipe a writer, so that the thread ends
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked and found == [None]
    assert epochs_done(zero) is None


def test_a_record_is_read_again_only_once_it_changed(tmp_path, monkeypatch):
    """A sweep's watch polls every record every 2 s: it parsed each one every time, and a
    thousand finished 100-epoch runs (130 kB each) took 2 s a poll, a core of the sweep's
    process for as long as it ran. An unchanged file is not read again."""
    import creditaudit.cli.run_watch as run_watch

    reads: list[Path] = []

    def counted(path: Path) -> tuple[int, str] | None:
        reads.append(path)
        return epochs_done(path)

    monkeypatch.setattr(run_watch, "epochs_done", counted)
    runs = {f"seed={s}": tmp_path / f"{s}" / "record.json" for s in range(3)}
    write_record(runs["seed=0"], 2, "completed")
    write_record(runs["seed=1"], 1)
    watch = RunWatch(runs, epochs=2, say=print)
    assert watch.counts() == {"seed=0": 2, "seed=1": 1, "seed=2": None}
    reads.clear()
    for _ in range(3):
        assert watch.counts() == {"seed=0": 2, "seed=1": 1, "seed=2": None}
    assert reads == []  # nothing changed: nothing parsed again
    replaced = runs["seed=1"].with_name("new.json")  # replaced atomically, as a run does
    write_record(replaced, 2)
    replaced.replace(runs["seed=1"])
    assert watch.counts() == {"seed=0": 2, "seed=1": 2, "seed=2": None}
    assert reads == [runs["seed=1"]]
    write_record(runs["seed=1"], 2, "failed")  # rewritten in place: its size changed
    assert watch.counts()["seed=1"] == 2 and watch.failed == {"seed=1"}


def test_a_sweeps_line_lists_the_runs_training_now_and_counts_the_others(tmp_path):
    runs = {f"seed={s}": tmp_path / f"{s}" / "progress.json" for s in range(8)}
    write_record(runs["seed=0"], 2, "completed")  # finished before the watch: no ETA pace
    now = [0.0]
    watch = RunWatch(runs, epochs=2, say=print, clock=lambda: now[0])
    write_record(runs["seed=1"], 1)
    write_record(runs["seed=2"], 0)
    now[0] = 10.0
    assert watch.poll() == ("  seed=1 1/2 · seed=2 0/2, 1 finished, 5 not started | 0m10s "
                            "elapsed, ETA 2m10s")  # 10 s per epoch trained here × 13 left


def test_the_watch_thread_says_lines_and_stops(tmp_path):
    lines: list[str] = []
    watch = RunWatch({"bp": tmp_path / "r.json"}, epochs=2, say=lines.append,
                     every=0.01).start()
    try:
        for _ in range(500):
            if lines:
                break
            time.sleep(0.01)
    finally:
        watch.stop()
    assert lines and lines[0].startswith("  bp – | ")


def test_runs_of_different_lengths_count_their_own_epochs(tmp_path):
    """A sweep over optim.epochs = [2, 8] counted every run out of 8: the 2-epoch run read
    "1/8", and its 6 epochs that never come were in the ETA."""
    runs = {"epochs=2": tmp_path / "a.json", "epochs=8": tmp_path / "b.json"}
    now = [0.0]
    watch = RunWatch(runs, epochs={"epochs=2": 2, "epochs=8": 8}, say=print,
                     clock=lambda: now[0])
    write_record(runs["epochs=2"], 1)
    write_record(runs["epochs=8"], 1)
    now[0] = 10.0
    assert watch.poll() == "  epochs=2 1/2 · epochs=8 1/8 | 0m10s elapsed, ETA 0m40s"
    write_record(runs["epochs=2"], 2, "completed")
    assert watch.counts() == {"epochs=2": 2, "epochs=8": 1}


def test_a_failed_run_reads_failed_and_is_not_waited_for(tmp_path):
    """A run that failed at epoch 1 of 4 read "1/4" as if it trained on, its 3 epochs that
    never come stayed in the ETA, and a sweep's line listed it among the runs training now."""
    now = [0.0]
    runs = {"a": tmp_path / "a.json", "b": tmp_path / "b.json"}
    watch = RunWatch(runs, epochs=4, say=print, clock=lambda: now[0])
    write_record(runs["a"], 1, "failed")
    write_record(runs["b"], 2)
    now[0] = 9.0
    assert watch.poll() == "  a 1/4 failed · b 2/4 | 0m09s elapsed, ETA 0m06s"  # 3 s × 2
    many = {f"seed={s}": tmp_path / f"{s}.json" for s in range(8)}
    write_record(many["seed=0"], 1, "failed")
    write_record(many["seed=1"], 1)
    sweep = RunWatch(many, epochs=4, say=print, clock=lambda: now[0])
    assert sweep.line(sweep.counts(), 9.0).startswith(
        "  seed=1 1/4, 0 finished, 1 failed, 6 not started |")


def test_a_record_whose_epoch_is_no_count_reads_as_not_started(tmp_path):
    """An epoch of Infinity (JSON that Python reads) raised OverflowError in the watch
    thread: a traceback, and no more progress lines."""
    for i, epoch in enumerate(("Infinity", "-3", "2.5", "true", '"3"')):
        path = tmp_path / f"{i}.json"
        path.write_text(f'{{"status": "running", "log": [{{"epoch": {epoch}}}]}}')
        assert epochs_done(path) is None, epoch
    assert RunWatch({"a": tmp_path / "0.json"}, epochs=2, say=print).counts() == {"a": None}


def test_the_watch_thread_ends_quietly_when_stdout_is_closed(tmp_path):
    """`creditaudit demo | head -3`: the watch's print met the closed pipe, and the thread
    died with a BrokenPipeError traceback on stderr."""
    import threading

    failures: list[object] = []
    previous = threading.excepthook
    threading.excepthook = failures.append
    said: list[str] = []

    def closed(line: str) -> None:
        said.append(line)
        raise BrokenPipeError(32, "Broken pipe")

    try:
        watch = RunWatch({"bp": tmp_path / "r.json"}, epochs=2, say=closed,
                         every=0.01).start()
        for _ in range(500):
            if said and watch._thread is not None and not watch._thread.is_alive():
                break
            time.sleep(0.01)
        watch.stop()
    finally:
        threading.excepthook = previous
    assert said == [said[0]] and failures == []


# --- the terminal ----------------------------------------------------------------------------
def test_a_terminal_without_a_size_still_draws_the_bar():
    """`script -qfc "creditaudit train …"` with stdin not a terminal opens a pty of 0×0:
    tqdm drew nothing on it, and a 1.5-minute run printed nothing until it ended."""
    master, slave = pty.openpty()
    assert os.get_terminal_size(slave).lines == 0  # what such a pty reports
    stream = os.fdopen(slave, "w", buffering=1)
    try:
        logger = ConsoleLogger(stream, bar_stream=stream)
        assert logger.terminal
        logger.start(RunStart(RunConfig(), "rid", Path("runs/rid"), first_epoch=1, epochs=1,
                              steps_per_epoch=3))
        for _ in range(3):
            logger.log_step(1.0)
        logger.close()
        stream.flush()
        shown = ""
        deadline = time.monotonic() + 30.0  # nothing shown: nothing to read, ever
        while "3/3" not in shown and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                shown += os.read(master, 65536).decode(errors="replace")
    finally:
        stream.close()
        os.close(master)
    assert "3/3" in shown


def screen_lines(text: str) -> list[str]:
    """What stays on screen of a stream with carriage returns: each line's last overwrite."""
    return [line.split("\r")[-1] for line in text.split("\n")]


def test_in_a_terminal_the_end_of_run_stages_are_lines_and_the_full_bar_names_what_runs(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["train", *TINY, "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    stages = [line for line in screen_lines(err) if line.startswith("dfa end of run: ")]
    assert [line.split(": ")[1].split(" (")[0].split(":")[0] for line in stages] == \
        ["ρ", "nudging", "fresh-feedback null"]
    assert "dfa epoch 0: evaluation and diagnostics" in err  # the bar, before any step
    assert "dfa epoch 1: evaluation and diagnostics" in err  # the bar, full, at epoch's end


# --- your own loop ---------------------------------------------------------------------------
@pytest.fixture
def small():
    torch.manual_seed(0)
    net = TransformerClassifier(image_shape=(1, 28, 28), patch=(7, 7), d=16, depth=2,
                                heads=2)
    x, y = torch.rand(64, 1, 28, 28), torch.arange(64) % 10
    model = adapt(net, ["encoder.layers.0", "encoder.layers.1"], example=x[:4])
    return rule("dfa", model), x, y


def test_the_recorder_says_what_it_measures(small, tmp_path):
    lines: list[str] = []
    rec = Recorder(*small, out=tmp_path, name="mine", progress=lines.append,
                   config={"diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
                           "diagnostics.null_draws": 2})
    rec.epoch(0)
    assert lines[0] == "Recorder mine: epoch 0: diagnostics on 64 samples …"
    rec.epoch(1, test_acc=0.1)
    rec.finish()
    said = "\n".join(lines)
    for stage in ("end of run: credit-quality block on 64 samples", "end of run: ρ",
                  "end of run: nudging", "end of run: fresh-feedback null",
                  "end of run: done in"):
        assert f"Recorder mine: {stage}" in said


def test_the_recorder_prints_its_lines_on_stderr_unless_told_not_to(small, tmp_path, capsys):
    rec = Recorder(*small, out=tmp_path, name="a", config={"diagnostics.end_of_run": False})
    rec.epoch(0)
    assert "Recorder a: epoch 0: diagnostics on 64 samples …" in capsys.readouterr().err
    quiet = Recorder(*small, out=tmp_path, name="b", progress=False,
                     config={"diagnostics.end_of_run": False})
    quiet.epoch(0)
    quiet.finish()
    assert capsys.readouterr() == ("", "")
    with pytest.raises(ConfigError, match="progress='yes' must be True"):
        Recorder(*small, out=tmp_path, name="c", progress="yes")


def test_nudging_says_how_far_it_is_within_one_chunk():
    """All samples in one chunk (the usual case on a CPU) gave no line until the stage
    ended: 21 s of silence on a small ResNet, minutes on ResNet-18."""
    torch.manual_seed(0)
    model = ResidualMLP(8, 16, 10, 3).eval()
    x, y = torch.randn(32, 8), torch.arange(32) % 10
    ticks = iter(range(0, 100000, 11))
    lines: list[str] = []
    nudging_table(model, x, y, [BP_CREDIT], etas=[0.01, 0.1], progress=lines.append,
                  clock=lambda: float(next(ticks)))
    assert lines and all(line.startswith("nudging: ") and "ETA" in line for line in lines)
    done = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    assert done == sorted(done) and done[-1] < 32


def test_progress_lines_never_change_the_numbers():
    torch.manual_seed(0)
    model = ResidualMLP(8, 16, 10, 3).eval()
    x, y = torch.randn(32, 8), torch.arange(32) % 10
    quiet = nudging_table(model, x, y, [BP_CREDIT], etas=[0.01])
    ticks = iter(range(0, 100000, 11))
    loud = nudging_table(model, x, y, [BP_CREDIT], etas=[0.01], progress=lambda text: None,
                         clock=lambda: float(next(ticks)))
    assert quiet == loud


def test_a_console_logger_on_a_plain_stream_is_not_a_terminal():
    assert not ConsoleLogger(io.StringIO()).terminal


def test_an_experiment_says_its_runs_epochs_while_they_train(tmp_path, capsys):
    """`creditaudit experiment` trained for minutes without a line between two runs' ends
    (a 30-epoch LeNet run: 17 minutes); its runs' epochs are now watched as the sweep's are."""
    assert main(["experiment", "random_init", "--scale", "smoke", "--out", str(tmp_path),
                 "--executor", "inline"]) == 0
    watched = [line for line in capsys.readouterr().err.splitlines()  # with the sweep's lines
               if re.search(r"(finished|not started).* elapsed, ETA ", line)]
    assert watched, "no RunWatch line while the experiment's runs trained"
    assert main(["experiment", "random_init", "--scale", "smoke", "--out",
                 str(tmp_path / "quiet"), "--executor", "inline", "-q"]) == 0
    assert "elapsed, ETA" not in "".join(capsys.readouterr())
