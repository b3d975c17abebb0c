"""Figure 7, weight alignment of the per-layer feedback rules.

One column per rule (and penalty) whose records carry per-layer feedback alignment
(fa-linear, usf, brsf, frsf, kp): (top) the angle between each layer's feedback matrix B and
its forward weight W in degrees — Lillicrap et al.'s angle between B and Wᵀ, BioTorch's
layer alignment; 90° = unrelated, 0° = B ∝ W — and (bottom) ‖B‖/‖W‖ on a log axis, per
epoch, one line per layer (mean across seeds, ± std band), coloured from the first layer
(light) to the head (dark).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from creditaudit.figures.common import (
    add_grid,
    integer_x,
    legend_right,
    literal,
    log_scale,
    mean_line,
    new_figure,
    notes_below,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import (
    MissingRuns,
    choose_group,
    epoch_mean_std,
    other_options_note,
    seed_runs,
)
from creditaudit.records import RunRecord
from creditaudit.results import RunIndex, sort_methods

NAME = "fig7_weight_alignment"
TITLE = "Figure 7 — weight alignment of per-layer feedback"
requirements = ("runs of a rule whose feedback stands in for each Linear's weight "
                "(fa-linear, usf, brsf, frsf or kp), ≥ 1 seed; every such rule and penalty of "
                "one recipe becomes a column.")
NEED = ("runs of a per-layer feedback rule (--method fa-linear, usf, brsf, frsf or kp) "
        "whose records hold feedback_angle")


def has_alignment(run: RunRecord) -> bool:
    return run.last_value("feedback_angle") is not None


def _missing(group: list[RunRecord]) -> list[str]:
    return [] if any(has_alignment(r) for r in group) else [NEED]


def _candidates(index: RunIndex) -> list[RunRecord]:
    """The runs the figure chooses its recipe from: any run of such a rule, on any model (a
    plain MLP without skips too), control variants included: the alignment of its feedback
    with its weights is the run's own, whatever the recipe is a variant of."""
    return index.select(standard=None)


def select(index: RunIndex) -> dict[tuple[str, float], list[RunRecord]]:
    """{(method, penalty): one run per seed} of the rules with alignment records."""
    group = choose_group(index, TITLE, _missing,
                         prefer=lambda g: (len({r.method for r in g if has_alignment(r)}),
                                           g[0].epochs, len(g)),
                         runs=_candidates(index))
    aligned = [r for r in group if has_alignment(r)]
    columns = {}
    for method in sort_methods(r.method for r in aligned):
        for penalty in sorted({r.penalty for r in aligned if r.method == method}):
            columns[(method, penalty)] = seed_runs(aligned, method, penalty)
    return columns


def layer_names(runs: list[RunRecord]) -> list[str]:
    names = runs[0].last_value("feedback_layers")
    if not isinstance(names, list) or not names:
        raise MissingRuns(TITLE, [f"{NEED} (feedback_layers is missing)"])
    return [str(n) for n in names]


def build(index: RunIndex) -> dict[str, Figure]:
    columns = select(index)
    fig, axes = new_figure(2, len(columns), figsize=(3.4 * len(columns) + 0.8, 5.4),
                           sharex="col")
    fig.subplots_adjust(wspace=0.35, hspace=0.12)
    cmap = colormaps["viridis_r"]
    for col, ((method, penalty), runs) in enumerate(columns.items()):
        names = layer_names(runs)
        shades = cmap(np.linspace(0.15, 0.95, len(names)))
        top, bottom = axes[0, col], axes[1, col]
        for layer, (name, color) in enumerate(zip(names, shades)):
            for ax, key, tag in ((top, "feedback_angle", "angle"),
                                 (bottom, "feedback_norm_ratio", "ratio")):
                epochs, mean, std = epoch_mean_std(runs, key, layer)
                mean_line(ax, epochs, mean, std, label=literal(name), color=color, lw=1.2,
                          gid=f"{tag}:{method}:{penalty:g}:{name}")
        top.axhline(90.0, color="black", ls=":", lw=0.8, gid=f"unrelated:{method}")
        top.set_title(rule_text(method, penalty))
        top.set_ylim(0.0, 180.0)
        top.set_yticks([0, 45, 90, 135, 180])
        log_scale(bottom)
        bottom.set_xlabel("epoch")
        for ax in (top, bottom):
            integer_x(ax)
            add_grid(ax, log_scale=ax is bottom)
        if col == 0:
            top.set_ylabel(r"$\angle(B, W)$ (degrees)")
            bottom.set_ylabel(r"$\|B\| / \|W\|$")
    legend_right(axes[0, -1], title="layer", title_fontsize=7)
    other = other_options_note(index, (run for runs in columns.values() for run in runs),
                               among=_candidates(index))
    if other:
        notes_below(fig, list(axes.flat), {"other_options": other})
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select"]
