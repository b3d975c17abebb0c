"""What every figure shares: labels, colours, styling and saving.

A figure module exposes ``NAME``, ``TITLE``, ``requirements`` (what runs it needs, in
words), ``build(index) -> {name: Figure}`` and ``render(index, out_dir) -> [paths]``; both
raise :class:`~creditaudit.figures.runs.MissingRuns` naming what is missing when the index
cannot support it. Run selection lives in :mod:`creditaudit.figures.runs`.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogFormatterSciNotation  # noqa: E402

from creditaudit.figures.rule_styles import (  # noqa: E402, F401 — importable from here as before
    FALLBACK_COLORS,
    FALLBACK_MARKERS,
    method_color,
    method_marker,
    own_style,
)
from creditaudit.files.safe_files import atomic_write_bytes  # noqa: E402
from creditaudit.formatting import plain_line  # noqa: E402
from creditaudit.protocol import FIRED, DiagnosticReport, Thresholds  # noqa: E402
from creditaudit.records import RunRecord  # noqa: E402
from creditaudit.results import method_label  # noqa: E402

# Penalised runs (λ > 0) get a sequence of greens/blues, vanilla keeps the method colour.
PENALTY_COLORS = ("#1a9850", "#2c7bb6", "#7b3294", "#d95f02", "#66a61e", "#e7298a")
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


# --- text ---------------------------------------------------------------------------------
def literal(text: object) -> str:
    """``text`` (a name, a label, a note: anything a record or a plugin wrote) as a figure
    draws it as itself: on one line (a line break would read as another label line),
    control characters as spaces (no font draws them) and every ``$`` escaped, so no
    mathtext is parsed — an even number of ``$`` would typeset what lies between them,
    and an invalid expression (``$\\frac$``) would stop the figure from being drawn."""
    return plain_line(text).replace("$", r"\$")


def rule_text(method: str, penalty: float = 0.0) -> str:
    """The rule's label (:func:`~creditaudit.results.method_label`) as figure text."""
    return literal(method_label(method, penalty))


# --- drawing ------------------------------------------------------------------------------
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
    """Integer ticks on the x axis (epochs, layers, blocks), also where the data hold one
    value (a run that diverged in its first epoch keeps only epoch 0), which matplotlib's
    default of two ticks at least labelled −0.045 … 0.045."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


# --- log axes -------------------------------------------------------------------------------
NARROW_DECADES = 2.0  # a log axis spanning fewer decades is labelled with plain numbers


def plain_number(value: float, digits: int = 4) -> str:
    """A tick value as people write it: ``2.3``, ``0.0005``, ``1500``, ``2.5e-08`` → ``2.5e-8``
    (between 1e-3 and 1e5 with up to ``digits`` significant digits)."""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}"
    mantissa, _, exponent = f"{value:.2g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


class ReadableLogFormatter(LogFormatterSciNotation):
    """Log-axis labels that read at a glance.

    Over a wide range the decades are labelled 10ⁿ as usual. Over a narrow range (fewer than
    ``NARROW_DECADES`` decades in view) matplotlib labels the ticks between decades as
    ``3.25×10⁰``; this writes them as plain numbers (``3.25``) instead.
    """

    _locs: Sequence[float] = ()

    def set_locs(self, locs: Sequence[float] | None = None) -> None:
        self._locs = () if locs is None else list(locs)
        super().set_locs(locs)

    def __call__(self, x: float, pos: int | None = None) -> str:
        label = super().__call__(x, pos)
        if not label or self.axis is None:
            return label
        low, high = sorted(abs(v) for v in self.axis.get_view_interval())
        if low <= 0 or math.log10(high / low) >= NARROW_DECADES:
            return label
        return plain_number(x, self._digits(low, high))

    def _digits(self, low: float, high: float) -> int:
        """The fewest significant digits (4 at least) that write the ticks in view
        (``low`` … ``high``) as different numbers: over a range as narrow as 2.2131 … 2.2142
        four digits label several ticks ``2.213``."""
        ticks = {v for v in self._locs if low <= v <= high and v > 0}
        digits = 4
        while digits < 12 and len({f"{v:.{digits}g}" for v in ticks}) < len(ticks):
            digits += 1
        return digits


def log_scale(ax: Any, axis: str = "y") -> None:
    """Put ``axis`` of ``ax`` on a log scale with :class:`ReadableLogFormatter` labels."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target.set_major_formatter(ReadableLogFormatter(labelOnlyBase=False))
    target.set_minor_formatter(ReadableLogFormatter(labelOnlyBase=False))


# --- legends and empty panels -----------------------------------------------------------------
LEGEND_STYLE = {"fontsize": 7, "frameon": False, "handlelength": 2.2}


def _bottom_in(fig: Figure, axes: Sequence[Any]) -> float:
    """The lowest point (figure fraction) of ``axes`` with their labels, ticks and notes."""
    renderer = fig.canvas.get_renderer()
    return min(ax.get_tightbbox(renderer).y0 for ax in axes) / fig.bbox.height


def unique_handles(axes: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """Legend entries of ``axes`` in drawing order, each label once."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label and not label.startswith("_") and label not in seen:
                seen[label] = handle
    return list(seen.values()), list(seen)


def legend_below(fig: Figure, axes: Sequence[Any], *, ncol: int | None = None,
                 handles: tuple[list[Any], list[str]] | None = None) -> Any:
    """One legend for ``axes``, centred under them (below their tick labels and notes), so
    it never covers a data point. Returns the Legend (None when there is nothing to list)."""
    found, labels = handles or unique_handles(axes)
    if not found:
        return None
    left = min(ax.get_position().x0 for ax in axes)
    right = max(ax.get_position().x1 for ax in axes)
    width_in = (right - left) * fig.get_figwidth()
    ncol = ncol or max(1, min(len(found), int(width_in / 1.6)))
    return fig.legend(found, labels, loc="upper center", ncol=ncol,
                      bbox_to_anchor=((left + right) / 2, _bottom_in(fig, axes) - 0.01),
                      **LEGEND_STYLE)


def legend_right(ax: Any, **kwargs: Any) -> Any:
    """The axes' legend to the right of it, outside the plotting area (None: nothing to
    list)."""
    if not unique_handles([ax])[0]:
        return None
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     **{**LEGEND_STYLE, **kwargs})


def has_data(ax: Any) -> bool:
    """Whether ``ax`` shows anything measured (lines and markers with finite points, bars
    or scatter points), reference lines (gid "floor", threshold…) and notes aside."""
    def measured(artist: Any) -> bool:
        gid = artist.get_gid()
        return bool(gid) and gid not in REFERENCE_GIDS and not gid.endswith(":threshold")

    for line in ax.get_lines():
        xy = np.column_stack([np.asarray(line.get_xdata(), dtype=float),
                              np.asarray(line.get_ydata(), dtype=float)])
        if measured(line) and np.isfinite(xy).all(axis=1).any():
            return True
    scatter = [c for c in ax.collections if isinstance(c, PathCollection) and measured(c)]
    return any(np.isfinite(np.asarray(c.get_offsets(), dtype=float)).all(axis=1).any()
               for c in scatter) \
        or any(np.isfinite(p.get_height()) for p in ax.patches if measured(p))


REFERENCE_GIDS = {"floor", "chance", "frozen", "frozen_margin", "c:frozen"}


def empty_note(ax: Any, text: str) -> None:
    """Say in the middle of an empty panel which runs (or record fields) would fill it."""
    import textwrap

    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(literal(text), 44)), transform=ax.transAxes,
            ha="center", va="center", fontsize=8, color="#555555", gid="empty_note",
            bbox={"boxstyle": "round,pad=0.5", "facecolor": "#f7f7f7", "edgecolor": "#cccccc"})


def notes_below(fig: Figure, axes: Sequence[Any], notes: dict[str, str],
                width: int = 120) -> None:
    """Each of ``notes`` (gid → text) as grey lines of at most ``width`` characters under
    ``axes`` and every legend of ``fig``, one below the other, so none covers the figure."""
    import textwrap

    renderer = fig.canvas.get_renderer()
    below = min([_bottom_in(fig, axes),
                 *(legend.get_window_extent(renderer).y0 / fig.bbox.height
                   for legend in fig.legends)])
    for gid, text in notes.items():
        lines = textwrap.wrap(literal(text), width, break_on_hyphens=False)
        note = fig.text(0.5, below - 0.02, "\n".join(lines), ha="center", va="top",
                        fontsize=8, color="#555555", gid=gid)
        below = note.get_window_extent(renderer).y0 / fig.bbox.height


# The per-epoch norms drawn on log axes, as notes name them.
PLAIN_NAMES = {"h_L_norm": "‖h_L‖", "g_L_norm": "‖g_L‖", "g_2_norm": "‖g_2‖"}
# Panel titles of the per-epoch norm curves (Figures 2 and 8): medians over the evaluation
# samples, ‖g_L‖ in the 1/128 scale every other figure and table names.
H_L_TITLE = r"median $\|h_L\|$ (residual norm)"
G_L_TITLE = r"median $\|g_L\|$ (BP gradient at $h_L$, 1/128 scale)"


def _undrawable(runs: list[RunRecord], key: str) -> list[str]:
    """How many of ``runs`` logged per-epoch ``key`` ≤ 0, and how many NaN/inf, in words
    (nothing for a count of 0)."""
    name = PLAIN_NAMES[key]
    zero = [run for run in runs if any(v <= 0 for v in run.series(key)[1])]
    overflowed = [run for run in runs
                  if any(not math.isfinite(v) for v in run.series(key)[1])]
    parts = [f"{len(zero)} of {len(runs)} runs logged {name} ≤ 0 at some epoch, which a "
             "log axis cannot show"] if zero else []
    if overflowed:
        parts.append(f"{len(overflowed)} of {len(runs)} runs logged {name} NaN/inf at some "
                     "epoch (diverged), not drawn")
    return parts


def log_panel_note(ax: Any, runs: list[RunRecord], key: str | Sequence[str]) -> None:
    """Say on a log panel of per-epoch ``key`` how many of ``runs`` logged it ≤ 0 (a log
    axis drops such epochs: a ‖g_L‖ collapsed to exactly 0 would leave no trace) and how
    many logged it NaN/inf (a diverged run's overflowed epoch, which no axis draws): in its
    middle when no run has a value it can draw, else in its corner. A panel drawing several
    norms (on twin y axes) passes their ``key``s: one note, a line per norm, so no two notes
    cover each other."""
    keys = [key] if isinstance(key, str) else list(key)
    lines = ["; ".join(parts) for k in keys if (parts := _undrawable(runs, k))]
    if not lines:
        return
    drawn = any(v > 0 and math.isfinite(v)
                for k in keys for run in runs for v in run.series(k)[1])
    if drawn:
        ax.text(0.99, 0.02, "\n".join(literal(line) for line in lines),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="gray",
                gid="not_drawable")
    else:
        empty_note(ax, " ".join(f"{line}." for line in lines) if len(lines) > 1 else lines[0])


END_OF_RUN_HINT = ("runs with end-of-run metrics (diagnostics.end_of_run = true, the default) "
                   "would fill it")


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


INVALID_LABEL = ("hollow: cosine not valid (reference ‖g_l‖ < 1e-7, or a reference gradient "
                 "that is not verified)")


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


# A PDF's metadata without its CreationDate (matplotlib writes the time of saving).
NO_DATE: dict[str, Any] = {"CreationDate": None}


def save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.png`` (``PNG_DPI``, 200) and ``.pdf``; closes it. The
    PDF carries no creation date, so the same records draw byte-identical files."""
    out = Path(out_dir)
    # One tight bounding box for both files: bbox_inches="tight" would lay out every text
    # twice per file, which dominates the time on a small machine.
    bbox = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    paths = []
    try:
        for ext, dpi, metadata in (("png", PNG_DPI, None), ("pdf", None, NO_DATE)):
            # Rendered in memory, then written atomically: a full disk leaves no half file.
            buffer = io.BytesIO()
            fig.savefig(buffer, bbox_inches=bbox, dpi=dpi, format=ext, metadata=metadata)
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
