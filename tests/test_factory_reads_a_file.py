"""What a factory reads besides its code: a ``module`` factory that takes its widths from a
JSON file beside it builds another network from the same code when the file changes. The
run id covers the factory's code, not such files, so the finished run of the old network was
served as the new one's ("completed", its record claiming the new network). The record now
keeps the module tree the factory built (``components.model.structure_digest``, not part of
the run id: ids do not move), and a finished run is not served — nor resumed, nor audited —
for a network of another module tree: one line naming the factory, what changed and what
to do.
"""

from __future__ import annotations

import sys

import pytest

from creditaudit import RunConfig
from creditaudit.errors import RunRecordError
from creditaudit.records import load_record
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train

NETS = '''\
import json
from pathlib import Path

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.b1, self.b2 = nn.Linear(8, width), nn.Linear(width, width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(torch.relu(self.b2(torch.relu(self.b1(x.flatten(1))))))


def make():
    return Net(json.loads((Path(__file__).parent / "widths.json").read_text())["width"])
'''


@pytest.fixture
def reading_factory(tmp_path, monkeypatch):
    """``fr_nets:make``, whose width ``widths.json`` beside it says (16)."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "fr_nets.py").write_text(NETS)
    (folder / "widths.json").write_text('{"width": 16}')
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("fr_nets", None)


def config(out) -> RunConfig:
    return RunConfig().replace(**{
        "data.name": "synthetic", "data.in_dim": 8, "data.n_train": 64, "data.n_test": 64,
        "model.arch": "module", "model.factory": "fr_nets:make", "model.states": ["b1", "b2"],
        "method.name": "bp", "optim.epochs": 1, "diagnostics.eval_samples": 64,
        "run.progress": False, "run.out_dir": str(out)})


def test_a_finished_run_is_not_served_for_the_network_a_changed_file_builds(reading_factory,
                                                                          tmp_path):
    first = train(config(tmp_path / "runs"))
    model = load_record(first.run_dir / "record.json").environment["components"]["model"]
    assert isinstance(model["structure_digest"], str) and model["code_digest"]
    (reading_factory / "widths.json").write_text('{"width": 8}')
    assert plan_run(config(tmp_path / "runs")).run_id == first.record.run_id  # not covered
    with pytest.raises(RunRecordError) as err:
        train(config(tmp_path / "runs"))
    text = str(err.value)
    assert "model factory 'fr_nets:make' builds another network than the run trained" in text
    assert "pass force=True to train it over this one" in text and "\n" not in text
    with pytest.raises(RunRecordError, match="builds another network than the run trained"):
        plan_run(config(tmp_path / "runs"), trained=first.record)  # audit rebuilds it so
    (reading_factory / "widths.json").write_text('{"width": 16}')  # restored: served
    again = train(config(tmp_path / "runs"))
    assert again.record.run_id == first.record.run_id
    assert again.record.epochs == first.record.epochs


def test_a_built_in_architectures_record_keeps_no_module_tree(tmp_path):
    cfg = RunConfig().replace(**{"data.name": "synthetic", "data.n_train": 64,
                                 "data.n_test": 64, "model.d": 16, "model.n_blocks": 2,
                                 "method.name": "bp", "optim.epochs": 1,
                                 "diagnostics.eval_samples": 64, "run.progress": False,
                                 "run.out_dir": str(tmp_path)})
    assert "structure_digest" not in plan_run(cfg).code.to_dict()["model"]
