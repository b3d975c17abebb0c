"""One run id is one run, and every number of a row carries the marks of what it is.

- A run found in two folders below a results folder (two experiments that share runs) is
  counted once by every reader (report, figures, export, the frozen baseline of (d));
  copies that differ are never merged silently: the finished one is taken when only one is,
  else none, in one line naming both.
- A diverged run's numbers are all of its last finite epoch, and each carries ‡ in every
  table (the run summary and sweep table, the report's audit and summary tables).
- A run trained with an unverified reference gradient has every number that reads it —
  deep cos, Γ, ‖g_L‖ ((b)'s statistic) — marked "(unverified)" in every table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.protocol import NOT_EVALUATED, UNVERIFIED_MARK
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RECORD_FILE, load_records
from creditaudit.report import format_run_summary
from creditaudit.report.folder import render_report_markdown
from creditaudit.results import RunIndex
from creditaudit.run.trainer import Trainer, train
from integrity_support import as_written, nan_weights_after, sweep_toml
from plugin_support import GUESTS

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The rows of the table under ``## heading``, as {column: cell}."""
    section = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[1:]]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """``res/a``: bp, dfa and frozen runs; ``res/b``: the same frozen run trained again
    (another experiment sharing it: the same run id, its own timestamps and times)."""
    root = tmp_path_factory.mktemp("shared")
    for method in ("bp", "dfa", "frozen"):
        train(tiny(root / "res" / "a", **{"method.name": method}))
    train(tiny(root / "res" / "b", **{"method.name": "frozen"}))
    return root / "res"


def copy_of(res: Path, method: str, where: str) -> Path:
    """A copy of ``res/a``'s ``method`` run under ``res/where`` (its record.json)."""
    source = next((res / "a").glob(f"{method}-*"))
    target = res / where / source.name
    shutil.copytree(source, target)
    return target / RECORD_FILE


# --- 1. one run id is one run ---------------------------------------------------------------
def test_a_run_in_two_folders_is_counted_once_by_every_reader(shared, tmp_path, caplog):
    frozen = next((shared / "a").glob("frozen-*")).name
    assert (shared / "b" / frozen).is_dir()  # trained twice: same id, other timestamps
    caplog.set_level("INFO")
    found, bad = load_records(shared)
    assert sorted(r.run_id for _, r in found) == sorted(p.name for p in
                                                        (shared / "a").iterdir())
    assert bad == []
    assert f"2 copies of run {frozen}: counted once" in caplog.text
    records = RecordSet.from_folder(shared)
    assert len(records) == 3 and [c.run_id for c in records.copies] == [frozen]
    dfa = next(r for r in records if r.method == "dfa")
    assert records.frozen_baseline(dfa)[1] == 1  # one frozen run, not two
    # (d) is the same read from the parent as from the folder holding every run
    margin = records.protocol_report(dfa).diagnostics
    alone = RecordSet.from_folder(shared / "a").protocol_report(dfa).diagnostics
    assert [d.value for d in margin] == [d.value for d in alone]
    index = RunIndex.from_dir(shared)
    assert len(index) == 3
    markdown = render_report_markdown(index)
    assert markdown.splitlines()[2].startswith("3 run records")
    assert f"- 2 copies of run {frozen}: counted once (" in markdown
    rows = table(markdown, "Audit table")
    assert sorted(row["run"] for row in rows) == sorted(r.run_id for r in records)
    frozen_row = next(row for row in table(markdown, "Summary across seeds")
                      if row["method"] == "Frozen blocks")
    assert frozen_row["seeds"] == str(dfa.seed)  # not "42, 42"


def test_an_unfinished_copy_beside_its_finished_run_gives_way(shared, tmp_path, caplog):
    res = tmp_path / "res"
    shutil.copytree(shared / "a", res / "a")
    path = copy_of(res, "dfa", "old")
    raw = json.loads(path.read_text())
    raw.update(status="interrupted", final=None, log=raw["log"][:1], protocol={})
    path.write_text(as_written(raw))
    records = RecordSet.from_folder(res)
    assert len(records) == 3 and records.skipped == []
    dfa = next(r for r in records if r.method == "dfa")
    assert dfa.status == "completed" and records.paths[records.records.index(dfa)].parent \
        .parent.name == "a"
    line = records.copies[0].text()
    assert line.startswith(f"2 copies of run {dfa.run_id} differ: counted the finished one")
    assert str(path.parent) in line and "interrupted" in line and "\n" not in line
    markdown = render_report_markdown(RunIndex.from_dir(res))
    assert "## Runs that did not finish" not in markdown


def test_copies_that_differ_and_are_both_finished_are_not_merged(shared, tmp_path, caplog):
    res = tmp_path / "res"
    shutil.copytree(shared / "a", res / "a")
    path = copy_of(res, "frozen", "other")
    raw = json.loads(path.read_text())
    raw["log"][-1]["acc_eval"] = raw["log"][-1]["test_acc"] = 0.5  # another final accuracy
    path.write_text(as_written(raw))
    records = RecordSet.from_folder(res)
    frozen = path.parent.name
    assert frozen not in {r.run_id for r in records}  # neither copy chosen for the user
    assert {p.parent for p, _ in records.skipped} == {path.parent, res / "a" / frozen}
    dfa = next(r for r in records if r.method == "dfa")
    d = next(r for r in records.protocol_report(dfa).diagnostics if r.id == "d")
    assert d.status == NOT_EVALUATED  # no baseline: not evaluated, never passed
    caplog.clear()
    assert main(["report", str(res), "--out", str(tmp_path / "rep")]) == 0
    said = [r.getMessage() for r in caplog.records if frozen in r.getMessage()]
    assert len(said) == 1 and "differ" in said[0] and "none is counted" in said[0]
    assert str(path.parent) in said[0] and str(res / "a" / frozen) in said[0]
    markdown = (tmp_path / "rep" / "report.md").read_text()
    assert "none is counted" in markdown and "could not be read" not in markdown


def test_runs_of_users_loops_that_share_a_name_are_each_counted(tmp_path):
    """A Recorder run's id is the name its user gave: two experiments' folders that each
    hold a run named "dfa" hold two runs, whose numbers differ; an identical copy of one is
    still counted once."""
    from torch import nn

    from creditaudit import Recorder, adapt, rule

    res = tmp_path / "res"
    for folder, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                            nn.Linear(16, 3))
        x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
        recorder = Recorder(rule("dfa", adapt(net, states=["0", "1"], example=x[:8])), x, y,
                            out=res / folder, name="dfa", progress=False,
                            config={"diagnostics.end_of_run": False})
        recorder.epoch(0)
        recorder.epoch(1, test_acc=0.5)
        recorder.finish()
    shutil.copytree(res / "a" / "dfa", res / "c" / "dfa")  # an identical copy of a's
    records, unreadable = load_records(res)
    assert not unreadable
    assert sorted(path.parent.parent.name for path, _ in records) == ["a", "b"]


# --- 2. a diverged run: every number of its row is of one epoch, and marked ‡ ---------------
@pytest.fixture(scope="module")
def diverged(tmp_path_factory) -> Path:
    """A run whose epoch-2 update leaves the weights NaN: diverged in epoch 2, its numbers
    those of epoch 1; and a completed run beside it."""
    out = tmp_path_factory.mktemp("diverged")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        train(tiny(out, **{"optim.epochs": 3, "method.name": "dfa"}))
    train(tiny(out, **{"method.name": "bp"}))
    return out


def test_a_diverged_runs_numbers_are_all_of_its_last_finite_epoch(diverged):
    record = next(r for _, r in load_records(diverged)[0] if r.status == "diverged")
    assert record.numbers_epoch == 1 and [e.epoch for e in record.log] == [0, 1, 2]
    kept = record.log[1].measures
    assert record.headline_measures() == kept
    cosines = [c for c in kept.cos_per_layer if c == c]
    assert record.headline_gamma == pytest.approx(sum(cosines) / len(cosines))
    assert record.headline_value("h_L_norm") == kept.h_L_norm != record.last_value("h_L_norm")


def test_every_number_of_a_diverged_row_is_marked_in_every_table(diverged):
    records = [r for _, r in load_records(diverged)[0]]
    record = next(r for r in records if r.status == "diverged")
    summary = format_run_summary(records)
    row = next(line for line in summary.splitlines() if line.startswith("dfa"))
    kept = record.log[1].measures
    for number in (f"{record.final_acc:.3f}", f"{kept.h_L_norm:.3g}", f"{kept.g_L_norm:.3g}",
                   f"{record.deep_cos:+.3f}"):
        assert f"{number}‡" in row, (number, row)
    assert "dfa diverged in epoch 2: ‡ numbers of epoch 1" in summary
    completed = next(line for line in summary.splitlines() if line.startswith("bp"))
    assert "‡" not in completed

    markdown = render_report_markdown(RunIndex.from_records(records))
    audit = next(r for r in table(markdown, "Audit table") if r["run"] == record.run_id)
    for column in ("acc", "deep cos", "Γ (samples then layers)"):
        assert audit[column].split(" (")[0].endswith("‡"), (column, audit[column])
    group = next(r for r in table(markdown, "Summary across seeds") if r["method"] == "DFA")
    for column in ("test acc", "deep cos", "Γ"):
        assert group[column].endswith("‡"), (column, group[column])
    assert "‡ of a diverged run: its numbers are those of its last epoch" in markdown
    # its per-run template is the protocol's last evaluation, of the epoch it diverged in:
    # the report says so above it
    assert (record.protocol.epoch, record.numbers_epoch) == (2, 1)
    template = markdown.split(f"### {record.run_id}", 1)[1].split("\n### ", 1)[0]
    assert ("This run diverged: the template below is its protocol's last evaluation, at "
            "epoch 2; its numbers in the tables above are of epoch 1") in template


@pytest.fixture(scope="module")
def diverged_between_measures(tmp_path_factory) -> Path:
    """Diagnostics every 3 epochs: a run diverged in epoch 2, whose last finite epoch (1)
    took none, and a completed run of 4 epochs (its last epoch measured all the same)."""
    out = tmp_path_factory.mktemp("between")
    every = {"optim.epochs": 4, "diagnostics.every": 3, "diagnostics.protocol_every": 3}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        train(tiny(out, **every, **{"method.name": "dfa"}))
    train(tiny(out, **every, **{"method.name": "bp"}))
    return out


def test_a_measure_its_numbers_epoch_did_not_take_is_not_measured(diverged_between_measures):
    records = [r for _, r in load_records(diverged_between_measures)[0]]
    record = next(r for r in records if r.status == "diverged")
    assert record.numbers_epoch == 1 and [e.epoch for e in record.log] == [0, 1, 2]
    assert record.log[0].has_diagnostics and not record.log[1].has_diagnostics
    # epoch 0's (the untrained network's) are not epoch 1's: none is shown
    for value in (record.headline_value("h_L_norm"), record.headline_value("g_L_norm"),
                  record.deep_cos, record.headline_gamma, record.headline_measures()):
        assert value is None
    # nor the end-of-run block's: it measured the network the run diverged with
    record.diagnostics.deep_cos, record.diagnostics.gamma = 0.5, {"samples_then_layers": 0.5}
    assert record.deep_cos is None and record.headline_gamma is None
    record.diagnostics.deep_cos = record.diagnostics.gamma = None

    summary = format_run_summary(records)
    row = next(line for line in summary.splitlines() if line.startswith("dfa")).split()
    assert row[3:7] == [f"{record.final_acc:.3f}‡", "—", "—", "—"], row
    assert ("dfa diverged in epoch 2: ‡ numbers of epoch 1, the last whose evaluation was "
            "finite; epoch 1 took no diagnostics (diagnostics.every = 3), so its ‖h_L‖, "
            "‖g_L‖, deep cos and Γ are not measured (—)") in summary
    markdown = render_report_markdown(RunIndex.from_records(records))
    audit = next(r for r in table(markdown, "Audit table") if r["run"] == record.run_id)
    assert (audit["deep cos"], audit["Γ (samples then layers)"]) == ("—", "—")
    group = next(r for r in table(markdown, "Summary across seeds") if r["method"] == "DFA")
    assert (group["deep cos"], group["Γ"]) == ("—", "—")

    # a completed run measures its last epoch whatever diagnostics.every says
    completed = next(r for r in records if r.status == "completed")
    last = completed.log[-1]
    assert [e.epoch for e in completed.log if e.has_diagnostics] == [0, 3, 4]
    assert completed.numbers_epoch == last.epoch == 4
    assert completed.headline_value("h_L_norm") == last.measures.h_L_norm
    assert completed.deep_cos == last.measures.deep_cos


# --- 3. an unverified reference: every number that reads it, in every table ------------------
def test_the_sweep_table_marks_every_number_that_reads_an_unverified_reference(
        tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(GUESTS.folder))
    try:
        sweep = tmp_path / "s.toml"
        sweep.write_text(sweep_toml(
            {**{k: v for k, v in TINY.items() if not k.startswith("model.")},
             "model.arch": "module",
             "model.factory": "creditaudit_guests.ref_factories:doubled_backward",
             "model.states": ["embed", "res"], "data.in_dim": 16,
             "diagnostics.allow_unverified_reference": True},
            '[grid]\n"method.name" = ["bp", "dfa"]\n'))
        assert main(["sweep", str(sweep), "--workers", "0", "--out", str(tmp_path / "runs"),
                     "-q"]) == 0
    finally:
        GUESTS.forget()
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "‖g_L‖" in line)
    rows = [line for line in out.splitlines() if line.startswith(("name=bp", "name=dfa"))]
    assert len(rows) == 2
    g_at = header.index("‖g_L‖") + len("‖g_L‖")  # right-aligned under its title
    for row in rows:
        assert row[:g_at].endswith(UNVERIFIED_MARK), row
        assert row.count(UNVERIFIED_MARK) == 2  # ‖g_L‖ and deep cos; ‖h_L‖ reads no gradient


def test_one_run_record_is_counted_in_the_singular():
    # the report, figures and report commands said "1 run records"
    from creditaudit.formatting import counted

    assert counted(1, "run record") == "1 run record"
    assert counted(0, "run record") == "0 run records"
    assert counted(2, "finished run record") == "2 finished run records"
