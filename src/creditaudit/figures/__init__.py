"""The figures of docs/figures.md, drawn from run records only (never a live model).

One module per figure; each exposes ``NAME``, ``TITLE``, ``requirements`` (the runs it
needs, in words), ``build(index) -> {file name: Figure}`` and ``render(index, out_dir) ->
[png and pdf paths]``. Both raise :class:`MissingRuns` (naming what is missing) when the
runs in the index cannot support the figure. :func:`render_all` draws every figure it can.

>>> index = RunIndex.from_dir("results")
>>> rendered, missing = render_all(index, "results/figures")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from creditaudit.figures import (
    audit_panels,
    hero,
    lambda_sweep,
    penalty,
    summary,
    temporal,
    weight_alignment,
)
from creditaudit.figures.runs import MissingRuns
from creditaudit.results import RunIndex

FIGURES: tuple[ModuleType, ...] = (hero, temporal, penalty, lambda_sweep, summary,
                                   audit_panels, weight_alignment)


@dataclass
class Rendered:
    """A figure that was drawn: its module name, title and files (PNG and PDF)."""

    name: str
    title: str
    paths: list[Path]

    @property
    def pngs(self) -> list[Path]:
        return [p for p in self.paths if p.suffix == ".png"]


def render_all(index: RunIndex, out_dir: str | Path
               ) -> tuple[list[Rendered], list[tuple[ModuleType, MissingRuns]]]:
    """Render every figure the index supports into ``out_dir``.

    Returns (rendered figures, [(figure module, MissingRuns) for the ones it cannot draw]).
    """
    rendered, missing = [], []
    for module in FIGURES:
        try:
            paths = module.render(index, out_dir)
        except MissingRuns as err:
            missing.append((module, err))
            continue
        rendered.append(Rendered(module.NAME, module.TITLE, paths))
    return rendered, missing


__all__ = ["FIGURES", "MissingRuns", "RunIndex", "Rendered", "render_all"]
