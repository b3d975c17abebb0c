"""Where what a sweep says of a run disagreed with what happened: a run taken over from the
sweep was summarised ``skipped`` (0 s), replacing the entry of the process that took it
over; a run whose logger raised after its final record was ``failed`` on the progress line
and ``completed`` in the summary; a refused run's row in the closing table showed its
record's ``interrupted``; merged entries did not say which invocation wrote them; and a
``--stack`` with nothing to stack read "0 runs in 0 stacks"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.cli.sweep_output import describe_stacks
from creditaudit.config import RunConfig
from creditaudit.errors import GuestError
from creditaudit.records import CLAIM_FILE
from creditaudit.run.plan import plan_run
from creditaudit.sweep import SUMMARY_FILE, InlineExecutor, plan_runs, prepare_configs, run_sweep
from creditaudit.sweep.summary_file import SUMMARY_SCHEMA, reported_status, write_summary
from sweep_files import tiny_sweep_run, write_tiny_sweep
from test_taken_over_runs import OTHER_PID, taken_over_in_epoch

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(out: Path, **overrides: object) -> RunConfig:
    return prepare_configs([tiny_sweep_run(out, **{"run.threads": 1,
                                                   "diagnostics.end_of_run": False,
                                                   **overrides})], threads=1)[0]


# --- 1. a run taken over ------------------------------------------------------------------
def _sweep_taken_over(tmp_path, monkeypatch, *, holder_writes: bool):
    """A 3-epoch sweep of one run, taken over in epoch 2 by "another process", which then
    finishes it (here, resuming it) and, with ``holder_writes``, writes its summary entry
    (``resumed``) before this sweep writes its own."""
    from creditaudit.run.trainer import train

    config = tiny(tmp_path, **{"optim.epochs": 3})
    run_dir = plan_run(config).run_dir
    taken_over_in_epoch(monkeypatch, [run_dir])

    def the_other_process(state, outcome):
        if outcome is None or outcome["status"] != "busy":
            return
        (run_dir / CLAIM_FILE).unlink()  # it resumes the run, and releases it
        train(config, resume=True)
        if holder_writes:
            write_summary(tmp_path / SUMMARY_FILE, {"schema": SUMMARY_SCHEMA, "runs": [
                {"run_id": run_dir.name, "status": "completed", "error": None,
                 "action": "resumed", "seconds": 1.5, "written_by": "other.toml"}]},
                reported_status)

    states = []
    result = run_sweep([config], InlineExecutor(), poll_seconds=0.01,
                       on_progress=lambda state, o: (states.append(state.done),
                                                     the_other_process(state, o)))
    return result, json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"], states


def test_a_run_taken_over_says_so_and_keeps_the_holders_entry(tmp_path, monkeypatch):
    result, runs, states = _sweep_taken_over(tmp_path, monkeypatch, holder_writes=True)
    [own] = result.summary["runs"]
    assert own["action"] == "taken over" and own["seconds"] > 0, own  # was skipped, 0 s
    assert own["status"] == "completed"  # read from the record on disk
    assert f"pid {OTHER_PID}" in own["error"]
    assert states[-1] == 1
    [entry] = runs  # the holder's entry, not replaced by this sweep's
    assert (entry["action"], entry["written_by"], entry["status"]) == (
        "resumed", "other.toml", "completed")


def test_a_run_taken_over_is_listed_as_taken_over_until_its_holder_writes(
        tmp_path, monkeypatch):
    _, runs, _ = _sweep_taken_over(tmp_path, monkeypatch, holder_writes=False)
    [entry] = runs
    assert (entry["action"], entry["status"]) == ("taken over", "completed")
    assert entry["seconds"] > 0


def _held_by_another_process(tmp_path: Path) -> tuple[RunConfig, Path]:
    """A 1-epoch run whose folder "another process" (:data:`OTHER_PID`, alive) has claimed,
    its entry (``trained``, by other.toml) in the summary file."""
    import socket

    config = tiny(tmp_path)
    run_dir = plan_run(config).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / CLAIM_FILE).write_text(json.dumps({"pid": OTHER_PID,
                                                  "host": socket.gethostname(),
                                                  "time": "now", "token": "the-other"}))
    write_summary(tmp_path / SUMMARY_FILE, {"schema": SUMMARY_SCHEMA, "runs": [
        {"run_id": run_dir.name, "status": "running", "error": None, "action": "trained",
         "seconds": 0.0, "written_by": "other.toml"}]}, reported_status)
    return config, run_dir


def test_a_run_held_elsewhere_for_the_whole_sweep_keeps_the_holders_entry(tmp_path):
    """Busy here until its holder finished it: the sweep wrote ``skipped`` (0 s, by
    itself) over the entry of the process that trained it."""
    from creditaudit.run.trainer import train

    config, run_dir = _held_by_another_process(tmp_path)

    def the_other_process(state, outcome):
        if outcome is None or outcome["status"] != "busy":
            return
        (run_dir / CLAIM_FILE).unlink()  # it trains the run, and releases it
        train(config, force=True)
        write_summary(tmp_path / SUMMARY_FILE, {"schema": SUMMARY_SCHEMA, "runs": [
            {"run_id": run_dir.name, "status": "completed", "error": None,
             "action": "trained", "seconds": 1.5, "written_by": "other.toml"}]},
            reported_status)

    result = run_sweep([config], InlineExecutor(), poll_seconds=0.01,
                       on_progress=the_other_process, written_by="mine.toml")
    [own] = result.summary["runs"]
    assert (own["action"], own["status"]) == ("skipped", "completed")  # what it did here
    [entry] = json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]
    assert (entry["action"], entry["written_by"], entry["status"], entry["seconds"]) == (
        "trained", "other.toml", "completed", 1.5)


def test_a_run_still_held_when_the_sweep_ends_keeps_the_holders_entry_as_busy(tmp_path):
    config, run_dir = _held_by_another_process(tmp_path)
    result = run_sweep([config], InlineExecutor(), wait_for_others=False,
                       written_by="mine.toml")
    assert result.summary["runs"][0]["status"] == "busy"
    [entry] = json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]
    assert (entry["action"], entry["written_by"], entry["status"]) == (
        "trained", "other.toml", "busy")


# --- 2. a logger failing after the record is final ----------------------------------------
def test_a_logger_failing_after_the_final_record_counts_completed_everywhere(
        tmp_path, monkeypatch, capsys):
    import creditaudit.run.trainer as trainer

    original = trainer.train

    def train(*args, **kwargs):
        original(*args, **kwargs)
        raise GuestError("logger Boom.finish raised ValueError: no (an error in its code)")

    monkeypatch.setattr(trainer, "train", train)
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out")
    assert main(["sweep", str(sweep), "--workers", "0"]) == 0
    captured = capsys.readouterr()
    assert "done 1, running 0, failed 0" in captured.err, captured.err  # was failed 1
    assert "logger Boom.finish raised ValueError" in captured.err
    assert "1 run (1 completed)" in captured.out
    [entry] = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())["runs"]
    assert entry["status"] == "completed"
    assert entry["error"].startswith("its record is final; raised after it: logger Boom")
    assert f"completed: {entry['run_id']}: its record is final" in captured.out


# --- 3. a refused run's row -----------------------------------------------------------------
def test_the_table_row_of_a_refused_run_says_refused(tmp_path, capsys):
    from test_sweep_lost_checkpoint import _lost_checkpoint

    sweep, run_dir, _ = _lost_checkpoint(tmp_path)
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 1
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.split()[1:2] == ["bp"]]
    assert row.split()[2] == "refused", out  # was the record's "interrupted"
    assert f"refused: {run_dir.name}: " in out  # why, below the table


# --- 4. who wrote each entry --------------------------------------------------------------
def test_each_entry_names_the_sweep_file_that_wrote_it(tmp_path, capsys):
    out = tmp_path / "out"
    old = {"run_id": "an-old-entry", "status": "completed", "error": None,
           "action": "trained", "seconds": 1.0}  # written before entries named their writer
    out.mkdir()
    (out / SUMMARY_FILE).write_text(json.dumps({"schema": SUMMARY_SCHEMA, "runs": [old]}))
    first = write_tiny_sweep(tmp_path / "a.toml", out, '[grid]\n"run.seed" = [1]\n')
    second = write_tiny_sweep(tmp_path / "b.toml", out, '[grid]\n"run.seed" = [2]\n')
    assert main(["sweep", str(first), "--workers", "0", "-q"]) == 0
    assert main(["sweep", str(second), "--workers", "0", "-q"]) == 0
    runs = json.loads((out / SUMMARY_FILE).read_text())["runs"]
    assert [run.get("written_by") for run in runs] == [None, str(first), str(second)]
    assert runs[0]["run_id"] == "an-old-entry"  # kept, as it was written
    assert runs[0]["status"] == "not started"  # no folder of that name


def test_an_experiments_entries_name_it(tmp_path):
    from creditaudit.study.experiments.runner import _written_by

    [plan] = plan_runs([tiny(tmp_path)], [])
    assert _written_by({"a": [plan]}) == {plan.run_id: "experiment a"}
    assert _written_by({"a": [plan], "b": [plan]}) == {plan.run_id: "experiments a, b"}
    result = run_sweep([plan], InlineExecutor(), written_by=_written_by({"a": [plan]}))
    assert result.summary["runs"][0]["written_by"] == "experiment a"


# --- 5. nothing to stack ------------------------------------------------------------------
def test_the_stacks_of_runs_that_do_not_stack_are_said_plainly(tmp_path):
    plans = plan_runs([tiny(tmp_path, **{"method.name": "bp"}),
                       tiny(tmp_path, **{"method.name": "fa-linear"})], [])
    assert describe_stacks(plans[:1], 3) == "nothing to stack: 1 run alone"
    assert describe_stacks(plans, 3) == "nothing to stack: 2 runs alone"


# --- 6. a stacked run's logger failing after the record is final -------------------------
def test_a_stacked_runs_logger_failing_after_its_final_record_is_noted(tmp_path, monkeypatch):
    """In a --stack, the logger's error of a run whose record was final was lost: the run
    was completed with no error (as the others), where a run trained alone notes it."""
    import creditaudit.run.stacked as stacked
    from creditaudit.run.plan import run_id
    from test_stacked import configs
    from test_stacked_loggers import BreaksOnce

    runs = configs(tmp_path, "dfa")
    failing = run_id(runs[1])
    build = stacked.build_loggers

    def with_a_broken_logger(config, rid, **options):  # noqa: ANN001, ANN202, ANN003
        built = build(config, rid, **options)
        if rid == failing:
            built.loggers.append(BreaksOnce("finish"))
        return built

    monkeypatch.setattr(stacked, "build_loggers", with_a_broken_logger)
    result = run_sweep(runs, InlineExecutor(), stack=3)
    by_id = {o["run_id"]: o for o in result.outcomes}
    assert [o["status"] for o in result.outcomes] == ["completed"] * 3
    said = "its record is final; raised after it: logger BreaksOnce.finish raised ValueError"
    assert by_id[failing]["error"].startswith(said), by_id[failing]
    assert all(o["error"] is None for i, o in by_id.items() if i != failing)
    entries = {e["run_id"]: e for e in json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]}
    assert entries[failing]["status"] == "completed"
    assert entries[failing]["error"].startswith(said)


def test_a_run_alone_in_a_stack_whose_logger_fails_after_its_record_is_not_failed(
        tmp_path, monkeypatch):
    """A run of a stack that steps alone (here: every run, as for a model with buffers)
    whose logger raised after its final record came back ``failed`` (its record:
    completed), where a stacked run's error is raised once every run has ended, or kept in
    ``after_record``."""
    import creditaudit.run.stacked as stacked
    from creditaudit.run.plan import run_id
    from creditaudit.run.stacked import train_stacked
    from test_stacked import configs
    from test_stacked_loggers import BreaksOnce

    monkeypatch.setattr(stacked, "stack_refusal", lambda rule: "it steps alone (the test)")
    runs = configs(tmp_path / "a", "dfa")[:2]
    with pytest.raises(GuestError, match=r"^logger BreaksOnce\.finish raised ValueError"):
        train_stacked(runs, loggers=[BreaksOnce("finish")])
    runs = configs(tmp_path / "b", "dfa")[:2]
    kept: dict = {}
    results = train_stacked(runs, loggers=[BreaksOnce("finish")], after_record=kept)
    assert [r.status for r in results] == ["completed", "completed"]
    assert list(kept) == [run_id(runs[0])]
    assert str(kept[run_id(runs[0])]).startswith("logger BreaksOnce.finish raised ValueError")


# --- an interrupted sweep ----------------------------------------------------------------
def test_an_interrupted_sweep_writes_its_summary_of_where_each_run_stopped(
        tmp_path, monkeypatch):
    """Ctrl-C in the second run of three: the summary lists the first completed, the second
    interrupted (resumable) and the third not started, and the interrupt goes on."""
    from creditaudit.run.trainer import Trainer, train

    configs = [tiny(tmp_path, **{"method.name": name, "optim.epochs": 2})
               for name in ("bp", "dfa", "fa")]
    run_dirs = [plan_run(config).run_dir for config in configs]
    original = Trainer.train_epoch

    def ctrl_c_in_dfa(self, epoch):
        if self.config.method.name == "dfa" and epoch == 2:
            raise KeyboardInterrupt
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", ctrl_c_in_dfa)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(configs, InlineExecutor())
    runs = {entry["run_id"]: entry
            for entry in json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]}
    said = [(runs[d.name]["status"], runs[d.name]["action"]) for d in run_dirs]
    assert said == [("completed", "trained"), ("interrupted", "interrupted"),
                    ("not started", "not started")]
    monkeypatch.setattr(Trainer, "train_epoch", original)
    assert train(configs[1], resume=True).status == "completed"


def test_a_run_interrupted_after_its_holder_let_it_go_is_not_summarised_busy(
        tmp_path, monkeypatch):
    """Busy in the first round, released by its holder, then trained here and interrupted:
    the summary said it was busy (held by another process: the holder's entry kept), though
    no process held it and its record says interrupted."""
    from creditaudit.run.trainer import Trainer

    config, run_dir = _held_by_another_process(tmp_path)

    def the_other_process_lets_go(state, outcome):
        if outcome is not None and outcome["status"] == "busy":
            (run_dir / CLAIM_FILE).unlink()  # it stops without training the run

    def ctrl_c(self, epoch):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_epoch", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_sweep([config], InlineExecutor(), poll_seconds=0.01,
                  on_progress=the_other_process_lets_go, written_by="mine.toml")
    [entry] = json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]
    assert (entry["status"], entry["action"], entry["written_by"]) == (
        "interrupted", "interrupted", "mine.toml")


def test_a_run_another_process_trains_when_the_sweep_is_interrupted_is_summarised_busy(
        tmp_path, monkeypatch):
    """Ctrl-C in this sweep's first run, while another process (a second sweep on the
    folder) trains the second run of this sweep's round: the summary said this sweep had
    interrupted that run, with status ``running`` (its live record's), though it never
    touched it; the run is the other process's, busy."""
    import socket

    from creditaudit.records import new_record, save_record
    from creditaudit.run.trainer import Trainer

    configs = [tiny(tmp_path, **{"method.name": name, "optim.epochs": 2})
               for name in ("bp", "dfa")]
    other = plan_run(configs[1]).run_dir

    def ctrl_c_as_the_other_process_trains(self, epoch):
        other.mkdir(parents=True, exist_ok=True)  # it claims the run and writes its record
        (other / CLAIM_FILE).write_text(json.dumps({"pid": OTHER_PID,
                                                    "host": socket.gethostname(),
                                                    "time": "now", "token": "the-other"}))
        save_record(other, new_record(configs[1], device="cpu", run_id=other.name))
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_epoch", ctrl_c_as_the_other_process_trains)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(configs, InlineExecutor())
    runs = {entry["run_id"]: entry
            for entry in json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"]}
    assert (runs[other.name]["status"], runs[other.name]["action"]) == ("busy", "busy")
    mine = plan_run(configs[0]).run_dir.name
    assert (runs[mine]["status"], runs[mine]["action"]) == ("interrupted", "interrupted")
