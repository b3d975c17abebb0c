"""Figure 2, the cross-architecture temporal grid.

Rows: the architectures present among ResMLP (terminal LN), ViT-Mini, ConvMixer, ResMLP
without terminal LN and StudentNet; columns: ‖h_L‖ (log), ‖g_L‖ (log, one y range shared by all
rows, with the 1e-7 floor) and test accuracy per epoch; one line per method (mean across
seeds, ± std band).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from creditaudit.figures.common import (
    ARCH_LABELS,
    ARCH_ROWS,
    FLOOR,
    G_L_TITLE,
    H_L_TITLE,
    add_grid,
    floor_line,
    integer_x,
    legend_below,
    log_panel_note,
    log_scale,
    mean_line,
    method_color,
    new_figure,
    notes_below,
    positive,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import (
    MissingRuns,
    choose_group,
    epoch_mean_std,
    need_methods,
    other_options_note,
    seed_runs,
)
from creditaudit.records import RunRecord
from creditaudit.results import RunIndex, sort_methods

NAME = "fig2_temporal"
TITLE = "Figure 2 — cross-architecture temporal grid"
requirements = ("for at least one architecture among ResMLP, ViT-Mini (--arch vit), "
                "ConvMixer (--arch convmixer), ResMLP with --no-out-ln and StudentNet "
                "(--arch student): BP, FA and DFA runs without "
                "penalty of one recipe, ≥ 1 seed each. Each architecture that has them "
                "becomes a row.")
REQUIRED = (("bp", 0.0, "BP runs (λ = 0)"), ("fa", 0.0, "FA runs (λ = 0)"),
            ("dfa", 0.0, "DFA runs (λ = 0)"))
COLUMNS = (("h_L_norm", H_L_TITLE),
           ("g_L_norm", G_L_TITLE),
           ("acc_eval", "test accuracy"))


def select(index: RunIndex) -> dict[str, dict[str, list[RunRecord]]]:
    """{architecture row: {method: one run per seed}} for every architecture with runs."""
    rows: dict[str, dict[str, list[RunRecord]]] = {}
    missing: list[str] = []
    for label in ARCH_ROWS:
        runs = index.select(arch_label=label)
        if not runs:
            missing.append(f"{ARCH_LABELS[label]}: no runs")
            continue
        try:
            group = choose_group(index, TITLE, lambda g: need_methods(g, REQUIRED), runs=runs)
        except MissingRuns as err:
            missing.append(f"{ARCH_LABELS[label]}: " + "; ".join(err.needs))
            continue
        methods = sort_methods(r.method for r in group
                               if r.penalty == 0 and r.method != "frozen")
        rows[label] = {m: seed_runs(group, m) for m in methods}
    if not rows:
        raise MissingRuns(TITLE, ["BP, FA and DFA runs (λ = 0) of one architecture — "
                                  + " | ".join(missing)])
    return rows


def build(index: RunIndex) -> dict[str, Figure]:
    rows = select(index)
    fig, axes = new_figure(len(rows), 3, figsize=(10.5, 2.5 * len(rows) + 0.6))
    fig.subplots_adjust(wspace=0.35, hspace=0.45)
    g_values: list[float] = []
    for row, (label, methods) in enumerate(rows.items()):
        for col, (key, title) in enumerate(COLUMNS):
            ax = axes[row, col]
            for method, runs in methods.items():
                epochs, mean, std = epoch_mean_std(runs, key)
                mean_line(ax, epochs, mean, std, label=rule_text(method),
                          color=method_color(method), lw=1.5, gid=f"{label}:{key}:{method}")
                if key == "g_L_norm":
                    g_values.extend(positive(mean))
            if key != "acc_eval":
                log_scale(ax)
                log_panel_note(ax, [run for runs in methods.values() for run in runs], key)
            if key == "g_L_norm":
                floor_line(ax)
            if row == 0:  # its note on a line of its own: one line is wider than the panel
                ax.set_title(title.replace(" (", "\n(", 1))
            if row == len(rows) - 1:
                ax.set_xlabel("epoch")
            integer_x(ax)
            ax.set_ylabel({"h_L_norm": f"{ARCH_LABELS[label]}\n" + r"$\|h_L\|_2$",
                           "g_L_norm": r"$\|g_L\|_2$", "acc_eval": "test accuracy"}[key])
            add_grid(ax, log_scale=key != "acc_eval")
    # One ‖g_L‖ range for all rows so the rows compare at a glance.
    lo = min([FLOOR, *g_values]) / 10
    hi = max([FLOOR, *g_values]) * 10
    for row in range(len(rows)):
        axes[row, 1].set_ylim(lo, hi)
    legend_below(fig, list(axes.flat))  # every row's methods and the floor, under the grid
    other = other_options_note(index, (run for methods in rows.values()
                                       for runs in methods.values() for run in runs))
    if other:
        notes_below(fig, list(axes.flat), {"other_options": other})
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select"]
