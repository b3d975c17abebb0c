"""``creditaudit demo``: what it says it trains on, ``--workers 0``, and refusals in the words
of its own flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.records import load_record

# A tiny synthetic task in place of the demo's MNIST-1D, as CREDITAUDIT_SET gives it.
TINY_SYNTHETIC = ("data.name=synthetic data.n_test=200 data.in_dim=8 model.d=16 "
                  "diagnostics.eval_samples=100")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()  # --workers 0 trains here, on one thread
    yield
    torch.set_num_threads(threads)


def test_the_demo_names_the_data_it_ran_on_and_workers_0_trains_in_this_process(
        tmp_path: Path, capsys, monkeypatch):
    """With CREDITAUDIT_SET="data.name=synthetic" the demo said "on MNIST-1D"; --workers 0
    was the default (worker processes) without a word."""
    import creditaudit.sweep

    def no_workers(*args: object, **kwargs: object) -> None:
        raise AssertionError("--workers 0 started worker processes")

    monkeypatch.setattr(creditaudit.sweep, "LocalExecutor", no_workers)
    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("training "))
    assert line.endswith("(1 epoch each, one after another in this process) on synthetic "
                         "teacher–student …"), line
    assert "MNIST-1D" not in out
    records = [load_record(path.parent) for path in tmp_path.glob("*/record.json")]
    assert len(records) == 4 and {r.dataset for r in records} == {"synthetic"}


def test_negative_workers_are_refused_in_one_line(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("CREDITAUDIT_SET", raising=False)
    assert main(["demo", "--workers", "-1", "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip() == (
        "creditaudit: error: --workers must be >= 0 (0 = one run after another in this "
        "process), got -1")
    assert not (tmp_path / "a").exists()


def test_n_train_refusals_speak_of_the_demos_flags(tmp_path: Path, capsys, monkeypatch):
    """They named data.n_test, which no flag of the demo's sets."""
    import creditaudit.run.memory

    monkeypatch.delenv("CREDITAUDIT_SET", raising=False)
    assert main(["demo", "--n-train", "105", "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip() == (
        "creditaudit: error: --n-train 105 is not a multiple of 10: MNIST-1D generates "
        "equally many samples of each class; use e.g. --n-train 100")
    monkeypatch.setattr(creditaudit.run.memory, "available_memory", lambda: 2**20)
    assert main(["demo", "--dataset", "synthetic", "--n-train", "20000",
                 "--out", str(tmp_path / "b")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("creditaudit: error: synthetic teacher–student task would hold "
                           "20,000 + 2,000 samples"), line
    assert line.endswith("use a smaller --n-train (the demo also tests on 2,000)"), line
    assert "data.n_" not in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_second_demo_says_it_reuses_finished_runs_and_retries_a_failed_one(
        tmp_path: Path, capsys, monkeypatch):
    """A second demo said "training bp, fa, dfa, frozen" and trained nothing, without a
    word of the runs it reused; a run that failed (here: dfa, out of memory) was skipped by
    every later demo, which has no --retry-failed, so the demo could never finish it."""
    from creditaudit.methods.dfa import DirectFeedbackRule

    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    demo = ["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
            "--out", str(tmp_path)]

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("simulated")

    with monkeypatch.context() as patch:
        patch.setattr(DirectFeedbackRule, "train_step", out_of_memory)
        assert main(demo) == 1
    assert "dfa" in capsys.readouterr().out
    finished = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/record.json")
                if load_record(p.parent).status == "completed"}
    assert len(finished) == 3
    assert main(demo) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"bp, fa, frozen finished earlier in {tmp_path}: reused, not retrained" in out
    assert any(line.startswith("training dfa (1 epoch each") for line in out), out
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # nothing retrained
    assert {load_record(p.parent).status for p in tmp_path.glob("*/record.json")} == \
        {"completed"}
    assert main(demo) == 0
    out = capsys.readouterr().out.splitlines()
    assert (f"bp, fa, dfa, frozen finished earlier in {tmp_path}: reused, not retrained "
            "(nothing to train)") in out
    assert not any(line.startswith("training ") for line in out), out


def test_a_run_that_diverged_before_its_protocol_ran_gets_no_margin_over_frozen(
        tmp_path: Path, capsys, monkeypatch):
    """A DFA run that diverged in epoch 1 had "—" for its verdict in the table (no protocol
    evaluation after training), yet the (d) lines said "dfa -2.0 pp fired" from the
    untrained network's accuracy, which `creditaudit audit` calls not evaluated."""
    from creditaudit.methods.dfa import DirectFeedbackRule

    step = DirectFeedbackRule.train_step

    def diverging(self, x, y, optimizer):  # noqa: ANN001, ANN202
        result = step(self, x, y, optimizer)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.fill_(float("nan"))
        return result

    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    monkeypatch.setattr(DirectFeedbackRule, "train_step", diverging)
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("dfa "))
    assert "diverged" in row and row.endswith("  —"), row
    margins = lines[next(i for i, line in enumerate(lines) if line.startswith("(d) ")):]
    assert any(line.startswith("  bp ") for line in margins), margins
    assert not any(line.startswith("  dfa ") for line in margins), margins
    # nor is its untrained checkpoint the run the demo suggests auditing
    assert lines[-1].startswith("  creditaudit audit ") and "/bp-" in lines[-1], lines[-1]


def test_the_audit_command_reads_a_results_folder_named_like_an_option_as_a_path(
        tmp_path: Path, capsys, monkeypatch):
    """`demo --out=-o` printed `creditaudit audit -o/dfa-…`, which audit reads as an
    option: "the following arguments are required: RUN"."""
    import shlex

    from creditaudit.cli import build_parser

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0", "-q",
                 "--out=-o"]) == 0
    command = shlex.split(capsys.readouterr().out.splitlines()[-1])
    assert command[:2] == ["creditaudit", "audit"], command
    args = build_parser().parse_args(command[1:])
    assert [(Path(p) / "record.json").is_file() for p in args.run_paths] == [True], args


def test_an_interrupted_run_is_named_with_how_to_resume_it_not_with_none(
        tmp_path: Path, capsys, monkeypatch):
    """Ctrl-C during `demo --workers 2`: the workers record their runs as interrupted, the
    sweep returns, and the demo printed "dfa-… interrupted: None" for each."""
    import creditaudit.sweep

    sweep = creditaudit.sweep.run_sweep

    def interrupted_dfa(*args: object, **kwargs: object) -> object:
        result = sweep(*args, **kwargs)
        for outcome in result.outcomes:
            if outcome["run_id"].startswith("dfa-"):
                outcome.update(status="interrupted", error=None)
        return result

    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    monkeypatch.setattr(creditaudit.sweep, "run_sweep", interrupted_dfa)
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0", "-q",
                 "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "None" not in out
    line = next(line for line in out.splitlines() if line.startswith("dfa-"))
    assert line.endswith(" interrupted"), line
    assert ("interrupted runs resume from their last finished epoch: run the same demo "
            "command again") in out.splitlines()


def test_the_demo_says_which_runs_another_process_trains_and_waits_for(tmp_path: Path):
    from types import SimpleNamespace

    from creditaudit.cli.demo import DEMO_METHODS, demo_config, start_lines
    from creditaudit.config import apply_where_read
    from creditaudit.config.overrides import parse_override
    from creditaudit.records.claims import try_claim
    from creditaudit.sweep import plan_runs

    shrink = dict(parse_override(item) for item in TINY_SYNTHETIC.split())
    plans = plan_runs([apply_where_read(demo_config(m, epochs=1, n_train=200,
                                                    out_dir=str(tmp_path), seed=0), shrink)
                       for m in DEMO_METHODS], ("method.name",))
    claim, _ = try_claim(plans[2].run_dir)  # this process, alive: another demo's worker
    assert claim is not None
    lines = start_lines(plans, SimpleNamespace(name="inline", slots=1), str(tmp_path),
                        "synthetic")
    assert lines == [f"dfa: another process is training it in {tmp_path}; waiting for it",
                     "training bp, fa, frozen (1 epoch each, one after another in this "
                     "process) on synthetic …"]


def test_runs_made_one_by_creditaudit_set_are_trained_and_shown_once(
        tmp_path: Path, capsys, monkeypatch):
    """CREDITAUDIT_SET="method.name=bp" makes the demo's four runs one: it said "training
    bp, bp, bp, bp", trained one run and printed its record four times."""
    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC + " method.name=bp")
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("training bp (1 epoch each") for line in lines), lines
    assert sum(line.startswith("bp ") for line in lines) == 1, lines


def test_the_demo_names_the_folder_creditaudit_set_sends_its_records_to(
        tmp_path: Path, capsys, monkeypatch):
    """CREDITAUDIT_SET="run.out_dir=…" moved the records, but the closing "records:" line
    and the audit hint still named --out, where nothing was written."""
    there = tmp_path / "there"
    monkeypatch.setenv("CREDITAUDIT_SET", f"{TINY_SYNTHETIC} run.out_dir={there}")
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path / "asked")]) == 0
    out = capsys.readouterr().out
    assert f"records: {there}/<run id>/record.json" in out
    audit = next(line for line in out.splitlines() if "creditaudit audit " in line)
    assert str(there) in audit and "asked" not in out
    assert len(list(there.glob("*/record.json"))) == 4


def test_untrained_runs_get_no_depth_utility_heading_without_margins(
        tmp_path: Path, capsys, monkeypatch):
    """`creditaudit demo --epochs 0` printed the "(d) depth utility: margin over frozen
    blocks …" heading with no method under it ((d) is not evaluated on an untrained
    network); the table's verdicts already say (d) not evaluated."""
    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    assert main(["demo", "--epochs", "0", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "(d) not evaluated" in out
    assert "margin over frozen blocks" not in out, out


def test_progress_lines_count_elapsed_time_from_one_start(tmp_path: Path, capsys,
                                                          monkeypatch):
    """A run's "completed (1/4, 0m23s elapsed)" line counted from the command's start
    (data preparation included) while the epoch lines between them counted from the start
    of training, so elapsed time went back from one line to the next ("… 0m20s elapsed")."""
    import time as real_time
    from types import SimpleNamespace

    import creditaudit.cli.demo as demo

    calls = []

    def perf_counter() -> float:  # the command's start is 100 s earlier: a slow data step
        calls.append(None)
        return real_time.perf_counter() - (100.0 if len(calls) == 1 else 0.0)

    monkeypatch.setattr(demo, "time", SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setenv("CREDITAUDIT_SET", TINY_SYNTHETIC)
    assert main(["demo", "--epochs", "1", "--n-train", "200", "--workers", "0",
                 "--out", str(tmp_path)]) == 0
    ended = [line for line in capsys.readouterr().out.splitlines()
             if line.endswith(" elapsed)")]
    assert len(ended) == 4 and not any("1m" in line for line in ended), ended
