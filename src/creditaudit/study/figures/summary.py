"""Figure 5, the multi-seed summary set (five files).

- ``fig5a_accuracy``: train and test accuracy per epoch, mean ± std across seeds;
- ``fig5b_per_layer``: end-of-run per-layer cosine cos(a_l, g_l), perturbation correlation
  ρ_l and nudging Δ loss at the smallest recorded η (deep layers), mean ± std;
- ``fig5c_drift``: feature drift ‖W_final − W_init‖/‖W_init‖ of ``blocks.{l}.w1.weight``;
- ``fig5d_bridge``: the State Bridge's state-prediction error per epoch (one line per seed)
  beside the final accuracy of DFA and the two bridges;
- ``fig5e_final_accuracy``: final test accuracy per method, mean ± std.

5b–5e show end-of-run values: a run that stopped early is left out of their means (a line
under each names it); 5a and 5d's prediction error draw the epochs it logged. A diverged
run stays in those means with its last finite epoch's numbers; a line under each names it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from creditaudit.figures.common import (
    END_OF_RUN_HINT,
    add_grid,
    empty_note,
    has_data,
    hollow_invalid,
    integer_x,
    legend_below,
    legend_right,
    literal,
    log_scale,
    mean_line,
    method_color,
    method_marker,
    new_figure,
    note_invalid,
    notes_below,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import (
    choose_group,
    describe_recipe,
    epoch_mean_std,
    layer_mean_std,
    need_methods,
    other_options_note,
    partial_means_note,
    seed_runs,
    seeds_text,
    valid_layers,
)
from creditaudit.protocol.records import model_description
from creditaudit.records import RunRecord
from creditaudit.results import (
    RunIndex,
    diverged_note,
    full_length,
    mean_std,
    sort_methods,
    stopped_early_note,
)

NAME = "fig5_summary"
NAMES = ("fig5a_accuracy", "fig5b_per_layer", "fig5c_drift", "fig5d_bridge",
         "fig5e_final_accuracy")
TITLE = "Figure 5 — multi-seed summary set"
requirements = ("BP, DFA, State Bridge and Credit Bridge runs without penalty of one recipe "
                "(--method bp, dfa, state-bridge, credit-bridge), ≥ 1 seed each (3 for "
                "meaningful error bars). FA, EP and frozen-blocks runs of that recipe are "
                "drawn too.")
REQUIRED = (("bp", 0.0, "BP runs (λ = 0)"), ("dfa", 0.0, "DFA runs (λ = 0)"),
            ("state-bridge", 0.0, "State Bridge runs (method state-bridge, λ = 0)"),
            ("credit-bridge", 0.0, "Credit Bridge runs (method credit-bridge, λ = 0)"))
BRIDGE_COMPARISON = ("dfa", "state-bridge", "credit-bridge")
PANEL_FIELDS = {"bp_cosine": "per-layer cosines", "perturbation_rho": "perturbation correlation",
                "nudging": "nudging test"}


def select(index: RunIndex) -> dict[str, list[RunRecord]]:
    """{method: one run per seed} for every λ = 0 method of the chosen recipe."""
    group = choose_group(index, TITLE, lambda g: need_methods(g, REQUIRED))
    methods = sort_methods(r.method for r in group if r.penalty == 0)
    return {m: seed_runs(group, m) for m in methods}


def nudging_eta(runs_by_method: dict[str, list[RunRecord]]) -> str | None:
    """The smallest nudging step η recorded by any run (the records' key, e.g. "0.01")."""
    etas = {eta for runs in runs_by_method.values() for r in runs
            for eta in (r.diagnostics.nudging or {})}
    return min(etas, key=float) if etas else None


def drift_keys(run: RunRecord) -> list[str]:
    """``blocks.{l}.w1.weight`` for l = 0 … L−1 (those present in the record)."""
    drift = run.diagnostics.drift or {}
    model = model_description(run)
    blocks = model.n_blocks if model is not None and model.n_blocks is not None else 0
    return [k for k in (f"blocks.{l}.w1.weight" for l in range(blocks)) if k in drift]


def build(index: RunIndex) -> dict[str, Figure]:
    chosen = select(index)
    where = literal(describe_recipe(next(iter(chosen.values()))[0]))
    figures: dict[str, Figure] = {}
    # 5b–5e show end-of-run values: their means leave out the runs that stopped early.
    curves = chosen
    stopped = stopped_early_note((r for runs in chosen.values() for r in runs), curves=False)
    other = other_options_note(index, (r for runs in chosen.values() for r in runs))
    chosen = {m: full_length(runs) for m, runs in chosen.items()}
    # A diverged run stays in those means, with its last finite epoch's numbers: named.
    diverged = diverged_note(r for runs in chosen.values() for r in runs)
    credited = {m: runs for m, runs in chosen.items() if m != "frozen"}

    # 5a accuracy curves
    fig, axes = new_figure(1, 2, figsize=(12, 4.5))
    for ax, key, title in ((axes[0, 0], "train_acc", "train accuracy"),
                           (axes[0, 1], "test_acc", "test accuracy")):
        for method, runs in curves.items():
            epochs, mean, std = epoch_mean_std(runs, key)
            mean_line(ax, epochs, mean, std, label=rule_text(method),
                      color=method_color(method), gid=f"{key}:{method}")
        ax.set_xlabel("epoch")
        integer_x(ax)
        ax.set_ylabel(title)
        ax.set_title(title)
        add_grid(ax)
    fig.suptitle(f"Accuracy, mean ± std over {seeds_text(curves)} — {where}", y=1.02)
    legend_below(fig, list(axes[0]))
    figures["fig5a_accuracy"] = fig

    # 5b per-layer cosine, ρ, nudging
    eta = nudging_eta(credited)
    fig, axes = new_figure(1, 3, figsize=(16, 4.5))
    panels = (("bp_cosine", "cosine with BP gradient", "per-layer cosine", 0),
              ("perturbation_rho", "perturbation correlation ρ", "perturbation correlation",
               0),
              ("nudging", "Δ loss (negative = useful)",
               f"nudging test (η={eta})" if eta else "nudging test (not recorded)", 1))
    invalid_cos = False
    for ax, (key, ylabel, title, first_layer) in zip(axes[0], panels):
        for method, runs in credited.items():
            if key == "nudging":
                rows = [(r.diagnostics.nudging or {}).get(eta) for r in runs]
            else:
                rows = [getattr(r.diagnostics, key) for r in runs]
            mean, std = layer_mean_std(rows)
            if mean.size == 0:
                continue
            layers = np.arange(first_layer, first_layer + mean.size)
            ax.errorbar(layers, mean, yerr=std,
                        color=method_color(method), marker=method_marker(method), ms=4,
                        capsize=2, label=rule_text(method), gid=f"{key}:{method}")
            if key == "bp_cosine":
                valid = valid_layers(runs)
                invalid_cos |= not all(valid)
                hollow_invalid(ax, layers, mean, valid, color=method_color(method),
                               marker=method_marker(method), gid=f"cos_invalid:{method}")
        if key == "bp_cosine":
            note_invalid(ax, invalid_cos)
        ax.axhline(0, color="gray", ls="--", alpha=0.5)
        ax.set_xlabel("layer $l$")
        integer_x(ax)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        add_grid(ax)
        if not has_data(ax):
            empty_note(ax, f"no {PANEL_FIELDS[key]} recorded: {END_OF_RUN_HINT}")
    fig.suptitle(f"Per-layer credit diagnostics, end of run — {where}", y=1.02)
    legend_below(fig, list(axes[0]))
    figures["fig5b_per_layer"] = fig

    # 5c feature drift
    fig, axes = new_figure(1, 1, figsize=(8, 5))
    ax = axes[0, 0]
    for method, runs in chosen.items():
        if not runs:  # every run of it stopped early
            continue
        keys = drift_keys(runs[0])
        mean, std = layer_mean_std([[(r.diagnostics.drift or {}).get(k) for k in keys]
                                    for r in runs])
        if mean.size == 0:
            continue
        ax.errorbar(np.arange(mean.size), mean, yerr=std, color=method_color(method),
                    marker=method_marker(method), ms=4, capsize=2, label=rule_text(method),
                    gid=f"drift:{method}")
    ax.set_xlabel("block $l$ (blocks.$l$.w1.weight)")
    integer_x(ax)
    ax.set_ylabel(r"$\|W_{final} - W_{init}\| / \|W_{init}\|$")
    ax.set_title(f"Feature drift per block — {where}")
    legend_right(ax)
    add_grid(ax)
    if not has_data(ax):
        empty_note(ax, f"no feature drift recorded: {END_OF_RUN_HINT}")
    figures["fig5c_drift"] = fig

    # 5d bridge prediction error vs accuracy
    fig, axes = new_figure(1, 2, figsize=(12, 4.5))
    ax = axes[0, 0]
    for run in curves["state-bridge"]:
        epochs, values = run.series("state_pred_error")
        ax.plot(epochs, values, alpha=0.8, label=f"seed {run.seed}",
                gid=f"state_pred_error:{run.seed}")
    log_scale(ax)
    ax.set_xlabel("epoch")
    integer_x(ax)
    ax.set_ylabel("state prediction error")
    ax.set_title("State Bridge: prediction error of $h_L$")
    add_grid(ax, log_scale=True)
    if not has_data(ax):
        empty_note(ax, "no state_pred_error in the State Bridge records: State Bridge runs "
                       "trained with this version log it every epoch")
    ax = axes[0, 1]
    methods = [m for m in BRIDGE_COMPARISON if m in chosen]
    stats = [mean_std(r.final_acc for r in chosen[m]) for m in methods]
    ax.bar(np.arange(len(methods)), [m for m, _ in stats], yerr=[s for _, s in stats],
           color=[method_color(m) for m in methods], capsize=5, alpha=0.85, gid="bridge_acc")
    ax.set_xticks(np.arange(len(methods)))
    ax.set_xticklabels([rule_text(m) for m in methods])
    ax.set_ylabel("test accuracy")
    ax.set_title("final test accuracy")
    add_grid(ax)
    fig.suptitle(f"Bridge prediction quality vs accuracy — {where}", y=1.02)
    legend_below(fig, [axes[0, 0]])
    figures["fig5d_bridge"] = fig

    # 5e final accuracy bars
    fig, axes = new_figure(1, 1, figsize=(9, 5))
    ax = axes[0, 0]
    methods = list(chosen)
    stats = [mean_std(r.final_acc for r in chosen[m]) for m in methods]
    bars = ax.bar(np.arange(len(methods)), [m for m, _ in stats], 0.6,
                  yerr=[s for _, s in stats], color=[method_color(m) for m in methods],
                  capsize=5, alpha=0.85, gid="final_acc")
    for bar, (mean, std) in zip(bars, stats):
        if np.isnan(mean):  # no run of it trained all its epochs (or none recorded one)
            continue
        ax.annotate(f"{mean:.1%}", (bar.get_x() + bar.get_width() / 2, mean + std),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                    fontweight="bold", gid="final_acc_label")
    tops = [mean + std for mean, std in stats if not np.isnan(mean)]
    if tops:  # room above the highest error bar for its label, inside the axes
        ax.set_ylim(top=max(ax.get_ylim()[1], max(tops) * 1.12))
    ax.set_xticks(np.arange(len(methods)))
    ax.set_xticklabels([rule_text(m) for m in methods])
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Final test accuracy ({seeds_text(chosen)}) — {where}")
    add_grid(ax)
    figures["fig5e_final_accuracy"] = fig
    final_acc = {"final accuracy": lambda r: r.final_acc}
    partial = {NAMES[0]: partial_means_note(curves, {}),
               NAMES[1]: partial_means_note(credited, {
                   "per-layer cosine": lambda r: r.diagnostics.bp_cosine,
                   "ρ": lambda r: r.diagnostics.perturbation_rho,
                   "nudging": lambda r: (r.diagnostics.nudging or {}).get(eta)}),
               NAMES[2]: partial_means_note(chosen, {"drift": lambda r: [
                   (r.diagnostics.drift or {}).get(k) for k in drift_keys(r)]}),
               NAMES[3]: partial_means_note(
                   {m: chosen[m] for m in BRIDGE_COMPARISON if m in chosen}, final_acc),
               NAMES[4]: partial_means_note(chosen, final_acc)}
    for name in NAMES:
        notes = {"stopped_early": stopped if name != NAMES[0] else None,
                 "diverged": diverged if name != NAMES[0] else None,
                 "partial": partial[name], "other_options": other}
        notes = {gid: text for gid, text in notes.items() if text}
        if notes:
            notes_below(figures[name], figures[name].axes, notes)
    return figures


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "NAMES", "TITLE", "requirements", "build", "render", "select"]
