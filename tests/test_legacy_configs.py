"""Config files written by earlier versions load.

Before each section held only its component's options, ``--print-config`` (and every run's
config.toml) listed every key of every component, each at that version's default. A key the
selected component does not read is dropped when it holds a value some earlier version
wrote by default, and refused otherwise. tests/legacy_configs holds verbatim prints of
earlier versions (the data folder aside) that together hold every such key and value: found
by printing each rule, architecture and dataset with every version since c6b4234, the commit
that introduced config files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w

from creditaudit.cli import main
from creditaudit.config import RunConfig, load_config, tomllib
from creditaudit.config.sections import legacy_default
from creditaudit.errors import ConfigError
from creditaudit.records import load_record

HERE = Path(__file__).parent
PRINTED = sorted((HERE / "legacy_configs").glob("*.toml"))
RECORDS = sorted((HERE / "legacy_records").glob("*.json"))


@pytest.mark.parametrize("path", PRINTED, ids=[p.stem for p in PRINTED])
def test_a_config_an_earlier_version_printed_loads(path, capsys):
    raw = tomllib.loads(path.read_text())
    loaded = load_config(path).to_dict()
    for section, values in raw.items():
        for key, value in values.items():
            if key in loaded[section]:  # read: the file's value
                assert loaded[section][key] == value, f"{section}.{key}"
            else:  # dropped: only ever a default of an earlier version
                assert legacy_default(section, key, value), f"{section}.{key}={value!r}"
    assert main(["train", "--config", str(path), "--print-config"]) == 0
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_the_config_of_an_earlier_record_written_as_toml_loads(tmp_path, path):
    """A record's config written out as a config file (TOML has no null: None left out)
    loads to the config the record layer reads from the record."""
    config = json.loads(path.read_text())["config"]
    file = tmp_path / "config.toml"
    file.write_text(tomli_w.dumps({section: {k: v for k, v in values.items() if v is not None}
                                   for section, values in config.items()}))
    assert load_config(file).to_dict() == load_record(path).config.to_dict()


@pytest.mark.parametrize(("line", "changed"), [
    ("ep_beta = 0.1", "ep_beta = 0.2"),  # not a value any version wrote
    ("download = false", "download = 0"),  # 0 is not false
])
def test_a_key_not_read_is_refused_unless_it_holds_an_earlier_default(tmp_path, line,
                                                                       changed):
    text = (HERE / "legacy_configs" / "c6b4234-method-dfa.toml").read_text()
    assert line in text
    file = tmp_path / "config.toml"
    file.write_text(text.replace(line, changed))
    with pytest.raises(ConfigError, match=f"{changed.split()[0]} is not read by"):
        load_config(file)


@pytest.mark.parametrize("value", [0.1, 0.01])
def test_an_override_of_a_key_not_read_is_refused_whatever_its_value(value, capsys):
    """A file of an earlier version drops ep_beta=0.1 or 0.01 for DFA; a value given now is
    meant to be read, so the same value as an override is refused."""
    with pytest.raises(ConfigError, match="method.ep_beta is not read by dfa"):
        RunConfig().replace(**{"method.name": "dfa", "method.ep_beta": value})
    assert main(["train", "--method", "dfa", "--set", f"method.ep_beta={value}",
                 "--print-config"]) == 2
    assert "method.ep_beta is not read by dfa" in capsys.readouterr().err
