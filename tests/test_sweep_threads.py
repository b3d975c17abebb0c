"""A sweep's thread count: ``--threads-per-worker`` when given, else the sweep file's
``run.threads``, else 1 — and a one-line warning wherever a file's ``run.threads`` is not
followed. ``run.threads`` is no part of a run id, so no choice changes one."""

from __future__ import annotations

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.records import RECORD_FILE, load_record
from sweep_files import write_tiny_sweep


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def trained(out) -> dict[str, int]:
    """Run id → the torch threads its record says it trained on."""
    return {d.name: load_record(d / RECORD_FILE).environment["torch_threads"]
            for d in out.iterdir() if (d / RECORD_FILE).exists()}


def test_the_sweep_files_run_threads_is_followed_without_the_flag(tmp_path, capsys):
    """--threads-per-worker (default 1) used to override the file's run.threads silently."""
    plain = write_tiny_sweep(tmp_path / "plain.toml", tmp_path / "plain")
    threaded = write_tiny_sweep(tmp_path / "threaded.toml", tmp_path / "threaded",
                                base={"run.threads": 2})
    assert main(["sweep", str(threaded), "--workers", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "in this process, 2 threads" in out and "warning" not in out
    for sweep in (plain, threaded):
        assert main(["sweep", str(sweep), "--workers", "0", "-q"]) == 0
    plain_runs, threaded_runs = trained(tmp_path / "plain"), trained(tmp_path / "threaded")
    assert list(plain_runs.values()) == [1] and list(threaded_runs.values()) == [2]
    assert list(plain_runs) == list(threaded_runs)  # the same run id


def test_the_flag_wins_and_says_what_it_overrides(tmp_path, capsys):
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out", base={"run.threads": 2})
    line = "--threads-per-worker 1 overrides the sweep's run.threads = 2"
    assert main(["sweep", str(sweep), "--workers", "0", "--threads-per-worker", "1",
                 "--dry-run"]) == 0
    assert f"warning: {line}" in capsys.readouterr().out
    assert main(["sweep", str(sweep), "--workers", "0", "--threads-per-worker", "1",
                 "-q"]) == 0
    assert f"creditaudit: warning: {line}" in capsys.readouterr().err
    assert list(trained(tmp_path / "out").values()) == [1]


def config(threads: int | None) -> RunConfig:
    return RunConfig().replace(**{"run.threads": threads})


@pytest.mark.parametrize(("threads", "given", "expected", "warned"), [
    ([None, None], None, 1, None),
    ([3, 3], None, 3, None),
    ([3, 3], 3, 3, None),
    ([3, 3], 2, 2, "--threads-per-worker 2 overrides the sweep's run.threads = 3"),
    ([None, 3], 2, 2, "--threads-per-worker 2 overrides the sweep's run.threads = 3"),
    ([None, 3], None, 1, "the sweep's runs do not all set one run.threads (they set 3)"),
    ([2, 3], None, 1, "the sweep's runs do not all set one run.threads (they set 2, 3)"),
])
def test_one_count_for_every_run(threads, given, expected, warned):
    from creditaudit.sweep import sweep_threads

    count, warning = sweep_threads([config(t) for t in threads], given)
    assert count == expected
    assert (warning is None) == (warned is None)
    if warned is not None:
        assert warning.startswith(warned) and "\n" not in warning


def test_a_count_past_64_bits_is_refused_naming_the_flag(tmp_path, capsys):
    """It was refused as run.threads=…, a key the command line never typed."""
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out")
    huge = str(10**30)
    assert main(["sweep", str(sweep), "--workers", "0", "--threads-per-worker", huge,
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"error: --threads-per-worker {huge} is out of range" in err, err
    assert "run.threads" not in err and len(err.strip().splitlines()) == 1


def test_the_flag_overriding_creditaudit_set_names_the_variable(tmp_path, capsys,
                                                                 monkeypatch):
    """The run.threads it overrides was CREDITAUDIT_SET's, not the sweep file's."""
    sweep = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "out")
    monkeypatch.setenv("CREDITAUDIT_SET", "run.threads=3")
    assert main(["sweep", str(sweep), "--workers", "0", "--threads-per-worker", "1",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "warning: --threads-per-worker 1 overrides CREDITAUDIT_SET's run.threads=3" in out
    assert "the sweep's run.threads" not in out
