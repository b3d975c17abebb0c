"""Shipped experiments: every one at smoke scale, run sharing and reuse, multi-seed
aggregation against hand computations, decision utility and threshold sensitivity on
hand-built records, the ``experiment`` command."""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DepthUtility,
    DiagnosticReport,
    DiagnosticResult,
    Evidence,
    protocol,
    verdict_of,
)
from creditaudit.protocol.builtin_options import DepthOptions
from creditaudit.protocol.records import record_verdict
from creditaudit.records import RECORD_FILE, SCHEMA, RunRecord, load_record, save_record
from creditaudit.study.experiments import (
    aggregate,
    all_names,
    experiment_names,
    get_experiment,
    group_records,
    run_experiment,
)
from creditaudit.study.experiments.penalty_sweep import LAMBDAS

NAMES = ["audit_table", "random_init", "decision_utility", "threshold_sensitivity",
         "temporal", "penalty_sweep", "capacity_cost", "fresh_null", "depth_ladder",
         "rule_zoo"]


def shared_results(tmp_path_factory):
    """One smoke results folder per test session (test_export.py reuses it too)."""
    return tmp_path_factory.getbasetemp() / "smoke_results"


@pytest.fixture(scope="module")
def runs_before_smoke(tmp_path_factory) -> set[str]:
    """The runs the shared folder already holds (test_export.py's, when it ran first in
    this worker): the experiments find them finished and train only the others."""
    return {p.parent.name for p in shared_results(tmp_path_factory).glob(f"*/{RECORD_FILE}")}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, single_thread, runs_before_smoke):
    folder = shared_results(tmp_path_factory)
    summaries = run_experiment("all", scale="smoke", out_dir=folder)
    records = {p.parent.name: load_record(p).to_dict()
               for p in folder.glob(f"*/{RECORD_FILE}")}
    return folder, summaries, records


# --- every experiment at smoke scale ------------------------------------------------------
def test_every_experiment_is_registered():
    # literature is run by name only: `all` runs the study's experiments.
    assert experiment_names() == [*NAMES, "literature"]
    assert all_names() == NAMES
    with pytest.raises(ConfigError, match="unknown experiment 'nope'"):
        get_experiment("nope")


def test_all_experiments_run_and_write_their_summaries(smoke):
    folder, summaries, _ = smoke
    assert list(summaries) == NAMES
    for name, summary in summaries.items():
        meta = summary["meta"]
        assert meta["runs_found"] == meta["runs_needed"] > 0 and not meta["missing"], name
        written = json.loads((folder / "experiments" / f"{name}.smoke.synthetic.json"
                              ).read_text())
        assert written["meta"]["run_ids"] == meta["run_ids"]
        markdown = (folder / "experiments" / f"{name}.smoke.synthetic.md").read_text()
        assert markdown.startswith(f"# Experiment `{name}`") and "|---|" in markdown


def test_experiments_share_runs_where_settings_coincide(smoke, runs_before_smoke):
    _, summaries, _ = smoke
    ids = {name: set(s["meta"]["run_ids"]) for name, s in summaries.items()}
    # Audit DFA (main epochs) is the penalty sweep's λ=0 run at smoke scale (epochs equal).
    audit_dfa = {i for i in ids["audit_table"] if i.startswith("dfa-")}
    assert audit_dfa <= ids["penalty_sweep"]
    # decision_utility and threshold_sensitivity read the audit runs: no new training.
    assert ids["decision_utility"] == ids["threshold_sensitivity"] == ids["audit_table"]
    # The ladder's k = L rung is the audit's all-trainable run.
    assert {i for i in ids["audit_table"] if i.startswith("bp-")} <= ids["depth_ladder"]
    assert ids["fresh_null"] <= ids["penalty_sweep"] | ids["capacity_cost"] | ids["audit_table"]
    union = set().union(*ids.values())
    # Every run the folder did not hold yet was trained (a shared run counts for each
    # experiment that lists it); what was there already was found, not trained again.
    assert sum(s["meta"]["execution"]["trained"] for s in summaries.values()) >= len(
        union - runs_before_smoke)


def test_second_run_trains_nothing(smoke):
    folder, _, _ = smoke
    before = {p: p.stat().st_mtime_ns for p in folder.glob(f"*/{RECORD_FILE}")}
    again = run_experiment("all", scale="smoke", out_dir=folder)
    assert all(s["meta"]["execution"]["trained"] == 0 for s in again.values())
    assert {p: p.stat().st_mtime_ns for p in folder.glob(f"*/{RECORD_FILE}")} == before
    single = run_experiment("capacity_cost", scale="smoke", out_dir=folder)
    assert single["meta"]["execution"]["trained"] == 0
    assert single["effects_pp"] == again["capacity_cost"]["effects_pp"]


def test_an_experiment_plans_each_run_once(smoke, monkeypatch):
    """Summarising finished runs: each run's id is computed once (by its plan), not once
    for the sweep, once for its state and twice for the summary."""
    import creditaudit.run.plan as plan_module

    folder, _, _ = smoke
    calls = []
    original = plan_module.compute_run_id
    monkeypatch.setattr(plan_module, "compute_run_id",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    summary = run_experiment("capacity_cost", scale="smoke", out_dir=folder)
    assert summary["meta"]["execution"]["trained"] == 0
    assert len(calls) == len(set(summary["meta"]["run_ids"]))


def test_audit_table_rows_match_records(smoke):
    _, summaries, records = smoke
    table = summaries["audit_table"]
    labels = [row["label"] for row in table["rows"]]
    assert labels == ["bp", "fa", "dfa", "dfa+λ=1e-2", "state-bridge", "credit-bridge", "ep",
                      "frozen"]
    bp = table["rows"][0]
    assert bp["headline_gamma"]["mean"] == pytest.approx(1.0, abs=1e-6)  # BP credit is g
    frozen_accs = [records[s["run_id"]]["final"]["test_acc"] for s in table["rows"][-1]["seeds"]]
    frozen_mean = sum(frozen_accs) / len(frozen_accs)
    for row in table["rows"][:-1]:
        accs = [records[s["run_id"]]["final"]["test_acc"] for s in row["seeds"]]
        assert row["test_acc"]["mean"] == pytest.approx(np.mean(accs))
        assert row["test_acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
        for seed in row["seeds"]:
            margin = 100 * (records[seed["run_id"]]["final"]["test_acc"] - frozen_mean)
            assert seed["margin_pp"] == pytest.approx(margin)
            assert seed["statuses"]["d"] == (FIRED if margin < 2.0 else PASSED)
            recorded = records[seed["run_id"]]["protocol"]["report"]["diagnostics"]
            assert all(seed["statuses"][i] == recorded[i]["status"] for i in "abc")


def test_random_init_runs_are_untrained_and_trustworthy(smoke):
    _, summaries, records = smoke
    summary = summaries["random_init"]
    # 5 architectures (the image ones on the synthetic task viewed as 3×32×32) × 3 × 2 seeds
    assert summary["n_runs"] == 30 and summary["all_at_chance"] and summary["n_fired"] == 0
    # at smoke scale (c) is not evaluated (256 evaluation samples): nothing fired is no pass
    assert summary["not_evaluated"] == {"c": 30} and summary["n_trustworthy"] == 0
    assert "0/30 fired; (c) not evaluated in 30/30" in get_experiment("random_init").to_markdown(
        summary)
    assert {r["arch"] for r in summary["rows"]} == {"resmlp", "resmlp-noLN", "student", "vit",
                                                    "convmixer"}
    for row in summary["rows"]:
        for seed in row["seeds"]:
            assert [e["epoch"] for e in records[seed["run_id"]]["log"]] == [0]
            # last branch layers init N(0, 0.01): blocks ≈ identity — except for ViT's CLS
            # token, which starts near 0 (a zero token + N(0, 0.02) position), so the first
            # attention read of the patches grows it by a factor even at init.
            if row["arch"] != "vit":
                assert seed["max_block_growth"] < 1.1


def test_decision_and_threshold_summaries_are_consistent(smoke):
    _, summaries, _ = smoke
    strategies = {s["name"]: s for s in summaries["decision_utility"]["strategies"]}
    assert all(s["of"] == 5 for s in strategies.values())
    # Each strategy demands at least the evidence of S1, S_full everything.
    for name in ("S2", "S3", "S4", "S5", "S_full"):
        assert set(strategies["S1"]["walked_back"]) <= set(strategies[name]["walked_back"])
        assert set(strategies[name]["walked_back"]) <= set(strategies["S_full"]["walked_back"])
    assert set(strategies["S0"]["walked_back"]) <= set(strategies["S1"]["walked_back"])
    blocks = summaries["threshold_sensitivity"]["diagnostics"]
    fired = {i: [r["n_fired"] for r in blocks[i]["rows"]] for i in "abd"}
    assert fired["a"] == sorted(fired["a"], reverse=True)  # fires above: fewer as t grows
    assert fired["b"] == sorted(fired["b"]) and fired["d"] == sorted(fired["d"])


def test_temporal_reads_first_firing_epochs(smoke):
    _, summaries, records = smoke
    rows = summaries["temporal"]["rows"]
    assert {(r["arch"], r["method"]) for r in rows} == {
        (a, m) for a in ("resmlp", "resmlp-noLN", "student", "vit", "convmixer")
        for m in ("bp", "fa", "dfa")}
    assert [r["arch"] for r in rows][::3] == ["resmlp", "resmlp-noLN", "student", "vit",
                                              "convmixer"]
    for row in rows:
        for seed in row["seeds"]:
            log = records[seed["run_id"]]["log"]
            for i in "abc":
                epochs = [e["epoch"] for e in log if e.get("protocol", {}).get(i) == FIRED]
                assert seed["first_fired"][i] == (epochs[0] if epochs else None)
            assert seed["d_evaluated"]


def test_rule_zoo_audits_every_rule_on_every_architecture(smoke):
    from creditaudit.study.experiments.rule_zoo import RULES

    folder, summaries, records = smoke
    rows = summaries["rule_zoo"]["rows"]
    assert {(r["arch"], r["method"]) for r in rows} == {
        (arch, method) for arch in ("resmlp", "vit", "convmixer")
        for method in (*RULES, "frozen")}
    per_linear = {"fa-linear", "usf", "brsf", "frsf", "kp"}
    for row in rows:
        assert row["verdict"]["n"] == 2, row["label"]
        assert 0 <= row["hidden"] <= row["status_quo_accepts"] <= 2
        walked = sum(s["verdict"].startswith("needs walk-back") for s in row["seeds"])
        assert row["hidden"] <= walked
        if row["method"] in per_linear:
            assert 0.0 <= row["feedback_angle"] <= 180.0, row["label"]
        else:
            assert row["feedback_angle"] is None, row["label"]
        for seed in row["seeds"]:
            assert records[seed["run_id"]]["final"]["test_acc"] == seed["test_acc"]
    markdown = (folder / "experiments" / "rule_zoo.smoke.synthetic.md").read_text()
    assert all(f"### {arch} " in markdown for arch in ("resmlp", "vit", "convmixer"))


def test_penalty_capacity_null_and_ladder(smoke):
    _, summaries, records = smoke
    sweep = summaries["penalty_sweep"]
    assert [r["lambda"] for r in sweep["rows"]] == list(LAMBDAS)
    assert all(r["epochs"] == 2 for r in sweep["rows"]) and sweep["frozen_acc"]["n"] == 2
    capacity = summaries["capacity_cost"]
    table = capacity["table"]
    assert capacity["effects_pp"]["credit_quality_gap"] == pytest.approx(
        100 * (table["bp"]["penalty"] - table["dfa"]["penalty"]))
    for row in summaries["fresh_null"]["rows"]:
        values = [records[s["run_id"]]["diagnostics"]["fresh_b_null"]["training_value"]
                  for s in row["seeds"]]
        assert row["training_deep_cos"]["mean"] == pytest.approx(np.mean(values))
        assert row["pooled_null"]["n"] == 3 * len(values)  # smoke: 3 fresh draws per run
        assert row["deep_cos_bp"]["mean"] == pytest.approx(1.0, abs=1e-6)
    ladder = summaries["depth_ladder"]["rows"]
    assert [(r["method"], r["k"]) for r in ladder] == [(m, k) for m in ("bp", "dfa")
                                                       for k in (0, 1, 2)]


def test_failed_run_is_reported_missing_not_fatal(smoke, tmp_path):
    folder, summaries, _ = smoke
    for run_id in summaries["fresh_null"]["meta"]["run_ids"]:
        shutil.copytree(folder / run_id, tmp_path / run_id)
    broken = summaries["fresh_null"]["meta"]["run_ids"][0]
    record = load_record(tmp_path / broken)
    record.status, record.error = "failed", "RuntimeError: boom"
    save_record(tmp_path / broken, record)
    summary = run_experiment("fresh_null", scale="smoke", out_dir=tmp_path)
    assert summary["meta"]["execution"]["trained"] == 0  # failed runs are not retried
    assert summary["meta"]["missing"] == [{"run_id": broken, "status": "failed",
                                           "error": "RuntimeError: boom"}]
    assert summary["meta"]["runs_found"] == summary["meta"]["runs_needed"] - 1
    assert "Missing runs" in (tmp_path / "experiments" / "fresh_null.smoke.synthetic.md"
                              ).read_text()


def test_another_runs_record_in_a_runs_folder_is_not_summarised_as_it(smoke, tmp_path):
    # A folder copied by hand over another run's: its record (of DFA λ=0) would count as
    # the λ=1e-2 run, so one seed twice in the λ=0 row's mean and the λ=1e-2 row one short.
    folder, summaries, _ = smoke
    ids = summaries["fresh_null"]["meta"]["run_ids"]
    for run_id in ids:
        shutil.copytree(folder / run_id, tmp_path / run_id)
    by_key = {(r["penalty"], s["seed"]): s["run_id"]
              for r in summaries["fresh_null"]["rows"] if r["method"] == "dfa"
              for s in r["seeds"]}
    source, target = by_key[(0.0, 42)], by_key[(1e-2, 42)]
    shutil.rmtree(tmp_path / target)
    shutil.copytree(folder / source, tmp_path / target)
    for train in (False, True):
        summary = run_experiment("fresh_null", scale="smoke", out_dir=tmp_path, train=train)
        assert summary["meta"]["execution"]["trained"] == 0  # never replaced
        [missing] = summary["meta"]["missing"]
        assert missing["run_id"] == target and missing["status"] == "refused"
        assert f"holds the record of run {source}" in missing["error"]
        seeds = {r["penalty"]: [s["run_id"] for s in r["seeds"]]
                 for r in summary["rows"] if r["method"] == "dfa"}
        assert seeds[0.0] == [source, by_key[(0.0, 123)]]  # once
        assert seeds[1e-2] == [by_key[(1e-2, 123)]]
    assert load_record(tmp_path / target).run_id == source  # left as it was


# --- aggregation ---------------------------------------------------------------------------
def test_aggregate_against_hand_computation():
    agg = aggregate([1.0, 2.0, 3.0, 4.0])
    assert agg["n"] == 4 and agg["mean"] == 2.5
    assert agg["std"] == pytest.approx(math.sqrt(5.0 / 3.0))  # ddof=1: Σ(x−2.5)² = 5, /3
    # The documented bootstrap: Generator(0), 2000 resamples, 2.5/97.5 percentiles.
    x = np.array([1.0, 2.0, 3.0, 4.0])
    means = x[np.random.default_rng(0).integers(0, 4, size=(2000, 4))].mean(axis=1)
    assert (agg["ci_low"], agg["ci_high"]) == tuple(np.percentile(means, [2.5, 97.5]))
    assert 1.0 <= agg["ci_low"] < agg["mean"] < agg["ci_high"] <= 4.0
    assert aggregate([4.0, 3.0, 2.0, 1.0]) == aggregate([4.0, 3.0, 2.0, 1.0])


def test_aggregate_edge_cases():
    one = aggregate([0.25])
    assert one["n"] == 1 and one["mean"] == 0.25 and math.isnan(one["std"])
    assert one["ci_low"] == one["ci_high"] == 0.25
    dropped = aggregate([1.0, None, float("nan"), float("inf"), 3.0])
    assert dropped["n"] == 2 and dropped["mean"] == 2.0
    assert dropped["std"] == pytest.approx(math.sqrt(2.0))
    empty = aggregate([])
    assert empty["n"] == 0 and math.isnan(empty["mean"]) and math.isnan(empty["ci_low"])


def test_a_number_over_one_seed_shows_no_spread():
    """One seed measures no spread: the .md cell has no ± part and names n, the .json's std
    is null (a summary row over one seed never reads ``± 0.000``)."""
    from creditaudit.files.safe_files import json_bytes
    from creditaudit.study.experiments.aggregate import format_aggregate

    one = aggregate([0.25])
    assert format_aggregate(one) == "0.250 (n=1)"
    assert json.loads(json_bytes({"acc": one}))["acc"] == {
        "mean": 0.25, "std": None, "n": 1, "ci_low": 0.25, "ci_high": 0.25}
    assert format_aggregate(aggregate([0.25, 0.25])) == "0.250 ± 0.000 (n=2)"  # measured


BASE_CONFIG = RunConfig().to_dict()


def fake_record(method, seed, *, acc, gamma=0.5, fired="", growth=1.2, g_last=4e-4,
                penalty=0.0, out_dir="runs", skipped=""):
    """A minimal finished record: one trained epoch with the given headline numbers
    (``skipped``: the diagnostics among (a)–(c) the protocol did not evaluate)."""
    config = copy.deepcopy(BASE_CONFIG)
    config["method"].update(name=method, penalty=penalty)
    config["run"].update(seed=seed, out_dir=out_dir)
    statuses = {i: (NOT_EVALUATED if i in skipped else FIRED if i in fired else PASSED)
                for i in "abc"}
    statuses["d"] = NOT_EVALUATED
    entry = {"epoch": 1, "acc_eval": acc, "test_acc": acc, "hidden_norms": [1.0, growth],
             "bp_grad_norms_per_sample_med": [1e-3, g_last], "g_L_zero_fraction": 0.0,
             "g_L_nonzero_median": g_last, "cos_per_layer": [gamma, gamma],
             "protocol": statuses}
    # The protocol block holds each statistic beside its status, as training writes it.
    values = {"a": growth, "b": g_last, "c": 0.9 if "c" in fired else 0.1, "d": None}
    values.update(dict.fromkeys(skipped))
    results = [DiagnosticResult(d.name, d.label, values[d.name], d.limit(), statuses[d.name], "")
               for d in protocol()]
    verdict, fired_ids, skipped = verdict_of(results)
    report = DiagnosticReport([1.0, growth], [1e-3, g_last], results, verdict, fired_ids,
                              skipped)
    return RunRecord.from_dict({
        "schema": SCHEMA, "run_id": f"{method}-{penalty}-s{seed}", "config": config,
        "status": "completed", "log": [{"epoch": 0, "acc_eval": 0.1}, entry],
        "final": {"epochs_completed": 1, "test_acc": acc},
        "diagnostics": {"gamma": {"samples_then_layers": gamma}},
        "protocol": {"epoch": 1, "verdict": verdict, "fired": fired_ids,
                     "report": report.to_dict()},
        "reference": VERIFIED})


# What a run of this version records when its reference gradient passed its check.
VERIFIED = {"verified": True, "how": "states", "where": None, "detail": "agrees"}


def test_decision_utility_says_where_a_strategys_diagnostic_was_not_evaluated():
    # (c) not evaluated (e.g. too few evaluation samples, as at smoke scale) walks nothing
    # back: S4 = S1 + (c) equal to S1 must not read as "(c) passed every rule".
    records = [fake_record(m, s, acc=a, gamma=g, fired=f.replace("c", ""),
                           skipped="c" if m == "ep" or s == 1 else "")
               for m, s, a, g, f in DECISION_RECORDS]
    experiment = get_experiment("decision_utility")
    summary = experiment.summarise(records)
    strategies = {s["name"]: s for s in summary["strategies"]}
    # the counted rules' 10 runs: ep's two and seed 1 of the other four
    assert strategies["S4"]["not_evaluated"] == {"diagnostics": ["c"], "runs": 6, "of": 10}
    assert strategies["S_full"]["not_evaluated"]["runs"] == 6
    assert strategies["S2"]["not_evaluated"]["runs"] == 0
    # (d) is recomputed against the frozen runs here: evaluated in every run
    assert strategies["S5"]["not_evaluated"]["runs"] == 0
    text = experiment.to_markdown(summary)
    assert "| S4 | S1 + (c) | 1/5 ((c) not evaluated in 6/10 runs) |" in text
    assert "| S2 | S1 + (a) | 3/5 |" in text


def test_random_init_does_not_call_a_run_with_a_diagnostic_not_evaluated_trustworthy():
    # (c) not evaluated (too few evaluation samples) and nothing fired: no walk-back, but
    # no pass of (c) either — the protocol's "trustworthy" needs every diagnostic evaluated.
    records = [fake_record("bp", 1, acc=0.1), fake_record("bp", 2, acc=0.1, skipped="c")]
    experiment = get_experiment("random_init")
    summary = experiment.summarise(records)
    [row] = summary["rows"]
    assert [s["trustworthy"] for s in row["seeds"]] == [True, False]
    assert not row["trustworthy"] and not summary["all_trustworthy"]
    assert summary["n_trustworthy"] == 1 and summary["n_fired"] == 0
    assert summary["not_evaluated"] == {"c": 1}
    text = experiment.to_markdown(summary)
    assert "**1/2 untrained runs trustworthy" in text and "(c) not evaluated in 1/2)" in text
    assert "| nothing fired; (c) not evaluated in 1/2 seeds |" in text


def test_threshold_sensitivity_says_where_a_diagnostic_judged_at_default_was_not_evaluated():
    # (c) has no range to sweep; where it was not evaluated it walks no run back in the
    # counts, which the summary must say rather than let it read as passed.
    records = [fake_record(m, s, acc=a, gamma=g, fired=f.replace("c", ""),
                           skipped="c" if s == 1 else "")
               for m, s, a, g, f in DECISION_RECORDS]
    experiment = get_experiment("threshold_sensitivity")
    summary = experiment.summarise(records)
    assert summary["judged_at_default"] == ["c"] and summary["n_runs"] == 12
    assert summary["not_evaluated_at_default"] == {"c": 6}
    assert ("Judged at the default threshold only (no range to sweep): (c); (c) not "
            "evaluated in 6 of the 12 runs.") in experiment.to_markdown(summary)
    every = experiment.summarise([fake_record("bp", 1, acc=0.6)])
    assert every["not_evaluated_at_default"] == {}


def test_group_records_ignores_seed_and_output_folder():
    records = [fake_record("dfa", 42, acc=0.3), fake_record("dfa", 123, acc=0.3, out_dir="x"),
               fake_record("fa", 42, acc=0.4), fake_record("dfa", 42, acc=0.3, penalty=1e-2)]
    groups = list(group_records(records).values())
    assert [[r.run_id for r in g] for g in groups] == [
        ["dfa-0.0-s42", "dfa-0.0-s123"], ["fa-0.0-s42"], ["dfa-0.01-s42"]]


def test_verdict_recomputes_d_only():
    record = fake_record("dfa", 42, acc=0.30, fired="ab")
    verdict = record_verdict(record, frozen_acc=0.35)
    assert verdict.statuses == {"a": FIRED, "b": FIRED, "c": PASSED, "d": FIRED}
    assert verdict.margin_pp == pytest.approx(-5.0)
    assert verdict.text == "needs walk-back (a)(b)(d)"
    assert record_verdict(record, None).statuses["d"] == NOT_EVALUATED
    passing = fake_record("bp", 42, acc=0.60)
    assert record_verdict(passing, None).text == "no walk-back in (a)–(c); (d) not evaluated"
    assert record_verdict(passing, 0.35).text == "trustworthy"


DECISION_RECORDS = [
    # method, seed, acc, Γ, fired
    ("bp", 1, 0.60, 1.00, ""), ("bp", 2, 0.61, 1.00, ""),
    ("fa", 1, 0.40, 0.25, ""), ("fa", 2, 0.41, 0.25, ""),
    ("dfa", 1, 0.30, 0.10, "ab"), ("dfa", 2, 0.31, 0.10, "ab"),
    ("ep", 1, 0.38, 0.05, ""), ("ep", 2, 0.39, 0.05, "c"),  # (c) in one of two seeds
    ("state-bridge", 1, 0.20, 0.30, "ab"), ("state-bridge", 2, 0.21, 0.30, "ab"),
    ("credit-bridge", 1, 0.29, -0.02, "ab"), ("credit-bridge", 2, 0.30, -0.01, "ab"),
    ("frozen", 1, 0.35, 1.00, ""), ("frozen", 2, 0.35, 1.00, ""),
]


def test_decision_utility_on_hand_built_records():
    records = [fake_record(m, s, acc=a, gamma=g, fired=f) for m, s, a, g, f in DECISION_RECORDS]
    summary = get_experiment("decision_utility").summarise(records)
    got = {s["name"]: sorted(s["walked_back"]) for s in summary["strategies"]}
    assert got == {
        "S0": [],
        "S1": ["credit-bridge"],  # Γ ≤ 0
        "S2": ["credit-bridge", "dfa", "state-bridge"],  # + (a)
        "S3": ["credit-bridge", "dfa", "state-bridge"],  # + (b)
        "S4": ["credit-bridge", "ep"],  # + (c): 1 of 2 ep seeds is half
        "S5": ["credit-bridge", "dfa", "state-bridge"],  # + (d): below frozen .35 + 2 pp
        "S_full": ["credit-bridge", "dfa", "ep", "state-bridge"],
    }
    assert all(s["of"] == 5 for s in summary["strategies"])
    bp = next(m for m in summary["methods"] if m["label"] == "bp")
    assert not bp["counted"] and not any(v["walked_back"] for v in bp["strategies"].values())
    assert all(s["not_evaluated"]["runs"] == 0 for s in summary["strategies"])
    # Accuracy at chance (0.1 + < 2 pp) is what S0 walks back.
    at_chance = [fake_record("fa", 1, acc=0.11), fake_record("fa", 2, acc=0.115)]
    summary = get_experiment("decision_utility").summarise(at_chance)
    assert summary["strategies"][0]["walked_back"] == ["fa"]


def test_threshold_sensitivity_on_hand_built_records():
    records = [
        fake_record("bp", 1, acc=0.60, growth=1.2, g_last=4.4e-4),
        fake_record("fa", 1, acc=0.40, growth=11.0, g_last=1.02e-4),
        fake_record("dfa", 1, acc=0.30, growth=694.0, g_last=4.18e-9, fired="ab"),
        fake_record("state-bridge", 1, acc=0.20, growth=4000.0, g_last=1e-10, fired="ab"),
        fake_record("frozen", 1, acc=0.35),
    ]
    summary = get_experiment("threshold_sensitivity").summarise(records)
    assert summary["n_runs"] == 4  # the frozen baseline is not a row

    def fired(diagnostic):
        return {r["threshold"]: r["n_fired"] for r in summary["diagnostics"][diagnostic]["rows"]}

    assert fired("a") == {2.0: 3, 5.0: 3, 10.0: 3, 20.0: 2, 50.0: 2, 100.0: 2, 200.0: 2,
                          500.0: 2, 1000.0: 1, 5000.0: 0}
    assert fired("b") == {1e-10: 0, 1e-9: 1, 1e-8: 2, 1e-7: 2, 1e-6: 2, 1e-5: 2, 1e-4: 2}
    d = fired("d")
    assert (d[0.0], d[2.0], d[10.0]) == (2, 2, 3)  # margins +25, +5, −5, −15 pp
    band = {i: summary["diagnostics"][i]["stable_band"] for i in "abd"}
    assert band["a"]["gap"] == pytest.approx(694.0 / 11.0)  # the SPEC's 63× gap
    assert band["b"]["gap"] == pytest.approx(1.02e-4 / 4.18e-9)  # the SPEC's 24,338×
    assert band["d"]["gap"] == pytest.approx(10.0)
    defaults = [r for r in summary["diagnostics"]["a"]["rows"] if r["default"]]
    assert defaults[0]["threshold"] == 50.0 and defaults[0]["n_walked_back"] == 2


# --- the command ------------------------------------------------------------------------
def test_experiment_command(smoke, capsys):
    folder, _, _ = smoke
    assert main(["experiment", "--list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{name}\n" in listing for name in NAMES)
    assert main(["experiment", "--list", "--scale", "smoke", "--out", str(folder)]) == 0
    assert "smoke: 16 runs, 16 finished" in capsys.readouterr().out
    assert main(["experiment", "depth_ladder", "--scale", "smoke", "--out", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "# Experiment `depth_ladder`" in out and "0 trained now" in out


def test_experiment_command_errors_are_one_line(capsys):
    assert main(["experiment", "nope", "--scale", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown experiment 'nope'" in err
    assert main(["experiment", "audit_table"]) == 2
    assert "--scale" in capsys.readouterr().err


def test_summaries_of_another_scale_or_dataset_do_not_overwrite_each_other():
    """`experiment all --scale cpu --no-train` once overwrote the smoke summaries: both
    scales' own datasets wrote NAME.json."""
    from creditaudit.registry import DATASETS
    from creditaudit.study.experiments import Choices
    from creditaudit.study.experiments.runner import summary_stem
    from creditaudit.study.experiments.scales import SCALES

    datasets = DATASETS.names()
    stems = {summary_stem("audit_table", scale, dataset)
             for scale in SCALES for dataset in datasets}
    assert len(stems) == len(SCALES) * len(datasets)
    assert summary_stem("audit_table", "cpu", "fashion-mnist") == \
        "audit_table.cpu.fashion-mnist"
    assert summary_stem("temporal", "smoke", "synthetic") == "temporal.smoke.synthetic"
    # Lists a user chose get a summary of their own.
    chosen = summary_stem("rule_zoo", "smoke", "synthetic", Choices(rules=("dfa", "kp"),
                                                                    archs=("vit",)))
    assert chosen == "rule_zoo.smoke.synthetic.rules=dfa,kp.arch=vit"


def test_find_summary_reads_current_and_older_file_names(tmp_path, plant):
    from creditaudit.records import atomic_write_json
    from creditaudit.study.experiments.runner import find_summary

    folder = tmp_path / "experiments"

    def write(stem: str, scale: str, dataset: str) -> Path:
        path = folder / f"{stem}.json"
        atomic_write_json(path, {"meta": {"scale": scale, "dataset": dataset}})
        return path

    assert find_summary(tmp_path, "audit_table", "smoke", "synthetic") is None
    # An older name is read only when its meta says which scale wrote it: smoke's and cpu's
    # own summaries were both NAME.json.
    legacy = write("audit_table", "smoke", "synthetic")
    assert find_summary(tmp_path, "audit_table", "smoke", "synthetic") == legacy
    assert find_summary(tmp_path, "audit_table", "cpu", "fashion-mnist") is None
    other = write("fresh_null.mnist1d", "cpu", "mnist1d")
    assert find_summary(tmp_path, "fresh_null", "cpu", "mnist1d") == other
    assert find_summary(tmp_path, "fresh_null", "smoke", "mnist1d") is None
    # The current name wins over an older one.
    current = write("audit_table.smoke.synthetic", "smoke", "synthetic")
    assert find_summary(tmp_path, "audit_table", "smoke", "synthetic") == current
    plant(folder / "temporal.json", "{not json")
    assert find_summary(tmp_path, "temporal", "smoke", "synthetic") is None
    # valid JSON of another shape ended in AttributeError
    for text in ('{"meta": ["smoke", "synthetic"]}', '["meta"]'):
        plant(folder / "temporal.json", text)
        assert find_summary(tmp_path, "temporal", "smoke", "synthetic") is None


def test_summary_meta_names_the_files_written(smoke):
    folder, summaries, _ = smoke
    for name, summary in summaries.items():
        json_file, md_file = summary["meta"]["files"]
        assert Path(json_file) == (folder / "experiments" / f"{name}.smoke.synthetic.json"
                                   ).resolve()
        assert Path(md_file).exists()


def test_no_train_summarises_what_is_there(tmp_path, capsys):
    assert main(["experiment", "capacity_cost", "--scale", "smoke", "--out", str(tmp_path),
                 "--no-train"]) == 1  # nothing finished yet: every run is missing
    captured = capsys.readouterr()
    assert "0 trained now" in captured.out and "missing:" in captured.err
    assert not [p for p in tmp_path.iterdir() if p.name != "experiments"]


def test_a_summary_of_other_precision_runs_has_its_own_file(smoke, capsys):
    # bf16 runs are other runs (the precision is in the run id): their summary, even of
    # none found, must not replace the fp32 one, and says which precision it is of.
    folder, summaries, _ = smoke
    fp32 = folder / "experiments" / "capacity_cost.smoke.synthetic.json"
    before = fp32.read_bytes()
    summary = run_experiment("capacity_cost", scale="smoke", out_dir=folder, train=False,
                             precision="bf16")
    assert fp32.read_bytes() == before
    assert summary["meta"]["precision"] == "bf16" and summary["meta"]["runs_found"] == 0
    assert summary["meta"]["files"][0].endswith("capacity_cost.smoke.synthetic.bf16.json")
    assert "precision `bf16`" in Path(summary["meta"]["files"][1]).read_text()
    assert summaries["capacity_cost"]["meta"]["precision"] == "fp32"
    from creditaudit.study.experiments.runner import find_summary
    assert find_summary(folder, "capacity_cost", "smoke", "synthetic", precision="bf16"
                        ) == Path(summary["meta"]["files"][0])
    assert find_summary(folder, "capacity_cost", "smoke", "synthetic") == fp32
    # --list counts the runs of the precision asked for
    capsys.readouterr()
    main(["experiment", "--list", "--scale", "smoke", "--out", str(folder)])
    assert "smoke: 10 runs, 10 finished" in capsys.readouterr().out
    main(["experiment", "--list", "--scale", "smoke", "--precision", "bf16", "--out",
          str(folder)])
    assert "smoke: 10 runs, 0 finished" in capsys.readouterr().out


# --- the cross-architecture variants ------------------------------------------------------
def test_image_architectures_run_wherever_the_data_are_images():
    from creditaudit.study.experiments.configs import arch_config, arch_variants

    for scale, dataset in (("cpu", None), ("cpu", "mnist"), ("paper", None),
                           ("smoke", None), ("cpu", "synthetic")):
        assert arch_variants(scale, dataset)[-2:] == ["vit", "convmixer"], (scale, dataset)
    assert arch_variants("cpu", "mnist1d") == ["resmlp", "resmlp-noLN", "student"]
    settings = {}
    for variant in ("vit", "convmixer"):
        cpu = arch_config(variant, "cpu", dataset=None, data_dir=None, out_dir="r")
        settings[variant] = (cpu.data.name, cpu.model.d, cpu.model.n_blocks, cpu.model.patch,
                             cpu.optim.epochs, cpu.data.train_subset)
        paper = arch_config(variant, "paper", dataset=None, data_dir="c", out_dir="r")
        assert (paper.data.name, paper.model.d, paper.model.patch) == ("cifar10", 128, 4)
        # the synthetic task is viewed as 3×32×32 images: in_dim 3072, whatever the scale
        for scale in ("smoke", "cpu"):
            synthetic = arch_config(variant, scale, dataset="synthetic", data_dir=None,
                                    out_dir="r")
            assert synthetic.data.in_dim == 3072 and synthetic.model.arch == variant
            assert synthetic.model.patch == 8  # 4×4 patches of 8×8 pixels
    assert settings["vit"] == ("fashion-mnist", 64, 4, 7, 20, 20000)
    assert settings["convmixer"] == ("fashion-mnist", 64, 4, 7, 20, 20000)
    assert arch_config("convmixer", "cpu", dataset=None, data_dir=None,
                       out_dir="r").model.kernel == 3
    resmlp = arch_config("resmlp", "smoke", dataset=None, data_dir=None, out_dir="r")
    assert resmlp.data.in_dim == 16  # only the image architectures change the view
    temporal = get_experiment("temporal").build_configs(
        "cpu", dataset=None, data_dir=None, out_dir="r")
    assert len(temporal) == 5 * 4 * 3  # 5 architectures × (bp, fa, dfa, frozen) × 3 seeds
    assert {c.model.arch for c in temporal} == {"resmlp", "student", "vit", "convmixer"}


def test_list_counts_runs_even_without_the_data(tmp_path, capsys):
    """--list --scale paper on a machine without CIFAR-10 still says how many runs each
    experiment needs (finished ones need the data's fingerprint, so they are not counted)."""
    assert main(["experiment", "--list", "--scale", "paper", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "paper: 24 runs (finished ones not counted: data.name='cifar10' needs" in out
    assert main(["experiment", "--list", "--scale", "smoke", "--out", str(tmp_path)]) == 0
    assert f"smoke: 16 runs, 0 finished in {tmp_path}" in capsys.readouterr().out


# --- any rule, any architecture ------------------------------------------------------------
@pytest.fixture
def noisy_bp(monkeypatch):
    """docs/examples/noisy_bp.py's rule registered in this process, as its entry point would
    register it (experiments at smoke scale train in this process)."""
    import importlib.util
    import sys

    from creditaudit.registry import RULES, Origin

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "noisy_bp.py"
    spec = importlib.util.spec_from_file_location("noisy_bp", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "noisy_bp", module)
    spec.loader.exec_module(module)
    RULES.names()  # the built-ins and installed plugins first
    RULES._plugins["noisy-bp"] = RULES.validate(module.NoisyBP, "test")
    RULES._origins["noisy-bp"] = Origin(builtin=False, distribution="tests")
    yield module.NoisyBP
    del RULES._plugins["noisy-bp"], RULES._origins["noisy-bp"]


def test_rules_and_arch_replace_an_experiments_lists(noisy_bp):
    from creditaudit.study.experiments import Choices

    def key(config):  # what a run id hashes (besides the data's fingerprint)
        return json.dumps(config.to_dict(), sort_keys=True)

    for name in ("audit_table", "temporal", "rule_zoo"):  # choosing nothing changes nothing
        experiment = get_experiment(name)
        assert experiment.configs("smoke", out_dir="r") == experiment.configs(
            "smoke", out_dir="r", choices=Choices())
    zoo = get_experiment("rule_zoo").configs(
        "smoke", out_dir="r", choices=Choices(rules=("noisy-bp", "dfa"), archs=("resmlp", "vit")))
    assert {(c.model.arch, c.method.name) for c in zoo} == {
        (arch, rule) for arch in ("resmlp", "vit") for rule in ("noisy-bp", "dfa", "frozen")}
    assert all(c.model.patch == 8 and c.data.in_dim == 3072 for c in zoo
               if c.model.arch == "vit")  # the synthetic task viewed as 3×32×32
    # One architecture instead of the ResidualMLP; the audit's DFA runs shared with the zoo.
    audit = get_experiment("audit_table").configs(
        "smoke", out_dir="r", choices=Choices(rules=("dfa",), archs=("vit",)))
    assert {(c.model.arch, c.method.name) for c in audit} == {("vit", "dfa"), ("vit", "frozen")}
    assert {key(c) for c in audit} <= {key(c) for c in zoo}
    untrained = get_experiment("random_init").configs(
        "smoke", out_dir="r", choices=Choices(archs=("resmlp-noLN", "student")))
    assert {(c.model.arch, getattr(c.model, "out_ln", None)) for c in untrained} == {
        ("resmlp", False), ("student", None)}
    sweep = get_experiment("penalty_sweep").configs("smoke", out_dir="r",
                                                    choices=Choices(rules=("kp",)))
    assert sorted({(c.method.name, c.method.penalty) for c in sweep}) == sorted(
        [("frozen", 0.0), *(("kp", lam) for lam in LAMBDAS)])


@pytest.mark.parametrize("argv, says", [
    (["capacity_cost", "--rules", "dfa"], "capacity_cost takes no --rules: it separates"),
    (["audit_table", "--arch", "resmlp,vit"], "runs on one architecture"),
    (["all", "--rules", "dfa"], "--rules applies to one experiment"),
    (["audit_table", "--rules", "dfa,nope"], "'nope' is not a known credit rule; choose one"),
    (["temporal", "--arch", "nope"], "--arch nope: model.arch='nope' is not a known"),
    (["random_init", "--arch", "vit", "--dataset", "mnist1d"], "--arch vit reads images"),
    (["fresh_null", "--rules", "bp"], "bp has feedback_kind 'symmetric'"),
    (["audit_table", "--arch", "student-noLN"], "student has no terminal LayerNorm"),
    (["rule_zoo", "--rules", ","], "--rules names nothing"),
])
def test_options_that_make_no_sense_are_refused_in_one_line(argv, says, tmp_path, capsys):
    assert main(["experiment", *argv, "--scale", "smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "experiments").exists()  # nothing trained, nothing written


def test_an_experiment_audits_a_plugin_rule(noisy_bp, tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["experiment", "audit_table", "--scale", "smoke", "--rules", "noisy-bp",
                 "--out", str(out)]) == 0
    stem = out / "experiments" / "audit_table.smoke.synthetic.rules=noisy-bp"
    summary = json.loads(Path(f"{stem}.json").read_text())
    assert summary["meta"]["choices"] == {"rules": ["noisy-bp"], "archs": None}
    assert [row["method"] for row in summary["rows"]] == ["noisy-bp", "frozen"]
    assert all(len(row["seeds"]) == 2 for row in summary["rows"])
    noisy = summary["rows"][0]
    assert noisy["margin_pp"]["n"] == 2 and "(d)" not in noisy["verdict"]["not_evaluated"]
    assert "rules `noisy-bp`" in Path(f"{stem}.md").read_text()
    # The experiment's own summary is another file, written by another choice.
    assert not (out / "experiments" / "audit_table.smoke.synthetic.json").exists()
    listing = capsys.readouterr().out
    assert "# Experiment `audit_table`" in listing


GENERATED = ("synthetic", "mnist1d")
FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
@pytest.mark.parametrize("dataset", [*GENERATED, pytest.param(
    "fashion-mnist", marks=pytest.mark.skipif(not FASHION.is_dir(),
                                              reason="Fashion-MNIST not installed"))])
def test_every_experiment_plans_at_every_scale_on_every_dataset(scale, dataset, tmp_path):
    """docs/experiments.md: ``--dataset`` takes the generated datasets at any scale (smoke
    MNIST-1D: 600 train / 200 test). Smoke MNIST-1D once asked for 256 evaluation samples of
    its 200 and refused to plan, and ``experiment`` has no --set to lower them."""
    from creditaudit.sweep import plan_runs

    for name in all_names():
        configs = get_experiment(name).configs(scale, dataset=dataset, data_dir=None,
                                               out_dir=str(tmp_path))
        plans = plan_runs(configs)  # raises ConfigError when a run's sizes do not fit
        assert len(plans) == len(configs) > 0, name
        for config in configs:
            if config.data.name == "mnist1d" and scale == "smoke":
                assert (config.data.n_train, config.data.n_test) == (600, 200)
                assert config.diagnostics.eval_samples <= config.data.n_test


def test_smoke_mnist1d_experiment_no_train_plans(tmp_path, capsys):
    """The probe's command: it plans every run, finds none finished, and exits 1 (missing
    runs), not 2 (a config error the user cannot fix)."""
    assert main(["experiment", "penalty_sweep", "--scale", "smoke", "--dataset", "mnist1d",
                 "--no-train", "--out", str(tmp_path)]) == 1
    assert "eval_samples" not in capsys.readouterr().err
    assert (tmp_path / "experiments" / "penalty_sweep.smoke.mnist1d.json").is_file()


def test_a_groups_verdict_counts_the_seeds_that_evaluated_each_diagnostic():
    from creditaudit.protocol import judge
    from creditaudit.protocol.records import Verdict
    from creditaudit.study.experiments.groups import verdict_overview

    def seed(statuses: dict[str, str]) -> Verdict:
        return Verdict(statuses=statuses, judgement=judge(statuses))

    passed = seed(dict.fromkeys("abcd", "passed"))
    blown = seed(dict.fromkeys("abcd", "not evaluated"))  # diverged before any evaluation
    no_d = seed({**dict.fromkeys("abc", "passed"), "d": "not evaluated"})
    # Two of three seeds evaluated (a)–(d) and passed: said so, not "not evaluated" alone.
    assert verdict_overview([passed, passed, blown])["text"] == \
        "no walk-back in (a)–(d) (2/3 seeds); (a)–(d) not evaluated in 1/3 seeds"
    assert verdict_overview([passed, no_d, blown])["text"] == (
        "no walk-back in (a)–(c) (2/3 seeds); no walk-back in (d) (1/3 seeds); (a)–(c) not "
        "evaluated in 1/3 seeds; (d) not evaluated in 2/3 seeds")
    assert verdict_overview([no_d, no_d])["text"] == \
        "no walk-back in (a)–(c) (2/2 seeds); (d) not evaluated"


def test_threshold_sensitivity_judges_a_float32_margin_of_exactly_a_swept_threshold_as_d():
    """(d) recorded a float32 margin at its default 2 pp (margin_pp snaps only a margin
    within float32's rounding of that threshold); the sweep re-judged the stored 0.999999 pp
    of a run exactly 1 pp above its frozen baseline (410/500 vs 405/500 as float32 means) at
    1 pp and counted it fired, where (d) judged at 1 pp passes it."""
    acc = float((torch.arange(500) < 410).float().mean())
    frozen = float((torch.arange(500) < 405).float().mean())
    assert 100 * (acc - frozen) < 1.0  # what float32 made of them
    records = [fake_record("bp", 1, acc=acc), fake_record("frozen", 1, acc=frozen)]
    summary = get_experiment("threshold_sensitivity").summarise(records)
    rows = {r["threshold"]: r["n_fired"] for r in summary["diagnostics"]["d"]["rows"]}
    assert (rows[0.5], rows[1.0], rows[2.0]) == (0, 0, 1)
    assert DepthUtility(DepthOptions(margin_pp=1.0)).assess(Evidence(
        [], [], headline_acc=acc, frozen_acc=frozen)).status == PASSED
