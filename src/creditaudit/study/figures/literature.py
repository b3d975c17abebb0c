"""Published vs reproduced test error, from the literature experiment's summary.

One panel per published column (a table's dataset): for every row with a published number,
the published error (black diamond), creditaudit's best-epoch error per seed (dots) and its
mean ± sd (bar), and the last-epoch mean (open circle); a row the protocol walks back in any
seed is drawn in the walk-back colour. A seed that stopped early (its best epoch is of a
shorter run, and the means leave it out) is ringed, and the summary's line naming it is
written under the figure. A column whose runs are not at the setting its numbers were
published at (the summary's ``not_compared``: the smoke scale's stand-in data, other sizes,
another epoch budget) says so in its title, and a line under the figure says why. Reads
the summary dict only (``OUT/experiments/literature.SCALE.DATASET.json``), so the figure is
regenerated from files.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from creditaudit.figures.common import add_grid, new_figure, notes_below, save
from creditaudit.formatting import PASS_COLOR, WALK_BACK_COLOR

PUBLISHED_COLOR = "#000000"
PANELS_PER_ROW = 4
TITLE_WIDTH = 46  # characters per line of a panel title
OFF_SETTING = "not the published setting"


def published_panels(summary: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(panel title, rows with a published number) for every column that has such rows; the
    title of a column whose runs are not at the setting its numbers were published at (its
    ``not_compared``: another dataset, other sizes, another epoch budget) says so."""
    panels = []
    for table in summary["tables"]:
        for column in table["columns"]:
            rows = [r for r in column["rows"] if r["published"] is not None]
            if rows:
                title = "\n".join(textwrap.wrap(table["title"], TITLE_WIDTH))
                off = f"\n{OFF_SETTING}" if column.get("not_compared") else ""
                panels.append((f"{title}\n{column['label']}{off}", rows))
    return panels


def off_setting_note(summary: dict[str, Any]) -> str | None:
    """The line naming each drawn column whose runs are not at the published setting and
    why (as its table says, where no Δ is computed); None when every one is."""
    off = [f"{table['title']}, {column['label']}: {column['not_compared']}"
           for table in summary["tables"] for column in table["columns"]
           if column.get("not_compared")
           and any(r["published"] is not None for r in column["rows"])]
    if not off:
        return None
    return (f"{OFF_SETTING.capitalize()}: the published numbers are drawn for reference, "
            "not compared (the summary computes no Δ): " + "; ".join(off) + ".")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def published_vs_reproduced(summary: dict[str, Any]) -> Figure:
    """The figure (module docstring); a figure saying "no published rows" when none ran."""
    panels = published_panels(summary)
    n_cols = min(max(len(panels), 1), PANELS_PER_ROW)
    n_rows = max(math.ceil(len(panels) / n_cols), 1)
    fig, axes = new_figure(n_rows, n_cols, figsize=(4.2 * n_cols, 4.0 * n_rows))
    if n_rows > 1:  # room for the next row's two-line titles under the tick labels
        fig.subplots_adjust(hspace=0.75)
    cells = [ax for row in axes for ax in row]
    for ax in cells[len(panels):] if panels else ():
        ax.set_visible(False)
    for ax, (title, rows) in zip(cells, panels):
        for x, row in enumerate(rows):
            color = WALK_BACK_COLOR if row["verdict"]["walked_back"] else PASS_COLOR
            seeds = [s["best_error"] for s in row["seeds"] if _finite(s["best_error"])]
            ax.scatter([x + 0.12] * len(seeds), seeds, s=9, color=color, alpha=0.6, zorder=3)
            early = [s["best_error"] for s in row["seeds"]
                     if s.get("stopped_early") and _finite(s["best_error"])]
            if early:
                ax.scatter([x + 0.12] * len(early), early, s=60, facecolors="none",
                           edgecolors="black", linewidths=0.8, zorder=4,
                           gid="stopped_early")
            best, last = row["best_error"], row["last_error"]
            if _finite(best.get("mean")):
                sd = best["std"] if _finite(best.get("std")) else 0.0
                ax.errorbar(x + 0.12, best["mean"], yerr=sd, fmt="_", color=color,
                            markersize=12, capsize=3, zorder=4)
            if _finite(last.get("mean")):
                ax.scatter(x + 0.3, last["mean"], s=18, facecolors="none", edgecolors=color,
                           zorder=4)
            ax.scatter(x - 0.15, row["published"], marker="D", s=22, color=PUBLISHED_COLOR,
                       zorder=5)
        ax.set_xticks(range(len(rows)), [r["row"] for r in rows], rotation=30, ha="right")
        ax.set_ylabel("test error (%)")
        ax.set_title(title, fontsize=8)
        add_grid(ax)
    if not panels:
        cells[0].text(0.5, 0.5, "no published rows in this summary", ha="center",
                      va="center", transform=cells[0].transAxes)
    handles = [Line2D([], [], marker="D", ls="", color=PUBLISHED_COLOR, label="published"),
               Line2D([], [], marker="_", ls="", color=PASS_COLOR, markersize=12,
                      label="best epoch, mean ± sd (dots: seeds)"),
               Line2D([], [], marker="o", ls="", mfc="none", color=PASS_COLOR,
                      label="last epoch, mean"),
               Line2D([], [], marker="o", ls="", color=WALK_BACK_COLOR,
                      label="walked back by the protocol")]
    stopped = summary.get("stopped_early")
    if stopped:
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec="black",
                              markersize=8, label="seed that stopped early (ringed)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, -0.08 / n_rows))
    notes = {"not_compared_note": off_setting_note(summary), "stopped_early_note": stopped}
    notes = {gid: text for gid, text in notes.items() if text}
    if notes:
        notes_below(fig, [ax for ax in cells if ax.get_visible()], notes)
    return fig


def save_literature_figure(summary: dict[str, Any], out_dir: str | Path,
                           name: str = "literature") -> list[Path]:
    """Write ``out_dir/name.png`` and ``.pdf``; returns the paths."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return save(published_vs_reproduced(summary), out_dir, name)


__all__ = ["off_setting_note", "published_panels", "published_vs_reproduced",
           "save_literature_figure"]
