"""The figures of docs/figures.md, drawn from run records only (never a live model).

One module per figure; the toolkit's own are the generic ones, drawn for any rule, model and
dataset (:mod:`.audit_panels`, :mod:`.weight_alignment`, :mod:`.run_curves`); the study
registers the paper's with :func:`register_figures` when :mod:`creditaudit.study.figures` is
imported (the command line does). Each exposes ``NAME``,
``TITLE``, ``requirements`` (the runs it needs, in words), ``build(index) -> {file name:
Figure}`` and ``render(index, out_dir) -> [png and pdf paths]``. Both raise
:class:`MissingRuns` (naming what is missing) when the runs in the index cannot support the
figure. :func:`render_all` draws every figure it can.

>>> index = RunIndex.from_dir("results")
>>> rendered, missing = render_all(index, "results/figures")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from creditaudit.figures import audit_panels, run_curves, weight_alignment
from creditaudit.figures.runs import MissingRuns
from creditaudit.results import RunIndex

# Every figure render_all draws, in order: registered ones first, then the generic ones.
FIGURES: list[ModuleType] = [audit_panels, weight_alignment, run_curves]
_GENERIC = len(FIGURES)


def register_figures(*modules: ModuleType) -> None:
    """Add figure modules (each with ``NAME``, ``TITLE``, ``build``, ``render``) for
    :func:`render_all` to draw, before the generic ones; a module registered twice is kept
    once."""
    for module in modules:
        if module not in FIGURES:
            FIGURES.insert(len(FIGURES) - _GENERIC, module)


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


__all__ = ["FIGURES", "MissingRuns", "RunIndex", "Rendered", "register_figures", "render_all"]
