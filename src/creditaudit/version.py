"""The package version (its own module so low layers can read it without the package), the
source revision a run record names beside it, and the torch releases the package is tested on
(one warning on any other).

pyproject.toml accepts ``torch>=2.1,<2.15`` so that creditaudit installs beside the
ecosystem's packages (torchvision, timm and transformers pull the newest torch); the test
suite runs on the releases of :data:`TESTED_TORCH` (CI on 2.13, and 2.14 beside
torchvision 0.29). On any other release creditaudit runs, and says once that its numbers
there are not covered by the tests.
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import sys
import warnings
from pathlib import Path

__version__ = "0.1.0"

# src/creditaudit/version.py → the checkout's root (an installed wheel has no .git there)
OWN_PACKAGE = __name__.partition(".")[0]  # "creditaudit": what is its own code, not a guest
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


# (major, minor) releases the whole test suite passed on.
TESTED_TORCH = ((2, 13), (2, 14))


class UntestedTorchWarning(UserWarning):
    """creditaudit runs on a torch release its test suite has not run on."""


def release(version: str) -> tuple[int, int] | None:
    """``"2.14.1+cu130"`` → ``(2, 14)``; None when the string names no release."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def untested_torch_message(version: str) -> str | None:
    """One line for a torch ``version`` outside :data:`TESTED_TORCH`, else None."""
    if release(version) in TESTED_TORCH:
        return None
    tested = " and ".join(f"{major}.{minor}" for major, minor in TESTED_TORCH)
    return (f"creditaudit is tested on torch {tested}, not on the installed torch {version}; "
            "it runs, but check results that matter against a tested release "
            f"(pip install torch=={TESTED_TORCH[0][0]}.{TESTED_TORCH[0][1]}.0)")


_warned = False


def warn_untested_torch(version: str | None = None) -> None:
    """Warn (:class:`UntestedTorchWarning`) once per process when ``version`` (default: the
    installed torch's) is outside the tested range. Torch is not imported for it (``import
    creditaudit`` does not import torch): its version is the imported module's where it is
    imported, else its installed distribution's."""
    global _warned
    if _warned:
        return
    if version is None:
        version = installed_torch_version()
    message = untested_torch_message(str(version))
    if message is not None:
        _warned = True
        warnings.warn(message, UntestedTorchWarning, stacklevel=2)


def installed_torch_version() -> str:
    """``torch.__version__``, read without importing torch where it is not imported yet
    (from its distribution's metadata; a torch without any is imported)."""
    if "torch" not in sys.modules:
        from importlib import metadata

        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version("torch")
    import torch

    return str(torch.__version__)
