"""Figure 6, audit panels: one panel per protocol diagnostic with its threshold line.

Every run with a protocol block is a point (x: its method, λ and — when the folder mixes
them — architecture and dataset; seeds side by side), coloured by its verdict: healthy
(trustworthy) or walked back (needs walk-back). Values are the statistic each diagnostic
compares with its threshold: (a) largest block growth (log), (b) median ‖g_L‖ (log),
(c) mean pairwise cosine of batch-mean gradients, (d) accuracy margin over the frozen-blocks
baseline in pp. Runs where a diagnostic was not evaluated (or whose value cannot be drawn on
a log axis, e.g. ‖g_L‖ exactly 0) are counted in the panel instead of drawn.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from creditaudit.figures.common import (
    ARCH_LABELS,
    HEALTHY_COLOR,
    WALKBACK_COLOR,
    add_grid,
    empty_note,
    legend_right,
    log_scale,
    new_figure,
    save_all,
)
from creditaudit.figures.runs import (
    MissingRuns,
)
from creditaudit.protocol import WALK_BACK, DiagnosticReport, protocol
from creditaudit.results import Run, RunIndex, method_label

NAME = "fig6_audit_panels"
TITLE = "Figure 6 — audit panels"
requirements = ("at least one completed or diverged run with a protocol block (training "
                "runs the protocol every diagnostics.protocol_every epochs; any method). (c) "
                "needs diagnostics.eval_samples ≥ 1024; (d) needs diagnostics.frozen_acc or "
                "--frozen-from-runs with frozen-blocks runs.")
LOG_PANELS = ("a", "b")
# What would fill a panel in which no run has a value to draw.
EMPTY_PANEL = {
    "a": "no run has a finite block growth: runs whose states stay finite would fill it",
    "b": "no run has a non-zero finite ‖g_L‖ to draw on a log axis",
    "c": "(c) was not evaluated: runs with diagnostics.eval_samples ≥ 1024 (8 batches of 128) "
         "would fill it",
    "d": "(d) was not evaluated: frozen-blocks runs (--method frozen) of the same recipe with "
         "--frozen-from-runs, or runs trained with diagnostics.frozen_acc, would fill it",
}
YLABELS = {"a": "max block growth (ratio)", "b": "median ‖g_L‖ (1/128 scale)",
           "c": "mean pairwise cos (state L//2)", "d": "accuracy − frozen (pp)"}


def category(run: Run, multi_arch: bool, multi_data: bool) -> str:
    label = method_label(run.method, run.penalty)
    if multi_arch:
        label += f"\n{ARCH_LABELS.get(run.arch_label, run.arch_label)}"
    if multi_data:
        label += f"\n{run.dataset}"
    if run.epochs == 0:  # random-init controls sit apart from the trained runs
        label += "\nuntrained"
    config = getattr(run, "config", None)
    if config is not None:  # control variants get their own columns too
        if config.method.trainable_blocks is not None:
            label += f"\nk={config.method.trainable_blocks} blocks"
        if config.data.random_targets:
            label += "\nrandom labels"
        if not config.model.residual:
            label += "\nno skips"
    return label


def select(index: RunIndex) -> list[tuple[Run, DiagnosticReport]]:
    """Every usable run with a protocol report (standard or control variant)."""
    pairs = [(run, report) for run in index.select(standard=None)
             if (report := index.protocol_report(run)) is not None]
    if not pairs:
        raise MissingRuns(TITLE, ["runs with a protocol block (train with "
                                  "diagnostics.protocol_every ≥ 1, the default)"])
    return pairs


def panel_points(pairs: list[tuple[Run, DiagnosticReport]]
                 ) -> tuple[list[str], dict[str, list[dict]]]:
    """(categories, {diagnostic id: [{x, value, walked_back, run_id, status}]})."""
    multi_arch = len({r.arch_label for r, _ in pairs}) > 1
    multi_data = len({r.dataset for r, _ in pairs}) > 1
    cats: list[str] = []
    members: dict[str, list[Run]] = {}
    for run, _ in pairs:
        cat = category(run, multi_arch, multi_data)
        if cat not in members:
            cats.append(cat)
        members.setdefault(cat, []).append(run)
    points: dict[str, list[dict]] = {d.name: [] for d in protocol()}
    for run, report in pairs:
        cat = category(run, multi_arch, multi_data)
        peers = members[cat]
        offset = (peers.index(run) - (len(peers) - 1) / 2) * min(0.12, 0.6 / len(peers))
        for result in report.diagnostics:
            points[result.id].append({
                "x": cats.index(cat) + offset, "value": result.value,
                "walked_back": report.verdict == WALK_BACK, "run_id": run.run_id,
                "status": result.status, "threshold": result.threshold})
    return cats, points


def drawable(point: dict, log_scale: bool) -> bool:
    value = point["value"]
    return value is not None and math.isfinite(value) and (value > 0 or not log_scale)


def build(index: RunIndex) -> dict[str, Figure]:
    pairs = select(index)
    cats, points = panel_points(pairs)
    width = min(18.0, max(8.0, 0.6 * len(cats) + 2.5))
    fig, axes = new_figure(4, 1, figsize=(width, 13.0))
    # Many columns: upright labels would overlap, so they stand vertical (and need room).
    rotation = 90 if len(cats) > 12 else 30 if len(cats) > 5 else 0
    fig.subplots_adjust(hspace={90: 1.2, 30: 0.9}.get(rotation, 0.5))
    for ax, (id_, name) in zip(axes.flat, ((d.name, d.label) for d in protocol())):
        on_log = id_ in LOG_PANELS
        pts = points[id_]
        for walked, color, label in ((False, HEALTHY_COLOR, "trustworthy"),
                                     (True, WALKBACK_COLOR, "needs walk-back")):
            chosen = [p for p in pts if p["walked_back"] == walked and drawable(p, on_log)]
            ax.scatter([p["x"] for p in chosen], [p["value"] for p in chosen], color=color,
                       edgecolors="k", linewidths=0.4, s=36, zorder=3, label=label,
                       gid=f"{id_}:{'walked_back' if walked else 'healthy'}")
        threshold = pts[0]["threshold"] if pts else None
        if threshold is not None:
            ax.axhline(threshold, color="black", ls="--", lw=1,
                       label=f"threshold {threshold:g}", gid=f"{id_}:threshold")
        hidden = [p for p in pts if not drawable(p, on_log)]
        if pts and len(hidden) == len(pts):
            empty_note(ax, f"{EMPTY_PANEL[id_]} ({len(hidden)} of {len(pts)} runs: "
                       + ("not evaluated" if all(p["status"] == "not evaluated" for p in hidden)
                          else "not evaluated or not drawable") + ")")
        elif hidden:
            not_eval = sum(p["status"] == "not evaluated" for p in hidden)
            notes = []
            if not_eval:
                notes.append(f"{not_eval} not evaluated")
            if len(hidden) > not_eval:
                notes.append(f"{len(hidden) - not_eval} not drawable (0 or non-finite)")
            ax.text(0.99, 0.02, "; ".join(notes), transform=ax.transAxes, ha="right",
                    va="bottom", fontsize=7, color="gray")
        if on_log:
            log_scale(ax)
        ax.set_xticks(np.arange(len(cats)))
        ax.set_xticklabels(cats, fontsize=7, rotation=rotation)
        ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_ylabel(YLABELS[id_], fontsize=8)
        ax.set_title(f"({id_}) {name}")
        legend_right(ax)
        add_grid(ax, log_scale=on_log)
    n_walk = sum(report.verdict == WALK_BACK for _, report in pairs)
    fig.suptitle(f"Protocol diagnostics of {len(pairs)} runs ({n_walk} need walk-back)",
                 y=0.93)
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select", "panel_points"]
