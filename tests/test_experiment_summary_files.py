"""An experiment's summary is one pair of files, .json and .md: a write that fails leaves
both as they were (it wrote the .json, then failed on the .md: a new .json beside an old .md),
and one experiment's summary that cannot be written stops no other's (with ``all``, the
experiments after it got none), while the command still fails in one line naming the file."""

from __future__ import annotations

import pytest

from creditaudit.cli import main
from creditaudit.errors import OutputError
from creditaudit.study.experiments.runner import run_experiments

NAMES = ["penalty_sweep", "depth_ladder"]


def _blocked(out):
    """penalty_sweep's old summary pair, its .md then made a folder (a write that fails)."""
    folder = out / "experiments"
    folder.mkdir(parents=True)
    stem = folder / "penalty_sweep.smoke.synthetic"
    (folder / f"{stem.name}.json").write_text("old json\n")
    (folder / f"{stem.name}.md").mkdir()
    return stem


def test_a_summary_that_cannot_be_written_leaves_its_pair_old_and_stops_no_other(tmp_path):
    stem = _blocked(tmp_path)
    with pytest.raises(OutputError) as caught:
        run_experiments(NAMES, scale="smoke", out_dir=tmp_path, train=False)
    message = str(caught.value)
    assert "\n" not in message and f"{stem}.md is a folder" in message
    assert "the summary of penalty_sweep" in message
    assert "call it again with train=False" in message and "--" not in message
    assert (tmp_path / "experiments" / f"{stem.name}.json").read_text() == "old json\n"
    other = tmp_path / "experiments" / "depth_ladder.smoke.synthetic"
    assert all(other.with_name(f"{other.name}.{suffix}").is_file() for suffix in ("json", "md"))
    assert not [p for p in (tmp_path / "experiments").iterdir() if p.name.startswith(".")]


def test_the_command_fails_in_one_line_naming_the_file(tmp_path, capsys):
    stem = _blocked(tmp_path)
    assert main(["experiment", "penalty_sweep", "--scale", "smoke", "--no-train",
                 "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{stem}.md is a folder" in err, err
    assert "run the same command with --no-train" in err
    assert (tmp_path / "experiments" / f"{stem.name}.json").read_text() == "old json\n"


def test_files_written_as_a_set_are_all_old_when_one_cannot_be_written(tmp_path):
    from creditaudit.files.safe_files import atomic_write_files

    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").mkdir()
    with pytest.raises(OutputError, match="is a folder"):
        atomic_write_files({tmp_path / "a": b"new a", tmp_path / "b": b"new b"})
    assert (tmp_path / "a").read_text() == "old a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary file
    atomic_write_files({tmp_path / "a": b"new a", tmp_path / "c": b"c"})
    assert (tmp_path / "a").read_bytes() == b"new a" and (tmp_path / "c").read_bytes() == b"c"


def test_a_summary_of_float64_runs_has_its_own_file(tmp_path):
    """A Python caller's float64 default dtype makes other runs (the dtype is in the run id):
    their summary replaced the float32 one under its name, its meta saying nothing of it."""
    from pathlib import Path

    import torch

    from creditaudit.study.experiments.runner import find_summary, run_experiment

    single = run_experiment("capacity_cost", scale="smoke", out_dir=tmp_path, train=False)
    fp32 = Path(single["meta"]["files"][0])
    before = fp32.read_bytes()
    torch.set_default_dtype(torch.float64)
    try:
        double = run_experiment("capacity_cost", scale="smoke", out_dir=tmp_path, train=False)
        assert find_summary(tmp_path, "capacity_cost", "smoke", "synthetic") == \
            Path(double["meta"]["files"][0])
    finally:
        torch.set_default_dtype(torch.float32)
    assert fp32.read_bytes() == before
    assert double["meta"]["files"][0].endswith("capacity_cost.smoke.synthetic.float64.json")
    assert double["meta"]["dtype"] == "float64" and "dtype" not in single["meta"]
    assert "parameters in `float64`" in Path(double["meta"]["files"][1]).read_text()
    assert double["meta"]["run_ids"] != single["meta"]["run_ids"]
    assert find_summary(tmp_path, "capacity_cost", "smoke", "synthetic") == fp32
