"""Figure 8, per-run curves: every run's training as its record logged it, for any rule,
architecture and dataset.

One row per recipe (runs that share data, model, optimiser and precision), three columns per
epoch — test accuracy, ‖h_L‖ (log) and ‖g_L‖ (log, with the 1e-7 floor of diagnostic (b)) —
and one line per run, coloured by its rule (λ in the label), so a plugin's runs, a control
variant's and a built-in's are drawn alike; the runs of one rule and λ differ in line style
(and past four of them in marker too), and each row's legend names every line's run.
Nothing is averaged: a seed that diverged stops where its record stops; an epoch drawn with
no finite neighbour (a run that diverged in its first epoch keeps only epoch 0) is marked, as
a line through one point draws nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from matplotlib.figure import Figure

from creditaudit.figures.common import (
    G_L_TITLE,
    H_L_TITLE,
    add_grid,
    floor_line,
    integer_x,
    legend_right,
    literal,
    log_panel_note,
    log_scale,
    method_color,
    new_figure,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import MissingRuns, describe_recipe, setting_difference
from creditaudit.records import RunRecord
from creditaudit.results import RunIndex, diverged_in_text, seed_text

NAME = "fig8_run_curves"
TITLE = "Figure 8 — per-run curves"
requirements = ("any completed or diverged run that logged at least one epoch — every rule, "
                "architecture and dataset, control variants included; each recipe becomes a "
                "row, each run a line.")
COLUMNS = (("acc_eval", "test accuracy"), ("h_L_norm", H_L_TITLE),
           ("g_L_norm", G_L_TITLE))
LINESTYLES = ("-", "--", ":", "-.")  # the seeds of one rule and λ, in seed order
# Past four runs of one rule and λ in a row, each line style again with a marker on every point.
MARKERS = (None, "s", "^", "v", "D", "x")
# (line style, marker) of the n-th run of one rule and λ in a row: all distinct up to this many.
STYLES = tuple((ls, marker) for marker in MARKERS for ls in LINESTYLES)


def logged(run: RunRecord) -> bool:
    """Whether the run's record holds a test accuracy for at least one epoch."""
    epochs, _ = run.series("acc_eval")
    return bool(epochs)


def select(index: RunIndex) -> dict[str, list[RunRecord]]:
    """{recipe description: its runs that logged an epoch}, recipes in the index's order;
    recipes that read alike are numbered, each after the first saying how it differs from
    it (:func:`row_labels`)."""
    groups = [runs for group in index.recipes(index.select(standard=None)).values()
              if (runs := [r for r in group if logged(r)])]
    if not groups:
        finished = len(index.runs)
        why = ("the results folder holds no completed or diverged run records" if not finished
               else f"none of the {finished} completed or diverged runs here logged an epoch")
        raise MissingRuns(TITLE, [f"runs that logged at least one epoch (optim.epochs ≥ 1) "
                                  f"— {why}"])
    return dict(zip(row_labels([runs[0] for runs in groups]), groups, strict=True))


def row_labels(firsts: list[RunRecord]) -> list[str]:
    """The row label of each recipe (``firsts``: one run of each): its description
    (:func:`describe_recipe`); where several read alike (they differ in a setting the
    description leaves out: a learning rate, the data's content, the trainable blocks),
    ``… (recipe 1)``, ``… (recipe 2: differs from recipe 1 in optim.lr: 1.0 vs 0.001)``."""
    labels = [describe_recipe(run) for run in firsts]
    out = []
    for i, (label, run) in enumerate(zip(labels, firsts)):
        alike = [j for j, other in enumerate(labels) if other == label]
        if len(alike) == 1:
            out.append(label)
            continue
        n, first = alike.index(i) + 1, firsts[alike[0]]
        if n == 1:
            out.append(f"{label} (recipe 1)")
            continue
        differs = setting_difference(run, first)
        out.append(f"{label} (recipe {n}: differs from recipe 1 in {differs})")
    return out


def line_labels(runs: list[RunRecord]) -> dict[int, str]:
    """The legend text of each of one row's ``runs`` (by ``id``): ``FA seed 2``; where two
    runs of the row would read alike (a rule's other options, a plugin's other code), each
    with its run id; a diverged run's says so (``DFA seed 1, diverged in epoch 3``): its
    line stops early, or is a dot at epoch 0, for that reason."""
    texts = [f"{rule_text(run.method, run.penalty)} seed {literal(seed_text(run))}"
             for run in runs]
    counts = Counter(texts)
    labels = {}
    for run, text in zip(runs, texts, strict=True):
        label = text if counts[text] == 1 else f"{text} ({literal(run.run_id)})"
        diverged = diverged_in_text(run)
        labels[id(run)] = f"{label}, {diverged}" if diverged else label
    return labels


def lone_points(values: list[float]) -> list[int]:
    """Indices of the finite ``values`` whose neighbours in the series are not finite or
    absent: a line draws nothing there, so they get a marker."""
    finite = [math.isfinite(v) for v in values]
    return [i for i, ok in enumerate(finite)
            if ok and not (i > 0 and finite[i - 1]) and not (i + 1 < len(finite) and finite[i + 1])]


def build(index: RunIndex) -> dict[str, Figure]:
    rows = select(index)
    fig, axes = new_figure(len(rows), len(COLUMNS), figsize=(10.5, 2.8 * len(rows) + 0.8))
    fig.subplots_adjust(wspace=0.35, hspace=0.75)
    for row, (label, runs) in enumerate(rows.items()):
        # Runs of one rule and λ (seeds; settings of the rule) differ in line style.
        kin: dict[tuple[str, float], list[RunRecord]] = {}
        for run in runs:
            kin.setdefault((run.method, run.penalty), []).append(run)
        labels = line_labels(runs)
        for col, (key, title) in enumerate(COLUMNS):
            ax = axes[row, col]
            for run in runs:
                order = kin[(run.method, run.penalty)].index(run)
                epochs, values = run.series(key)
                ls, marker = STYLES[order % len(STYLES)]
                ax.plot(epochs, values, color=method_color(run.method), lw=1.3, ls=ls,
                        marker=marker or "o", ms=3,
                        markevery=None if marker else lone_points(values),
                        label=labels[id(run)], gid=f"{row}:{key}:{run.run_id}")
            if key != "acc_eval":
                log_scale(ax)
                log_panel_note(ax, runs, key)
            if key == "g_L_norm":
                floor_line(ax)
            ax.set_title(title, fontsize=9)
            if row == len(rows) - 1:
                ax.set_xlabel("epoch")
            if col == 0:  # the recipe, above its row
                ax.annotate(literal(label), xy=(0.0, 1.2), xycoords="axes fraction", fontsize=9,
                            ha="left", va="bottom", fontweight="bold")
            integer_x(ax)
            add_grid(ax, log_scale=key != "acc_eval")
        # Each row's runs named beside it: a style means another run in every row.
        legend_right(axes[row, -1])
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select"]
