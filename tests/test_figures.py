"""Figures read run records only: every plotted number equals the records' values.

One module-scoped set of tiny runs (d=16, L=2, 2 epochs, 1 thread) covers what every figure
needs; the values each figure draws are read back from the matplotlib artists and compared
with numbers computed here straight from the record JSON.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.figures import (
    FIGURES,
    MissingRuns,
    RunIndex,
    audit_panels,
    render_all,
    run_curves,
    weight_alignment,
)
from creditaudit.records import RunRecord, load_record
from creditaudit.study.figures import hero, lambda_sweep, penalty, summary, temporal
from figure_support import SEEDS, collapse_g_l_norms


@pytest.fixture(scope="module")
def results(figure_results) -> Path:
    return figure_results


@pytest.fixture(scope="module")
def index(results) -> RunIndex:
    return RunIndex.from_dir(results)


@pytest.fixture(scope="module")
def records(results) -> list[dict]:
    """The records as dicts, every value in place (record.json stores each number once:
    the headline numbers are read from their epoch's entry)."""
    return [load_record(p).to_dict() for p in sorted(results.rglob("record.json"))]


def pick(records, method, penalty=0.0, arch="resmlp"):
    out = [r for r in records if r["config"]["method"]["name"] == method
           and r["config"]["method"]["penalty"] == penalty
           and r["config"]["model"]["arch"] == arch]
    assert out, (method, penalty, arch)
    return sorted(out, key=lambda r: r["config"]["run"]["seed"])


def gid(fig, name):
    found = fig.findobj(lambda a: a.get_gid() == name)
    assert found, f"no artist with gid {name!r}"
    return found


def line_y(fig, name):
    return np.asarray(gid(fig, name)[0].get_ydata(), dtype=float)


def line_x(fig, name):
    return np.asarray(gid(fig, name)[0].get_xdata(), dtype=float)


def bar_heights(fig, name):
    return np.array([patch.get_height() for patch in gid(fig, name)])


def final_acc(r):
    return r["final"]["test_acc"]


def mean(values):
    return np.mean(np.array(values, dtype=float), axis=0)


def raw_value(entry, key):
    """A value of a record.json log entry; g_L_norm is stored once, as the last state's
    gradient norm."""
    if key == "g_L_norm":
        grads = entry.get("bp_grad_norms_per_sample_med")
        return grads[-1] if grads else None
    return entry.get(key)


def per_epoch_mean(runs, key):
    return mean([[raw_value(e, key) for e in r["log"] if raw_value(e, key) is not None]
                 for r in runs])


def deep(values):
    return float(np.mean(values[1:]))


# --- rendering ----------------------------------------------------------------------------
def test_cli_renders_every_figure_png_and_pdf(results, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("creditaudit.figures.common.PNG_DPI", 60)  # keep the test fast
    out = tmp_path / "figs"
    assert main(["figures", str(results), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{len(FIGURES)} figures drawn, 0 missing" in text
    names = [hero.NAME, temporal.NAME, penalty.NAME, lambda_sweep.NAME, *summary.NAMES,
             audit_panels.NAME, weight_alignment.NAME]
    for name in names:
        for ext in ("png", "pdf"):
            path = out / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 1000, path
    assert (out / f"{hero.NAME}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / f"{hero.NAME}.pdf").read_bytes()[:5] == b"%PDF-"


def test_the_same_records_draw_byte_identical_figures(results, tmp_path, monkeypatch):
    """Drawn twice, a second apart, the files are the same bytes: no creation date in the
    PDF (matplotlib writes the time of saving unless told not to)."""
    monkeypatch.setattr("creditaudit.figures.common.PNG_DPI", 30)
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["figures", str(results), "--out", str(first)]) == 0
    time.sleep(1.1)
    assert main(["figures", str(results), "--out", str(second)]) == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir()) and names
    assert [n for n in names if (first / n).read_bytes() != (second / n).read_bytes()] == []


# --- plotted values equal the records -----------------------------------------------------
def test_cosines_against_an_invalid_reference_are_drawn_hollow(results):
    index = RunIndex.from_dir(results)
    dfa = [r for r in index.runs if r.method == "dfa" and r.penalty == 0 and r.is_standard]
    for run in dfa:  # layer 2's reference gradient fell below the floor in every seed
        run.diagnostics.cosine_table[2]["valid_reference"] = False
    fig = hero.build(index)[hero.NAME]
    hollow = gid(fig, "cos_invalid:dfa")[0]
    assert list(hollow.get_xdata()) == [2]
    np.testing.assert_allclose(hollow.get_ydata(), [line_y(fig, "cos:dfa")[2]])
    assert hollow.get_markerfacecolor() == "white"
    assert not fig.findobj(lambda a: a.get_gid() == "cos_invalid:bp")  # valid: filled
    assert gid(fig, "invalid_note")


def test_hero_values_come_from_records(index, records):
    fig = hero.build(index)[hero.NAME]
    for method in ("bp", "fa", "dfa", "state-bridge", "credit-bridge"):
        runs = pick(records, method)
        gamma = mean([r["diagnostics"]["gamma"]["samples_then_layers"] for r in runs])
        np.testing.assert_allclose(line_x(fig, f"point:{method}"), [gamma], rtol=1e-12)
        np.testing.assert_allclose(line_y(fig, f"point:{method}"),
                                   [mean([final_acc(r) for r in runs])], rtol=1e-12)
        np.testing.assert_allclose(line_y(fig, f"cos:{method}"),
                                   mean([r["diagnostics"]["bp_cosine"] for r in runs]),
                                   rtol=1e-12)
        np.testing.assert_allclose(
            line_y(fig, f"grad:{method}"),
            mean([r["log"][-1]["bp_grad_norms_per_sample_med"] for r in runs]), rtol=1e-12)
    np.testing.assert_allclose(line_y(fig, "chance"), [0.1, 0.1])  # synthetic: 10 classes
    np.testing.assert_allclose(line_y(fig, "floor"), [1e-7, 1e-7])
    # Frozen-blocks runs are a baseline, not a point of the reporting pair.
    assert not fig.findobj(lambda a: a.get_gid() == "point:frozen")


def test_temporal_rows_and_values(index, records):
    fig = temporal.build(index)[temporal.NAME]
    assert len(fig.axes) == 3 * 3  # ResMLP, ConvMixer and StudentNet rows, in that order
    assert [ax.get_ylabel().split("\n")[0] for ax in fig.axes[::3]] == [
        "ResMLP", "ConvMixer", "StudentNet"]
    for arch, row in (("resmlp", "resmlp"), ("convmixer", "convmixer"), ("student", "student")):
        for method in ("bp", "fa", "dfa"):
            runs = pick(records, method, arch=arch)
            for key in ("h_L_norm", "g_L_norm", "acc_eval"):
                np.testing.assert_allclose(line_y(fig, f"{row}:{key}:{method}"),
                                           per_epoch_mean(runs, key), rtol=1e-12)
            np.testing.assert_allclose(line_x(fig, f"{row}:acc_eval:{method}"),
                                       [e["epoch"] for e in runs[0]["log"]])
    g_axes = [fig.axes[1], fig.axes[4], fig.axes[7]]
    assert g_axes[0].get_ylim() == g_axes[1].get_ylim() == g_axes[2].get_ylim()  # shared


def test_temporal_says_when_a_log_panel_cannot_show_its_norms(index, monkeypatch):
    # ‖g_L‖ collapsed to exactly 0 leaves a log panel empty: each row's says so.
    collapse_g_l_norms(monkeypatch)
    fig = temporal.build(index)[temporal.NAME]
    notes = [text.get_text().replace("\n", " ") for ax in fig.axes[1::3] for text in ax.texts]
    assert len(notes) == 3 and all("runs logged ‖g_L‖ ≤ 0 at some epoch, which a log axis "
                                   "cannot show" in note for note in notes)


def test_penalty_values_come_from_records(index, records):
    fig = penalty.build(index)[penalty.NAME]
    vanilla, pen = pick(records, "dfa"), pick(records, "dfa", 0.01)
    np.testing.assert_allclose(line_y(fig, "a:h_L:vanilla"), per_epoch_mean(vanilla, "h_L_norm"))
    np.testing.assert_allclose(line_y(fig, "a:g_L:penalised"), per_epoch_mean(pen, "g_L_norm"))
    assert any(ax.get_yscale() == "log" for ax in fig.axes)
    draws = [v for r in pen for v in r["diagnostics"]["fresh_b_null"]["values"]]
    cos = [mean([r["diagnostics"]["deep_cos"] for r in vanilla]),
           mean([r["diagnostics"]["deep_cos"] for r in pen]),
           np.mean(draws),
           mean([deep(r["diagnostics"]["cosine_controls"]["random"]) for r in pen]),
           mean([deep(r["diagnostics"]["cosine_controls"]["bp"]) for r in pen])]
    np.testing.assert_allclose(bar_heights(fig, "b:cos"), cos, rtol=1e-12)
    rho = [mean([deep(r["diagnostics"]["perturbation_rho"]) for r in vanilla]),
           mean([deep(r["diagnostics"]["perturbation_rho"]) for r in pen]),
           mean([deep(r["diagnostics"]["rho_controls"]["random"]) for r in pen]),
           mean([deep(r["diagnostics"]["rho_controls"]["bp"]) for r in pen])]
    np.testing.assert_allclose(bar_heights(fig, "b:rho"), rho, rtol=1e-12)
    # The error bars of (b) are the sample std across seeds, as the report's ±.
    rows = penalty.conditions(penalty.select(index))
    np.testing.assert_allclose(rows[0]["cos"][1],
                               np.std([r["diagnostics"]["deep_cos"] for r in vanilla], ddof=1))
    plain = [mean([final_acc(r) for r in pick(records, m)]) for m in ("bp", "dfa")]
    pens = [mean([final_acc(r) for r in pick(records, m, 0.01)]) for m in ("bp", "dfa")]
    np.testing.assert_allclose(bar_heights(fig, "c:plain"), plain, rtol=1e-12)
    np.testing.assert_allclose(bar_heights(fig, "c:penalised"), pens, rtol=1e-12)
    frozen = mean([final_acc(r) for r in pick(records, "frozen")])
    np.testing.assert_allclose(line_y(fig, "c:frozen"), [frozen, frozen], rtol=1e-12)


def test_lambda_sweep_values_come_from_records(index, records):
    fig = lambda_sweep.build(index)[lambda_sweep.NAME]
    for lam in (0.0, 0.01):
        runs = pick(records, "dfa", lam)
        for key in ("h_L_norm", "g_2_norm", "acc_eval"):
            np.testing.assert_allclose(line_y(fig, f"{key}:{lam:g}"),
                                       per_epoch_mean(runs, key), rtol=1e-12)
    frozen = mean([final_acc(r) for r in pick(records, "frozen")])
    np.testing.assert_allclose(line_y(fig, "frozen"), [frozen] * 2, rtol=1e-12)
    np.testing.assert_allclose(line_y(fig, "frozen_margin"), [frozen + 0.02] * 2, rtol=1e-12)
    np.testing.assert_allclose(line_y(fig, "floor"), [1e-7] * 2)


def test_summary_set_values_come_from_records(index, records):
    figs = summary.build(index)
    assert list(figs) == list(summary.NAMES)
    for method in ("bp", "dfa", "state-bridge", "credit-bridge", "frozen"):
        runs = pick(records, method)
        np.testing.assert_allclose(line_y(figs["fig5a_accuracy"], f"test_acc:{method}"),
                                   per_epoch_mean(runs, "test_acc"), rtol=1e-12)
        np.testing.assert_allclose(line_y(figs["fig5a_accuracy"], f"train_acc:{method}"),
                                   per_epoch_mean(runs, "train_acc"), rtol=1e-12)
        drift = [[r["diagnostics"]["drift"][f"blocks.{l}.w1.weight"] for l in range(2)]
                 for r in runs]
        np.testing.assert_allclose(line_y(figs["fig5c_drift"], f"drift:{method}"),
                                   mean(drift), rtol=1e-12)
    for method in ("bp", "dfa", "state-bridge", "credit-bridge"):
        runs = pick(records, method)
        fig = figs["fig5b_per_layer"]
        for key in ("bp_cosine", "perturbation_rho"):
            np.testing.assert_allclose(line_y(fig, f"{key}:{method}"),
                                       mean([r["diagnostics"][key] for r in runs]), rtol=1e-12)
        np.testing.assert_allclose(line_y(fig, f"nudging:{method}"),
                                   mean([r["diagnostics"]["nudging"]["0.01"] for r in runs]),
                                   rtol=1e-12)
        np.testing.assert_allclose(line_x(fig, f"nudging:{method}"), [1, 2])
    for r in pick(records, "state-bridge"):
        seed = r["config"]["run"]["seed"]
        np.testing.assert_allclose(
            line_y(figs["fig5d_bridge"], f"state_pred_error:{seed}"),
            [e["state_pred_error"] for e in r["log"] if "state_pred_error" in e])
    np.testing.assert_allclose(
        bar_heights(figs["fig5d_bridge"], "bridge_acc"),
        [mean([final_acc(r) for r in pick(records, m)])
         for m in ("dfa", "state-bridge", "credit-bridge")], rtol=1e-12)
    order = ("bp", "fa", "fa-linear", "kp", "dfa", "state-bridge", "credit-bridge", "frozen")
    np.testing.assert_allclose(
        bar_heights(figs["fig5e_final_accuracy"], "final_acc"),
        [mean([final_acc(r) for r in pick(records, m)]) for m in order], rtol=1e-12)


def stopped_early_index(results, methods) -> RunIndex:
    """The runs, with the ResMLP λ = 0 runs of ``methods`` of seed 123 stopped early at
    epoch 1 (as --stop-on-walkback leaves a run: completed, its log ending at that epoch)."""
    runs = [load_record(p) for p in sorted(results.rglob("record.json"))]
    for run in runs:
        if run.method in methods and run.penalty == 0 and run.seed == SEEDS[1] \
                and run.config.model.arch == "resmlp":
            run.stopped_early = {"epoch": 1, "reason": "protocol verdict needs walk-back: (a)"}
            run.log = [entry for entry in run.log if entry.epoch <= 1]
    return RunIndex.from_records(runs)


@pytest.fixture(scope="module")
def early_index(results) -> RunIndex:
    """The runs, with DFA's and the frozen runs' seed 123 stopped early at epoch 1."""
    return stopped_early_index(results, ("dfa", "frozen"))


def notes(fig) -> list[str]:
    return [t.get_text().replace("\n", " ") for t in fig.texts
            if t.get_gid() == "stopped_early"]


def test_runs_that_stopped_early_are_left_out_of_end_of_run_means_and_named(early_index,
                                                                          records):
    """A run that stopped early mixed into a mean over seeds of full-length runs made a mean
    over runs of different lengths: end-of-run means leave it out, a line under the figure
    names it in the report's words, and per-epoch curves keep the epochs it logged."""
    dfa, frozen = pick(records, "dfa")[:1], pick(records, "frozen")[:1]  # seed 42 only
    named = ("DFA seed 123 stopped early at epoch 1: protocol verdict needs walk-back: (a)",
             "Frozen blocks seed 123 stopped early at epoch 1")
    fig = hero.build(early_index)[hero.NAME]
    np.testing.assert_allclose(line_y(fig, "point:dfa"), [final_acc(dfa[0])], rtol=1e-12)
    np.testing.assert_allclose(line_x(fig, "point:dfa"),
                               [dfa[0]["diagnostics"]["gamma"]["samples_then_layers"]])
    np.testing.assert_allclose(line_y(fig, "cos:dfa"), dfa[0]["diagnostics"]["bp_cosine"])
    [note] = notes(fig)
    assert named[0] in note and "Frozen" not in note  # the hero draws no frozen run
    figs = summary.build(early_index)
    logged = {}  # epoch → test accs: seed 123's up to epoch 1, seed 42's all
    for run, last in zip(pick(records, "dfa"), (2, 1)):
        for entry in run["log"]:
            if entry["epoch"] <= last and entry.get("test_acc") is not None:
                logged.setdefault(entry["epoch"], []).append(entry["test_acc"])
    assert [len(logged[e]) for e in sorted(logged)][-1] == 1
    np.testing.assert_allclose(line_y(figs["fig5a_accuracy"], "test_acc:dfa"),
                               [np.mean(logged[e]) for e in sorted(logged)], rtol=1e-12)
    heights = dict(zip(("bp", "fa", "fa-linear", "kp", "dfa", "state-bridge",
                        "credit-bridge", "frozen"),
                       bar_heights(figs["fig5e_final_accuracy"], "final_acc")))
    assert heights["dfa"] == pytest.approx(final_acc(dfa[0]), rel=1e-12)
    assert heights["frozen"] == pytest.approx(final_acc(frozen[0]), rel=1e-12)
    assert not notes(figs["fig5a_accuracy"])
    for name in summary.NAMES[1:]:
        assert all(text in notes(figs[name])[0] for text in named)
    fig = penalty.build(early_index)[penalty.NAME]
    assert bar_heights(fig, "b:cos")[0] == pytest.approx(dfa[0]["diagnostics"]["deep_cos"])
    np.testing.assert_allclose(line_y(fig, "c:frozen"), [final_acc(frozen[0])] * 2)
    assert all(text in notes(fig)[0] for text in named)
    fig = lambda_sweep.build(early_index)[lambda_sweep.NAME]
    np.testing.assert_allclose(line_y(fig, "frozen"), [final_acc(frozen[0])] * 2)
    [note] = notes(fig)
    assert named[1] in note and "DFA" not in note


def test_figure_3_says_only_the_curves_it_draws_show_a_stopped_runs_epochs(results):
    """Panel (a) draws DFA's curves, not BP's: with both stopped early, the note says DFA's
    curve shows the epochs it logged, and nothing of a BP curve."""
    fig = penalty.build(stopped_early_index(results, ("bp", "dfa")))[penalty.NAME]
    [note] = notes(fig)
    assert "BP seed 123 stopped early at epoch 1" in note
    assert "DFA seed 123 stopped early at epoch 1" in note
    assert note.endswith("Per-epoch curves show the epochs DFA seed 123 logged.")
    assert "each logged" not in note


def test_audit_panels_ring_and_name_a_run_that_stopped_early(early_index):
    """Its protocol values are of an earlier epoch than its recipe's other runs': every
    point of it is ringed, and a line under the figure names it in the report's words."""
    fig = audit_panels.build(early_index)[audit_panels.NAME]
    early = [run for run in early_index.runs if run.stopped_early]
    assert len(early) == 2
    for id_ in "abc":
        values = [result.value for run in early
                  for result in early_index.protocol_report(run).diagnostics
                  if result.id == id_]
        np.testing.assert_allclose(drawn(fig, f"{id_}:stopped_early"),
                                   sorted(v for v in values if v is not None and v > 0),
                                   rtol=1e-12)
    [note] = notes(fig)
    assert note.startswith("Ringed: runs that stopped early")
    for name in ("DFA seed 123", "Frozen blocks seed 123"):
        assert f"{name} stopped early at epoch 1: protocol verdict needs walk-back: (a)" in note
    assert "end-of-run means" not in note and "Per-epoch" not in note


def test_weight_alignment_values_come_from_records(index, records):
    fig = weight_alignment.build(index)[weight_alignment.NAME]
    assert len(fig.axes) == 2 * 2  # kp and fa-linear columns; BP, FA, DFA have no pairing
    for method in ("kp", "fa-linear"):
        runs = pick(records, method)
        names = runs[0]["log"][-1]["feedback_layers"]
        assert names[0] == "embed" and names[-1] == "out_head"
        for layer, name in enumerate(names):
            for tag, key in (("angle", "feedback_angle"), ("ratio", "feedback_norm_ratio")):
                want = mean([[e[key][layer] for e in r["log"]] for r in runs])
                np.testing.assert_allclose(line_y(fig, f"{tag}:{method}:0:{name}"), want,
                                           rtol=1e-12)
    # The panels draw a trajectory: the angles move with training (after 16 steps by up to a
    # few degrees either way; KP's approach to W is tested in test_linear_feedback.py).
    kp = pick(records, "kp")[0]["log"]
    assert kp[-1]["feedback_angle"] != kp[0]["feedback_angle"]


def drawn(fig, name) -> list[float]:
    """The y values of the scatter with gid ``name`` (none drawn: an empty list)."""
    found = fig.findobj(lambda a: a.get_gid() == name)
    return sorted(y for f in found for y in np.asarray(f.get_offsets()).reshape(-1, 2)[:, 1])


def test_audit_panels_plot_each_runs_protocol_values(results, records):
    """Each run's value in the colour of its verdict (the judgement's kind): a run whose (d)
    was not evaluated is incomplete, never drawn as trustworthy. A finished frozen-blocks
    run is drawn as the baseline of (d), as the tables label it (it was drawn
    'incomplete', its own (d) never evaluated, where every table says 'baseline of (d)')."""
    from creditaudit.formatting import BASELINE_KIND
    from creditaudit.protocol import KINDS, judge

    index = RunIndex.from_dir(results, frozen_from_runs=False)  # each record's own (d)
    fig = audit_panels.build(index)[audit_panels.NAME]
    for id_ in "abc":
        expected = {kind: [] for kind in [*KINDS.values(), BASELINE_KIND]}
        for r in records:
            value = r["protocol"]["report"]["diagnostics"][id_]["value"]
            statuses = {i: d["status"] for i, d in r["protocol"]["report"]["diagnostics"].items()}
            kind = (BASELINE_KIND if r["config"]["method"]["name"] == "frozen"
                    else judge(statuses, r["reference"]).kind)
            if value is not None and (id_ == "c" or value > 0):
                expected[kind].append(value)
        assert not expected["pass"], expected  # (d) not evaluated: never drawn trustworthy
        assert expected[BASELINE_KIND], expected  # the frozen runs' own points
        for kind, values in expected.items():
            np.testing.assert_allclose(drawn(fig, f"{id_}:{kind}"), sorted(values), rtol=1e-12)
        threshold = records[0]["protocol"]["report"]["diagnostics"][id_]["threshold"]
        np.testing.assert_allclose(line_y(fig, f"{id_}:threshold"), [threshold] * 2)
    # (d) was not evaluated in the records (no frozen accuracy given): nothing drawn.
    for kind in [*KINDS.values(), BASELINE_KIND]:
        assert drawn(fig, f"d:{kind}") == []


def test_audit_panels_frozen_from_runs_evaluates_d(results, records):
    from creditaudit.protocol import KINDS

    index = RunIndex.from_dir(results, frozen_from_runs=True)
    fig = audit_panels.build(index)[audit_panels.NAME]
    frozen = {}
    for r in records:
        if r["config"]["method"]["name"] == "frozen":
            frozen.setdefault(r["config"]["model"]["arch"], []).append(final_acc(r))
    expected = sorted(100 * (final_acc(r) - np.mean(frozen["resmlp"])) for r in records
                      if r["config"]["model"]["arch"] == "resmlp"
                      and r["config"]["method"]["name"] != "frozen")
    got = [y for kind in KINDS.values() for y in drawn(fig, f"d:{kind}")]
    np.testing.assert_allclose(sorted(got), expected, rtol=1e-9)


# --- missing runs -------------------------------------------------------------------------
def test_missing_runs_name_what_is_needed(results, index):
    only_bp = RunIndex([r for r in index.all_runs if r.method == "bp"])
    with pytest.raises(MissingRuns) as err:
        hero.build(only_bp)
    text = str(err.value)
    assert "FA runs" in text and "DFA runs" in text and "BP runs" not in text
    with pytest.raises(MissingRuns) as err:
        penalty.build(only_bp)
    assert "frozen-blocks runs" in str(err.value) and "DFA runs" in str(err.value)
    with pytest.raises(MissingRuns, match="fa-linear, usf, brsf, frsf or kp"):
        weight_alignment.build(only_bp)
    rendered, missing = render_all(only_bp, results / "unused")
    assert [r.name for r in rendered] == [audit_panels.NAME, run_curves.NAME]
    assert {m.NAME for m, _ in missing} == {hero.NAME, temporal.NAME, penalty.NAME,
                                              lambda_sweep.NAME, summary.NAME,
                                              weight_alignment.NAME}
    assert all(e.needs for _, e in missing)
    for module in FIGURES:
        assert isinstance(module.requirements, str) and module.requirements


def test_cli_folder_of_no_records_is_one_line_error(tmp_path, capsys):
    """`creditaudit figures` of a folder holding no record (a mistyped one) once drew
    nothing, listed every figure as missing and exited 0: now, as `report` and `export`,
    one line says there is nothing to draw and where the runs are, and nothing is written."""
    assert main(["figures", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and not captured.out
    assert (f"{tmp_path} holds no run records (record.json below it), so there is nothing "
            "to draw: pass the folder your runs were written to") in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command,doing", [("figures", "draw"), ("report", "report"),
                                            ("export", "export")])
def test_cli_folder_of_only_unreadable_records_is_one_line_error(tmp_path, capsys, caplog,
                                                                 plant, command, doing):
    """`creditaudit figures|report|export` of a folder whose every record was unreadable
    warned of each, then drew, reported or exported nothing and exited 0, as if the folder
    had held runs; an empty folder is refused (exit 2). It now is too: after the warnings
    naming each record, one line says none could be read, exit 2, nothing written."""
    results = tmp_path / "results"
    plant(results / "r1" / "record.json", '{"schema": "creditaudit.run/1", "log": [')
    plant(results / "r2" / "record.json", "garbage")
    out = tmp_path / "out"
    assert main([command, str(results), *(["--out"] if command != "export" else []),
                 str(out)]) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("skipping an unreadable record" in w for w in warnings)
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"creditaudit: error: {results} holds 2 run records but none that could be read (each "
        f"named in a warning above), so there is nothing to {doing}: repair or replace them, "
        "or pass the folder your runs were written to")
    assert not captured.out and not out.exists()
    assert sorted(p.name for p in results.iterdir()) == ["r1", "r2"]


def test_cli_lists_the_figures_it_cannot_draw(results, tmp_path, capsys):
    """A folder of one run, which most figures do not read: what cannot be drawn is listed
    with the runs it needs, and that is no error."""
    one = tmp_path / "one"
    run = sorted(results.rglob("record.json"))[0].parent
    shutil.copytree(run, one / run.name)
    assert main(["figures", str(one), "--out", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "figures drawn" in out and "missing " in out and "runs it reads:" in out


def test_cli_missing_folder_is_one_line_error(tmp_path, capsys):
    assert main(["figures", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err


def test_run_index_selects_by_config_predicates(index, records):
    dfa = index.select(method="dfa", penalty=lambda lam: lam > 0)
    assert {r.run_id for r in dfa} == {r["run_id"] for r in pick(records, "dfa", 0.01)}
    # out_ln is what the model has: StudentNet has no terminal LN (whatever a config said)
    archs = ("resmlp", "student")
    assert {r.config.model.arch for r in index.select(out_ln=True, arch=archs)} == {"resmlp"}
    assert {r.config.model.arch for r in index.select(out_ln=False, arch=archs)} == {"student"}
    seeds = index.by_seed(method="bp", penalty=0.0, arch="resmlp")
    assert list(seeds) == list(SEEDS)
    assert all(len(runs) == 1 and runs[0].seed == s for s, runs in seeds.items())
    assert index.select(dataset="cifar10") == []


def test_the_index_holds_records_and_each_keyword_compares_one_fact_of_them(index):
    import creditaudit.results
    from creditaudit.results import arch_label, figure_recipe, terminal_ln
    from creditaudit.results.runs import SELECT_KEYS

    assert "Run" not in creditaudit.results.__all__ and not hasattr(creditaudit.results, "Run")
    runs = index.select(standard=None)
    assert runs and all(isinstance(r, RunRecord) for r in runs)
    assert set(SELECT_KEYS) == {"method", "penalty", "out_ln", "arch", "arch_label", "dataset",
                                "seed", "recipe", "standard"}
    # Given one run's own fact, a keyword keeps exactly the runs that share it.
    for key, fact in SELECT_KEYS.items():
        for run in runs:
            kept = index.select(**{"standard": None, key: fact(run)})
            assert [r.run_id for r in kept] == [r.run_id for r in runs
                                                if fact(r) == fact(run)], (key, run.run_id)
    student = [r for r in runs if r.config.model.arch == "student"]
    assert student and not any(terminal_ln(r) for r in student)
    assert {arch_label(r) for r in student} == {"student"}
    assert all(figure_recipe(r) == f"{r.recipe_key}|None" for r in runs)


def test_audit_panels_put_untrained_runs_and_controls_in_their_own_columns():

    def category(**settings) -> str:
        config = RunConfig().replace(**{"method.name": "bp", **settings})
        return audit_panels.category(RunRecord(config=config), False, False)

    assert category(**{"optim.epochs": 0}).endswith("\nuntrained")
    assert "untrained" not in category(**{"optim.epochs": 20})
    assert category(**{"method.trainable_blocks": 2}).endswith("\nk=2 blocks")
    assert category(**{"data.random_targets": True}).endswith("\nrandom labels")


# --- colours --------------------------------------------------------------------------------
def test_every_built_in_rule_keeps_its_own_colour_and_marker_in_every_colour_vision():
    from colour_support import closest_pair
    from creditaudit.figures.common import FALLBACK_COLORS, method_color, method_marker
    from creditaudit.methods import rule_names

    names = rule_names()
    assert len(names) >= 13
    colors = [method_color(name).upper() for name in names]
    assert len(set(colors)) == len(names), dict(zip(names, colors))
    assert len({method_marker(name) for name in names}) == len(names)
    distance, vision, a, b = closest_pair(colors)
    assert distance >= 10, f"{a} and {b} look alike in {vision} (ΔE {distance:.1f})"
    # Every fallback colour stays apart from every built-in's and every other fallback's.
    distance, vision, a, b = closest_pair([*colors, *FALLBACK_COLORS])
    assert len(FALLBACK_COLORS) >= 8 and distance >= 10, (a, b, vision)


@pytest.fixture
def dfa_variant():
    """A DFA subclass that declares no style of its own, registered as a plugin would be."""
    from creditaudit.methods import DFA
    from creditaudit.registry import RULES, Origin

    class QuietDFA(DFA):
        name = "quiet-dfa"
        label = "Quiet DFA"

    RULES.names()  # the built-ins and installed plugins first
    RULES._plugins[QuietDFA.name] = RULES.validate(QuietDFA, "test")
    RULES._origins[QuietDFA.name] = Origin(builtin=False, distribution="tests")
    yield QuietDFA
    del RULES._plugins[QuietDFA.name], RULES._origins[QuietDFA.name]


def test_a_rule_without_its_own_style_gets_one_no_built_in_has(dfa_variant):
    from colour_support import closest_pair
    from creditaudit.figures.common import method_color, method_marker
    from creditaudit.methods import rule_class, rule_names
    from creditaudit.results import method_rank

    builtins = [name for name in rule_names() if name != dfa_variant.name]
    colors = {method_color(name).upper() for name in builtins}
    markers = {method_marker(name) for name in builtins}
    assert dfa_variant.color == rule_class("dfa").color  # inherited as a class attribute …
    color, marker = method_color(dfa_variant.name), method_marker(dfa_variant.name)
    assert color.upper() not in colors and marker not in markers  # … but never drawn with
    distance, vision, a, b = closest_pair([*colors, color])
    assert distance >= 10, f"{a} and {b} look alike in {vision}"
    # A record of a rule not installed here gets a fallback style too, the same every time.
    assert method_color("gone-rule") not in colors and method_marker("gone-rule") not in markers
    assert (method_color("gone-rule"), method_marker("gone-rule")) == (
        method_color("gone-rule"), method_marker("gone-rule"))
    # Listed as a rule of its own, not beside DFA (whose rank it inherits).
    assert method_rank(dfa_variant.name)[0] != method_rank("dfa")[0]


def test_a_fallback_style_avoids_one_a_plugin_declares(dfa_variant):
    """A plugin that declares a fallback colour and marker as its own keeps them to itself:
    a rule without a style of its own then gets another."""
    from creditaudit.figures.common import method_color, method_marker
    from creditaudit.methods import DFA
    from creditaudit.registry import RULES, Origin

    color, marker = method_color(dfa_variant.name), method_marker(dfa_variant.name)

    class Styled(DFA):
        name = "styled-dfa"
        label = "Styled DFA"

    Styled.color, Styled.marker = color, marker
    RULES._plugins[Styled.name] = RULES.validate(Styled, "test")
    RULES._origins[Styled.name] = Origin(builtin=False, distribution="tests")
    try:
        assert (method_color(Styled.name), method_marker(Styled.name)) == (color, marker)
        assert method_color(dfa_variant.name) != color
        assert method_marker(dfa_variant.name) != marker
    finally:
        del RULES._plugins[Styled.name], RULES._origins[Styled.name]


def test_hero_draws_each_method_in_a_colour_and_marker_of_its_own(index):
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D

    from colour_support import closest_pair

    fig = hero.build(index)[hero.NAME]
    found = fig.findobj(lambda a: isinstance(a, Line2D)
                        and (a.get_gid() or "").startswith("point:"))
    first = {a.get_gid(): a for a in reversed(found)}  # the data line, not its caps
    points = list(first.values())
    methods = [gid.split(":", 1)[1] for gid in first]
    assert {"bp", "fa", "dfa", "kp", "state-bridge", "credit-bridge", "fa-linear"} <= set(methods)
    colors = [to_hex(p.get_color()) for p in points]
    assert len({p.get_marker() for p in points}) == len(points)
    distance, vision, a, b = closest_pair(colors)
    assert distance >= 10, f"{a} and {b} look alike in {vision} in Figure 1"
