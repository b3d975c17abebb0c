"""The benchmark scripts are not run in CI (they measure for minutes and assert nothing), so
a name they import from creditaudit can move without a failing test: this checks every such
import still resolves."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))


def creditaudit_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from creditaudit… import name`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] == "creditaudit" for alias in node.names]


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_every_name_a_benchmark_imports_from_creditaudit_exists(path):
    missing = []
    for module_name, name in creditaudit_imports(path):
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"{path.name} imports names creditaudit no longer has: {missing}"


def test_the_check_sees_the_imports():
    assert ("creditaudit.audit", "load_run") in creditaudit_imports(
        Path(__file__).parent.parent / "benchmarks" / "bench_end_of_run.py")


SCRIPTS = sorted((Path(__file__).parent.parent / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", BENCHMARKS + SCRIPTS, ids=lambda p: p.name)
def test_a_script_that_takes_arguments_parses_them(path):
    """The docs name these scripts; one that reads ``sys.argv`` itself takes ``--help`` for
    a value (scripts/protocol_table.py trained ten minutes of runs into a folder "--help")."""
    text = path.read_text(encoding="utf-8")
    assert "sys.argv" not in text or "ArgumentParser(" in text, \
        f"{path.name} reads sys.argv without argparse: give it an ArgumentParser"


def test_protocol_table_answers_help_without_training(tmp_path):
    root = Path(__file__).parent.parent
    proc = subprocess.run([sys.executable, str(root / "scripts" / "protocol_table.py"),
                           "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]
    assert not list(tmp_path.iterdir()), "--help wrote files"
