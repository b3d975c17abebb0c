"""A Recorder identifies the user's network by its code, as the command line identifies a
``module`` factory: the digest of the source files of the module defining the network's
class (a script's ``__main__``: the script) and of the modules of the user's own code it
imports joins the run id and the recipe, so

- two scripts that each define a ``Net`` (tanh in one, ReLU in the other) are two runs, not
  one run id refused the second time as "holds a run record already";
- (d) of the ReLU network's run, in ``report``, is never judged against the tanh network's
  frozen-blocks run, while the tanh network's own runs are judged against it;
- a module edited between runs (itself, or a module of its own that it imports) is another
  run and another recipe; the same code again is the same run;
- a class with no source file (a notebook's ``__main__``) is recorded as such, its run id
  and recipe derived as before;
- a network of installed classes only (an ``nn.Sequential`` of torch's layers written in a
  script, creditaudit's zoo), which no source file of the user's defines, is identified by
  its module tree (classes, settings, parameter and buffer names, shapes, dtypes; not
  values, not ``requires_grad``), the same in any process: a tanh and a ReLU ``Sequential``
  are two runs and two recipes; so are two encoder layers whose activations are two
  functions (``torch.tanh``, ``torch.sigmoid``), and a module's kept tensors and forward
  hooks count by shape, dtype and name.
"""

from __future__ import annotations

import functools
import importlib
import os
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule
from creditaudit.cli import main
from creditaudit.models.structure import structure_digest
from creditaudit.protocol.records import RecordSet
from creditaudit.records import load_record, recipe_key
from creditaudit.records.compare import recipe_difference
from creditaudit.run.recorder_config import network_code, network_identity
from creditaudit.testing.zoo import TransformerClassifier

pytestmark = pytest.mark.usefixtures("single_thread")

# The end of every user's script below: the rule RULE trained on `model` in the script's own
# loop, recorded under OUT with the default name (the run id).
RECORDED_LOOP = '''\
trained = rule(RULE, model)
optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-2)
with Recorder(trained, EVAL_X, EVAL_Y, out=OUT, data="ts", progress=False,
              config={"optim.lr": 1e-2, "run.seed": 0,
                      "diagnostics.end_of_run": False}) as rec:
    rec.epoch(0)
    for batch in torch.arange(len(TRAIN_Y)).split(32):
        trained.train_step(TRAIN_X[batch], TRAIN_Y[batch], optimizer)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(EVAL_X).argmax(1) == EVAL_Y).float().mean())
    rec.epoch(1, test_acc=accuracy)
    RECORD = rec.finish()
'''

# A user's script, as `python rec.py` runs it: its own Net, trained in its own loop with the
# rule RULE and recorded under OUT with the default name (the run id).
SCRIPT = '''\
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        return h + torch.ACTIVATION(self.lin(h))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.b0, self.b1 = Block(16), Block(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.b1(self.b0(self.embed(x))))


torch.manual_seed(0)
model = adapt(Net(), states=["embed", "b0", "b1"], example=TRAIN_X[:8])
''' + RECORDED_LOOP
NETS = '''\
import torch
from torch import nn

from fx5_layers import Block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.b0, self.head = nn.Linear(16, 16), Block(16), nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.b0(self.embed(x)))
'''
LAYERS = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        return h + torch.tanh(self.lin(h))
'''


def data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(160, 16, generator=generator)
    y = torch.randint(0, 10, (160,), generator=generator)
    return {"TRAIN_X": x[:96], "TRAIN_Y": y[:96], "EVAL_X": x[96:], "EVAL_Y": y[96:]}


def run_script(script: Path, rule_name: str, out: Path):
    """``python script`` with rule ``rule_name``: the script's module is ``__main__``."""
    globals_ = runpy.run_path(str(script), run_name="__main__",
                              init_globals={"RULE": rule_name, "OUT": str(out), **data()})
    return globals_["RECORD"]


def scripts(tmp_path: Path, source: str = SCRIPT,
            activations: tuple[str, ...] = ("tanh", "relu")) -> dict[str, Path]:
    """A folder per activation, each with a rec.py: ``source`` with that activation (by
    default its own Net: tanh in one, ReLU in the other)."""
    out = {}
    for activation in activations:
        script = tmp_path / activation / "rec.py"
        script.parent.mkdir()
        script.write_text(source.replace("ACTIVATION", activation))
        out[activation] = script
    return out


def frozen_baseline_is_its_own_networks(out: Path, frozen, relu, tanh):  # noqa: ANN001, ANN201
    """Check (d)'s pairing of the runs under ``out``: the tanh network's frozen run is the
    baseline of the tanh DFA run only, the ReLU run has another recipe (the network's code)
    and no baseline; returns the record set and its records by run id."""
    assert relu.recipe_key != frozen.recipe_key == tanh.recipe_key
    assert recipe_difference(relu, frozen) == "the network's code"
    records = RecordSet.from_folder(out)
    loaded = {r.run_id: r for r in records}
    assert records.frozen_baseline(loaded[tanh.run_id]) == (frozen.final_acc, 1)
    assert records.frozen_baseline(loaded[relu.run_id]) is None
    return records, loaded


def test_two_scripts_with_a_net_of_one_name_are_two_runs_and_two_recipes(tmp_path, capsys):
    out = tmp_path / "runs"
    script = scripts(tmp_path)
    frozen = run_script(script["tanh"], "frozen", out)
    relu = run_script(script["relu"], "dfa", out)  # refused before: the tanh run's id
    tanh = run_script(script["tanh"], "dfa", out)
    models = {r.run_id: r.environment["components"]["model"] for r in (frozen, relu, tanh)}
    assert all(m["module"] == "__main__:Net" for m in models.values())
    assert relu.config.model == tanh.config.model  # the config names the class, no more
    digests = {r.run_id: r.model_code_digest for r in (frozen, relu, tanh)}
    assert digests[frozen.run_id] == digests[tanh.run_id] != digests[relu.run_id]
    assert all(m["code_digest"] == digests[i] for i, m in models.items())
    assert len({frozen.run_id, relu.run_id, tanh.run_id}) == 3
    # the same script again is the same run: refused, not recorded twice
    with pytest.raises(Exception, match="holds a run record already"):
        run_script(script["relu"], "dfa", out)
    # (d): the tanh network's frozen run is the baseline of its own DFA run only
    records, loaded = frozen_baseline_is_its_own_networks(out, frozen, relu, tanh)
    assert records.verdict(loaded[relu.run_id]).statuses["d"] == "not evaluated"
    assert main(["report", str(out)]) == 0
    capsys.readouterr()
    report = (out / "report" / "report.md").read_text()
    assert "re-evaluated against" in report and "1 run." in report
    sections = {part.split("\n", 1)[0].strip(): part for part in report.split("### ")[1:]}
    against = {run_id: "vs frozen blocks" in sections[run_id] for run_id in loaded}
    assert against == {frozen.run_id: False, tanh.run_id: True, relu.run_id: False}


@pytest.fixture
def own_module(tmp_path, monkeypatch):
    """``fx5_nets`` (its Net imports ``Block`` from ``fx5_layers``) in a folder on the path."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "fx5_nets.py").write_text(NETS)
    (folder / "fx5_layers.py").write_text(LAYERS)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("fx5_nets", "fx5_layers"):
        sys.modules.pop(name, None)


def record_net(make, out: Path, rule_name: str = "dfa"):
    x = data()
    model = adapt(make(), states=["embed", "b0"], example=x["TRAIN_X"][:8])
    with Recorder(rule(rule_name, model), x["EVAL_X"], x["EVAL_Y"], out=out, data="ts",
                  progress=False, config={"diagnostics.end_of_run": False}) as rec:
        rec.epoch(0, test_acc=0.1)
    return rec.record


def test_a_module_edited_between_runs_is_another_run_and_recipe(own_module, tmp_path):
    out = tmp_path / "runs"
    nets = importlib.import_module("fx5_nets")
    first = record_net(nets.Net, out)
    assert first.model_code_digest == network_identity(nets.Net())[0] is not None
    model = first.environment["components"]["model"]
    assert model["source_digest"] == network_code(nets.Net())[0]
    assert model["structure_digest"] == structure_digest(nets.Net())
    nets_file, layers_file = own_module / "fx5_nets.py", own_module / "fx5_layers.py"
    nets_file.write_text(NETS.replace("self.b0(self.embed(x))", "self.b0(self.embed(x) * 2)"))
    nets = importlib.reload(nets)
    edited = record_net(nets.Net, out)  # refused before: the first run's id
    assert edited.run_id != first.run_id
    assert edited.model_code_digest != first.model_code_digest
    assert edited.recipe_key != first.recipe_key
    # a module of its own that it imports is its code too
    nets_file.write_text(NETS)
    nets = importlib.reload(nets)
    assert network_identity(nets.Net())[0] == first.model_code_digest  # the same code again
    layers_file.write_text(LAYERS.replace("torch.tanh", "torch.sigmoid"))
    importlib.reload(sys.modules["fx5_layers"])
    nets = importlib.reload(nets)
    assert network_code(nets.Net())[0] not in (None, first.model_code_digest)


# A user's script whose own Block takes its activation from the command line
# (`python rec.py Tanh`): one file, two networks.
ARGV_CHOICE = SCRIPT.replace("import torch\n", "import sys\n\nimport torch\n", 1).replace(
    "self.lin = nn.Linear(d, d)", "self.lin, self.act = nn.Linear(d, d), getattr(nn, sys.argv[1])()"
).replace("torch.ACTIVATION(self.lin(h))", "self.act(self.lin(h))")


def test_a_choice_read_at_run_time_that_builds_another_network_is_another_run(
        tmp_path, monkeypatch):
    out = tmp_path / "runs"
    script = scripts(tmp_path, ARGV_CHOICE, ("argv",))["argv"]
    runs = {}
    for choice, rule_name in (("Tanh", "frozen"), ("ReLU", "dfa"), ("Tanh", "dfa")):
        monkeypatch.setattr(sys, "argv", [str(script), choice])
        runs[choice, rule_name] = run_script(script, rule_name, out)  # ReLU/dfa: refused before
    frozen, relu, tanh = runs["Tanh", "frozen"], runs["ReLU", "dfa"], runs["Tanh", "dfa"]
    models = [r.environment["components"]["model"] for r in (frozen, relu, tanh)]
    assert all(m["code_digest_of"] == "source+structure" for m in models)
    assert len({m["source_digest"] for m in models}) == 1  # one file
    assert models[0]["structure_digest"] == models[2]["structure_digest"]
    assert models[0]["structure_digest"] != models[1]["structure_digest"]
    assert len({frozen.run_id, relu.run_id, tanh.run_id}) == 3
    frozen_baseline_is_its_own_networks(out, frozen, relu, tanh)


def test_a_class_without_a_source_file_says_so_and_keeps_its_id(tmp_path, monkeypatch):
    notebook = types.ModuleType("__main__")  # a notebook's __main__: no __file__
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    exec(NETS.replace("from fx5_layers import Block", LAYERS.split("\n", 3)[3]),  # noqa: S102
         notebook.__dict__)
    record = record_net(notebook.Net, tmp_path)
    model = load_record(tmp_path / record.run_id).environment["components"]["model"]
    assert model["code_digest"] is None and "has no source file" in model["code_digest_reason"]
    assert record.model_code_digest is None
    # no digest: the run id and the recipe are what they were before digests joined them
    # (and before the record kept the parameters' dtype and those frozen outside the rule);
    # the id moved once since, when rule() began to keep its feedback seed in the method
    # section (it was cef4e00b17 before)
    assert record.run_id == "dfa-own-loop-ts-s42-e1903fc8ac"
    assert record.recipe_key == recipe_key(record.config, record.data.source,
                                           record.not_recorded)
    assert "code_digest" not in record.recipe_key


def test_a_container_is_its_blocks_code_and_installed_code_carries_no_digest(own_module):
    """An ``nn.Sequential`` of the user's blocks is identified by the blocks' code; classes
    of creditaudit (its version) and of torch (``module_packages``) carry no code digest
    (their networks are identified by their module tree instead, below)."""
    layers = importlib.import_module("fx5_layers")
    blocks = nn.Sequential(nn.Linear(16, 16), layers.Block(16), nn.Linear(16, 10))
    digest, why = network_code(blocks)
    assert digest is not None and why is None
    (own_module / "fx5_layers.py").write_text(LAYERS.replace("torch.tanh", "torch.sigmoid"))
    assert network_code(blocks)[0] not in (None, digest)  # the file is what is identified
    assert network_code(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 10))) == (None, None)
    zoo = TransformerClassifier((1, 1, 16), patch=(1, 4), d=8, depth=1, heads=2)
    assert network_code(zoo) == (None, None)


# A user's script whose network is torch's classes only: nothing of the user's defines it.
SEQUENTIAL = '''\
import torch
from torch import nn

from creditaudit import Recorder, adapt, rule

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.Linear(16, 16), nn.ACTIVATION()),
                    nn.Sequential(nn.Linear(16, 16), nn.ACTIVATION()), nn.Linear(16, 10))
model = adapt(net, states=["0", "1", "2"], example=TRAIN_X[:8])
''' + RECORDED_LOOP


def test_a_network_of_torch_classes_is_identified_by_its_module_tree(tmp_path):
    out = tmp_path / "runs"
    script = scripts(tmp_path, SEQUENTIAL, ("Tanh", "ReLU"))
    frozen = run_script(script["Tanh"], "frozen", out)
    relu = run_script(script["ReLU"], "dfa", out)
    tanh = run_script(script["Tanh"], "dfa", out)  # refused before: the ReLU run's id
    models = {r.run_id: r.environment["components"]["model"] for r in (frozen, relu, tanh)}
    assert all(m["code_digest_of"] == "structure" and "code_digest_reason" not in m
               for m in models.values())
    assert frozen.model_code_digest == tanh.model_code_digest != relu.model_code_digest
    assert len({frozen.run_id, relu.run_id, tanh.run_id}) == 3
    frozen_baseline_is_its_own_networks(out, frozen, relu, tanh)


def tree(activation: type[nn.Module] = nn.Tanh, width: int = 16, eps: float = 1e-5,
         dtype: torch.dtype = torch.float32) -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, width), activation(), nn.LayerNorm(width, eps=eps),
                         nn.BatchNorm1d(width), nn.Linear(width, 3)).to(dtype)


def double(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output * 2


def halve(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output / 2


def kept(activation: object = torch.tanh, scale: torch.Tensor | None = None,
         hook: object = double) -> nn.Sequential:
    """A network whose modules keep what is no plain setting: a callable (the encoder
    layer's activation), a tensor that is no parameter or buffer, a forward hook."""
    net = nn.Sequential(nn.Unflatten(1, (2, 8)),
                        nn.TransformerEncoderLayer(8, 2, 16, activation=activation,
                                                   batch_first=True, dropout=0.0),
                        nn.Flatten(), nn.Linear(16, 10))
    net[3].scale = torch.ones(3) if scale is None else scale
    if hook is not None:
        net[3].register_forward_hook(hook)
    return net


def test_what_a_module_keeps_beyond_plain_settings_makes_another_network():
    digest = structure_digest(kept())
    assert structure_digest(kept()) == digest
    # values of a kept tensor are no part of it, as of parameters
    assert structure_digest(kept(scale=torch.full((3,), 5.0))) == digest
    # the activation named or given as the function it names is the same network
    assert structure_digest(kept("gelu")) == structure_digest(kept(nn.functional.gelu))
    others = [kept(torch.sigmoid), kept(nn.functional.gelu),
              kept(functools.partial(nn.functional.leaky_relu, negative_slope=0.1)),
              kept(functools.partial(nn.functional.leaky_relu, negative_slope=0.2)),
              kept(nn.Tanh().forward), kept(nn.Sigmoid().forward),
              kept(scale=torch.ones(4)), kept(scale=torch.ones(3, dtype=torch.float64)),
              kept(hook=halve), kept(hook=None)]
    digests = {structure_digest(other) for other in others}
    assert len(digests) == len(others) and digest not in digests
    pre = kept()
    pre[0].register_forward_pre_hook(lambda module, inputs: None)
    assert structure_digest(pre) not in digests | {digest}
    # another process builds the same network: the same digest (no ids, no addresses)
    assert digest_in_another_process("kept") == digest


def scaled(factor: float):  # noqa: ANN201 - a closure: one qualified name for every factor
    def activation(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * factor
    return activation


def kept_lambda() -> nn.Sequential:
    return kept(lambda x: torch.tanh(x), hook=lambda module, inputs, output: output * 2)


def test_lambdas_and_closures_are_told_apart_by_what_they_compute():
    """Every lambda is ``<lambda>`` and every closure of ``scaled`` is
    ``scaled.<locals>.activation``: their names alone made two networks one."""
    digest = structure_digest(kept_lambda())
    assert structure_digest(kept_lambda()) == digest
    others = [kept(lambda x: torch.sigmoid(x), hook=lambda module, inputs, output: output * 2),
              kept(lambda x: torch.tanh(x), hook=lambda module, inputs, output: output * 3),
              kept(scaled(1.0)), kept(scaled(2.0)),
              kept(lambda x: torch.tanh(x)), kept(lambda x: torch.relu(x))]
    digests = {structure_digest(other) for other in others}
    assert len(digests) == len(others) and digest not in digests
    assert structure_digest(kept(scaled(2.0))) == structure_digest(kept(scaled(2.0)))

    def recursive(x: torch.Tensor) -> torch.Tensor:  # holds itself in its closure
        return x if x.dim() else recursive(x)
    assert structure_digest(kept(recursive)) not in digests
    assert digest_in_another_process("kept_lambda") == digest


def digest_in_another_process(builder: str) -> str:
    """structure_digest of ``<builder>()`` of this test module, computed by a new Python."""
    code = ("import torch, sys; sys.path.insert(0, sys.argv[1]); "
            f"from test_network_code import {builder}; "
            "from creditaudit.models.structure import structure_digest; "
            f"print(structure_digest({builder}()))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                          capture_output=True, text=True, check=True, env=env, timeout=120)
    return done.stdout.strip()


def test_the_module_tree_digest_is_content_not_values_flags_or_process():
    digest = structure_digest(tree())
    assert len(digest) == 64 and structure_digest(tree()) == digest
    # weights, requires_grad, the train/eval mode, adapt() and a rule's step leave it
    net = tree()
    with torch.no_grad():
        net[0].weight.add_(1.0)
    net[0].bias.requires_grad_(False)
    model = adapt(net.eval(), states=["0", "2"], example=torch.randn(4, 8))
    bound = rule("frozen", model)
    bound.train_step(torch.randn(8, 8), torch.randint(0, 3, (8,)),
                     torch.optim.SGD(bound.trainable_parameters(), lr=0.1))
    assert structure_digest(net) == digest
    # a class, a width, a setting, a dtype, a module's place make another network
    others = [tree(nn.ReLU), tree(width=32), tree(eps=1e-6), tree(dtype=torch.float64),
              nn.Sequential(*list(tree().children())[::-1])]
    digests = {structure_digest(other) for other in others}
    assert len(digests) == len(others) and digest not in digests
    # another process builds the same network: the same digest (no ids, no addresses)
    assert digest_in_another_process("tree") == digest
