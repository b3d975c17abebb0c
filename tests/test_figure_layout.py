"""Figures people can read: no legend over data, plain log ticks over narrow ranges, and an
empty panel that says which runs would fill it.

Every figure is built from tiny real runs (tests/figure_support.py) and inspected through
its matplotlib artists after a draw, in display coordinates.
"""

from __future__ import annotations

import contextlib
import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from creditaudit.config import RunConfig
from creditaudit.figures import FIGURES, MissingRuns, RunIndex, audit_panels
from creditaudit.figures.common import has_data, log_scale, new_figure, plain_number
from creditaudit.run.trainer import train
from creditaudit.study.figures import hero, summary
from figure_support import SMOKE


def built(index: RunIndex) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    for module in FIGURES:
        with contextlib.suppress(MissingRuns):  # figures whose runs are not there
            figures.update(module.build(index))
    for fig in figures.values():
        fig.canvas.draw()
    return figures


@pytest.fixture(scope="module")
def figures(figure_results):
    drawn = built(RunIndex.from_dir(figure_results))
    yield drawn
    for fig in drawn.values():
        plt.close(fig)


def data_points(ax) -> np.ndarray:
    """Display coordinates of everything measured in ``ax``: line vertices and 20 points
    along every segment, scatter points, and the corners and centre of every bar."""
    points = []
    for line in ax.get_lines():
        xy = np.column_stack([np.asarray(line.get_xdata(), float),
                              np.asarray(line.get_ydata(), float)])
        xy = xy[np.isfinite(xy).all(axis=1)]
        if not len(xy):
            continue
        shown = line.get_transform().transform(xy)
        for a, b in itertools.pairwise(shown) if line.get_linestyle() != "None" else ():
            points.extend(a + (b - a) * t for t in np.linspace(0, 1, 20))
        points.extend(shown)
    for collection in ax.collections:
        offsets = np.asarray(collection.get_offsets(), float)
        if len(offsets) and collection.get_offset_transform() is not None:
            points.extend(collection.get_offset_transform().transform(offsets))
    for patch in ax.patches:
        box = patch.get_window_extent()
        if np.isfinite(box.bounds).all() and box.width > 0:
            points.extend([(box.x0, box.y1), (box.x1, box.y1), ((box.x0 + box.x1) / 2,
                                                                 (box.y0 + box.y1) / 2)])
    return np.asarray(points, float).reshape(-1, 2)


def legends(fig: Figure) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def test_no_legend_covers_a_plotted_point_or_line(figures):
    for name, fig in figures.items():
        boxes = [legend.get_window_extent() for legend in legends(fig)]
        for ax in fig.axes:
            points = data_points(ax)
            for box in boxes:
                inside = [p for p in points if Bbox.contains(box, *p)]
                assert not inside, f"{name}: the legend at {box.bounds} covers {len(inside)} " \
                                   f"plotted points of '{ax.get_title()}'"


def visible_tick_labels(ax, axis: str) -> list[str]:
    target = ax.yaxis if axis == "y" else ax.xaxis
    low, high = sorted(target.get_view_interval())
    ticks = [*target.get_major_ticks(), *target.get_minor_ticks()]
    return [label.get_text() for tick in ticks for label in (tick.label1, tick.label2)
            if label.get_visible() and label.get_text() and low <= tick.get_loc() <= high]


def test_log_axes_over_narrow_ranges_are_labelled_with_plain_numbers(figures):
    """No "3.25×10⁰": over less than two decades every label is a number as written."""
    narrow = 0
    for name, fig in figures.items():
        for ax in fig.axes:
            for axis in ("x", "y"):
                if (ax.get_yscale() if axis == "y" else ax.get_xscale()) != "log":
                    continue
                labels = visible_tick_labels(ax, axis)
                assert labels, f"{name} '{ax.get_title()}': a log axis without tick labels"
                assert not any("times" in label for label in labels), (name, labels)
                low, high = sorted(abs(v) for v in (ax.yaxis if axis == "y" else ax.xaxis)
                                   .get_view_interval())
                if np.log10(high / low) < 2:
                    narrow += 1
                    for label in labels:
                        float(label)  # "2.3", "0.0005", "2.5e-8": no mathtext, no ×10ⁿ
    assert narrow, "the tiny runs should give at least one narrow log axis (‖h_L‖ ≈ 2.3)"


@pytest.mark.parametrize(("values", "expected"), [
    ((2.25, 2.31), ["2.26", "2.28", "2.3"]),
    ((0.5, 0.9), ["0.5", "0.6", "0.7", "0.8", "0.9"]),
    ((1e-8, 3.5e-8), ["1e-8", "2e-8", "3e-8"]),
    # ‖h_L‖ of a one-epoch run: four digits wrote several ticks 2.213 and 2.214
    ((2.2130, 2.2142), ["2.2132", "2.2136", "2.214"]),
])
def test_readable_log_formatter_on_narrow_ranges(values, expected):
    fig, axes = new_figure(1, 1, figsize=(3, 3))
    ax = axes[0, 0]
    ax.plot([0, 1], values)
    log_scale(ax)
    ax.set_ylim(*values)
    fig.canvas.draw()
    labels = visible_tick_labels(ax, "y")
    plt.close(fig)
    assert set(expected) <= set(labels), labels
    assert len(set(labels)) == len(labels), labels  # no two ticks read alike


def test_wide_log_ranges_keep_powers_of_ten():
    fig, axes = new_figure(1, 1, figsize=(3, 3))
    ax = axes[0, 0]
    ax.plot([0, 1], [1e-8, 1e-2])
    log_scale(ax)
    fig.canvas.draw()
    labels = visible_tick_labels(ax, "y")
    plt.close(fig)
    assert "$\\mathdefault{10^{-5}}$" in labels and all("times" not in s for s in labels)
    assert plain_number(2.5e-8) == "2.5e-8" and plain_number(1500.0) == "1500"


# --- empty panels -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bare(bare_index):
    drawn = built(bare_index)
    yield drawn
    for fig in drawn.values():
        plt.close(fig)


@pytest.fixture(scope="module")
def bare_index(tmp_path_factory) -> RunIndex:
    """Runs without end-of-run metrics and with too few evaluation samples for (c)."""
    out = tmp_path_factory.mktemp("bare_runs")
    for method in ("bp", "fa", "dfa", "state-bridge", "credit-bridge"):
        train(RunConfig().replace(**{**SMOKE, "diagnostics.end_of_run": False,
                                     "diagnostics.eval_samples": 256, "optim.epochs": 1,
                                     "method.name": method, "run.out_dir": str(out)}))
    return RunIndex.from_dir(out)


def notes(ax) -> list[str]:
    return [t.get_text().replace("\n", " ") for t in ax.texts if t.get_gid() == "empty_note"]


def test_every_panel_shows_data_or_says_what_would_fill_it(figures, bare):
    for name, fig in [*figures.items(), *bare.items()]:
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>" or not ax.get_visible():
                continue
            twin = any(other is not ax and other.bbox.bounds == ax.bbox.bounds
                       and has_data(other) for other in fig.axes)
            assert has_data(ax) or notes(ax) or twin, \
                f"{name} '{ax.get_title()}' is empty and does not say why"


def test_empty_panels_name_the_missing_runs(figures, bare):
    for ax in bare["fig5b_per_layer"].axes:
        assert any("diagnostics.end_of_run" in n for n in notes(ax)), ax.get_title()
    assert any("diagnostics.end_of_run" in n for n in notes(bare["fig5c_drift"].axes[0]))
    # Figure 1 leaves out the panel no run fills, and says why under it.
    assert [ax.get_title(loc="left")[:3] for ax in bare[hero.NAME].axes] == ["(A)", "(C)"]
    left_out = [t.get_text() for t in bare[hero.NAME].texts if t.get_gid() == "left_out"]
    assert len(left_out) == 1 and "(B) per-layer cosine" in left_out[0]
    assert "diagnostics.end_of_run" in left_out[0]
    assert [ax.get_title(loc="left")[:3] for ax in figures[hero.NAME].axes] == [
        "(A)", "(B)", "(C)"]
    panels = {ax.get_title()[:3]: ax for ax in bare[audit_panels.NAME].axes}
    assert any("eval_samples ≥ 1024" in n for n in notes(panels["(c)"]))
    assert any("--method frozen" in n for n in notes(panels["(d)"]))
    full = {ax.get_title()[:3]: ax for ax in figures[audit_panels.NAME].axes}
    assert not notes(full["(a)"]) and not notes(full["(c)"])  # panels with data: no note
    assert summary.NAMES[1] in bare


def test_an_epoch_axis_of_one_epoch_has_integer_ticks():
    """A row whose runs all diverged in their first epoch holds only epoch 0: its epoch
    axis was labelled −0.045, −0.030, … 0.045, epochs no run has."""
    from creditaudit.figures.common import integer_x

    fig, axes = new_figure(1, 1, figsize=(3, 3))
    ax = axes[0, 0]
    ax.plot([0], [0.1], "o")
    integer_x(ax)
    fig.canvas.draw()
    labels = visible_tick_labels(ax, "x")
    plt.close(fig)
    assert labels and all(float(label.replace("−", "-")).is_integer() for label in labels), \
        labels


def test_final_accuracy_bar_labels_stay_inside_their_axes(figures):
    """Figure 5e writes each bar's mean above its error bar: the highest label sat above
    the axes, across the title (a folder of smoke runs: EP's 15.6% over its title)."""
    fig = figures["fig5e_final_accuracy"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    box = ax.get_window_extent(renderer)
    labels = [t for t in ax.texts if t.get_text().endswith("%")]  # the bars' means
    assert labels
    for label in labels:
        extent = label.get_window_extent(renderer)
        assert extent.y1 <= box.y1 and extent.y0 >= box.y0, label.get_text()


def test_no_two_panel_titles_overlap(figures):
    """Figure 2's column titles ran into each other on a real folder's grid: "median ‖h_L‖
    (residual norm)" was cut by "median ‖g_L‖ (BP gradient at h_L, 1/128 scale)" beside it,
    each title wider than its panel."""
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()
        titles = [(ax.title.get_text(), ax.title.get_window_extent(renderer))
                  for ax in fig.axes if ax.title.get_text()]
        for (a, box_a), (b, box_b) in itertools.combinations(titles, 2):
            assert not box_a.overlaps(box_b), f"{name}: the titles '{a}' and '{b}' overlap"
