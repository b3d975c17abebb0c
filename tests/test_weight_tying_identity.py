"""Which names share one parameter, buffer or module belongs to a network's identity.

``named_modules`` and a module's own parameters list a shared object once, so the module
tree of an ``nn.Sequential`` with ``net[4].weight = net[0].weight`` was that of one with
``net[4].weight = net[2].weight``: one run id for two networks (a Recorder with
``overwrite=True`` replaced the first's folder with the second's), and a factory whose tying
a file chose had its finished run served for the other tying. The sharing now joins the
module tree digest where there is any, so an untied network keeps the digest, run id and
recipe it had; a factory run recorded before the sharing was counted is refused in one
line (its record cannot say what it shared), never served, resumed or audited as the
network built now.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import creditaudit.run.plan as plan_module
from creditaudit import Recorder, RunConfig, adapt, rule
from creditaudit.errors import RunRecordError
from creditaudit.models.structure import sharing, structure_digest
from creditaudit.run.trainer import train

pytestmark = pytest.mark.usefixtures("single_thread")


def tied(to: int) -> nn.Sequential:
    """Five layers of equal shapes, the last's weight that of layer ``to``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                            nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    net[4].weight = net[to].weight
    return net


def test_tying_other_layers_is_another_module_tree():
    assert structure_digest(tied(0)) != structure_digest(tied(2))
    assert sharing(tied(0)) == {"parameters": [["0.weight", "4.weight"]]}
    assert structure_digest(tied(0)) == structure_digest(tied(0))  # not the process's ids


def test_an_untied_network_keeps_its_digest():
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    assert sharing(net) == {}
    # the digest written before the sharing was counted: the records of untied networks
    # keep their run ids
    assert structure_digest(net) == (
        "5af0d59d6bf60fccd12198239c8840e0358c43c4299f7a92ee9fbeaad8bcb005")
    assert structure_digest(tied(0), shared=False) == structure_digest(tied(2), shared=False)


def test_a_module_placed_twice_is_told_from_two_modules():
    a, b, c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
    tanh, relu = nn.Tanh(), nn.ReLU()
    # named_modules lists the second place of a module not at all: the last layer was
    # unseen
    assert (structure_digest(nn.Sequential(a, tanh, b, relu, c, tanh))
            != structure_digest(nn.Sequential(a, tanh, b, relu, c, relu)))
    assert structure_digest(nn.Sequential(a, b, a)) != structure_digest(nn.Sequential(a, b, b))
    assert sharing(nn.Sequential(a, tanh, a)) == {
        "modules": [["0", "2"]], "parameters": [["0.bias", "2.bias"], ["0.weight", "2.weight"]]}


class Normed(nn.Module):
    def __init__(self, mean: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("mean", torch.zeros(4) if mean is None else mean)


def test_a_buffer_shared_between_modules_is_told_from_two():
    mean = torch.zeros(4)
    shared = nn.Sequential(Normed(mean), Normed(mean))
    assert structure_digest(shared) != structure_digest(nn.Sequential(Normed(), Normed()))
    assert sharing(shared) == {"buffers": [["0.mean", "1.mean"]]}


class OlderSignature(nn.Module):
    """Overrides ``named_parameters`` and ``named_buffers`` with torch 1.x's signature (no
    ``remove_duplicate``), as code written then does."""

    def __init__(self, tie: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.register_buffer("scale", torch.ones(8))
        if tie:
            self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x) * self.scale))))

    def named_parameters(self, prefix: str = "", recurse: bool = True):  # noqa: ANN201
        yield from super().named_parameters(prefix=prefix, recurse=recurse)

    def named_buffers(self, prefix: str = "", recurse: bool = True):  # noqa: ANN201
        yield from super().named_buffers(prefix=prefix, recurse=recurse)


def test_a_network_overriding_named_parameters_keeps_its_identity(tmp_path):
    """Such a network's Recorder raised TypeError (named_parameters() got an unexpected
    keyword argument 'remove_duplicate') where it had recorded before the sharing was
    counted; its tying is still told apart."""
    assert sharing(OlderSignature()) == {}
    assert structure_digest(OlderSignature()) == structure_digest(OlderSignature(), shared=False)
    assert sharing(OlderSignature(tie=True)) == {"parameters": [["a.weight", "b.weight"]]}
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    model = adapt(OlderSignature(), ["a", "b"], input_shape=(8,))
    recorder = Recorder(rule("bp", model), x, y, out=tmp_path, progress=False)
    assert recorder.run_dir.is_dir()


def test_a_recorder_gives_networks_tying_other_layers_two_runs(tmp_path):
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,),
                                                                  generator=generator)
    folders = []
    for to in (0, 2):
        model = adapt(tied(to), states=["1", "3", "5"], example=x[:8])
        rec = Recorder(rule("bp", model), x, y, out=tmp_path, data="mine", progress=False,
                       overwrite=True,
                       config={"diagnostics.end_of_run": False, "run.seed": 0})
        rec.epoch(0, test_acc=0.5)
        rec.finish()
        folders.append(rec.run_dir)
    assert folders[0] != folders[1]
    assert all((folder / "record.json").is_file() for folder in folders)


NETS = '''\
import json
from pathlib import Path

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, tie):
        super().__init__()
        self.b1, self.b2 = nn.Linear(8, 16), nn.Linear(16, 16)
        self.b3, self.b4 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)
        self.b4.weight = getattr(self, tie).weight

    def forward(self, x):
        h = torch.relu(self.b2(torch.relu(self.b1(x.flatten(1)))))
        return self.head(torch.relu(self.b4(torch.relu(self.b3(h)))))


def make():
    return Net(json.loads((Path(__file__).parent / "tie.json").read_text())["tie"])
'''


@pytest.fixture
def tying_factory(tmp_path, monkeypatch):
    """``wt_nets:make``, tying ``b4.weight`` to the layer ``tie.json`` beside it names."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "wt_nets.py").write_text(NETS)
    (folder / "tie.json").write_text('{"tie": "b2"}')
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("wt_nets", None)


def config(out) -> RunConfig:
    return RunConfig().replace(**{
        "data.name": "synthetic", "data.in_dim": 8, "data.n_train": 64, "data.n_test": 64,
        "model.arch": "module", "model.factory": "wt_nets:make",
        "model.states": ["b1", "b2", "b3", "b4"], "method.name": "bp", "optim.epochs": 1,
        "diagnostics.eval_samples": 64, "run.progress": False, "run.out_dir": str(out)})


def test_a_factory_run_is_not_served_for_other_tied_layers(tying_factory, tmp_path):
    first = train(config(tmp_path / "runs"))
    (tying_factory / "tie.json").write_text('{"tie": "b3"}')
    with pytest.raises(RunRecordError, match="builds another network than the run trained"):
        train(config(tmp_path / "runs"))
    (tying_factory / "tie.json").write_text('{"tie": "b2"}')
    assert train(config(tmp_path / "runs")).record.run_id == first.record.run_id


def test_a_tied_factory_run_recorded_before_sharing_counted_is_refused(tying_factory,
                                                                       tmp_path, monkeypatch):
    with monkeypatch.context() as old:  # the digest records of earlier versions keep
        old.setattr(plan_module, "structure_digest",
                    lambda net, shared=True: structure_digest(net, shared=False))
        first = train(config(tmp_path / "runs"))
    for resume in (False, True):
        with pytest.raises(RunRecordError) as err:
            train(config(tmp_path / "runs"), resume=resume)
        text = str(err.value)
        assert "model factory 'wt_nets:make' builds a network that shares" in text
        assert "written before creditaudit counted such sharing" in text
        assert "pass force=True" in text and "\n" not in text
    again = train(config(tmp_path / "runs"), force=True)
    assert again.record.run_id == first.record.run_id and again.record.status == "completed"
