"""The package version (its own module so low layers can read it without the package), and
the source revision a run record names beside it."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__version__ = "0.1.0"

# src/creditaudit/version.py → the checkout's root (an installed wheel has no .git there)
_CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def source_revision() -> str | None:
    """The git commit this package's source is at, with ``+dirty`` when tracked files under
    ``src/`` differ from it; None when the package does not run from a git checkout (an
    installed wheel) or git cannot tell. Cached per process.

    Numbers change when a defect of a rule is fixed while the version stays the same; the
    revision tells a reader which code produced a record.
    """
    if not (_CHECKOUT / ".git").exists():
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "src")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if changed else "")
