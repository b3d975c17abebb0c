"""Figure 4, λ-sweep trajectories of DFA with the residual-branch penalty.

Per epoch, one line per λ (λ = 0 is vanilla DFA; mean across seeds, ± std band): (a) ‖h_L‖
(log), (b) ‖g_2‖ (log) with the 1e-7 floor, (c) test accuracy with the frozen-blocks
accuracy and the frozen + margin line of diagnostic (d) (2 pp by default), the mean final
accuracy of the frozen runs that trained all their epochs (one that stopped early is no
baseline of (d): a line under the figure names it; a diverged one is kept with the
numbers of its last finite epoch, and a line names it and that epoch).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from creditaudit.figures.common import (
    PENALTY_COLORS,
    add_grid,
    floor_line,
    integer_x,
    legend_below,
    literal,
    log_panel_note,
    log_scale,
    mean_line,
    method_color,
    new_figure,
    notes_below,
    save_all,
)
from creditaudit.figures.runs import (
    choose_group,
    describe_recipe,
    epoch_mean_std,
    other_options_note,
    penalties,
    seed_runs,
)
from creditaudit.protocol import Thresholds
from creditaudit.records import RunRecord
from creditaudit.results import (
    RunIndex,
    diverged_note,
    full_length,
    mean_std,
    stopped_early_note,
)

NAME = "fig4_lambda_sweep"
TITLE = "Figure 4 — λ-sweep trajectories"
requirements = ("in one recipe: DFA without penalty, DFA with at least one penalty λ > 0 "
                "(--penalty), and frozen-blocks runs (--method frozen); ≥ 1 seed each. Every "
                "λ of that recipe becomes a line.")
PANELS = (("h_L_norm", r"$\|h_L\|_2$ (log)", "(a) residual stream"),
          ("g_2_norm", r"$\|g_2\|_2$ (log)", "(b) reference gradient at state 2"),
          ("acc_eval", "test accuracy", "(c) accuracy, frozen baseline and (d) margin"))


def _missing(group: list[RunRecord]) -> list[str]:
    out = []
    if not seed_runs(group, "dfa", 0.0):
        out.append("DFA runs without penalty (method dfa, λ = 0)")
    if not [p for p in penalties(group, "dfa") if p > 0]:
        out.append("DFA runs with a penalty λ > 0 (--penalty, e.g. 1e-3 and 1e-2)")
    if not seed_runs(group, "frozen", lambda p: True):
        out.append("frozen-blocks runs (method frozen)")
    return out


def select(index: RunIndex) -> dict[str, object]:
    """{"lambdas": {λ: one DFA run per seed}, "frozen": frozen runs}."""
    group = choose_group(index, TITLE, _missing,
                         prefer=lambda g: (len(penalties(g, "dfa")), g[0].epochs, len(g)))
    return {"lambdas": {p: seed_runs(group, "dfa", p) for p in penalties(group, "dfa")},
            "frozen": seed_runs(group, "frozen", lambda p: True)}


def build(index: RunIndex) -> dict[str, Figure]:
    chosen = select(index)
    margin = Thresholds().margin_pp / 100.0
    fig, axes = new_figure(1, 3, figsize=(13, 4.0))
    fig.subplots_adjust(wspace=0.35)
    colors = iter(PENALTY_COLORS * 4)
    styles = {p: (method_color("dfa") if p == 0 else next(colors)) for p in chosen["lambdas"]}
    for col, (key, ylabel, title) in enumerate(PANELS):
        ax = axes[0, col]
        for p, runs in chosen["lambdas"].items():
            epochs, mean, std = epoch_mean_std(runs, key)
            label = "vanilla DFA" if p == 0 else f"DFA λ={p:g}"
            mean_line(ax, epochs, mean, std, label=label, color=styles[p], lw=2,
                      marker=None if p == 0 else "o", ms=3, gid=f"{key}:{p:g}")
        if key != "acc_eval":
            log_scale(ax)
            log_panel_note(ax, [r for runs in chosen["lambdas"].values() for r in runs], key)
        if key == "g_2_norm":
            floor_line(ax)
        if key == "acc_eval":
            frozen, _ = mean_std(r.final_acc for r in full_length(chosen["frozen"]))
            ax.axhline(frozen, color="k", ls="--", lw=1.0, label=f"frozen blocks {frozen:.3f}",
                       gid="frozen")
            ax.axhline(frozen + margin, color="purple", ls=":", lw=1.0,
                       label=f"(d) threshold +{margin * 100:g} pp {frozen + margin:.3f}",
                       gid="frozen_margin")
        ax.set_xlabel("epoch")
        integer_x(ax)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        add_grid(ax, log_scale=key != "acc_eval")
    first = next(iter(chosen["lambdas"].values()))[0]
    fig.suptitle(f"Penalty λ sweep — {literal(describe_recipe(first))}", y=1.03)
    legend_below(fig, list(axes[0]))  # every λ, the floor and the (d) lines, under the panels
    stopped = stopped_early_note(chosen["frozen"], curves=False)
    other = other_options_note(index, [*chosen["frozen"], *(run for runs in
                                                            chosen["lambdas"].values()
                                                            for run in runs)])
    # The frozen line, the one end-of-run value drawn, keeps a diverged frozen run.
    diverged = diverged_note(full_length(chosen["frozen"]))
    notes = {"stopped_early": stopped, "diverged": diverged, "other_options": other}
    notes_below(fig, list(axes[0]), {gid: text for gid, text in notes.items() if text})
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select"]
