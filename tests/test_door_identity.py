"""What ran, by content: a run id covers a guest's code — a ``module`` factory's module and
the modules of its own code it imports (not the standard library, not other installed
distributions), a plugin's source files as well as its distribution version — so editing a
guest makes a new run, never an old record served as "already completed". The record keeps
each guest's digest, and the recipe covers it: (d) of an edited factory's run is not judged
against the frozen run of the code before the edit. Built-in run ids do not move.
"""

from __future__ import annotations

import sys

import pytest

from creditaudit.config import config_from_dict
from creditaudit.models.module_factory import factory_guest
from creditaudit.protocol.records import RecordSet
from creditaudit.records.compare import recipe_difference
from creditaudit.run.plan import plan_run, run_id
from creditaudit.run.trainer import train
from door_support import ORIGIN, cli_args, guests, image_run, tiny_config
from integrity_support import write_idx_dataset
from plugin_support import GUESTS, cli

FASHION = "/usr/share/datasets/fashion-mnist"
RESNET20_STATES = ["stem", "layer1.0", "layer1.1", "layer1.2", "layer2.0", "layer2.1",
                   "layer2.2", "layer3.0", "layer3.1", "layer3.2"]
# Run ids computed before guests' code joined the id (b1055f1): built-ins keep them,
# creditaudit.testing.zoo's factories included (their code is creditaudit's version).
PINNED = [
    ({"data": {"name": "synthetic", "n_train": 256, "n_test": 256},
      "model": {"arch": "resmlp", "d": 16, "n_blocks": 2}, "method": {"name": "dfa"}},
     "dfa-resmlp-synthetic-s42-6fd75498ba"),
    ({"data": {"name": "fashion-mnist", "data_dir": FASHION}, "model": {"arch": "resmlp"},
      "method": {"name": "bp"}}, "bp-resmlp-fashion-mnist-s42-7afdcdc8d6"),
    ({"data": {"name": "fashion-mnist", "data_dir": FASHION},
      "model": {"arch": "module", "factory": "creditaudit.testing.zoo:resnet20",
                "args": {"in_channels": 1}, "states": RESNET20_STATES},
      "method": {"name": "dfa"}}, "dfa-module-fashion-mnist-s42-cb3e7e08ca"),
    ({"data": {"name": "mnist1d"},
      "model": {"arch": "module", "factory": "creditaudit.testing.zoo:TransformerClassifier",
                "args": {"image_shape": [1, 1, 40], "patch": [1, 4], "d": 32, "depth": 2,
                         "heads": 4},
                "states": ["encoder.layers.0", "encoder.layers.1"]},
      "method": {"name": "dfa"}}, "dfa-module-mnist1d-s42-7ca8696f0d"),
]

NETS = '''\
from torch import nn

from .layers import Block


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.b1, self.b2, self.head = Block(4), Block(4), nn.Linear(4, n_classes)

    def forward(self, x):
        return self.head(self.b2(self.b1(self.stem(x))))


def make(n_classes=10):
    return Net(n_classes)
'''
LAYERS = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, h):
        return h + torch.relu(self.linear(h))
'''


@pytest.mark.skipif(not __import__("pathlib").Path(FASHION).exists(),
                    reason="dataset-fashion-mnist is not installed")
@pytest.mark.parametrize("config,pinned", PINNED, ids=[p[1].rsplit("-", 1)[0] for p in PINNED])
def test_builtin_run_ids_do_not_move(config, pinned):
    assert run_id(config_from_dict(config)) == pinned


@pytest.fixture
def own_package(tmp_path, monkeypatch):
    """A package of the user's own beside their work: ``mynets.build:make`` imports
    ``mynets.layers``; ``mynets.unused`` is imported by nothing."""
    folder = tmp_path / "work"
    package = folder / "mynets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "build.py").write_text(NETS)
    (package / "layers.py").write_text(LAYERS)
    (package / "unused.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in [n for n in sys.modules if n == "mynets" or n.startswith("mynets.")]:
        del sys.modules[name]


def test_a_factory_is_identified_by_its_code_and_what_of_its_own_it_imports(own_package,
                                                                           tmp_path):
    guest = factory_guest("mynets.build:make")
    names = {p.relative_to(own_package).as_posix() for p in guest.files}
    # The module, the package's __init__ and what it imports; not torch, not the stdlib.
    assert names == {"mynets/__init__.py", "mynets/build.py", "mynets/layers.py"}
    data = write_idx_dataset(tmp_path / "mnist")
    config = tiny_config(tmp_path / "runs", **image_run(data, **{
        "model.arch": "module", "model.factory": "mynets.build:make"}))
    first = plan_run(config)
    assert first.code.model.digest == guest.digest
    layers = own_package / "mynets" / "layers.py"
    layers.write_text(LAYERS.replace("torch.relu", "torch.tanh"))
    edited = plan_run(config)
    assert edited.run_id != first.run_id  # an edit of an imported module is a new run
    (own_package / "mynets" / "unused.py").write_text("X = 2\n")
    assert plan_run(config).run_id == edited.run_id  # what it does not import is not it
    layers.write_text(LAYERS)
    assert plan_run(config).run_id == first.run_id  # the same code, the same run


def test_an_edited_factory_is_trained_again_not_served_as_completed(tmp_path):
    """Through the command line: the second run after an edit trains a new run instead of
    answering 'already completed' with the old record."""
    (tmp_path / "mynet.py").write_text(LAYERS + NETS.replace("from .layers import Block", ""))
    data = write_idx_dataset(tmp_path / "mnist")
    args = ["train", "--arch", "module:mynet:make",
            *cli_args(tmp_path / "runs", **image_run(data))]
    first = cli(None, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = cli(None, *args, cwd=tmp_path)
    assert again.returncode == 0 and "already completed; not rerun" in again.stderr
    source = (tmp_path / "mynet.py").read_text()
    (tmp_path / "mynet.py").write_text(source.replace("torch.relu", "torch.tanh"))
    edited = cli(None, *args, cwd=tmp_path)
    assert edited.returncode == 0, edited.stderr
    assert "already completed" not in edited.stderr
    assert len(list((tmp_path / "runs").glob("*/record.json"))) == 2


def test_a_plugin_is_identified_by_its_code_as_well_as_its_version(tmp_path):
    with guests(tmp_path / "site", "door-mixture") as site:
        config = tiny_config(tmp_path / "runs")
        first = plan_run(config)
        code = first.code.to_dict()["data"]
        assert code["origin"] == ORIGIN and len(code["code_digest"]) == 64
        module = site / GUESTS.module / "door_datasets.py"
        module.write_text(module.read_text() + "\n# edited, same version\n")
        from creditaudit.registry import reload_plugins

        reload_plugins()
        edited = plan_run(config)
        assert edited.code.to_dict()["data"]["origin"] == ORIGIN
        assert edited.run_id != first.run_id


def test_the_record_keeps_the_factorys_code_digest(own_package, tmp_path):
    data = write_idx_dataset(tmp_path / "mnist")
    config = tiny_config(tmp_path / "runs", **image_run(data, **{
        "model.arch": "module", "model.factory": "mynets.build:make"}))
    record = train(config).record
    model = record.environment["components"]["model"]
    assert model["code_digest"] == factory_guest("mynets.build:make").digest
    assert model["origin"] == "creditaudit"  # the module architecture itself is built in
    assert "builds_for_the_data" in model["checks"]


def test_an_edited_factorys_run_is_not_judged_against_the_old_codes_frozen_run(own_package,
                                                                              tmp_path):
    data = write_idx_dataset(tmp_path / "mnist")
    out = tmp_path / "runs"
    config = tiny_config(out, **image_run(data, **{
        "model.arch": "module", "model.factory": "mynets.build:make"}))
    frozen = train(config.replace(**{"method.name": "frozen"})).record
    before = train(config.replace(**{"method.name": "dfa"})).record
    (own_package / "mynets" / "layers.py").write_text(LAYERS.replace("torch.relu",
                                                                     "torch.tanh"))
    after = train(config.replace(**{"method.name": "dfa"})).record
    assert before.recipe_key == frozen.recipe_key != after.recipe_key
    assert recipe_difference(after, frozen) == "the network's code"
    records = RecordSet.from_folder(out)
    loaded = {r.run_id: r for r in records}
    assert records.frozen_baseline(loaded[before.run_id]) == (frozen.final_acc, 1)
    assert records.frozen_baseline(loaded[after.run_id]) is None
