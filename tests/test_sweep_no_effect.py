"""A grid value that changes nothing in some runs is left out of them, as an option another
rule reads is: a penalty of the frozen baseline (no block trains) is that baseline's run.
Experiments never generate such runs; a single run that asks for one is still refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.study.experiments import get_experiment
from creditaudit.study.experiments.registry import Choices
from creditaudit.sweep import load_sweep, plan_runs
from integrity_support import assert_one_line_error
from sweep_files import write_tiny_sweep


def tiny_sweep(tmp_path: Path, body: str, **base: object) -> Path:
    return write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", body, base=base)


def _runs(path: Path) -> list[tuple[str, float, int | None]]:
    return [(c.method.name, c.method.penalty, c.method.trainable_blocks)
            for c in load_sweep(path).configs()]


def test_a_grid_penalty_of_the_frozen_baseline_is_left_out_with_a_warning(tmp_path, caplog,
                                                                           capsys):
    """The review's sweep: bp and frozen × λ ∈ {0, 0.01}. The penalised frozen point is the
    frozen run (λ left out, said in a warning), so 3 runs, every one of them plannable."""
    path = tiny_sweep(tmp_path, """
        [grid]
        "method.name" = ["bp", "frozen"]
        "method.penalty" = [0.0, 0.01]
    """)
    with caplog.at_level(logging.WARNING):
        runs = _runs(path)
    assert runs == [("bp", 0.0, None), ("bp", 0.01, None), ("frozen", 0.0, None)]
    warned = [r.getMessage() for r in caplog.records if "method.penalty" in r.getMessage()]
    assert warned and "left out of those runs" in warned[0] and "'frozen'" in warned[0]
    plan_runs(load_sweep(path).configs())  # nothing refused
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 runs" in out and "name=frozen penalty=0.0" in out


def test_a_penalty_where_the_grid_trains_no_block_is_left_out(tmp_path):
    """trainable_blocks=0 trains no block either: its penalised point is its λ = 0 run."""
    path = tiny_sweep(tmp_path, """
        [grid]
        "method.trainable_blocks" = [0, 1]
        "method.penalty" = [0.0, 0.01]
    """, **{"method.name": "dfa"})
    assert _runs(path) == [("dfa", 0.0, 0), ("dfa", 0.0, 1), ("dfa", 0.01, 1)]


def test_an_include_run_with_a_penalty_of_the_baseline_is_the_baseline_run(tmp_path):
    path = tiny_sweep(tmp_path, """
        [grid]
        "method.name" = ["bp", "frozen"]

        [[include]]
        "method.name" = "frozen"
        "method.penalty" = 0.1
    """)
    assert _runs(path) == [("bp", 0.0, None), ("frozen", 0.0, None)]


def test_a_penalty_axis_that_changes_nothing_in_any_run_is_refused(tmp_path, capsys):
    path = tiny_sweep(tmp_path, '[grid]\n"method.penalty" = [0.0, 0.01]\n',
                      **{"method.name": "frozen"})
    with pytest.raises(ConfigError, match="grid axis method.penalty changes nothing"):
        load_sweep(path)
    assert main(["sweep", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "method.penalty changes nothing in any run",
                          "drop the axis")


def test_a_single_penalised_frozen_run_is_still_refused(tmp_path, capsys):
    assert main(["train", "--method", "frozen", "--penalty", "0.1", "--dataset", "synthetic",
                 "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "--penalty 0.1 has no effect with --method frozen",
                          "leave it out")  # the flags typed


@pytest.mark.parametrize("name", ["penalty_sweep", "depth_ladder"])
def test_experiments_with_the_baseline_among_their_rules_plan_every_run(tmp_path, name):
    """`--rules dfa,frozen`: the baseline is added once per seed, never penalised nor given
    a ladder of trainable blocks (each refused: it trains no block)."""
    experiment = get_experiment(name)
    configs = experiment.configs("smoke", dataset=None, data_dir=None,
                                 out_dir=str(tmp_path), choices=Choices(rules=("dfa", "frozen")))
    frozen = [c for c in configs if c.method.name == "frozen"]
    assert frozen and all(c.method.penalty == 0 and c.method.trainable_blocks is None
                          for c in frozen)
    assert len(frozen) == len({c.run.seed for c in configs})
    plan_runs(configs)  # nothing refused


# --- trainable_blocks = L: the default's run, labelled as the user wrote it ----------------
LADDER = '[grid]\n"method.trainable_blocks" = [1, 2]\n'


def test_the_dry_run_says_why_all_blocks_is_the_default_run(tmp_path, capsys):
    """dfa with 2 blocks, trainable_blocks ∈ {1, 2} and the default run as an include: the
    row of 2 keeps its label, and the include is its run for the true reason (not 'the
    same data in another folder')."""
    path = tiny_sweep(tmp_path, LADDER + '\n[[include]]\n"method.name" = "dfa"\n',
                      **{"method.name": "dfa"})
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.startswith("trainable_blocks=")}
    assert set(rows) == {"trainable_blocks=1", "trainable_blocks=2", "trainable_blocks=None"}
    assert rows["trainable_blocks=2"].endswith("to run")
    assert rows["trainable_blocks=None"].endswith(
        "the run of trainable_blocks=2 (trainable_blocks=2 trains every block: the default "
        "run): runs once")
    assert "another folder" not in out
    assert "note: run trainable_blocks=2: trainable_blocks=2 trains every block" in out


def test_the_table_and_summary_keep_the_value_the_user_gave(tmp_path, capsys):
    path = tiny_sweep(tmp_path, LADDER, **{"method.name": "dfa"})
    assert main(["sweep", str(path), "--workers", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "trainable_blocks=2" in out and "trainable_blocks=None" not in out
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert [run["grid"]["method.trainable_blocks"] for run in summary["runs"]] == [1, 2]
    record = json.loads((tmp_path / "out" / summary["runs"][1]["run_id"] / "record.json")
                        .read_text())
    assert record["config"]["method"]["trainable_blocks"] is None  # the default's run


# --- a record changed after it was written: the sweep starts the run over ----------------
def test_a_sweep_says_it_resumes_a_changed_record_without_load_records_advice(
        tmp_path, capsys, caplog):
    """load_record's advice (restore the file, or train again with --force) is for a
    command that stops there; the sweep resumes the run from its checkpoint itself (which
    holds the record as of its epoch: the trained epochs are kept) and says so."""
    path = tiny_sweep(tmp_path, '[grid]\n"method.name" = ["bp"]\n')
    assert main(["sweep", str(path), "--workers", "0", "-q"]) == 0
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    raw = json.loads((run_dir / "record.json").read_text())
    raw["log"][-1]["acc_eval"] = 0.99  # a number the run did not reach
    (run_dir / "record.json").write_text(json.dumps(raw))
    capsys.readouterr()
    assert main(["sweep", str(path), "--dry-run"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith(run_dir.name))
    assert "to resume from its checkpoint of epoch" in row, row
    assert "changed after creditaudit wrote it" in row
    assert "--force" not in row and "restore the file" not in row
    with caplog.at_level(logging.WARNING):
        assert main(["sweep", str(path), "--workers", "0", "-q"]) == 0
    (warning,) = [r.getMessage() for r in caplog.records if "changed after" in r.getMessage()]
    assert warning.startswith(f"warning: resuming {run_dir.name} from its checkpoint of "
                              "epoch "), warning
    assert "--force" not in warning and "restore the file" not in warning
    assert json.loads((run_dir / "record.json").read_text())["log"][-1]["acc_eval"] != 0.99
