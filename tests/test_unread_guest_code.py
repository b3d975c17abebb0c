"""Guest code creditaudit cannot read is said, never identified as "no code": a ``module``
factory, or the network of a ``Recorder``, whose module was loaded from a zip archive or
defined without a source file (a notebook, ``exec`` into a new module) had a digest over no
file at all — the same whatever that code computed, so an edited factory's old record was
served as the finished run — and a Recorder's network of such classes was recorded as made
of installed classes only (``code_digest_of: "structure"``). Now the factory is refused in
one line naming it and what is not covered, and the Recorder's record says why its network
has no code digest (``code_digest_reason``), as it does for a notebook's class.
"""

from __future__ import annotations

import sys
import types
import zipfile
from pathlib import Path

import pytest

from creditaudit.errors import GuestError
from creditaudit.models.module_factory import factory_guest
from creditaudit.run.recorder_config import network_code
from plugin_support import cli

NET = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1, self.b2, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.relu(self.b2(torch.relu(self.b1(x.flatten(1))))))


def make():
    return Net()
'''


def zipped(tmp_path: Path, name: str) -> Path:
    """A zip archive holding the module ``name`` (:data:`NET`)."""
    archive = tmp_path / "nets.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"{name}.py", NET)
    return archive


@pytest.fixture
def zip_module(tmp_path, monkeypatch):
    """The module ``ux_zipnets`` imported from a zip archive on ``sys.path``."""
    monkeypatch.syspath_prepend(str(zipped(tmp_path, "ux_zipnets")))
    yield "ux_zipnets"
    sys.modules.pop("ux_zipnets", None)


def test_a_factory_from_a_zip_archive_is_refused_naming_what_is_not_covered(zip_module):
    with pytest.raises(GuestError) as err:
        factory_guest(f"{zip_module}:make")
    text = str(err.value)
    assert text.startswith(f"model factory '{zip_module}:make': module '{zip_module}' was "
                           "loaded from inside ") and "nets.zip, an archive" in text
    assert "\n" not in text


def test_a_factory_defined_without_a_source_file_is_refused(monkeypatch):
    notebook = types.ModuleType("ux_notebook")  # exec'd into a new module: no __file__
    exec(NET, notebook.__dict__)  # noqa: S102
    monkeypatch.setitem(sys.modules, "ux_notebook", notebook)
    with pytest.raises(GuestError, match=r"^model factory 'ux_notebook:make': module "
                       r"'ux_notebook' has no source file \(it was defined in a notebook"):
        factory_guest("ux_notebook:make")


def test_a_factory_of_installed_code_is_not_refused():
    assert factory_guest("torch.nn:Identity").files == ()  # its version names its code


def test_the_command_line_refuses_a_zipped_factory_in_one_line(tmp_path):
    archive = zipped(tmp_path, "ux_zipcli")
    done = cli(archive, "train", "--arch", "module:ux_zipcli:make", "--set",
               'model.states=["b1", "b2"]', "--dataset", "synthetic", "--set",
               "data.in_dim=8", "--epochs", "1",
               "--out", str(tmp_path / "runs"), "-q", cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "model factory 'ux_zipcli:make'" in lines[0]
    assert "an archive" in lines[0] and not (tmp_path / "runs").exists()


def test_a_recorders_network_from_a_zip_archive_has_no_digest_and_says_why(zip_module):
    net = __import__(zip_module).Net()
    digest, reason = network_code(net)
    assert digest is None
    assert reason is not None and "ux_zipnets:Net cannot be read" in reason
    assert "an archive" in reason and "name=" in reason
