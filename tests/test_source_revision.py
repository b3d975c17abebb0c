"""A run record names the source revision that produced it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from creditaudit import version
from creditaudit.records.files import environment

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A git checkout with one committed source file, standing in for the package's own."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "rule.py").write_text("BETA = 0.01\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "src/rule.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "rule")
    monkeypatch.setattr(version, "_CHECKOUT", tmp_path)
    version.source_revision.cache_clear()
    yield tmp_path
    version.source_revision.cache_clear()


def test_a_clean_checkout_is_named_by_its_commit(checkout):
    assert version.source_revision() == git(checkout, "rev-parse", "HEAD")


def test_changed_source_is_marked_dirty_and_other_files_are_not(checkout):
    (checkout / "notes.txt").write_text("untracked\n")
    assert not version.source_revision().endswith("+dirty")
    version.source_revision.cache_clear()
    (checkout / "src" / "rule.py").write_text("BETA = 0.001\n")
    assert version.source_revision() == git(checkout, "rev-parse", "HEAD") + "+dirty"


def test_an_installed_package_has_no_revision(tmp_path, monkeypatch):
    monkeypatch.setattr(version, "_CHECKOUT", tmp_path)  # no .git: a wheel's site-packages
    version.source_revision.cache_clear()
    try:
        assert version.source_revision() is None
        assert environment("cpu")["source"] is None
    finally:
        version.source_revision.cache_clear()


def test_the_record_environment_carries_the_revision(checkout):
    assert environment("cpu")["source"] == git(checkout, "rev-parse", "HEAD")
