"""Installing tests/plugin_pkg — one credit rule, architecture, dataset and protocol
diagnostic from outside creditaudit — the way ``pip install`` would, without pip.

What pip leaves for a package's entry points is the package on a ``sys.path`` folder plus a
``NAME-VERSION.dist-info`` folder holding ``METADATA`` (name, version) and
``entry_points.txt``; :func:`install_test_plugins` writes exactly that from the package's own
``pyproject.toml``, so the entry points are declared in one place. Used by
tests/test_outside_plugins.py and by tests/test_docs_run.py (docs/extending.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tests" / "plugin_pkg"
MODULE = "creditaudit_test_plugins"
PROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
DISTRIBUTION, VERSION = PROJECT["name"], PROJECT["version"]


def entry_points_text() -> str:
    """``entry_points.txt`` as pip writes it from ``[project.entry-points.*]``."""
    lines = []
    for group, entries in PROJECT["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
        lines.append("")
    return "\n".join(lines)


def dist_info(site: Path) -> Path:
    return site / f"{MODULE}-{VERSION}.dist-info"


def install_test_plugins(site: Path) -> Path:
    """Put the package and its dist-info folder into ``site`` (created); returns ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(PACKAGE / MODULE, site / MODULE, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = dist_info(site)
    info.mkdir(exist_ok=True)
    (info / "entry_points.txt").write_text(entry_points_text())
    set_version(site, VERSION)
    return site


def set_version(site: Path, version: str) -> None:
    """What upgrading the installed package changes: the version in its METADATA."""
    (dist_info(site) / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n")


def forget_test_plugins() -> None:
    """Drop the package's modules from this process (after its folder left sys.path)."""
    for name in [n for n in sys.modules if n == MODULE or n.startswith(f"{MODULE}.")]:
        del sys.modules[name]


def cli(site: Path | None, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m creditaudit ARGS`` in a fresh process with ``site`` installed (None: without
    the plugins)."""
    # The plugin's site first, then whatever the suite runs with (a checkout's src/).
    parts = (str(site) if site else "", os.environ.get("PYTHONPATH", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}
    return subprocess.run([sys.executable, "-m", "creditaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)
