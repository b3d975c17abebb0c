"""Figure 1, the audit hero: the standard reporting pair hides what the protocol shows.

(A) final test accuracy against the headline aggregate Γ, with quadrant shading at chance
(1/C) and Γ = 0; (B) end-of-run per-layer cosine cos(a_l, g_l) per method; (C) per-layer
median ‖g_l‖ at the last epoch on a log axis with the 1e-7 floor. Every point is the mean
across seeds (error bars ± std) of the runs that trained all their epochs: every panel shows
end-of-run values, so a run that stopped early is left out, and a line under the figure
names it; a diverged run is kept with the numbers of its last finite epoch, and a line under
the figure names it and that epoch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from creditaudit.config import ModelConfig
from creditaudit.figures.common import (
    END_OF_RUN_HINT,
    FLOOR,
    add_grid,
    empty_note,
    floor_line,
    has_data,
    hollow_invalid,
    legend_below,
    literal,
    log_scale,
    method_color,
    method_marker,
    new_figure,
    note_invalid,
    notes_below,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import (
    MissingRuns,
    choose_group,
    describe_recipe,
    layer_mean_std,
    need_methods,
    other_options_note,
    partial_means_note,
    reference_verified,
    seed_runs,
    valid_layers,
)
from creditaudit.protocol import HEADLINE_GAMMA
from creditaudit.results import (
    RunIndex,
    arch_label,
    as_float,
    diverged_note,
    full_length,
    mean_std,
    sort_methods,
    stopped_early_note,
)

DEFAULT_ARCH = ModelConfig().arch  # the figure prefers runs of the default architecture

NAME = "fig1_hero"
TITLE = "Figure 1 — audit hero"
requirements = ("BP, FA and DFA runs without penalty (λ = 0) of one recipe (same data, "
                "architecture and optimiser), ≥ 1 seed each; preferably ResMLP with terminal "
                "LN. EP and bridge runs of that recipe are drawn too.")
REQUIRED = (("bp", 0.0, "BP runs (method bp, λ = 0)"),
            ("fa", 0.0, "FA runs (method fa, λ = 0)"),
            ("dfa", 0.0, "DFA runs (method dfa, λ = 0)"))


def select(index: RunIndex) -> dict[str, list]:
    """The runs Figure 1 draws: {method: one run per seed}."""
    group = choose_group(index, TITLE, lambda g: need_methods(g, REQUIRED),
                         prefer=lambda g: (arch_label(g[0]) == DEFAULT_ARCH, g[0].epochs,
                                           len(g)))
    methods = sort_methods(r.method for r in group if r.penalty == 0 and r.method != "frozen")
    return {m: seed_runs(group, m) for m in methods}


def build(index: RunIndex) -> dict[str, Figure]:
    chosen = select(index)
    first = next(iter(chosen.values()))[0]
    # Every panel shows end-of-run values: a run that stopped early is left out of them.
    stopped = stopped_early_note((r for runs in chosen.values() for r in runs), curves=False)
    other = other_options_note(index, (r for runs in chosen.values() for r in runs))
    chosen = {m: ended for m, runs in chosen.items() if (ended := full_length(runs))}
    # A diverged run stays in them, with the numbers of its last finite epoch: named too.
    diverged = diverged_note(r for runs in chosen.values() for r in runs)
    # A panel no run can fill is left out (one line under the title says why), not drawn
    # empty; (C) reads the per-epoch norms every run logs, so one panel always remains.
    left_out = []
    if not any(np.isfinite(as_float(r.headline_gamma)) and np.isfinite(as_float(r.final_acc))
               for runs in chosen.values() for r in runs):
        left_out.append("(A) standard reporting pair: no aggregate Γ recorded")
    if not any(r.diagnostics.bp_cosine for runs in chosen.values() for r in runs):
        left_out.append("(B) per-layer cosine: no per-layer cosines recorded")
    panels = [draw for draw, letter in ((_reporting_pair, "(A)"), (_layer_cosines, "(B)"),
                                        (_gradient_norms, "(C)"))
              if not any(text.startswith(letter) for text in left_out)]
    fig, axes = new_figure(1, len(panels), figsize=(11 * len(panels) / 3 + 0.6, 4.0))
    fig.subplots_adjust(wspace=0.38)
    for draw, ax in zip(panels, axes[0]):
        draw(ax, chosen, first)
        add_grid(ax, log_scale=draw is _gradient_norms)
    fig.suptitle(f"Audit hero — {literal(describe_recipe(first))}", y=1.02)
    legend_below(fig, axes[0])  # one legend for the panels, under them
    notes = {}
    if left_out:
        notes["left_out"] = "Left out: " + "; ".join(left_out) + f" — {END_OF_RUN_HINT}."
    if stopped:
        notes["stopped_early"] = stopped
    if diverged:
        notes["diverged"] = diverged
    if other:
        notes["other_options"] = other
    partial = partial_means_note(chosen, {
        "final accuracy": lambda r: r.final_acc,
        **({"Γ": lambda r: r.headline_gamma} if _reporting_pair in panels else {}),
        **({"per-layer cosine": lambda r: r.diagnostics.bp_cosine}
           if _layer_cosines in panels else {}),
        "last-epoch ‖g_l‖": lambda r: r.headline_value("bp_grad_norms_per_sample_med")})
    if partial:
        notes["partial"] = partial
    notes_below(fig, axes[0], notes, width=40 * len(panels))
    return {NAME: fig}


def _reporting_pair(ax, chosen: dict[str, list], first) -> None:
    """(A) accuracy vs aggregate Γ."""
    chance = 1.0 / first.n_classes
    points = {}
    for method, runs in chosen.items():
        gamma = mean_std(r.headline_gamma for r in runs)
        acc = mean_std(r.final_acc for r in runs)
        points[method] = (gamma, acc)
    xs = [p[0][0] for p in points.values() if np.isfinite(p[0][0])]
    ys = [p[1][0] for p in points.values() if np.isfinite(p[1][0])]
    x_lo, x_hi = min([-0.22, *(x - 0.1 for x in xs)]), max([1.12, *(x + 0.1 for x in xs)])
    y_lo, y_hi = -0.02, max([chance * 1.5, *(y + 0.08 for y in ys)])
    ax.fill_between([0, x_hi], chance, y_hi, color="#c8e6c9", alpha=0.5, zorder=0)
    ax.fill_between([x_lo, 0], y_lo, chance, color="#ffcdd2", alpha=0.5, zorder=0)
    ax.fill_between([x_lo, 0], chance, y_hi, color="#f5f5f5", alpha=0.6, zorder=0)
    ax.fill_between([0, x_hi], y_lo, chance, color="#f5f5f5", alpha=0.6, zorder=0)
    ax.axvline(0, color="gray", lw=0.6, ls="--", zorder=1)
    ax.axhline(chance, color="gray", lw=0.6, ls="--", zorder=1, gid="chance",
               label=f"chance 1/{first.n_classes}")
    ax.text(x_hi * 0.5, (chance + y_hi) / 2, '"looks like\nlearning"', fontsize=7,
            color="#388e3c", ha="center", va="center", fontweight="bold")
    unverified = [method for method, runs in chosen.items() if not reference_verified(runs)]
    for method, ((g, g_sd), (acc, acc_sd)) in points.items():
        hollow = method in unverified  # Γ against an unverified reference is no measure
        ax.errorbar([g], [acc], xerr=[g_sd], yerr=[acc_sd], fmt=method_marker(method),
                    color=method_color(method), mec=method_color(method) if hollow else "k",
                    mfc="white" if hollow else method_color(method), mew=1.5 if hollow else 0.5,
                    ms=8, capsize=2, zorder=5, label=rule_text(method),
                    gid=f"point:{method}" + (":unverified" if hollow else ""))
    note_invalid(ax, bool(unverified))
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel(f"aggregate Γ ({HEADLINE_GAMMA.replace('_', ' ')})")
    ax.set_ylabel("test accuracy")
    ax.set_title("(A) standard reporting pair", loc="left", fontweight="bold")
    if not has_data(ax):
        empty_note(ax, "no aggregate Γ recorded: " + END_OF_RUN_HINT)


def _layer_cosines(ax, chosen: dict[str, list], first) -> None:
    """(B) per-layer cosine at the end of the run."""
    any_invalid = False
    n_layers = 0
    for method, runs in chosen.items():
        mean, std = layer_mean_std([r.diagnostics.bp_cosine for r in runs])
        layers = np.arange(len(mean))
        n_layers = max(n_layers, len(mean))
        ax.errorbar(layers, mean, yerr=std, color=method_color(method),
                    marker=method_marker(method), ms=5, lw=1.8, capsize=2,
                    label=rule_text(method), gid=f"cos:{method}")
        valid = valid_layers(runs)
        any_invalid |= not all(valid)
        hollow_invalid(ax, layers, mean, valid, color=method_color(method),
                       marker=method_marker(method), gid=f"cos_invalid:{method}")
    note_invalid(ax, any_invalid)
    ax.axhline(0, color="gray", lw=0.5, ls=":")
    _layer_ticks(ax, n_layers)
    ax.set_xlabel("state $h_l$")
    ax.set_ylabel(r"$\cos(a_l, g_l)$")
    ax.set_title("(B) per-layer cosine", loc="left", fontweight="bold")
    if not has_data(ax):
        empty_note(ax, "no per-layer cosines recorded: " + END_OF_RUN_HINT)


def _gradient_norms(ax, chosen: dict[str, list], first) -> None:
    """(C) per-layer median ‖g_l‖ at the last epoch (a diverged run's last finite one, as
    its other numbers), log axis, with the floor."""
    n_layers = 0
    for method, runs in chosen.items():
        mean, _ = layer_mean_std([r.headline_value("bp_grad_norms_per_sample_med")
                                   for r in runs])
        n_layers = max(n_layers, len(mean))
        ax.plot(np.arange(len(mean)), mean, color=method_color(method),
                marker=method_marker(method), ms=5, lw=1.8, label=rule_text(method),
                gid=f"grad:{method}")
    log_scale(ax)
    floor_line(ax)
    _layer_ticks(ax, n_layers)
    ax.set_xlabel("state $h_l$")
    ax.set_ylabel(r"median $\|g_l\|$ (1/128 scale)")
    ax.set_title(r"(C) per-layer $\|g_l\|$ (BP gradient)", loc="left", fontweight="bold")
    lo = min([FLOOR, *(v for line in ax.get_lines() for v in np.atleast_1d(line.get_ydata())
                       if v > 0)])
    ax.set_ylim(bottom=lo / 10)


def _layer_ticks(ax, n: int) -> None:
    ax.set_xticks(np.arange(n))
    ax.set_xticklabels([f"$h_{{{layer}}}$" for layer in range(n)])


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select", "MissingRuns"]
