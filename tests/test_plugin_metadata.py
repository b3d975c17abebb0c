"""An installed package whose entry-point metadata is broken loses only its own plugins.

``importlib.metadata.entry_points(group=…)`` raised on the first unparseable
``entry_points.txt`` of any installed package (TypeError), so one broken package broke the
discovery of every plugin; and an entry point that is not ``name = module:attr`` was said,
when asked for, as ``AttributeError: 'NoneType' object has no attribute 'group'``. Now each
is one line naming the distribution, its file and the fix, and the other plugins and the
built-ins work.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from creditaudit.errors import ConfigError
from creditaudit.registry import ARCHITECTURES, RULES
from plugin_support import forget_test_plugins, install_test_plugins, plugins_on_path


def broken_package(site: Path, entry_points: str) -> Path:
    """A distribution ``broken-pkg==0.2`` in ``site`` whose ``entry_points.txt`` reads
    ``entry_points``; returns that file."""
    info = site / "broken_pkg-0.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pkg\nVersion: 0.2\n")
    (info / "entry_points.txt").write_text(entry_points)
    return info / "entry_points.txt"


def test_an_unreadable_entry_points_file_loses_only_its_packages_plugins(tmp_path, caplog):
    site = install_test_plugins(tmp_path / "site")
    file = broken_package(site, "[creditaudit.rules]\nthis line is no entry point\n")
    with plugins_on_path(site, forget_test_plugins):
        assert RULES.get("sparse-dfa").name == "sparse-dfa"  # another package's plugin
        assert RULES.get("dfa").name == "dfa"
        assert ARCHITECTURES.get("plain-mlp").name == "plain-mlp"
        with pytest.raises(ConfigError) as caught:
            RULES.get("mine")
        text = str(caught.value)
        assert "\n" not in text and text.startswith("method.name='mine' is not a known")
        assert (f"the entry points of broken-pkg==0.2 cannot be read ({file}: TypeError"
                in text)
        assert text.endswith("so its plugins are ignored: every line of that file must be a "
                             "[group] or `name = module:attr`; fix the file, or reinstall or "
                             "uninstall that package")
        with caplog.at_level(logging.WARNING):
            assert "sparse-dfa" in RULES.names()
        assert "broken-pkg==0.2 cannot be read" in caplog.text


@pytest.mark.parametrize("value", ["", "a b:c", "not valid"])
def test_an_entry_point_that_is_not_module_attr_is_named_with_its_file(tmp_path, value):
    site = install_test_plugins(tmp_path / "site")
    file = broken_package(site, f"[creditaudit.rules]\nmine = {value}\n= m:C\n")
    with plugins_on_path(site, forget_test_plugins):
        with pytest.raises(ConfigError) as caught:
            RULES.get("mine")
        assert str(caught.value) == (
            f"credit rule entry point `mine = {value}` of broken-pkg==0.2 ({file}), group "
            "creditaudit.rules, is not `name = module:attr`: fix that line of the package's "
            "pyproject.toml and reinstall it, or uninstall it")
        assert RULES.get("sparse-dfa").name == "sparse-dfa"
        assert "" not in RULES.listed_names()  # the line without a name names nothing
