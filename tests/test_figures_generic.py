"""The generic figures draw any rule, model and dataset — per-run curves (Figure 8) every
run, control variants included — and a paper figure that cannot draw says which runs it
needs and why the folder's runs are not those, never that the folder is empty when it is
not. (tests/test_outside_plugins.py draws them on a folder of plugin runs.)"""

from __future__ import annotations

import numpy as np
import pytest

from creditaudit.config import RunConfig
from creditaudit.figures import (
    MissingRuns,
    audit_panels,
    render_all,
    run_curves,
    weight_alignment,
)
from creditaudit.figures.runs import other_options_note
from creditaudit.records import EpochEntry, EpochMeasures, RunRecord
from creditaudit.results import RunIndex
from creditaudit.run.trainer import train
from creditaudit.study.figures import hero, lambda_sweep, penalty, summary, temporal
from figure_support import collapse_g_l_norms

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 128, "data.n_test": 128, "data.in_dim": 6, "model.d": 8,
        "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 64, "diagnostics.end_of_run": False,
        "run.progress": False, "run.threads": 1}
NOT_EMPTY = "holds no completed or diverged run records"


def control(method: str = "bp", **settings) -> RunRecord:
    """A completed record of a control variant (a model without skips)."""
    config = RunConfig().replace(**{"method.name": method, "model.residual": False,
                                    **settings})
    return RunRecord(config=config, status="completed")


@pytest.mark.parametrize("figure", [hero, penalty, lambda_sweep, summary])
def test_a_paper_figure_says_which_runs_it_needs_and_why_these_are_not_them(figure):
    with pytest.raises(MissingRuns) as err:
        figure.build(RunIndex.from_records([control(), control("dfa")]))
    text = str(err.value)
    assert NOT_EMPTY not in text
    assert "DFA runs" in text or "BP runs" in text  # what it needs, by rule
    assert text.endswith("— the 2 completed or diverged runs here are all control variants "
                         "(depth ladder, random labels or no residual stream), which it does "
                         "not compare")
    with pytest.raises(MissingRuns) as err:
        figure.build(RunIndex.from_records([control()]))
    assert "the one completed or diverged run here is a control variant" in str(err.value)
    with pytest.raises(MissingRuns, match=NOT_EMPTY):  # and an empty folder says so
        figure.build(RunIndex.from_records([]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A BP run, a DFA run with λ and a control variant (BP without skips), one seed each,
    plus a second DFA seed: tiny, two epochs."""
    out = tmp_path_factory.mktemp("generic")
    settings = [{"method.name": "bp"}, {"method.name": "dfa", "method.penalty": 0.01},
                {"method.name": "dfa", "method.penalty": 0.01, "run.seed": 7},
                {"method.name": "bp", "model.residual": False}]
    for extra in settings:
        train(RunConfig().replace(**{**TINY, "run.out_dir": str(out), **extra}))
    return RunIndex.from_dir(out)


def test_per_run_curves_draw_every_run_as_its_record_logged_it(runs):
    assert len(runs.runs) == 4
    fig = run_curves.build(runs)[run_curves.NAME]
    rows = run_curves.select(runs)
    assert len(rows) == 2  # the control variant is a recipe of its own, drawn too
    drawn = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
             if line.get_gid() and line.get_gid().count(":") == 2}
    for row, group in enumerate(rows.values()):
        for run in group:
            for key, _ in run_curves.COLUMNS:
                line = drawn.pop(f"{row}:{key}:{run.run_id}")
                epochs, values = run.series(key)
                assert epochs == list(range(3))  # epochs 0 (init), 1, 2
                np.testing.assert_array_equal(line.get_xdata(), epochs)
                np.testing.assert_array_equal(line.get_ydata(), values)
    assert not drawn
    # The two DFA seeds of one recipe differ in line style, not in colour.
    dfa = [line for gid, line in _lines(fig, "acc_eval") if "dfa" in gid]
    assert len({line.get_color() for line in dfa}) == 1
    assert len({line.get_linestyle() for line in dfa}) == 2


def test_norm_curves_name_the_statistic_and_scale_they_draw(runs):
    """Figures 2 and 8 drew the records' median ‖g_L‖ (1/128 scale) under a bare
    "‖g_L‖₂ (BP gradient at h_L)", while Figures 1 and 6 and every table name the same
    numbers "median ‖g_L‖ (1/128 scale)": read as raw per-sample gradients they are 128×
    too small. Every panel of those numbers now says median and, for ‖g_L‖, the scale."""
    fig = run_curves.build(runs)[run_curves.NAME]
    titles = {ax.get_title() for ax in fig.axes}
    assert r"median $\|g_L\|$ (BP gradient at $h_L$, 1/128 scale)" in titles
    assert r"median $\|h_L\|$ (residual norm)" in titles
    assert dict(temporal.COLUMNS) == {key: title for key, title in run_curves.COLUMNS
                                      if key != "acc_eval"} | {"acc_eval": "test accuracy"}


def _lines(fig, key):
    return [(line.get_gid(), line) for ax in fig.axes for line in ax.get_lines()
            if (line.get_gid() or "").split(":")[1:2] == [key]]


def test_per_run_curves_need_a_logged_epoch():
    with pytest.raises(MissingRuns, match="runs that logged at least one epoch"):
        run_curves.build(RunIndex.from_records([control()]))


def test_render_all_draws_the_generic_figures_of_any_folder(runs, tmp_path):
    rendered, missing = render_all(runs, tmp_path)
    assert {r.name for r in rendered} >= {"fig6_audit_panels", run_curves.NAME}
    assert all(NOT_EMPTY not in str(err) for _, err in missing)
    assert any(m is weight_alignment for m, _ in missing)  # no per-layer feedback rule


def _run(method: str, seed: int, **settings) -> RunRecord:
    config = RunConfig().replace(**{"method.name": method, "run.seed": seed, **settings})
    return RunRecord(config=config, status="completed")


def test_a_figure_never_averages_seeds_of_a_rule_run_with_other_options():
    # DFA seed 1 with the default feedback scale; seeds 1 and 2 with another: one recipe.
    default = _run("dfa", 1)
    scaled = [_run("dfa", seed, **{"method.feedback_scale": 100.0}) for seed in (1, 2)]
    others = [_run("bp", 1), _run("fa", 1)]
    index = RunIndex.from_records([default, *scaled, *others])
    assert len(index.recipes()) == 1
    drawn = hero.select(index)["dfa"]
    assert [run.seed for run in drawn] == [1, 2]
    assert all(run.config.method.feedback_scale == 100.0 for run in drawn)
    # and the run left out is named under the figure
    fig = hero.build(index)[hero.NAME]
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "other_options")
    assert "DFA seed 1 (method.feedback_scale 1.0 where the drawn runs have 100.0)" in \
        note.replace("\n", " ")


@pytest.mark.parametrize("figure", [hero, summary])
def test_a_paper_figure_says_which_of_recipes_that_read_alike_it_drew(figure):
    """Two complete recipes that differ only in the learning rate: the title
    (``synthetic, ResMLP d=256 L=4, … epochs``) reads the same for both, and nothing said
    which one the figure drew."""
    methods = ("bp", "fa", "dfa", "state-bridge", "credit-bridge")
    index = RunIndex.from_records([_run(m, 1, **{"optim.lr": lr})
                                   for lr in (1e-3, 1e-2) for m in methods])
    assert len(index.recipes()) == 2
    fig = figure.build(index)[hero.NAME if figure is hero else summary.NAMES[0]]
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "other_options")
    assert "Drawn: one of 2 recipes here that read 'synthetic" in note.replace("\n", " ")
    assert "the other differs from it in optim.lr: 0.001 vs 0.01 (drawn vs not drawn)" in \
        note.replace("\n", " ")


def test_recipes_that_differ_alike_from_the_drawn_one_are_counted_not_repeated():
    """A sweep's recipes that read alike may differ from the drawn one in the same first
    setting: it was written once per recipe ("the data; the data; …")."""
    methods = ("bp", "fa", "dfa")
    settings = [{"optim.lr": 1e-3}, {"optim.lr": 1e-2},
                {"optim.lr": 1e-2, "optim.weight_decay": 0.5}]
    index = RunIndex.from_records([_run(m, 1, **given) for given in settings
                                   for m in methods])
    fig = hero.build(index)[hero.NAME]
    note = next(t.get_text() for t in fig.texts
                if t.get_gid() == "other_options").replace("\n", " ")
    assert "Drawn: one of 3 recipes here" in note
    assert note.count("optim.lr:") == 1 and "(2 recipes)" in note, note


def _aligned(method: str, **settings) -> RunRecord:
    """A completed per-layer feedback run whose record holds two epochs of alignment."""
    run = _run(method, 1, **settings)
    run.log = [EpochEntry(epoch=epoch, measures=EpochMeasures(
        hidden_norms=[1.0], bp_grad_norms_per_sample_med=[0.1], g_L_zero_fraction=0.0,
        g_L_nonzero_median=0.1, cos_per_layer=[1.0], feedback_layers=["a", "b"],
        feedback_angle=[40.0, 50.0], feedback_norm_ratio=[1.0, 1.0])) for epoch in (0, 1)]
    return run


@pytest.mark.parametrize("drawn", ["standard", "control"])
@pytest.mark.parametrize(("key", "value", "standard"), [("data.random_targets", True, False),
                                                        ("method.trainable_blocks", 1,
                                                         "every block")])
def test_figure_7_names_a_control_variant_whose_title_reads_as_its_recipe(
        drawn, key, value, standard):
    """Figure 7 draws control variants too (random labels, a depth-ladder step), whose
    title reads as the standard recipe's: the note that says which of two such recipes it
    drew looked only among standard recipes, so it said nothing when the standard one was
    drawn, and 'another setting' for a depth-ladder step."""
    rules = {"standard": ("fa-linear", "kp"), "control": ("fa-linear",)}  # more rules: drawn
    if drawn == "control":
        rules = {"standard": ("fa-linear",), "control": ("fa-linear", "kp")}
    index = RunIndex.from_records([*(_aligned(m) for m in rules["standard"]),
                                   *(_aligned(m, **{key: value}) for m in rules["control"])])
    assert len(weight_alignment.select(index)) == 2
    fig = weight_alignment.build(index)[weight_alignment.NAME]
    note = " ".join(t.get_text() for t in fig.texts
                    if t.get_gid() == "other_options").replace("\n", " ")
    assert "Drawn: one of 2 recipes here that read 'synthetic" in note
    pair = (value, standard) if drawn == "control" else (standard, value)
    assert f"the other differs from it in {key}: {pair[0]} vs {pair[1]} (drawn vs not drawn)" \
        in note
    # the figures that draw standard recipes only leave the control variants unsaid
    assert other_options_note(index, [_aligned("fa-linear")]) is None


def _of_code(run: RunRecord, digest: str) -> RunRecord:
    """``run`` as a run of a plugin rule whose code has the digest ``digest``."""
    run.environment = {"components": {"method": {"name": run.method, "origin": "mine==1.0",
                                                 "code_digest": digest}}}
    return run


def test_a_figure_never_averages_seeds_of_a_rule_whose_code_changed_between_them():
    """Seed 1 of a plugin rule before its code was edited, seeds 1 and 2 after: one rule
    name and options, one recipe, yet two rules. The hero's DFA mean took one run per seed
    whatever its code (seed 1 of the old code, seed 2 of the new) and named no run left
    out; it draws the seeds of one code now, and names the other under the figure."""
    old = _of_code(_run("dfa", 1), "a" * 64)
    new = [_of_code(_run("dfa", seed), "b" * 64) for seed in (1, 2)]
    index = RunIndex.from_records([old, *new, _run("bp", 1), _run("fa", 1)])
    drawn = hero.select(index)["dfa"]
    assert [run.seed for run in drawn] == [1, 2]
    assert all(run is not old for run in drawn)
    fig = hero.build(index)[hero.NAME]
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "other_options")
    assert (f"DFA seed 1 (rule code {'a' * 12} where the drawn runs' is {'b' * 12})"
            in note.replace("\n", " "))


def test_audit_panels_draw_each_runs_own_threshold_where_runs_differ(tmp_path):
    # Two DFA seeds judged against other (a) thresholds: no point is drawn against a line
    # at the other run's threshold.
    for seed, growth in ((1, 10.0), (2, 1.01)):
        train(RunConfig().replace(**{**TINY, "optim.epochs": 1, "run.out_dir": str(tmp_path),
                                     "method.name": "dfa", "run.seed": seed,
                                     "diagnostics.a": {"growth": growth}}))
    index = RunIndex.from_dir(tmp_path)
    fig = audit_panels.build(index)[audit_panels.NAME]
    _, points = audit_panels.panel_points(audit_panels.select(index))
    marks = {ax.get_title()[:3]: line for ax in fig.axes for line in ax.get_lines()
             if (line.get_gid() or "").endswith(":threshold")}
    drawn = sorted(zip(marks["(a)"].get_xdata(), marks["(a)"].get_ydata()))
    assert drawn == sorted((p["x"], p["threshold"]) for p in points["a"])
    assert sorted(p["threshold"] for p in points["a"]) == [1.01, 10.0]
    assert list(marks["(b)"].get_ydata()) == [1e-7, 1e-7]  # shared: one line, as before


def test_runs_whose_seed_is_not_recorded_are_each_drawn():
    # Two runs of a loop of one's own not told their seed (both read the default): two
    # runs, not two copies of one seed of which a figure keeps the first.
    runs = [RunRecord(config=RunConfig().replace(**{"method.name": method}),
                      status="completed", run_id=f"{method}-{name}", not_recorded=["run.seed"])
            for method in ("bp", "fa", "dfa") for name in ("mine", "yours")]
    drawn = hero.select(RunIndex.from_records(runs))
    assert {m: [r.run_id for r in rs] for m, rs in drawn.items()} == {
        m: [f"{m}-mine", f"{m}-yours"] for m in ("bp", "fa", "dfa")}


def test_per_run_curves_say_when_a_log_panel_cannot_show_a_runs_values(runs, monkeypatch):
    # ‖g_L‖ collapsed to exactly 0 (what diagnostic (b) looks for) leaves no line on a log
    # axis: the panel says so instead of standing empty.
    collapse_g_l_norms(monkeypatch)
    fig = run_curves.build(runs)[run_curves.NAME]
    notes = [text.get_text().replace("\n", " ") for ax in fig.axes for text in ax.texts
             if text.get_gid() == "empty_note"]
    assert sorted(notes) == [f"{n} of {n} runs logged ‖g_L‖ ≤ 0 at some epoch, which a log "
                             "axis cannot show" for n in (1, 3)]  # one per recipe's row


def test_runs_of_other_rule_options_with_as_many_seeds_give_way_to_the_defaults():
    scaled = [_run("dfa", seed, **{"method.feedback_scale": 100.0}) for seed in (1, 2)]
    default = [_run("dfa", seed) for seed in (1, 2)]
    for runs in (scaled + default, default + scaled):
        drawn = hero.select(RunIndex.from_records([*runs, _run("bp", 1), _run("fa", 1)]))
        assert [r.config.method.feedback_scale for r in drawn["dfa"]] == [1.0, 1.0]


def test_per_run_curves_mark_an_epoch_no_line_can_draw():
    """A run that diverged in its first epoch keeps only epoch 0: its curve was a line
    through one point, which draws nothing (an empty row, the run's numbers of the report's
    table nowhere); such points are marked, the series drawn as before."""
    from creditaudit.records import EpochEntry

    diverged = RunRecord(config=RunConfig().replace(**{"method.name": "dfa"}),
                         status="diverged", log=[EpochEntry(epoch=0, acc_eval=0.125)])
    fig = run_curves.build(RunIndex.from_records([diverged]))[run_curves.NAME]
    (_, line), = _lines(fig, "acc_eval")
    assert list(line.get_xdata()) == [0] and list(line.get_ydata()) == [0.125]
    assert line.get_marker() not in ("None", None, "") and line.get_markevery() == [0]
    assert run_curves.lone_points([0.1, float("nan"), 0.2, 0.3, float("nan")]) == [0]
    assert run_curves.lone_points([float("nan"), 0.2, float("nan"), 0.4]) == [1, 3]


def test_per_run_curves_name_every_line_of_a_row_in_its_legend():
    """Each seed of a rule was drawn in a line style the legend did not explain (it showed
    the rule once, in the first seed's style), and a fifth seed took the first one's style
    again: two runs read as one. Each row's legend now names every line's run, and up to
    24 runs of one rule and λ are drawn in distinct styles."""
    from creditaudit.records import EpochEntry

    def logged_run(method: str, seed: int, acc: float) -> RunRecord:
        config = RunConfig().replace(**{"method.name": method, "run.seed": seed})
        return RunRecord(config=config, status="completed",
                         log=[EpochEntry(epoch=0, acc_eval=acc),
                              EpochEntry(epoch=1, acc_eval=acc + 0.1)])

    runs = [logged_run("dfa", seed, 0.1 + seed / 100) for seed in range(1, 7)]
    runs.append(logged_run("bp", 1, 0.5))
    fig = run_curves.build(RunIndex.from_records(runs))[run_curves.NAME]
    lines = [line for _, line in _lines(fig, "acc_eval")]
    assert len(lines) == 7
    looks = {(line.get_color(), line.get_linestyle(), line.get_marker()
              if line.get_markevery() is None else None) for line in lines}
    assert len(looks) == 7  # no two runs of the row drawn alike
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1  # the row's, beside it
    texts = [t.get_text() for t in legends[0].get_texts()]
    assert set(texts) == {*(f"DFA seed {s}" for s in range(1, 7)), "BP seed 1", "floor 1e-07"}
    # each legend entry is drawn as its run's line
    by_label = {line.get_label(): line for line in lines}
    for handle, text in zip(legends[0].legend_handles, texts):
        if text in by_label:
            assert (handle.get_linestyle(), handle.get_color()) == \
                (by_label[text].get_linestyle(), by_label[text].get_color())


def test_per_run_curves_say_how_recipes_that_read_alike_differ():
    """Two recipes differing only in the learning rate read alike (``synthetic, ResMLP
    d=256 L=4, 10 epochs``); the second row was ``… (recipe 2)``, which says nothing of
    which runs it holds. Each such row is numbered and says how it differs from the
    first."""
    from creditaudit.records import EpochEntry

    def logged_run(lr: float) -> RunRecord:
        config = RunConfig().replace(**{"method.name": "dfa", "optim.lr": lr})
        return RunRecord(config=config, status="completed",
                         log=[EpochEntry(epoch=0, acc_eval=0.1)])

    rows = list(run_curves.select(RunIndex.from_records([logged_run(1e-3), logged_run(0.5)])))
    base = "synthetic, ResMLP d=256 L=4, 10 epochs"
    assert rows[0] == f"{base} (recipe 1)"
    assert rows[1] in (f"{base} (recipe 2: differs from recipe 1 in optim.lr: 0.5 vs 0.001)",
                       f"{base} (recipe 2: differs from recipe 1 in optim.lr: 0.001 vs 0.5)")
