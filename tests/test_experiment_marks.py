"""The shipped experiments' tables mark every headline number as the report's tables do.

- A diverged run's numbers (accuracy, (d)'s margin, ‖h_L‖, ‖g_L‖, deep cos, Γ, …) carry ‡ in
  every experiment table that shows them — in a row that averages it with other seeds too —
  and are of its last finite epoch; the ‡ footnote is under the table.
- A run trained with an unverified reference gradient has every number that reads it (deep
  cos, Γ, ‖g_L‖, ‖g_2‖) marked "(unverified)", its accuracy not; the footnote says why.
- Clean runs' rows carry no mark and their tables no footnote; a footnote appears exactly
  where its mark does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit.config import RunConfig
from creditaudit.protocol import UNVERIFIED_MARK
from creditaudit.records import load_records
from creditaudit.report.runs import DIVERGED_MARK
from creditaudit.run.trainer import Trainer, train
from creditaudit.study.experiments import experiment_names, get_experiment
from integrity_support import nan_weights_after
from plugin_support import GUESTS
from test_copies_and_marks import TINY, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

DIVERGED_NOTE = f"{DIVERGED_MARK} of a diverged run: its numbers are those of its last epoch"
UNVERIFIED_NOTE = f"{UNVERIFIED_MARK} the reference gradient every cosine, Γ and (b) compares"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """``clean``: bp, dfa and frozen runs; ``marked``: the same plus a dfa run that diverges
    in epoch 2, its last (seed 7: a second seed of the dfa row) and a bp run of a network whose
    backward is twice its gradient (allowed unverified)."""
    root = tmp_path_factory.mktemp("experiment_marks")
    clean, marked = root / "clean", root / "marked"
    for out in (clean, marked):
        for method in ("bp", "dfa", "frozen"):
            train(tiny(out, **{"method.name": method}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", nan_weights_after(2))
        train(tiny(marked, **{"method.name": "dfa", "run.seed": 7}))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(GUESTS.folder))
        try:
            train(RunConfig().replace(**{
                **{k: v for k, v in TINY.items() if not k.startswith("model.")},
                "run.out_dir": str(marked), "model.arch": "module",
                "model.factory": "creditaudit_guests.ref_factories:doubled_backward",
                "model.states": ["embed", "res"], "data.in_dim": 16,
                "diagnostics.allow_unverified_reference": True}))
        finally:
            GUESTS.forget()
    return {"clean": clean, "marked": marked}


def records_of(folder: Path) -> list:
    records, unreadable = load_records(folder)
    assert not unreadable
    return [r for _, r in records]


def rows(markdown: str, first: str) -> list[dict[str, str]]:
    """The rows of every table whose first column is titled ``first``, as {column: cell}."""
    out, header = [], None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells if cells[0] == first else []
        elif header and not set(cells[0]) <= {"-"}:
            out.append(dict(zip(header, cells)))
    return out


def summary_md(name: str, records: list) -> tuple[dict, str]:
    experiment = get_experiment(name)
    summary = experiment.summarise(records)
    return summary, experiment.to_markdown(summary)


def diverged_run(records: list):
    return next(r for r in records if r.status == "diverged")


def unverified_run(records: list):
    return next(r for r in records if r.reference.verified is False)


def test_the_runs_are_what_the_tests_need(folders):
    records = records_of(folders["marked"])
    assert diverged_run(records).numbers_epoch == 1
    assert unverified_run(records).config.model.arch == "module"
    assert all(r.status == "completed" and r.reference.verified is not False
               for r in records_of(folders["clean"]))


def test_audit_table_marks_a_diverged_and_an_unverified_run(folders):
    records = records_of(folders["marked"])
    summary, markdown = summary_md("audit_table", records)
    table = rows(markdown, "method")
    dfa = next(r for r in table if r["method"] == "dfa")  # seeds 42 and 7 (diverged)
    assert "(n=2)" in dfa["test acc"]
    for column in ("test acc", "Γ (samples→layers)", "deep cos", "(d) margin pp"):
        assert dfa[column].endswith(DIVERGED_MARK), (column, dfa[column])
    # end-of-run Γs (not measured here: —, which is no number and carries no mark)
    assert all(cell == "—" or cell.endswith(DIVERGED_MARK) for cell in dfa[
        "Γ: layers→samples / samples→layers / pooled / deep"].split(" / "))
    assert DIVERGED_NOTE in markdown
    bps = [r for r in table if r["method"] == "bp"]
    unverified = next(r for r in bps if UNVERIFIED_MARK in r["deep cos"])
    assert unverified["Γ (samples→layers)"].endswith(UNVERIFIED_MARK)
    assert unverified["deep cos"].endswith(UNVERIFIED_MARK)
    assert UNVERIFIED_MARK not in unverified["test acc"]
    assert UNVERIFIED_MARK not in unverified["(d) margin pp"]
    assert f"{UNVERIFIED_NOTE} with is not verified: bp: reference gradient failed" in markdown
    clean = next(r for r in bps if r is not unverified)
    assert not any(mark in cell for cell in clean.values()
                   for mark in (DIVERGED_MARK, UNVERIFIED_MARK))
    # the JSON keeps its numbers; the marks sit beside them
    row = next(r for r in summary["rows"] if r["label"] == "dfa")
    assert isinstance(row["test_acc"]["mean"], float)
    assert row["marks"]["acc"] == DIVERGED_MARK


def test_rule_zoo_marks_a_diverged_and_an_unverified_run(folders):
    records = records_of(folders["marked"])
    _, markdown = summary_md("rule_zoo", records)
    table = rows(markdown, "rule")
    dfa = next(r for r in table if r["rule"] == "dfa")
    for column in ("test acc", "deep cos", "Γ", "‖h_L‖"):
        assert dfa[column].endswith(DIVERGED_MARK), (column, dfa[column])
    assert DIVERGED_NOTE in markdown
    unverified = next(r for r in table if r["rule"] == "bp" and UNVERIFIED_MARK in r["Γ"])
    assert unverified["deep cos"].endswith(UNVERIFIED_MARK)
    assert not any(UNVERIFIED_MARK in unverified[c] for c in ("test acc", "‖h_L‖"))
    assert UNVERIFIED_NOTE in markdown


def test_penalty_sweep_marks_norms_and_reads_them_at_the_last_finite_epoch(folders):
    records = records_of(folders["marked"])
    summary, markdown = summary_md("penalty_sweep", records)
    table = rows(markdown, "rule")  # a column of its own: two rules, dfa and bp
    dfa = next(r for r in table if r["rule"] == "dfa")
    for column in ("test acc", "‖h_L‖", "‖g_2‖", "‖g_L‖", "max growth", "deep cos"):
        assert dfa[column].endswith(DIVERGED_MARK), (column, dfa[column])
    unverified = next(r for r in table if r["rule"] == "bp" and UNVERIFIED_MARK in r["‖g_L‖"])
    assert unverified["deep cos"].endswith(UNVERIFIED_MARK)
    assert not any(UNVERIFIED_MARK in unverified[c] for c in ("test acc", "‖h_L‖"))
    assert DIVERGED_NOTE in markdown and UNVERIFIED_NOTE in markdown
    # the diverged seed's norms are those of its last finite epoch, as its accuracy is
    diverged = diverged_run(records)
    row = next(r for r in summary["rows"] if r["method"] == "dfa")
    seed = next(s for s in row["seeds"] if s["run_id"] == diverged.run_id)
    kept = diverged.log[diverged.numbers_epoch].measures
    assert seed["h_L_norm"] == kept.h_L_norm
    assert seed["g_L_norm"] == kept.g_L_norm


@pytest.mark.parametrize("name", [n for n in experiment_names() if n != "literature"])
def test_every_experiment_footnotes_exactly_the_marks_it_shows(folders, name):
    """Marked runs: each footnote is there iff its mark is in a cell; clean runs: neither."""
    for which in ("marked", "clean"):
        _, markdown = summary_md(name, records_of(folders[which]))
        cells = "\n".join(line for line in markdown.splitlines()
                          if not line.startswith((DIVERGED_NOTE, UNVERIFIED_NOTE)))
        for mark, note in ((DIVERGED_MARK, DIVERGED_NOTE), (UNVERIFIED_MARK, UNVERIFIED_NOTE)):
            assert (mark in cells) == (note in markdown), (name, which, mark)
            if which == "clean":
                assert mark not in markdown, (name, mark)
