"""A run plan refuses a run that would not fit in this machine's memory, counting what the rule
builds beside the model (auxiliary nets, local classifiers, feedback), sized on the meta
device: one line, exit 2, instead of an allocation failure inside training."""

from __future__ import annotations

import pytest

from creditaudit import RunConfig
from creditaudit.cli import main
from creditaudit.errors import ConfigError
from creditaudit.methods import build_rule
from creditaudit.methods.footprint import rule_bytes
from creditaudit.models import build_model
from creditaudit.run import memory
from creditaudit.run.memory import TRAINING_BYTES_PER_PARAMETER
from creditaudit.run.plan import plan_run
from integrity_support import assert_one_line_error

TINY = {"data.n_train": 64, "data.n_test": 64, "data.in_dim": 16, "model.d": 16,
        "model.n_blocks": 2, "optim.epochs": 1, "diagnostics.end_of_run": False,
        "run.progress": False}
GIB = 2**30


def _config(tmp_path, **values) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(tmp_path), **values})


@pytest.mark.parametrize("name", ["state-bridge", "credit-bridge"])
def test_a_bridge_too_large_for_the_machine_is_one_line_exit_2(tmp_path, capsys, monkeypatch,
                                                                name):
    """The ResMLP d=16 needs a few kB; a bridge of width 20 000 needs GiBs."""
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * GIB)
    args = ["train", "--method", name, "--set", "method.bridge_hidden=20000", "--epochs", "1",
            "--width", "16", "--blocks", "2", "--set", "data.n_train=64", "--set",
            "data.n_test=64", "--set", "data.in_dim=16", "-q", "--out", str(tmp_path)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "1,626 parameters", f"and {name} builds",
                          "smaller method options")
    assert not any(tmp_path.iterdir())
    plan_run(_config(tmp_path, **{"method.name": name}))  # the default width fits


@pytest.mark.parametrize("name", ["dfa", "local-ce", "state-bridge", "credit-bridge"])
def test_what_the_plan_counts_is_what_the_rule_holds(name):
    """Sized on the meta device, a rule holds what it holds bound for real: its state's tensors
    (feedback, nets, EMA targets) and a gradient and two moments per parameter it trains."""
    config = _config("unused", **{"method.name": name, "method.bridge_hidden": 32}
                     if "bridge" in name else {"method.name": name})
    model = build_model(config.model, input_shape=(16,), n_classes=10)
    rule = build_rule(model, config.method, n_classes=10, seed=0)
    held = rule_bytes(rule)
    assert held > 0
    meta_model = build_model(config.model, input_shape=(16,), n_classes=10).to("meta")
    assert memory.rule_on_meta_bytes(type(rule), meta_model, config, 10) == held
    if "bridge" in name:  # the net alone, trained: weights, gradient, moments
        net = rule.value if name == "credit-bridge" else rule.predictor
        values = sum(p.numel() for p in net.parameters())
        assert held >= values * TRAINING_BYTES_PER_PARAMETER


def test_a_rule_that_cannot_bind_on_meta_counts_nothing_and_refuses_no_run(monkeypatch):
    """Code that needs values to bind is sized once the run binds it: the plan goes on; a
    refusal of the rule's options still stops the plan (it checks them before sizing)."""
    def fails(rule):
        raise RuntimeError("needs values")

    monkeypatch.setattr(memory, "rule_bytes", fails)
    config = _config("unused", **{"method.name": "dfa"})
    meta_model = build_model(config.model, input_shape=(16,), n_classes=10).to("meta")
    cls = type(build_rule(build_model(config.model, input_shape=(16,), n_classes=10),
                          config.method, n_classes=10, seed=0))
    assert memory.rule_on_meta_bytes(cls, meta_model, config, 10) == 0
    refused = config.replace(**{"method.penalty": 0.1, "method.trainable_blocks": 0})
    with pytest.raises(ConfigError, match="method.penalty=0.1 has no effect"):
        plan_run(refused)


def test_generated_data_too_large_for_the_machine_is_one_line_exit_2(tmp_path, capsys,
                                                                      monkeypatch):
    """50 million synthetic samples of 256 float32 features need 48 GiB: refused by the
    plan, not an allocation failure ('internal error') while generating them."""
    monkeypatch.setattr(memory, "available_memory", lambda: 2 * GIB)
    args = ["train", "--set", "data.n_train=50000000", "--set", "data.n_test=100", "--epochs",
            "1", "--width", "16", "--blocks", "2", "-q", "--out", str(tmp_path)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "synthetic would hold 50,000,000 + 100 samples of shape "
                          "(256,): at least 48.1 GiB, but this machine has 2.0 GiB "
                          "available; use fewer samples (data.n_train, data.n_test)")
    assert not any(tmp_path.iterdir())
    plan_run(_config(tmp_path, **{"data.n_train": 1_000_000}))  # 1 GiB fits


def test_a_float64_run_counts_its_parameters_in_float64(tmp_path, monkeypatch):
    """A Python caller's float64 default dtype makes float64 parameters: weight, gradient and
    moments take twice a float32 run's memory, so a model that fits in float32 only is
    refused in float64, in one line, rather than failing inside training."""
    import torch

    config = _config(tmp_path, **{"method.name": "bp", "model.d": 256, "model.n_blocks": 4})
    model = build_model(config.model, input_shape=(16,), n_classes=10)
    float32_bytes = sum(p.numel() for p in model.parameters()) * TRAINING_BYTES_PER_PARAMETER
    monkeypatch.setattr(memory, "available_memory", lambda: int(1.5 * float32_bytes))
    plan_run(config)  # fits in float32
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(ConfigError, match="training needs about"):
            plan_run(config)
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("key", ["data.in_dim", "model.d"])
def test_sizes_no_tensor_can_address_are_one_line_exit_2(tmp_path, capsys, key):
    """A size whose bytes overflow 64 bits fails the meta build and any CPU build alike:
    the options' fault, said in one line (it was reported as an internal error)."""
    args = ["train", "--method", "bp", "--dataset", "synthetic", "--set", f"{key}={2**62}",
            "--epochs", "1", "-q", "--out", str(tmp_path)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "model.arch='resmlp'", "too large to address",
                          "choose a smaller model")
    assert not any(tmp_path.iterdir())
