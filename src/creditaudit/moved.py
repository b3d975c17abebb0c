"""Where the modules that moved in 0.2 went, and the import hook that keeps the old paths.

The package was reorganised into packages that say what the code is (``run/``, ``audit/``,
``measures/``, ``study/``, ``files/``, ``guests/``, ``testing/``; see docs/architecture.md).
For one release the old import paths keep working: importing ``creditaudit.training`` gives
the module ``creditaudit.run.trainer`` itself — the same object, so monkeypatching and
``isinstance`` see one module — with a :class:`DeprecationWarning` naming the new path. A
moved package's submodules follow it (``creditaudit.diagnostics.quality`` →
``creditaudit.measures.quality``).

:data:`MOVED` is the one table: the hook reads it, and run ids read it backwards
(:func:`pre_move_path`) so that a config naming a module factory by its new path
(``creditaudit.testing.zoo:resnet20``) has the run id it had under the old one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old module path → new module path (a package's submodules follow it)
MOVED: dict[str, str] = {
    "creditaudit.plan": "creditaudit.run.plan",
    "creditaudit.run_setup": "creditaudit.run.setup",
    "creditaudit.run_folder": "creditaudit.run.folder",
    "creditaudit.run_results": "creditaudit.run.results",
    "creditaudit.training": "creditaudit.run.trainer",
    "creditaudit.resume": "creditaudit.run.resume",
    "creditaudit.evaluation": "creditaudit.run.evaluation",
    "creditaudit.recorder": "creditaudit.run.recorder",
    "creditaudit.recorder_config": "creditaudit.run.recorder_config",
    "creditaudit.door": "creditaudit.run.door",
    "creditaudit.stacked": "creditaudit.run.stacked",
    "creditaudit.stepping": "creditaudit.run.steps.stepping",
    "creditaudit.epochs": "creditaudit.run.steps.epochs",
    "creditaudit.capture": "creditaudit.run.steps.capture",
    "creditaudit.own_model": "creditaudit.audit.diagnose",
    "creditaudit.experiments": "creditaudit.study.experiments",
    "creditaudit.export": "creditaudit.study.export",
    "creditaudit.figures.hero": "creditaudit.study.figures.hero",
    "creditaudit.figures.temporal": "creditaudit.study.figures.temporal",
    "creditaudit.figures.penalty": "creditaudit.study.figures.penalty",
    "creditaudit.figures.lambda_sweep": "creditaudit.study.figures.lambda_sweep",
    "creditaudit.figures.summary": "creditaudit.study.figures.summary",
    "creditaudit.figures.literature": "creditaudit.study.figures.literature",
    "creditaudit.run_ids": "creditaudit.records.run_ids",
    "creditaudit.strict_json": "creditaudit.files.strict_json",
    "creditaudit.safe_files": "creditaudit.files.safe_files",
    "creditaudit.cache": "creditaudit.files.cache",
    "creditaudit.blame": "creditaudit.guests.blame",
    "creditaudit.diagnostics": "creditaudit.measures",
    "creditaudit.zoo": "creditaudit.testing.zoo",
    "creditaudit.torch_range": "creditaudit.version",
    "creditaudit.sweep.claims": "creditaudit.records.claims",  # train() holds claims too
}


def _translate(name: str, table: dict[str, str]) -> str | None:
    """``name`` under ``table`` (itself or its nearest listed package), or None."""
    head, rest = name, ""
    while head:
        if head in table:
            return table[head] + rest
        head, dot, tail = head.rpartition(".")
        rest = dot + tail + rest
    return None


def new_path(name: str) -> str | None:
    """The module path an old path ``name`` moved to; None when it did not move."""
    return _translate(name, MOVED)


def pre_move_path(name: str) -> str:
    """The old path of a moved module ``name`` (its run-id spelling), else ``name``.

    Only modules that were modules before the move map back (``creditaudit.version`` is
    not ``creditaudit.torch_range``)."""
    back = {new: old for old, new in MOVED.items() if old != "creditaudit.torch_range"}
    return _translate(name, back) or name


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module of its new path (the same object)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the old name's spec on the module; it keeps its own.
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds old module paths (see :data:`MOVED`) before any other finder."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import {new} (the old path goes in the "
                      "next release)", DeprecationWarning, stacklevel=2)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


__all__ = ["MOVED", "install", "new_path", "pre_move_path"]
