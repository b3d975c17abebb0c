"""What a sweep says about its axes and folders, and says once: an axis that some runs do
not read gives no 'lists one value twice' warning, a factory argument (``model.args.d``)
that no run reads is named as any other unread key, runs in two results folders are refused
by the dry run as by the sweep, and the sweep command warns once per warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.sweep import load_sweep
from integrity_support import assert_one_line_error
from sweep_files import write_tiny_sweep

# bp reads no feedback seed: its runs collapse by design, named in a warning.
FA_FIRST = '[grid]\n"method.name" = ["fa", "bp"]\n"method.feedback_seed" = [1, 2]\n'
BP_FIRST = '[grid]\n"method.name" = ["bp", "fa"]\n"method.feedback_seed" = [1, 2]\n'
NOT_READ = "method.feedback_seed is not read by bp: left out of those runs"
REPEAT = "1 grid combination gives the run of an earlier combination: each run runs once"


def sweep_file(tmp_path: Path, body: str) -> Path:
    return write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", body)


@pytest.mark.parametrize("body", [FA_FIRST, BP_FIRST], ids=["fa first", "bp first"])
def test_an_axis_some_runs_do_not_read_is_not_said_to_list_a_value_twice(tmp_path, body):
    """The grid's order must not matter: with bp first, the axis's first line (the bp runs)
    collapsed and was reported as 'lists one value twice (1 and 2)', which also hid the
    note about the repeated combination."""
    sweep = load_sweep(sweep_file(tmp_path, body))
    for overrides in (None, {"run.out_dir": str(tmp_path / "elsewhere")}):
        expansion = sweep.expand(overrides)
        assert len(expansion.configs) == 3
        assert expansion.warnings == []
        assert expansion.notes == [REPEAT]


def test_an_overridden_axis_names_the_value_that_overrides_it(tmp_path):
    """The axis's first line holds bp, which does not read the seed: the warning showed
    the bp run's value (None), not the one the command line sets."""
    expansion = load_sweep(sweep_file(tmp_path, BP_FIRST)).expand({"method.feedback_seed": 5})
    assert expansion.warnings == [
        "grid axis method.feedback_seed is set for every run by the command line "
        "(method.feedback_seed=5): its 2 values give 1 run"]


def test_a_factory_argument_no_run_reads_is_named_not_dropped(tmp_path, caplog):
    """model.args is read by model.arch = "module" only: on resmlp one value was left out
    without a word, and two were said to be 'one value listed twice'."""
    with caplog.at_level(logging.WARNING):
        assert len(load_sweep(sweep_file(tmp_path, '[grid]\n"model.args.d" = [4]\n'))
                   .configs()) == 1
    assert any("model.args.d is not read by resmlp: left out of those runs" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ConfigError, match=r"grid axis model\.args\.d is not read by resmlp: "
                                          r"its 2 values give 1 run"):
        load_sweep(sweep_file(tmp_path, '[grid]\n"model.args.d" = [4, 8]\n'))


def test_an_empty_axis_is_one_clear_line(tmp_path, capsys):
    path = sweep_file(tmp_path, '[grid]\n"method.name" = []\n')
    assert main(["sweep", str(path), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    line = assert_one_line_error(out, err, "grid key 'method.name' lists no value")
    assert "[[]]" not in line


def test_runs_in_two_results_folders_are_refused_by_the_dry_run_too(tmp_path, capsys):
    """An [[include]] run with its own run.out_dir: the dry run listed it and exited 0, the
    sweep then printed its header and refused."""
    path = sweep_file(tmp_path, f"""
        [grid]
        "method.name" = ["bp", "fa"]
        [[include]]
        "method.name" = "dfa"
        "run.out_dir" = "{tmp_path / 'other'}"
    """)
    for flags in (["--dry-run"], ["--workers", "0"]):
        assert main(["sweep", str(path), *flags]) == 2
        out, err = capsys.readouterr()
        assert_one_line_error(out, err, "all runs of a sweep must share one results folder")
        assert out == ""  # no header, no table
    assert main(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "one")]) == 0
    assert "3 runs: 0 done or skipped, 3 to run" in capsys.readouterr().out
    assert not (tmp_path / "out").exists() and not (tmp_path / "other").exists()


def test_the_sweep_command_says_each_warning_once(tmp_path, capsys, caplog):
    """load_sweep expanded the grid to validate it and the command expanded it again: each
    warning of the expansion was printed twice."""
    path = sweep_file(tmp_path, FA_FIRST)
    with caplog.at_level(logging.WARNING):
        assert main(["sweep", str(path), "--dry-run"]) == 0
    said = [r.getMessage() for r in caplog.records if NOT_READ in r.getMessage()]
    assert len(said) == 1
    assert f"note: {REPEAT}" in capsys.readouterr().out


def test_zero_and_minus_zero_are_one_value_listed_twice(tmp_path):
    """Both are one run id (signless zeros): the axis was said not to be part of the run id."""
    with pytest.raises(ConfigError, match=r"grid axis method\.penalty lists one value twice "
                                          r"\(0\.0 and -0\.0\): its 2 values give 1 run"):
        load_sweep(sweep_file(tmp_path, '[grid]\n"method.penalty" = [0.0, -0.0]\n'))


def test_an_include_that_repeats_the_base_run_of_a_file_without_grid_says_so(tmp_path):
    """Without a [grid] the first run is the [base] run, not 'grid combination {}'."""
    expansion = load_sweep(sweep_file(tmp_path, '[[include]]\n"method.penalty" = 0.0\n')).expand()
    assert expansion.notes == ["[[include]] run 1 {method.penalty=0.0} is the [base] run: it "
                               "runs once"]


def test_an_axis_another_override_collapses_names_that_override(tmp_path):
    """CREDITAUDIT_SET="method.name=bp" over fa and dfa: the seed axis then gives one run
    because bp reads no seed, not because 1 and 2 are 'one value listed twice'."""
    path = sweep_file(tmp_path, '[grid]\n"method.name" = ["fa", "dfa"]\n'
                                '"method.feedback_seed" = [1, 2]\n')
    assert load_sweep(path).expand({"method.name": "bp"}).warnings == [
        "grid axis method.name is set for every run by the command line "
        "(method.name='bp'): its 2 values give 1 run",
        "grid axis method.feedback_seed gives fewer runs under the command line's "
        "method.name='bp': its 2 values give 1 run"]


def test_grid_values_with_control_characters_label_rows_on_one_plain_line(tmp_path, capsys):
    """A folder's name may hold any character: the dry run printed an escape sequence (or a
    line break) of a data_dir value into its table, which the final table already strips."""
    from integrity_support import write_idx_dataset

    plain, odd = tmp_path / "data", tmp_path / "data\x1b[31m\nx"
    for folder in (plain, odd):
        write_idx_dataset(folder)
    path = tmp_path / "s.toml"  # JSON's string escapes are TOML's
    path.write_text(f"""
[base.data]
name = "mnist"
data_dir = {json.dumps(str(plain))}
[base.run]
out_dir = {json.dumps(str(tmp_path / "out"))}
[grid]
"method.name" = ["bp", "fa"]
"data.data_dir" = [{json.dumps(str(plain))}, {json.dumps(str(odd))}]
""")
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert any(line.startswith(f"name=bp data_dir={plain} [31m x ") for line in
               out.splitlines())
