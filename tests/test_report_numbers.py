"""The numbers of a folder report traced back to the records: a summary mean says over how
many of its row's runs it is, a frozen-blocks run that diverged is no baseline of (d), and
a run's template shows its rule's own fields of the audited epoch (EP's relaxation)."""

from __future__ import annotations

import json

import pytest

from creditaudit.config import RunConfig
from creditaudit.descriptions.epoch import BELOW_FLOOR
from creditaudit.protocol import NOT_EVALUATED
from creditaudit.protocol.records import RecordSet
from creditaudit.records import RunRecord
from creditaudit.report import format_run_summary
from creditaudit.report.folder import audit_table, render_report_markdown, summary_table
from creditaudit.results import RunIndex
from creditaudit.run.trainer import train
from creditaudit.study.experiments.aggregate import aggregate, format_aggregate

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.name": "synthetic", "data.n_train": 256, "data.n_test": 256, "data.in_dim": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.batch_size": 64, "optim.epochs": 2,
        "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False,
        "run.progress": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """A DFA, an EP and a frozen-blocks run of one recipe (EP's of one epoch), as record
    dicts by method."""
    out = tmp_path_factory.mktemp("report_numbers")
    records = {}
    for method in ("dfa", "frozen", "ep"):
        result = train(RunConfig().replace(**{
            **TINY, "method.name": method, "run.out_dir": str(out),
            "optim.epochs": 1 if method == "ep" else 2}))
        records[method] = result.record.to_dict()
    return records


def variant(record: dict, run_id: str, seed: int) -> dict:
    copy = json.loads(json.dumps(record))
    copy["run_id"] = run_id
    copy["config"]["run"]["seed"] = seed
    return copy


def diverged_at_first_epoch(record: dict, run_id: str, seed: int) -> dict:
    """``record`` as a run of another seed that diverged in epoch 1: its numbers are those
    of epoch 0 (the untrained network) and epoch 1 measured nothing finite."""
    copy = variant(record, run_id, seed)
    untrained = copy["log"][0]
    copy["status"] = "diverged"
    copy["divergence"] = {"epoch": 1, "reason": "non-finite loss"}
    copy["log"] = [untrained, {**copy["log"][1], "cos_per_layer": [None] * 3,
                               "test_loss": float("nan")}]
    copy["final"].update(epochs_completed=1, from_epoch=0, test_acc=untrained["test_acc"],
                         test_loss=untrained["test_loss"], deep_cos=None)
    copy["protocol"]["epoch"] = 1  # the protocol judged the network that diverged
    return copy


def index_of(raws: list[dict]) -> RunIndex:
    return RunIndex.from_records([RunRecord.from_dict(raw) for raw in raws])


def test_a_summary_row_of_one_seed_shows_no_spread(runs):
    """A row of one run said ``± 0.000``, as if its seeds' spread had been measured as
    zero: one seed measures none. Its cells are the value, saying it is one run's."""
    index = index_of([runs["dfa"]])
    [row] = summary_table(index, index.runs).rows
    run = index.runs[0]
    assert row["seeds"] == "42"
    assert row["test acc"] == f"{run.final_acc:.3f} (1 run)"
    assert row["deep cos"] == f"{run.deep_cos:+.3f} (1 run)"
    assert "±" not in row["Γ"] and row["Γ"].endswith("(1 run)")


def test_a_summary_row_shows_the_sample_std_as_the_experiments_do(runs):
    """The report's ± was the population std while the experiments' summaries gave the
    sample std (ddof=1): the same runs read "0.154 ± 0.010" in one and "± 0.014" in the
    other. Both show the sample std now, what papers report across seeds."""
    first, second = variant(runs["dfa"], "dfa-1", 1), variant(runs["dfa"], "dfa-2", 2)
    first["final"]["test_acc"], second["final"]["test_acc"] = 0.2, 0.4
    index = index_of([first, second])
    [row] = summary_table(index, index.runs).rows
    assert row["test acc"].startswith("0.300 ± 0.141")  # population std: ± 0.100
    assert format_aggregate(aggregate([0.2, 0.4])) == "0.300 ± 0.141 (n=2)"
    # The line under the table says which std it is: it said "(population)" after the
    # numbers became the sample std.
    note = next(line for line in render_report_markdown(index).splitlines()
                if line.startswith("Mean ± std"))
    assert "sample std, ddof=1" in note and "population" not in note


def test_a_mean_over_fewer_runs_than_its_row_says_over_how_many(runs):
    """Seed 2 diverged before any finite measure of its credit (deep cos —): the row's deep
    cos and Γ are means over seed 1 alone while its accuracy is over both, and the table
    said ``± 0.000`` for them as for a mean over the two seeds it lists."""
    dfa = runs["dfa"]
    broken = diverged_at_first_epoch(dfa, "dfa-diverged", 2)
    broken["log"][0]["cos_per_layer"] = [None] * 3  # not even epoch 0's credit is finite
    index = index_of([dfa, broken])
    by_id = {run.run_id: run for run in index.runs}
    assert by_id["dfa-diverged"].deep_cos is None
    assert by_id["dfa-diverged"].final_acc is not None
    [row] = summary_table(index, index.runs).rows
    assert row["seeds"] == "2, 42"
    assert "of 2 runs" not in row["test acc"]
    measured = by_id[dfa["run_id"]].deep_cos
    assert row["deep cos"].startswith(f"{measured:+.3f} (1 of 2 runs)")  # one: no spread
    assert "(1 of 2 runs)" in row["Γ"]
    markdown = render_report_markdown(index)
    assert "(k of n runs): only k of the n runs the row's means are over" in markdown
    # Every run measured: no count, no line.
    whole = index_of([dfa, variant(dfa, "dfa-7", 7)])
    assert "runs)" not in render_report_markdown(whole).split("## Summary across seeds")[1]


def test_a_diverged_frozen_run_is_no_baseline_of_d(runs):
    """A frozen-blocks run that diverged in its first epoch holds the untrained readout's
    accuracy: as (d)'s baseline every run of its recipe cleared it. Like one that stopped
    early, it is no baseline: (d) is not evaluated, and its row says why."""
    dfa, frozen = runs["dfa"], runs["frozen"]
    diverged = diverged_at_first_epoch(frozen, "frozen-diverged", 42)
    index = index_of([dfa, diverged])
    trained = next(run for run in index.runs if run.run_id == dfa["run_id"])
    assert index.records.frozen_baseline(trained) is None
    assert index.records.verdict(trained).statuses["d"] == NOT_EVALUATED
    rows = {row["run"]: row for row in audit_table(index, index.runs).rows}
    assert rows["frozen-diverged"]["verdict"] == "no baseline of (d): diverged"
    assert rows[trained.run_id]["(d)"] == "n/e"
    # Beside a frozen run that trained all its epochs, only that one is the baseline.
    index = index_of([dfa, diverged, variant(frozen, "frozen-7", 7)])
    assert index.records.frozen_baseline(trained) == (frozen["final"]["test_acc"], 1)
    lines = format_run_summary(RecordSet([RunRecord.from_dict(diverged)]).records)
    assert "no baseline of (d): diverged" in lines  # as the report's table says it


def test_the_template_shows_the_rules_own_fields_of_the_audited_epoch(runs):
    """EP records its relaxation's ‖∇_ρF‖ end/start per epoch; `creditaudit audit` prints it
    under the template, with a warning where it is above 1 (the blocks trained on credits
    that are not EP's estimate), and docs/methods.md says the report does too — but the
    report's templates never showed it."""
    ep = runs["ep"]
    audited = ep["log"][-1]
    ratio = audited["ep_relax_grad_ratio"]
    markdown = render_report_markdown(index_of([ep]))
    assert f"EP relaxation: ‖∇_ρF‖ end/start {ratio:.3g}" in markdown
    worse = variant(ep, "ep-worse", 7)
    worse["log"][-1]["ep_relax_grad_ratio"] = 1.5
    assert "the nudged phase ended farther from equilibrium than it started" in \
        render_report_markdown(index_of([worse]))
    # A loop's own extra named as an end-of-run metric is not taken for that metric.
    named = variant(runs["dfa"], "dfa-extra", 8)
    named["log"][-1]["bp_cosine"] = 0.5
    assert "cos per layer" not in render_report_markdown(index_of([named]))


def test_footnotes_and_template_cells_say_what_the_cells_hold(runs):
    """The * footnote (a deep cos measured against references below the floor) is printed
    only where a cell carries *: a diverged run whose deep cos is — (no finite value), with
    its references below the floor, printed the footnote beside no mark. A rule that draws
    no feedback has no feedback seed: its template said ``None``, not —."""
    broken = diverged_at_first_epoch(runs["dfa"], "dfa-diverged", 2)
    for entry in broken["log"]:
        entry.update(cos_per_layer=[None] * 3, cos_invalid=[None, BELOW_FLOOR, BELOW_FLOOR],
                     cos_valid=[True, False, False])
    index = index_of([broken])
    assert index.runs[0].deep_cos is None
    assert BELOW_FLOOR in index.runs[0].deep_cos_invalid
    markdown = render_report_markdown(index)
    assert "* measured against reference gradients below the 1e-7 floor" not in markdown
    assert "* measured against" not in format_run_summary(index.runs)
    both = render_report_markdown(index_of([runs["dfa"], runs["frozen"]]))
    header, _, row = section_lines(both, "### " + runs["frozen"]["run_id"])[:3]
    assert dict(zip(cells(header), cells(row)))["feedback seed"] == "—"


def section_lines(markdown: str, heading: str) -> list[str]:
    return [line for line in markdown.split(heading, 1)[1].splitlines() if line.startswith("|")]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split(" | ")]


def test_runs_of_two_networks_of_the_users_own_code_read_apart(runs):
    """Two scripts' networks of one config (a ReLU and a Tanh `Net` under a `Recorder`) are
    two recipes, each its own summary row, yet no column told the rows apart: the network's
    code joins the columns as the data source does (a hash prefix)."""
    def with_code(seed: int, digest: str) -> dict:
        record = variant(runs["dfa"], f"net-{digest[0]}-{seed}", seed)
        components = record["environment"].setdefault("components", {})
        components["model"] = {**components.get("model", {}), "code_digest": digest}
        return record

    index = index_of([with_code(seed, c * 64) for c in "ab" for seed in (1, 2)])
    table = summary_table(index, index.runs)
    assert "model code" in table.columns
    assert sorted(row["model code"] for row in table.rows) == ["a" * 12, "b" * 12]
    assert len({tuple(row.values()) for row in table.rows}) == 2
    assert "model code" in audit_table(index, index.runs).columns
    # One network's code for every run: no column.
    same = index_of([with_code(seed, "a" * 64) for seed in (1, 2)])
    assert "model code" not in summary_table(same, same.runs).columns


def test_seeds_of_a_plugin_rule_whose_code_changed_are_not_averaged(runs):
    """Seed 1 of a plugin rule trained before its code was edited, seed 2 after: the
    summary averaged them in one row (accuracy 0.500 ± 0.566 of 0.9 and 0.1) as seeds of
    one rule. The rule's code splits the row and a column shows it, as the network's code
    does; rows of two rules (whose codes differ because the rules do) get no column."""
    def with_code(seed: int, digest: str, acc: float) -> dict:
        record = variant(runs["dfa"], f"mine-{digest[0]}-{seed}", seed)
        components = record["environment"].setdefault("components", {})
        components["method"] = {**components.get("method", {}), "code_digest": digest,
                                "origin": "mine==1.0"}
        record["final"]["test_acc"] = acc
        return record

    index = index_of([with_code(1, "a" * 64, 0.9), with_code(2, "b" * 64, 0.1)])
    table = summary_table(index, index.runs)
    assert "rule code" in table.columns
    assert sorted((row["rule code"], row["seeds"], row["test acc"]) for row in table.rows) \
        == [("a" * 12, "1", "0.900 (1 run)"), ("b" * 12, "2", "0.100 (1 run)")]
    assert "rule code" in audit_table(index, index.runs).columns
    # One code for every seed: one row, no column; beside a built-in rule's runs, none.
    same = index_of([with_code(seed, "a" * 64, 0.5) for seed in (1, 2)] + [runs["frozen"]])
    table = summary_table(same, same.runs)
    assert "rule code" not in table.columns and len(table.rows) == 2


def test_a_diverged_row_says_its_verdict_is_of_a_later_epoch_than_its_numbers(runs):
    """The protocol judged the network of epoch 1, which diverged; the row's accuracy is of
    epoch 0 (‡). Its (a)–(d) values and verdict are epoch 1's, yet the row said only that
    its numbers are epoch 0's (docs/figures.md: every number of its row is of that epoch)."""
    broken = diverged_at_first_epoch(runs["dfa"], "dfa-diverged", 2)
    index = index_of([broken])
    [row] = audit_table(index, index.runs).rows
    assert row["acc"].endswith("numbers of epoch 0, the last whose evaluation was finite; "
                               "its verdict and diagnostics are of epoch 1, the protocol's "
                               "last evaluation)")
    assert "verdict and diagnostics are of epoch 1" in format_run_summary(index.runs)
