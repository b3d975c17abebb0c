"""What every figure shares: labels, colours, styling and saving.

A figure module exposes ``NAME``, ``TITLE``, ``requirements`` (what runs it needs, in
words), ``build(index) -> {name: Figure}`` and ``render(index, out_dir) -> [paths]``; both
raise :class:`~creditaudit.figures.runs.MissingRuns` naming what is missing when the index
cannot support it. Run selection lives in :mod:`creditaudit.figures.runs`.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from creditaudit.methods import find_rule, rule_label  # noqa: E402
from creditaudit.protocol import FIRED, DiagnosticReport, Thresholds  # noqa: E402
from creditaudit.safe_files import atomic_write_bytes  # noqa: E402

# Rules without their own `color`/`marker` (and records of rules not installed here) take
# one of these, chosen from the name so a rule keeps its style across figures and runs.
FALLBACK_COLORS = ("#8c510a", "#01665e", "#c51b7d", "#4d9221", "#542788", "#b35806",
                   "#2d004b", "#7f3b08", "#1f78b4", "#e31a1c")
FALLBACK_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "*")
# Penalised runs (λ > 0) get a sequence of greens/blues, vanilla keeps the method colour.
PENALTY_COLORS = ("#1a9850", "#2c7bb6", "#7b3294", "#d95f02", "#66a61e", "#e7298a")
HEALTHY_COLOR, WALKBACK_COLOR = "#1a9850", "#d73027"
FLOOR = Thresholds().grad_floor
ARCH_ROWS = ("resmlp", "vit", "convmixer", "resmlp no out_ln", "student")
ARCH_LABELS = {"resmlp": "ResMLP", "vit": "ViT-Mini", "convmixer": "ConvMixer",
               "resmlp no out_ln": "ResMLP no out_LN", "vit no out_ln": "ViT-Mini no out_LN",
               "convmixer no out_ln": "ConvMixer no out_LN", "student": "StudentNet"}
PNG_DPI = 200
STYLE = {
    "font.size": 9, "axes.labelsize": 10, "axes.titlesize": 10, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "font.family": "serif",
}


# --- drawing ------------------------------------------------------------------------------
def method_label(method: str, penalty: float = 0.0) -> str:
    """The rule's own label (the name for rules not installed here), λ appended."""
    label = rule_label(method)
    return f"{label} λ={penalty:g}" if penalty else label


def _stable_index(name: str, n: int) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % n


def method_color(method: str) -> str:
    rule = find_rule(method)
    if rule is not None and rule.color:
        return rule.color
    return FALLBACK_COLORS[_stable_index(method, len(FALLBACK_COLORS))]


def method_marker(method: str) -> str:
    rule = find_rule(method)
    if rule is not None and rule.marker:
        return rule.marker
    return FALLBACK_MARKERS[_stable_index(method, len(FALLBACK_MARKERS))]


def method_rank(method: str) -> tuple[int, str]:
    """Listing order of a rule: its ``rank``, then its name (unknown rules: rank 100)."""
    rule = find_rule(method)
    return (rule.rank if rule is not None else 100, method)


def new_figure(nrows: int, ncols: int, *, figsize: tuple[float, float], **kwargs: Any
               ) -> tuple[Figure, np.ndarray]:
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, **kwargs)
    return fig, axes


def add_grid(ax: Any, log_scale: bool = False) -> None:
    ax.grid(True, which="major", color="#d0d0d0", linewidth=0.4, linestyle=":")
    if log_scale:
        ax.grid(True, which="minor", color="#e8e8e8", linewidth=0.3, linestyle=":")
    ax.set_axisbelow(True)


def integer_x(ax: Any) -> None:
    """Integer ticks on the x axis (epochs, layers, blocks)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def floor_line(ax: Any, label: str | None = None) -> Any:
    """The 1e-7 reference-gradient floor of diagnostic (b)."""
    return ax.axhline(FLOOR, color="black", ls="--", lw=0.9,
                      label=label or f"floor {FLOOR:.0e}", gid="floor")


def positive(values: Iterable[float]) -> list[float]:
    return [v for v in values if v > 0 and math.isfinite(v)]


def mean_line(ax: Any, x: Sequence[float], mean: np.ndarray, std: np.ndarray, *, label: str,
              color: str, band: bool = True, **kwargs: Any) -> Any:
    """The mean across seeds as a line (label = ``label``) and ± std as a band."""
    (line,) = ax.plot(x, mean, color=color, label=label, **kwargs)
    if band and np.any(std > 0):
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)
    return line


INVALID_LABEL = "hollow: reference ‖g_l‖ < 1e-7, cosine not valid"


def hollow_invalid(ax: Any, x: Sequence[float], y: Sequence[float], valid: Sequence[bool], *,
                   color: str, marker: str, gid: str) -> None:
    """Redraw the points whose cosine is not valid (reference gradient below the floor) as
    hollow markers, so a number measured against numerical noise is never read as a value."""
    bad = [i for i, ok in enumerate(valid) if not ok and i < len(x)]
    if not bad:
        return
    ax.plot([x[i] for i in bad], [y[i] for i in bad], ls="none", marker=marker, ms=8,
            mfc="white", mec=color, mew=1.5, zorder=6, gid=gid)


def note_invalid(ax: Any, any_invalid: bool) -> None:
    """Explain hollow markers under the axes when some are drawn."""
    if any_invalid:
        ax.text(0.0, -0.18, INVALID_LABEL, transform=ax.transAxes, fontsize=7, color="#555555",
                va="top", gid="invalid_note")


def save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.png`` (``PNG_DPI``, 200) and ``.pdf``; closes it."""
    out = Path(out_dir)
    # One tight bounding box for both files: bbox_inches="tight" would lay out every text
    # twice per file, which dominates the time on a small machine.
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    paths = []
    try:
        for ext, dpi in (("png", PNG_DPI), ("pdf", None)):
            # Rendered in memory, then written atomically: a full disk leaves no half file.
            buffer = io.BytesIO()
            fig.savefig(buffer, bbox_inches=bbox, dpi=dpi, format=ext)
            path = out / f"{name}.{ext}"
            atomic_write_bytes(path, buffer.getvalue())
            paths.append(path)
    finally:
        plt.close(fig)
    return paths


def save_all(figures: dict[str, Figure], out_dir: str | Path) -> list[Path]:
    paths: list[Path] = []
    for name, fig in figures.items():
        paths.extend(save(fig, out_dir, name))
    return paths


def fired_ids(report: DiagnosticReport) -> list[str]:
    return [r.id for r in report.diagnostics if r.status == FIRED]
