"""A resumed run continues on the thread count it started with, and its record says what ran
in every part (docs/reliability.md §2).

The thread count is not part of the run id: it changes no option of the computation, only
the order in which torch adds up the pieces of a sum — the last bits (1.5e-8 in the weights
of the tiny run below after two epochs, 1 against 2 threads). So a resumed run keeps the
count of its earlier epochs (else it would not equal the uninterrupted run), and each part
of a run keeps its own environment in the record (``resumed``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from creditaudit import version
from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import RunRecordError
from creditaudit.records import (
    CHECKPOINT_FILE,
    RunRecord,
    comparable,
    load_checkpoint,
    load_record,
    save_record,
)
from creditaudit.report import format_run_summary
from creditaudit.report.folder import render_report_markdown
from creditaudit.results import RunIndex
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import Trainer, train
from creditaudit.sweep import InlineExecutor, prepare_configs, run_sweep
from integrity_support import assert_one_line_error, snapshot, toml_of

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 3, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


@pytest.fixture(autouse=True)
def threads_as_found():
    """Training sets torch's process-wide thread count: put it back for the next test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def threads_seen(monkeypatch):
    """``threads_seen()``: from now on, the torch thread count each trained epoch runs on,
    ``{epoch: threads}``."""

    def watch() -> dict[int, int]:
        seen: dict[int, int] = {}
        original = Trainer.train_epoch

        def counting(self, epoch):  # noqa: ANN001
            seen[epoch] = torch.get_num_threads()
            return original(self, epoch)

        monkeypatch.setattr(Trainer, "train_epoch", counting)
        return seen

    return watch


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_checkpoint(a / CHECKPOINT_FILE), load_checkpoint(b / CHECKPOINT_FILE)
    return all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"])


def test_resume_refuses_another_explicit_thread_count(tmp_path, capsys, kill_run_at):
    config = tiny(tmp_path / "out", **{"run.threads": 1})
    kill_run_at(config)
    run_dir = tmp_path / "out" / run_id(config)
    assert run_id(config.replace(**{"run.threads": 2})) == run_dir.name  # not in the id
    before = snapshot(tmp_path / "out")
    path = tmp_path / "config.toml"
    path.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "out")}))
    capsys.readouterr()
    code = main(["train", "--config", str(path), "--resume", "--threads", "2"])
    out, err = capsys.readouterr()
    assert code == 2
    assert_one_line_error(out, err, "cannot resume", "with --threads 2: its epochs",  # typed
                          "ran on 1 torch thread",
                          "--threads 1", "--force")
    with pytest.raises(RunRecordError, match="ran on 1 torch thread"):
        Trainer(config.replace(**{"run.threads": 2})).run(resume=True)  # the Python API too
    assert snapshot(tmp_path / "out") == before
    # --force starts it over, on the count asked for.
    code = main(["train", "--config", str(path), "--threads", "2", "--force"])
    assert code == 0
    record = load_record(run_dir)
    assert record.status == "completed" and record.environment["torch_threads"] == 2
    assert not record.resumed


def test_resume_without_a_thread_count_continues_on_the_recorded_one(tmp_path, kill_run_at,
                                                                      threads_seen):
    straight = train(tiny(tmp_path / "a", **{"run.threads": 1}))
    killed = tiny(tmp_path / "b", **{"run.threads": 1})
    kill_run_at(killed)
    seen = threads_seen()
    torch.set_num_threads(2)  # another default, as on another machine or in a sweep worker
    resumed = train(killed.replace(**{"run.threads": None}), resume=True)
    assert seen == {2: 1, 3: 1}  # each resumed epoch on the recorded count
    assert resumed.status == "completed"
    assert comparable(resumed.record) == comparable(straight.record)
    assert same_weights(straight.run_dir, resumed.run_dir)
    record = load_record(resumed.run_dir)
    assert [part.epoch for part in record.resumed] == [2]
    assert record.resumed[0].environment["torch_threads"] == 1
    assert record.resumed[0].settings == {"run.threads": None}  # as it was asked for


def test_a_sweep_resumes_a_run_on_its_own_thread_count(tmp_path, kill_run_at, threads_seen):
    config = tiny(tmp_path / "out", **{"run.threads": 1})
    kill_run_at(config)
    seen = threads_seen()
    result = run_sweep(prepare_configs([config], threads=2), InlineExecutor(threads=2))
    assert [(o["action"], o["status"]) for o in result.outcomes] == [("resumed", "completed")]
    assert seen == {2: 1, 3: 1}
    record = load_record(tmp_path / "out" / run_id(config))
    assert record.resumed[0].environment["torch_threads"] == 1


def test_a_sweep_starting_over_a_run_killed_in_epoch_1_records_the_sweeps_count(
        tmp_path, kill_run_at):
    # Killed in epoch 1, its checkpoint holds only the initial weights: the sweep starts it
    # over, and its record equals the uninterrupted run's, run.threads included (it recorded
    # None, as if the sweep had resumed it on the count of its earlier epochs).
    straight = run_sweep(prepare_configs([tiny(tmp_path / "a")], threads=1),
                         InlineExecutor(threads=1))
    config = prepare_configs([tiny(tmp_path / "b")], threads=1)[0]
    kill_run_at(config, epoch=1)
    result = run_sweep(prepare_configs([tiny(tmp_path / "b")], threads=1),
                       InlineExecutor(threads=1))
    assert [o["status"] for o in result.outcomes] == ["completed"]
    twin = load_record(tmp_path / "a" / straight.outcomes[0]["run_id"])
    record = load_record(tmp_path / "b" / result.outcomes[0]["run_id"])
    assert record.config.run.threads == twin.config.run.threads == 1
    assert comparable(record) == comparable(twin)


def test_the_record_keeps_each_part_s_environment(tmp_path, kill_run_at, monkeypatch):
    straight = train(tiny(tmp_path / "a", **{"run.threads": 1}))
    config = tiny(tmp_path / "b", **{"run.threads": 1})
    monkeypatch.setattr(version, "source_revision", lambda: "a" * 40)
    kill_run_at(config)
    monkeypatch.setattr(version, "source_revision", lambda: "b" * 40 + "+dirty")
    resumed = train(config.replace(**{"run.device": "cpu"}), resume=True)
    record = load_record(resumed.run_dir)
    assert record.status == "completed"
    assert record.environment["source"] == "a" * 40  # the first part's
    assert record.environment["torch_threads"] == 1
    [part] = record.resumed
    assert part.epoch == 2 and part.started
    assert part.environment["source"] == "b" * 40 + "+dirty"
    assert part.environment["torch_threads"] == 1
    assert part.environment["execution"]["stacked_runs"] == 1
    assert part.settings == {"run.device": "cpu"}
    assert record.config.run.device == "auto"  # the config stays the first part's
    assert comparable(record) == comparable(straight.record)  # the same numbers
    # The numbers come from two versions of the code: the summary and the report say so.
    summary = format_run_summary([record])
    [line] = [x for x in summary.splitlines() if "version" in x]
    assert "aaaaaaaaaaaa" in line and "bbbbbbbbbbbb" in line and "epoch 2" in line
    markdown = render_report_markdown(RunIndex.from_dir(tmp_path / "b"))
    assert "aaaaaaaaaaaa" in markdown and "bbbbbbbbbbbb" in markdown
    # One version of the code throughout: no such line.
    assert "version" not in format_run_summary([straight.record])
    same = load_record(resumed.run_dir)
    same.resumed[0].environment["source"] = "a" * 40
    assert not [x for x in format_run_summary([same]).splitlines() if "version" in x]


def test_a_run_resumed_on_another_torch_says_so(tmp_path, kill_run_at, monkeypatch):
    # killed on one torch, resumed on another (an environment upgraded between the two):
    # the record kept both versions in its parts, but the summary and the report said
    # nothing, so numbers of two torch builds read as one run's
    config = tiny(tmp_path, **{"run.threads": 1})
    installed = str(torch.__version__)
    monkeypatch.setattr(torch, "__version__", "2.3.0")
    kill_run_at(config)
    monkeypatch.setattr(torch, "__version__", installed)
    resumed = train(config, resume=True)
    record = load_record(resumed.run_dir)
    assert record.environment["torch"] == "2.3.0"
    assert record.resumed[0].environment["torch"] == installed
    [line] = [x for x in format_run_summary([record]).splitlines() if "torch" in x]
    assert "with torch 2.3.0, from epoch 2 on" in line
    assert line.endswith(f"with torch {installed})")
    markdown = render_report_markdown(RunIndex.from_dir(tmp_path))
    assert "with torch 2.3.0" in markdown and installed in markdown
    # one torch throughout: no torch named
    record.resumed[0].environment["torch"] = "2.3.0"
    assert "torch" not in format_run_summary([record])


def test_a_second_resume_adds_a_second_part(tmp_path, kill_run_at):
    config = tiny(tmp_path, **{"run.threads": 1, "optim.epochs": 4})
    kill_run_at(config, epoch=2)
    with pytest.MonkeyPatch.context() as patch:
        original = Trainer.train_epoch

        def killed(self, epoch):  # noqa: ANN001
            if epoch == 4:
                raise KeyboardInterrupt
            return original(self, epoch)

        patch.setattr(Trainer, "train_epoch", killed)
        with pytest.raises(KeyboardInterrupt):
            train(config, resume=True)
    record = load_record(tmp_path / run_id(config))
    assert record.status == "interrupted" and [p.epoch for p in record.resumed] == [2]
    done = train(config, resume=True)
    assert [p.epoch for p in done.record.resumed] == [2, 4]
    assert [p.epoch for p in load_record(done.run_dir).resumed] == [2, 4]


def test_resumed_parts_read_back_and_a_malformed_one_is_refused(tmp_path, kill_run_at):
    config = tiny(tmp_path, **{"run.threads": 1})
    kill_run_at(config)
    record = train(config, resume=True).record
    again = RunRecord.from_dict(record.to_dict(stored=True))
    assert again.resumed == record.resumed
    assert RunRecord.from_dict(record.to_dict()).resumed == record.resumed
    raw = record.to_dict(stored=True)
    del raw["resumed"]  # a record written before parts were kept, or never resumed
    assert RunRecord.from_dict(raw).resumed == []
    assert "resumed" not in load_record(train(tiny(tmp_path / "c")).run_dir).to_dict()
    for bad in ("x", [{"epoch": "2", "environment": {}}], [{"epoch": 2, "environment": 3}],
                [{"epoch": 2, "environment": {}, "host": "h"}], [{"environment": {}}]):
        raw["resumed"] = bad
        with pytest.raises(RunRecordError, match="resumed"):
            RunRecord.from_dict(raw, "r.json")
    (tmp_path / "saved").mkdir()
    save_record(tmp_path / "saved", record)
    assert load_record(tmp_path / "saved").resumed == record.resumed


def test_a_stack_resumes_each_run_on_its_own_thread_count(tmp_path, kill_run_at,
                                                          monkeypatch):
    from creditaudit.run.stacked import AloneEpochs, train_stacked
    from creditaudit.run.steps.epochs import StackedEpochs

    runs = [tiny(tmp_path, **{"method.name": "fa", "run.seed": seed, "run.threads": threads})
            for seed, threads in ((1, 1), (2, 2), (3, 1))]
    for config in runs:  # each killed alone, on its own count
        kill_run_at(config)
    seen: list[tuple[int, int]] = []  # (threads, runs in the group) of each group's epoch

    def counting(runner, size):  # noqa: ANN001 - an epoch runner class
        original = runner.train_epoch

        def train_epoch(self, epoch):  # noqa: ANN001
            seen.append((torch.get_num_threads(), size(self)))
            return original(self, epoch)

        monkeypatch.setattr(runner, "train_epoch", train_epoch)

    counting(StackedEpochs, lambda stack: len(stack.members))
    counting(AloneEpochs, lambda alone: 1)  # a group of one takes the run's own step
    torch.set_num_threads(2)
    results = train_stacked([c.replace(**{"run.threads": None}) for c in runs], resume=True)
    assert [r.status for r in results] == ["completed"] * 3
    assert sorted(seen) == [(1, 2), (1, 2), (2, 1), (2, 1)]  # epochs 2 and 3 of each stack
    for result, threads, stacked in zip(results, (1, 2, 1), (2, 1, 2), strict=True):
        [part] = load_record(result.run_dir).resumed
        assert part.environment["torch_threads"] == threads
        assert part.environment["execution"]["stacked_runs"] == stacked
