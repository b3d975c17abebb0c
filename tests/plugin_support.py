"""Installing an outside package of plugins the way ``pip install`` would, without pip.

What pip leaves for a package's entry points is the package on a ``sys.path`` folder plus a
``NAME-VERSION.dist-info`` folder holding ``METADATA`` (name, version) and
``entry_points.txt``; :func:`install_package` writes exactly that from the package's own
``pyproject.toml``, so the entry points are declared in one place. Two packages live beside
the tests: ``tests/plugin_pkg`` (one well-behaved plugin of each kind; used by
tests/test_outside_plugins.py and tests/test_docs_run.py for docs/extending.md) and
``tests/guest_pkg`` (guests that lie or break, each installed on its own with ``only=``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class OutsidePackage:
    """A plugin package beside the tests: its folder, import name, distribution and
    version, and its ``[project.entry-points.*]`` tables."""

    folder: Path
    module: str

    @property
    def project(self) -> dict:
        return tomllib.loads((self.folder / "pyproject.toml").read_text())["project"]

    @property
    def distribution(self) -> str:
        return self.project["name"]

    @property
    def version(self) -> str:
        return self.project["version"]

    def entry_points_text(self, only: Iterable[str] | None = None) -> str:
        """``entry_points.txt`` as pip writes it; ``only``: the entry-point names to keep."""
        keep = None if only is None else set(only)
        lines = []
        for group, entries in self.project["entry-points"].items():
            chosen = {n: t for n, t in entries.items() if keep is None or n in keep}
            if not chosen:
                continue
            lines.append(f"[{group}]")
            lines += [f"{name} = {target}" for name, target in chosen.items()]
            lines.append("")
        return "\n".join(lines)

    def dist_info(self, site: Path) -> Path:
        return site / f"{self.module}-{self.version}.dist-info"

    def install(self, site: Path, only: Iterable[str] | None = None) -> Path:
        """Put the package and its dist-info folder into ``site`` (created), with the entry
        points named in ``only`` (all when None); returns ``site``."""
        site.mkdir(parents=True, exist_ok=True)
        shutil.copytree(self.folder / self.module, site / self.module, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        info = self.dist_info(site)
        info.mkdir(exist_ok=True)
        (info / "entry_points.txt").write_text(self.entry_points_text(only))
        self.set_version(site, self.version)
        return site

    def set_version(self, site: Path, version: str) -> None:
        """What upgrading the installed package changes: the version in its METADATA."""
        (self.dist_info(site) / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {self.distribution}\nVersion: {version}\n")

    def forget(self) -> None:
        """Drop the package's modules from this process (after its folder left sys.path)."""
        for name in [n for n in sys.modules
                     if n == self.module or n.startswith(f"{self.module}.")]:
            del sys.modules[name]


PLUGINS = OutsidePackage(ROOT / "tests" / "plugin_pkg", "creditaudit_test_plugins")
GUESTS = OutsidePackage(ROOT / "tests" / "guest_pkg", "creditaudit_guests")
# The well-behaved package's facts, as the tests that predate OutsidePackage import them.
PACKAGE, MODULE = PLUGINS.folder, PLUGINS.module
PROJECT, DISTRIBUTION, VERSION = PLUGINS.project, PLUGINS.distribution, PLUGINS.version


@contextlib.contextmanager
def one_module_plugin(site: Path, group: str, entry: str, modules: dict[str, str]
                      ) -> Iterator[Path]:
    """A distribution ``one-module==0.1.0`` of top-level modules (``modules``: name →
    source) registering ``entry`` (``name = module:Class``) in ``group``, installed in
    ``site`` without a RECORD (as an editable install or a folder on PYTHONPATH is) and found
    in this process; gone afterwards. Yields ``site``."""
    info = site / "one_module-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: one-module\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)

    def forget() -> None:
        for name in modules:
            sys.modules.pop(name, None)

    with plugins_on_path(site, forget):
        yield site


@contextlib.contextmanager
def plugins_on_path(site: Path, forget: Callable[[], None]) -> Iterator[Path]:
    """``site`` first on ``sys.path`` and the plugins it installs found, while the block
    runs; afterwards off the path, ``forget()`` run (the modules it imported dropped) and the
    plugins found again without it. Yields ``site``."""
    from creditaudit.registry import reload_plugins

    sys.path.insert(0, str(site))
    reload_plugins()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        forget()
        reload_plugins()


def entry_points_text() -> str:
    return PLUGINS.entry_points_text()


def dist_info(site: Path) -> Path:
    return PLUGINS.dist_info(site)


def install_test_plugins(site: Path) -> Path:
    """Install the well-behaved package (every entry point) into ``site``."""
    return PLUGINS.install(site)


def set_version(site: Path, version: str) -> None:
    PLUGINS.set_version(site, version)


def forget_test_plugins() -> None:
    PLUGINS.forget()


def cli(site: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m creditaudit ARGS`` in a fresh process with ``site`` installed (None: without
    the plugins)."""
    # The plugin's site first, then whatever the suite runs with (a checkout's src/).
    parts = (str(site) if site else "", os.environ.get("PYTHONPATH", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}
    return subprocess.run([sys.executable, "-m", "creditaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def exiting_net_source(exit_call: str, *, once: bool) -> str:
    """The source of a module factory ``Net(exit_at=0)``: an MLP (8 → 16 → 16 → 10) whose
    forward runs ``exit_call`` (``"os._exit(0)"``, ``"sys.exit(3)"``) at its ``exit_at``-th
    training batch of the process (``once``: then only; else from then on)."""
    module = exit_call.split(".")[0]
    when = ("self.calls == self.exit_at" if once
            else "self.exit_at and self.calls >= self.exit_at")
    return f'''
import {module}

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, exit_at=0):
        super().__init__()
        self.exit_at, self.calls = exit_at, 0
        self.l1, self.l2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 10)

    def forward(self, x):
        if self.training:
            self.calls += 1
            if {when}:
                {exit_call}
        return self.head(torch.relu(self.l2(torch.relu(self.l1(x)))))
'''
