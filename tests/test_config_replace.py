"""RunConfig.replace from Python: a pathlib.Path for a path key is the path it names, and a
value of the wrong type is one line naming the key and the type it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit import RunConfig
from creditaudit.config import config_to_toml
from creditaudit.errors import ConfigError


def test_a_path_key_takes_a_pathlib_path(tmp_path):
    config = RunConfig().replace(**{"run.out_dir": tmp_path / "runs",
                                    "run.tensorboard": Path("tb")})
    assert config.run.out_dir == str(tmp_path / "runs") and config.run.tensorboard == "tb"
    assert config == RunConfig().replace(**{"run.out_dir": str(tmp_path / "runs"),
                                            "run.tensorboard": "tb"})
    assert f'out_dir = "{tmp_path / "runs"}"' in config_to_toml(config)


@pytest.mark.parametrize(("key", "needs"), [("optim.epochs", "an integer"),
                                            ("optim.lr", "a number"),
                                            ("run.device", "a string")])
def test_no_value_for_a_key_that_needs_one_names_its_type(key, needs):
    with pytest.raises(ConfigError) as error:
        RunConfig().replace(**{key: None})
    assert str(error.value) == f"{key} must be {needs}, got none"
