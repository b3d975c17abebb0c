"""Names that collide: a name two installed distributions register in one entry-point group
is refused in one line naming both (which one ran used to depend on sys.path order), and
their other names keep working; a plugin registered under a built-in's name is ignored, said
in one warning line when that name is used; a diagnostic named after a common key of
``[diagnostics]`` (its options table would be that key) is refused in one line naming it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from creditaudit.config import config_from_dict
from creditaudit.errors import ConfigError
from creditaudit.models.registry import ResMLPArchitecture
from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, reload_plugins
from door_support import ORIGIN, cli_args, error_line, guests, site_with
from plugin_support import cli

RIVAL = "fx21-rival==1.0"


def install_rival(site: Path) -> None:
    """A second distribution, ``fx21-rival``, registering the architecture ``fx21-twin``
    that creditaudit-guests registers too."""
    info = site / "fx21_rival-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fx21-rival\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[creditaudit.models]\nfx21-twin = creditaudit_guests.fx21_models:RivalTwin\n")


def test_a_name_two_distributions_register_is_refused_naming_both(tmp_path):
    with guests(tmp_path / "site", "fx21-twin", "door-mixture") as site:
        install_rival(site)
        reload_plugins()
        with pytest.raises(ConfigError) as caught:
            ARCHITECTURES.get("fx21-twin")
        message = str(caught.value)
        assert "\n" not in message
        assert ORIGIN in message and RIVAL in message and "uninstall" in message
        assert "fx21-twin" not in ARCHITECTURES.names(warn=False)
        # Their other names, and the built-ins, keep working.
        assert DATASETS.get("door-mixture").name == "door-mixture"
        assert ARCHITECTURES.get("resmlp") is ResMLPArchitecture


def test_a_name_two_distributions_register_is_one_error_line(tmp_path):
    site = site_with(tmp_path, "fx21-twin")
    install_rival(site)
    done = cli(site, "train", "--arch", "fx21-twin", "--print-config", cwd=tmp_path)
    line = error_line(done)
    assert "'fx21-twin'" in line and ORIGIN in line and RIVAL in line


def test_a_plugin_under_a_builtins_name_is_ignored_with_one_warning(tmp_path, caplog):
    with guests(tmp_path / "site", "resmlp"), caplog.at_level(logging.WARNING):
        assert ARCHITECTURES.get("resmlp") is ResMLPArchitecture
        assert ARCHITECTURES.get("resmlp") is ResMLPArchitecture
        warned = [r.getMessage() for r in caplog.records if "shadowed" in r.getMessage()]
        assert len(warned) == 1  # once per process, however often the name is used
        assert f"{ORIGIN}'s architecture 'resmlp'" in warned[0]
        assert "creditaudit_guests.fx21_models:Shadow" in warned[0]
        assert "ignored" in warned[0] and "\n" not in warned[0]
        assert "creditaudit_guests.fx21_models" not in sys.modules  # never imported


def test_a_plugin_under_a_builtins_name_is_one_warning_line_on_stderr(tmp_path):
    site = site_with(tmp_path, "resmlp")
    done = cli(site, "train", "--arch", "resmlp", "--print-config", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "shadowed" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ")
    assert f"{ORIGIN}'s architecture 'resmlp'" in warned[0]


@pytest.mark.parametrize("name", ["every", "frozen_acc"])
def test_a_diagnostic_named_after_a_common_key_is_refused_naming_it(tmp_path, name):
    with guests(tmp_path / "site", name):
        with pytest.raises(ConfigError) as caught:
            DIAGNOSTICS.get(name)
        message = str(caught.value)
        assert "\n" not in message
        assert f"entry point {name!r}" in message and "creditaudit-guests 0.1.0" in message
        assert "common key of [diagnostics]" in message and "rename" in message
        assert message.count("protocol diagnostic plugin") == 1  # said once, not nested
        with pytest.raises(ConfigError) as selected:
            config_from_dict({"diagnostics": {"protocol": ["a", name]}})
        assert str(selected.value) == message
        assert config_from_dict({"diagnostics": {"protocol": ["a", "b"]}})  # others work


def test_a_diagnostic_named_after_a_common_key_is_one_error_line(tmp_path):
    site = site_with(tmp_path, "every")
    done = cli(site, "train", "--set", 'diagnostics.protocol=["a","every"]',
               *cli_args(tmp_path / "runs", **{"data.name": "synthetic"}), cwd=tmp_path)
    line = error_line(done)
    assert "entry point 'every'" in line and "common key of [diagnostics]" in line
    assert not list((tmp_path / "runs").glob("*/record.json"))
