"""``module`` factories from the command line (#35.3): a network whose first layer expects
other samples than the data holds (torchvision's resnet18 — 3 channels — on Fashion-MNIST's
1×28×28) is refused in one line saying so and how to adapt; a factory file in the working
folder is found without PYTHONPATH, as ``python -m`` finds it; ``weights=None`` has a
documented spelling (``model.none_args``), as TOML has no null.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from creditaudit.errors import ConfigError
from creditaudit.models.module_factory import factory_args
from creditaudit.run.plan import plan_run
from door_support import (
    FACTORIES,
    cli_args,
    error_line,
    guests,
    image_run,
    site_with,
    tiny_config,
)
from integrity_support import write_idx_dataset
from plugin_support import cli

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_a_three_channel_network_on_one_channel_images_is_one_line_saying_how_to_adapt(
        tmp_path):
    """The stand-in for torchvision's resnet18 (weights=None): its first convolution reads
    3 channels; the data has 1×28×28 images."""
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:three_channel_net",
               *cli_args(tmp_path / "runs", **image_run(data, **{
                   "model.none_args": ["weights"]})), cwd=tmp_path)
    line = error_line(done)
    assert (f"--arch module:{FACTORIES}:three_channel_net: the network's first layer "
            "'stem.0' (Conv2d) expects 3 input channels, but the data's samples are 1×28×28"
            ) in line
    assert "--set model.args.in_channels=1" in line and "wraps the network" in line
    assert "internal error" not in done.stderr


def test_a_factory_in_the_working_folder_is_found_without_pythonpath(tmp_path):
    """The installed `creditaudit` script runs with its own folder first on sys.path, not
    the working folder (python -m puts that there): a script of that kind, elsewhere."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "here_net.py").write_text(f"from {FACTORIES} import ImageNet as Net\n")
    scripts = tmp_path / "bin"
    scripts.mkdir()
    (scripts / "creditaudit_script.py").write_text(
        "import sys\nfrom creditaudit.cli import main\nsys.exit(main())\n")
    data = write_idx_dataset(tmp_path / "mnist")
    site = site_with(tmp_path)
    env = {"PYTHONPATH": f"{site}:{ROOT / 'src'}", "CREDITAUDIT_CACHE": str(tmp_path / "c"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(scripts / "creditaudit_script.py"), "train", "--arch",
         "module:here_net:Net", *cli_args(tmp_path / "runs", **image_run(data))],
        cwd=work, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp_path / "runs").glob("*-module-mnist-*/record.json"))


def test_none_arguments_have_a_spelling_a_config_file_can_hold(tmp_path):
    data = write_idx_dataset(tmp_path / "mnist")
    factory = f"{FACTORIES}:three_channel_net"
    config = tiny_config(tmp_path / "runs", **image_run(data, **{
        "model.arch": "module", "model.factory": factory, "model.args": {"n_classes": 10},
        "model.none_args": ["weights"]}))
    assert factory_args(config.model) == {"n_classes": 10, "weights": None}
    # A None inside model.args would not survive the run's config.toml: refused, with the way.
    with guests(tmp_path / "site"), \
            pytest.raises(ConfigError, match=r"model.args.weights is None.*model.none_args"):
        plan_run(tiny_config(tmp_path / "runs", **image_run(data, **{
            "model.arch": "module", "model.factory": factory,
            "model.args": {"weights": None}})))
    # An argument in both: the factory got None while the record said model.args' value.
    with guests(tmp_path / "site"), pytest.raises(
            ConfigError, match=r"model.none_args names 'weights', which model.args gives as "
                               r"'DEFAULT': give the argument in one of them"):
        plan_run(tiny_config(tmp_path / "runs", **image_run(data, **{
            "model.arch": "module", "model.factory": factory,
            "model.args": {"weights": "DEFAULT"}, "model.none_args": ["weights"]})))


def test_the_docs_wrapper_fits_a_three_channel_network_to_one_channel_images(tmp_path,
                                                                            monkeypatch):
    """docs/your_model.md's my_nets.py: the run plans, passes the door (a real build on the
    data's 1×28×28 samples) and builds; and, as the doc has it (the file in the folder
    creditaudit runs in, the factory named in the config), it trains: two DFA steps on 64
    images, its record completed with finite losses and its states' norms measured."""
    from creditaudit.cli import main
    from creditaudit.records import load_record
    from docs_support import doc_blocks

    source = next(b.text for b in doc_blocks() if b.doc == "docs/your_model.md"
                  and "def gray_resnet20" in b.text)
    (tmp_path / "my_nets.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write_idx_dataset(tmp_path / "mnist")
    states = ["1.stem", "1.layer1.0", "1.layer2.0", "1.layer3.0"]
    try:
        plan = plan_run(tiny_config(tmp_path / "runs", **image_run(data, **{
            "model.arch": "module", "model.factory": "my_nets:gray_resnet20",
            "model.states": states})))
        assert "builds_for_the_data" in plan.code.model.checks
        assert plan.build_model().n_classes == 10
        monkeypatch.chdir(tmp_path)
        assert main(["train", "--method", "dfa", "-q", "--no-progress", *cli_args(
            tmp_path / "trained", **image_run(data, **{
                "model.arch": "module", "model.factory": "my_nets:gray_resnet20",
                "model.states": states, "optim.batch_size": 32,
                "diagnostics.end_of_run": False}))]) == 0
        [record] = [load_record(p) for p in (tmp_path / "trained").glob("*/record.json")]
        assert record.status == "completed" and [e.epoch for e in record.log] == [0, 1]
        assert math.isfinite(record.log[-1].train_loss)
        assert len(record.log[-1].hidden_norms) == len(states)
    finally:
        sys.modules.pop("my_nets", None)


RANDOM_FACTORIES = '''
import random

from torch import nn


def random_width(n_classes=10):
    """Its width drawn from Python's RNG, which no run.seed seeds."""
    width = random.choice([4, 8, 16, 32, 64, 128, 256, 512])
    return nn.Sequential(nn.Flatten(), nn.Linear(12, width), nn.Linear(width, width),
                         nn.Linear(width, n_classes))


def random_init(n_classes=10):
    """Its weights drawn from Python's RNG: one run seed, another network each time."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Linear(8, 8), nn.Linear(8, n_classes))
    net[1].weight.data.fill_(random.random())
    return net


CALLS = [0]


def alternating(n_classes=10):
    """A Tanh on odd calls, a ReLU on even ones: the same weights, another network."""
    CALLS[0] += 1
    activation = nn.Tanh() if CALLS[0] % 2 else nn.ReLU()
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Linear(8, 8), activation,
                         nn.Linear(8, n_classes))
'''


COUNTING_FACTORY = '''
import torch
from torch import nn


class Counted(nn.Module):
    """Counts its forwards in a buffer, eval-mode ones too (a warm-up's clock, say)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(12, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def net(n_classes=10):
    return nn.Sequential(nn.Flatten(), Counted(), nn.Linear(8, 8), nn.Linear(8, n_classes))
'''


def test_a_factory_whose_eval_forward_changes_a_buffer_is_refused(tmp_path, monkeypatch):
    """The diagnostics forward the network in eval mode between training steps: a buffer
    they change would make training depend on what was measured."""
    from creditaudit.testing import check_module

    (tmp_path / "counting_nets.py").write_text(COUNTING_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AssertionError) as err:
        check_module({"factory": "counting_nets:net", "states": ["1", "2"]},
                     input_shape=(1, 3, 4), n_classes=10)
    message = str(err.value)
    assert "fails 1 conformance check:" in message, message
    assert ("eval_forward_leaves_the_network_alone: an eval-mode forward of the network "
            "changed 1.calls") in message


@pytest.mark.parametrize(("factory", "differs"), [
    ("random_width", "are different networks ('1.weight' is ("),
    ("random_init", "differ (at '1.weight')"),
    # the same parameters, so it passed: audit and --resume rebuilt the other activation
    ("alternating", "are different networks ('3' is a ")])
def test_a_factory_that_builds_another_network_under_one_seed_is_refused(
        tmp_path, monkeypatch, factory, differs):
    """A factory drawing from Python's RNG trains one network and gives audit and --resume
    another (which then called its checkpoint 'another run's'): the door builds it twice
    under one seed."""
    from creditaudit.testing import check_module

    (tmp_path / "random_nets.py").write_text(RANDOM_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    random = __import__("random")
    random.seed(0)  # not a chance draw of the same width or value twice (they would pass)
    with pytest.raises(AssertionError) as err:
        check_module({"factory": f"random_nets:{factory}", "states": ["1", "2"]},
                     input_shape=(1, 3, 4), n_classes=10)
    message = str(err.value)
    assert "initial_weights_follow_the_seed" in message and differs in message, message
    assert ("draws from a random source other than torch's" in message
            or "builds another network on some calls" in message)


def test_a_factory_module_that_changes_a_torch_setting_on_import_is_named(tmp_path,
                                                                         monkeypatch):
    """``torch.set_default_dtype(torch.float64)`` at the top of the factory's file: the run
    trained in float64 and its record said fp32 (or a dataset refused its own arrays)."""
    from creditaudit.errors import GuestError
    from creditaudit.models.module_factory import load_factory

    (tmp_path / "f64_nets.py").write_text(
        "import torch\nfrom torch import nn\n\ntorch.set_default_dtype(torch.float64)\n\n\n"
        "def net(n_classes=10):\n    return nn.Linear(4, n_classes)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "f64_nets", raising=False)
    with pytest.raises(GuestError, match=r"model factory 'f64_nets:net' changed torch's "
                                         r"default dtype from float32 to float64"):
        load_factory("f64_nets:net")
    assert torch.get_default_dtype() == torch.float32


def test_a_factory_network_in_float64_is_refused_naming_the_factory(tmp_path, monkeypatch):
    """A network of torch's own layers cast with .double() on the data's float32 samples:
    the first forward raised inside torch's Linear, with no frame of the factory's code to
    blame, so the command line called it an internal error of creditaudit."""
    from creditaudit.errors import GuestError

    (tmp_path / "double_nets.py").write_text(
        "from torch import nn\n\n\ndef net(n_classes=10):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.Linear(8, 8),\n"
        "                         nn.Linear(8, n_classes)).double()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = write_idx_dataset(tmp_path / "mnist")
    with pytest.raises(GuestError, match=r"model factory 'double_nets:net' builds a Sequential "
                                         r"with float64 parameters, but the command line "
                                         r"trains float32 networks"):
        plan_run(tiny_config(tmp_path / "runs", **image_run(data, **{
            "model.arch": "module", "model.factory": "double_nets:net",
            "model.states": ["1", "2"]})))
