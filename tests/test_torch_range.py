"""The torch range: pyproject accepts 2.14 (what torchvision, timm and transformers pull),
and a torch outside the tested releases is named once, on import."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tomllib

from creditaudit import version as torch_range
from creditaudit.version import (
    TESTED_TORCH,
    UntestedTorchWarning,
    release,
    untested_torch_message,
    warn_untested_torch,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_declared_range_holds_every_tested_release():
    """`pip install torchvision` brings torch 2.14: a pin below it would let pip replace
    creditaudit's torch without a word, or refuse the ecosystem."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert spec == "torch>=2.1,<2.15"
    assert (2, 14) in TESTED_TORCH and (2, 13) in TESTED_TORCH


@pytest.mark.parametrize("version, expected", [("2.14.1+cu130", (2, 14)), ("2.13.0", (2, 13)),
                                               ("2.15.0.dev20270101", (2, 15)), ("x", None)])
def test_release_reads_major_and_minor(version, expected):
    assert release(version) == expected


def test_only_untested_releases_get_a_message():
    assert untested_torch_message("2.13.0+cpu") is None
    assert untested_torch_message("2.14.1+cu130") is None
    message = untested_torch_message("2.12.1")
    assert message is not None and "2.12.1" in message and "2.13 and 2.14" in message
    assert "\n" not in message
    assert untested_torch_message("2.15.0") is not None


def test_the_warning_comes_once(monkeypatch):
    monkeypatch.setattr(torch_range, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_untested_torch("2.16.0")
        warn_untested_torch("2.16.0")
        warn_untested_torch("2.13.0")
    assert [w.category for w in caught] == [UntestedTorchWarning]
    assert "2.16.0" in str(caught[0].message)


def test_importing_creditaudit_warns_on_an_untested_torch_and_not_on_this_one():
    """A fresh interpreter whose torch reports 2.99.0 gets the warning from `import
    creditaudit`; the real torch (a tested release in CI) gets none."""
    code = ("import warnings, torch\nwarnings.simplefilter('always')\n{patch}"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n    import creditaudit\n"
            "print([str(x.category.__name__) for x in w])\n")
    fake = subprocess.run([sys.executable, "-c", code.format(
        patch="torch.__version__ = '2.99.0'\n")], capture_output=True, text=True, check=True)
    assert "UntestedTorchWarning" in fake.stdout
    real = subprocess.run([sys.executable, "-c", code.format(patch="")], capture_output=True,
                          text=True, check=True)
    if release(__import__("torch").__version__) in TESTED_TORCH:
        assert "UntestedTorchWarning" not in real.stdout
