"""Figure 6, audit panels: one panel per protocol diagnostic with its threshold line.

Every run with a protocol block is a point (x: its method, λ and — when the folder mixes
them — architecture and dataset, and its recipe's number where a column would otherwise mix
recipes; seeds side by side), coloured by its verdict as every
report colours it (:attr:`~creditaudit.protocol.Judgement.kind`): trustworthy, needs
walk-back, incomplete (a diagnostic or the reference check not evaluated: never drawn as
trustworthy) or unverified; a value computed from a reference gradient that is not
verified ((b), (c)) is drawn hollow. There is a panel for every diagnostic the
runs' protocol blocks hold — the four built-ins, and any diagnostic a config added — showing
the statistic it compares with its threshold, on the axis it describes (``axis_label``; log
where its ``scale`` is, as for (a)'s block growth and (b)'s ‖g_L‖). Runs where a diagnostic
was not evaluated (or whose value cannot be drawn on a log axis, e.g. ‖g_L‖ exactly 0) are
counted in the panel instead of drawn. A run that stopped early (``record.stopped_early``:
``--stop-on-walkback``, a Recorder finished before its ``optim.epochs``) judged an earlier
epoch than its recipe's other runs: its points are ringed and a line under the figure names
it in the report's words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from creditaudit.figures.common import (
    ARCH_LABELS,
    add_grid,
    empty_note,
    legend_right,
    literal,
    log_scale,
    new_figure,
    notes_below,
    rule_text,
    save_all,
)
from creditaudit.figures.runs import (
    MissingRuns,
    setting_difference,
)
from creditaudit.formatting import BASELINE_COLOR, BASELINE_KIND, VERDICT_COLORS
from creditaudit.protocol import KINDS, WALK_BACK, DiagnosticReport, in_order
from creditaudit.protocol.records import BASELINE_TEXT, is_frozen_baseline, not_a_baseline
from creditaudit.protocol.verdicts import reads_reference
from creditaudit.records import RunRecord
from creditaudit.registry import DIAGNOSTICS
from creditaudit.results import RunIndex, arch_label, stopped_early_note

NAME = "fig6_audit_panels"
TITLE = "Figure 6 — audit panels"
# What the figure does with a run that stopped early (the note under it names each).
STOPPED_EARLY = ("Ringed: runs that stopped early, their protocol values of an earlier epoch "
                 "than their recipe's other runs'")
requirements = ("at least one completed or diverged run with a protocol block (training "
                "runs the protocol every diagnostics.protocol_every epochs; any method). (c) "
                "needs diagnostics.eval_samples ≥ 1024; (d) needs diagnostics.frozen_acc or "
                "frozen-blocks runs of the same recipe (read unless --no-frozen-from-runs).")


@dataclass(frozen=True)
class Panel:
    """How one diagnostic's panel is drawn: as the diagnostic describes itself, or — for a
    diagnostic the records hold but that is not installed here — by its result's name."""

    id: str
    title: str
    ylabel: str
    log: bool
    needs: str

    @classmethod
    def of(cls, id_: str, name: str) -> Panel:
        diagnostic = DIAGNOSTICS.find(id_)
        if diagnostic is None:
            return cls(id_, literal(f"({id_}) {name}"), literal(name), False, "")
        return cls(id_, literal(f"{diagnostic.id_label()} {diagnostic.label}"),
                   literal(diagnostic.axis_label()), diagnostic.scale == "log",
                   diagnostic.needs)

    def empty_text(self) -> str:
        """What an empty panel says: no value to draw, and which runs would fill it."""
        text = f"no run has a value of ({self.id}) to draw"
        return f"{text}: {self.needs} would fill it" if self.needs else text


def category(run: RunRecord, multi_arch: bool, multi_data: bool) -> str:
    label = rule_text(run.method, run.penalty)
    if multi_arch:
        label += f"\n{literal(ARCH_LABELS.get(arch_label(run), arch_label(run)))}"
    if multi_data:
        label += f"\n{literal(run.dataset)}"
    if run.epochs == 0:  # random-init controls sit apart from the trained runs
        label += "\nuntrained"
    config = run.config  # control variants get their own columns too
    if config.method.trainable_blocks is not None:
        label += f"\nk={config.method.trainable_blocks} blocks"
    if config.data.random_targets:
        label += "\nrandom labels"
    if getattr(config.model, "residual", True) is False:  # the option, where it exists
        label += "\nno skips"
    return label


def recipe_numbers(pairs: list[tuple[RunRecord, DiagnosticReport]]) -> dict[int, int]:
    """Each run's recipe number (by ``id``; 1, 2, … in order of first appearance) where a
    column of :func:`category` would hold runs of more than one recipe (BP at two learning
    rates), so every column can say which recipe it draws; empty where none would."""
    multi_arch = len({arch_label(r) for r, _ in pairs}) > 1
    multi_data = len({r.dataset for r, _ in pairs}) > 1
    columns: dict[str, set[str]] = {}
    for run, _ in pairs:
        columns.setdefault(category(run, multi_arch, multi_data), set()).add(run.recipe_key)
    if all(len(recipes) == 1 for recipes in columns.values()):
        return {}
    order = list(dict.fromkeys(run.recipe_key for run, _ in pairs))
    return {id(run): order.index(run.recipe_key) + 1 for run, _ in pairs}


def recipes_note(pairs: list[tuple[RunRecord, DiagnosticReport]]) -> str | None:
    """``Recipes: 2 differs from 1 in optim.lr: 50.0 vs 0.001.`` for the recipe numbers
    the columns carry (:func:`recipe_numbers`), None where they carry none."""
    numbers = recipe_numbers(pairs)
    if not numbers:
        return None
    firsts: dict[int, RunRecord] = {}
    for run, _ in pairs:
        firsts.setdefault(numbers[id(run)], run)
    return "Recipes: " + "; ".join(f"{n} differs from 1 in {setting_difference(run, firsts[1])}"
                                   for n, run in sorted(firsts.items()) if n > 1) + "."


def select(index: RunIndex) -> list[tuple[RunRecord, DiagnosticReport]]:
    """Every usable run with a protocol report (standard or control variant)."""
    pairs = [(run, report) for run in index.select(standard=None)
             if (report := index.protocol_report(run)) is not None]
    if not pairs:
        raise MissingRuns(TITLE, ["runs with a protocol block (train with "
                                  "diagnostics.protocol_every ≥ 1, the default)"])
    return pairs


def panel_points(pairs: list[tuple[RunRecord, DiagnosticReport]]
                 ) -> tuple[list[str], dict[str, list[dict]]]:
    """(categories, {diagnostic id: [{x, value, verdict, kind, walked_back, hollow,
    stopped_early, run_id, status, threshold}]}): one entry per diagnostic the reports hold,
    in listing order; ``verdict``/``kind`` are the run's judgement, ``hollow`` marks a value
    computed from a reference gradient that is not verified, ``stopped_early`` one of a run
    that stopped early (ringed)."""
    multi_arch = len({arch_label(r) for r, _ in pairs}) > 1
    multi_data = len({r.dataset for r, _ in pairs}) > 1
    numbers = recipe_numbers(pairs)

    def column(run: RunRecord) -> str:
        label = category(run, multi_arch, multi_data)
        return f"{label}\nrecipe {numbers[id(run)]}" if numbers else label

    cats: list[str] = []
    members: dict[str, list[RunRecord]] = {}
    for run, _ in pairs:
        cat = column(run)
        if cat not in members:
            cats.append(cat)
        members.setdefault(cat, []).append(run)
    points: dict[str, list[dict]] = {
        id_: [] for id_ in in_order(r.id for _, report in pairs for r in report.diagnostics)}
    for run, report in pairs:
        cat = column(run)
        peers = members[cat]
        # Records that read alike (a copied folder) are still two points: found by identity.
        place = next(i for i, peer in enumerate(peers) if peer is run)
        offset = (place - (len(peers) - 1) / 2) * min(0.12, 0.6 / len(peers))
        judged = report.judgement
        verdict, kind = judged.verdict, judged.kind
        if is_frozen_baseline(run) and run.is_finished and not_a_baseline(run) is None:
            # as the tables label it (baseline_text)
            verdict, kind = BASELINE_TEXT, BASELINE_KIND
        for result in report.diagnostics:
            points[result.id].append({
                "x": cats.index(cat) + offset, "value": result.value,
                "verdict": verdict, "kind": kind,
                "walked_back": judged.verdict == WALK_BACK,
                "hollow": reads_reference(result.id) and judged.reference_verified is False,
                "stopped_early": bool(run.stopped_early),
                "run_id": run.run_id, "status": result.status,
                "threshold": result.threshold})
    return cats, points


def drawable(point: dict, log_scale: bool) -> bool:
    value = point["value"]
    return value is not None and math.isfinite(value) and (value > 0 or not log_scale)


def threshold_marks(ax: Any, id_: str, pts: list[dict]) -> None:
    """The threshold each run was judged against: one line where the runs share it, else a
    dash at each run's point (runs with their own ``[diagnostics.ID]`` options), so no point
    is read against another run's threshold."""
    judged = [p for p in pts if p["threshold"] is not None]
    thresholds = sorted({p["threshold"] for p in judged})
    if len(thresholds) == 1:
        ax.axhline(thresholds[0], color="black", ls="--", lw=1,
                   label=f"threshold {thresholds[0]:g}", gid=f"{id_}:threshold")
    elif thresholds:
        ax.plot([p["x"] for p in judged], [p["threshold"] for p in judged], ls="none",
                marker="_", ms=14, mew=1.5, color="black", zorder=2,
                label="each run's threshold (" + ", ".join(f"{t:g}" for t in thresholds)
                + ")", gid=f"{id_}:threshold")


def build(index: RunIndex) -> dict[str, Figure]:
    pairs = select(index)
    cats, points = panel_points(pairs)
    names = {r.id: r.name for _, report in pairs for r in report.diagnostics}
    panels = [Panel.of(id_, names[id_]) for id_ in points]
    width = min(18.0, max(8.0, 0.6 * len(cats) + 2.5))
    fig, axes = new_figure(len(panels), 1, figsize=(width, 3.25 * len(panels)))
    # Many columns: upright labels would overlap, so they stand vertical (and need room).
    rotation = 90 if len(cats) > 12 else 30 if len(cats) > 5 else 0
    fig.subplots_adjust(hspace={90: 1.2, 30: 0.9}.get(rotation, 0.5))
    for ax, panel in zip(axes.flat, panels):
        id_, on_log = panel.id, panel.log
        pts = points[id_]
        for verdict, kind in [*KINDS.items(), (BASELINE_TEXT, BASELINE_KIND)]:
            chosen = [p for p in pts if p["kind"] == kind and drawable(p, on_log)]
            for hollow in (False, True):
                shown = [p for p in chosen if p["hollow"] == hollow]
                if not shown:
                    continue
                color = {**VERDICT_COLORS, BASELINE_KIND: BASELINE_COLOR}[kind]
                ax.scatter([p["x"] for p in shown], [p["value"] for p in shown],
                           facecolors="white" if hollow else color,
                           edgecolors=color if hollow else "k",
                           linewidths=1.4 if hollow else 0.4, s=36, zorder=3,
                           label=verdict + (" (reference unverified: hollow)" if hollow
                                            else ""),
                           gid=f"{id_}:{kind}" + (":hollow" if hollow else ""))
        early = [p for p in pts if p["stopped_early"] and drawable(p, on_log)]
        if early:
            ax.scatter([p["x"] for p in early], [p["value"] for p in early], s=130,
                       facecolors="none", edgecolors="black", linewidths=1.0, zorder=4,
                       label="stopped early (ringed)", gid=f"{id_}:stopped_early")
        threshold_marks(ax, id_, pts)
        hidden = [p for p in pts if not drawable(p, on_log)]
        if pts and len(hidden) == len(pts):
            empty_note(ax, f"{panel.empty_text()} ({len(hidden)} of {len(pts)} runs: "
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
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.set_title(panel.title)
        legend_right(ax)
        add_grid(ax, log_scale=on_log)
    n_walk = sum(report.judgement.walked_back for _, report in pairs)
    fig.suptitle(f"Protocol diagnostics of {len(pairs)} runs ({n_walk} need walk-back)",
                 y=0.93)
    stopped = stopped_early_note((run for run, _ in pairs), curves=False, lead=STOPPED_EARLY)
    notes = {gid: text for gid, text in (("stopped_early", stopped),
                                         ("recipes", recipes_note(pairs))) if text}
    if notes:
        notes_below(fig, list(axes.flat), notes)
    return {NAME: fig}


def render(index: RunIndex, out_dir: str | Path) -> list[Path]:
    return save_all(build(index), out_dir)


__all__ = ["NAME", "TITLE", "requirements", "build", "render", "select", "panel_points",
           "Panel"]
