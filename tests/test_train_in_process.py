"""train() in a researcher's process: the run is the command's whatever torch settings the
caller has (grad mode, autocast, matmul precision, default device), the caller's settings
and random streams are back afterwards, and a served run's rule steps as the trained one
did (its precision)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from creditaudit import RunConfig, train
from creditaudit.errors import ConfigError, RunRecordError
from creditaudit.records import RunRecord, load_record
from integrity_support import write_idx_dataset

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"method.name": "dfa", "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "run.device": "cpu"}


def tiny(out: Path, **overrides: object) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out), **overrides})


def numbers(record: RunRecord) -> list[dict]:
    """Every epoch's entry without its wall-clock seconds."""
    return [{k: v for k, v in entry.to_dict().items() if k != "seconds"}
            for entry in record.log]


@contextlib.contextmanager
def setting(write: Callable[[object], None], value: object, default: object
            ) -> Iterator[None]:
    write(value)
    try:
        yield
    finally:
        write(default)


CALLER_SETTINGS = {
    "no_grad": lambda: torch.no_grad(),
    "inference_mode": lambda: torch.inference_mode(),
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "matmul_precision_medium": lambda: setting(torch.set_float32_matmul_precision,
                                               "medium", "highest"),
    "default_device_meta": lambda: setting(torch.set_default_device, "meta", None),
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The tiny run trained with torch's defaults."""
    return train(tiny(tmp_path_factory.mktemp("plain")))


@pytest.mark.parametrize("name", list(CALLER_SETTINGS))
def test_train_records_the_commands_run_whatever_the_caller_set(tmp_path, plain, name):
    with CALLER_SETTINGS[name]():
        result = train(tiny(tmp_path))
    assert result.status == "completed", result.record.error
    assert result.record.run_id == plain.record.run_id
    assert numbers(result.record) == numbers(plain.record)


def test_train_leaves_the_callers_settings_and_random_streams(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(4)  # what the caller's stream draws next, without train()
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    with setting(torch.use_deterministic_algorithms, True, False):
        train(tiny(tmp_path, **{"run.threads": threads + 1}))
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.rand(4), expected)


def test_a_served_bf16_run_steps_in_the_precision_it_trained_in(tmp_path):
    config = tiny(tmp_path, **{"run.precision": "bf16"})
    trained = train(config)
    served = train(config)  # finished: rebuilt from its checkpoint
    assert served._rule is None
    rule, live = served.rule, trained.rule
    assert (rule.precision, rule.device_type) == (live.precision, live.device_type) \
        == ("bf16", "cpu")
    assert rule.options == live.options
    assert rule.model.training == live.model.training
    for key, value in live.model.state_dict().items():
        assert torch.equal(value, rule.model.state_dict()[key]), key
    x, y = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2
    losses = []
    for each in (copy.deepcopy(live), copy.deepcopy(rule)):
        step = each.train_step(x, y, torch.optim.SGD(each.trainable_parameters(), lr=0.0))
        losses.append(step.loss)
    assert losses[0] == losses[1]


@pytest.mark.parametrize("config", [{"method.name": "dfa"}, None, "config.toml"])
def test_train_refuses_what_is_no_config_in_one_line(config):
    with pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert "RunConfig" in message and "\n" not in message, message


def test_a_run_trained_in_another_default_dtype_is_another_run(tmp_path):
    """Features and parameters are made in torch's default dtype: a caller's float64 run is
    another computation, under another id beside the float32 one (whose id is as before),
    and each is served in its own dtype."""
    config = tiny(tmp_path)
    single = train(config)
    with setting(torch.set_default_dtype, torch.float64, torch.float32):
        double = train(config)  # the default dtype is the caller's: a float64 run
    assert double.record.model.dtype == "float64" and single.record.model.dtype == "float32"
    assert double.run_dir != single.run_dir
    assert double.run_dir.name.rsplit("-", 1)[0] == single.run_dir.name.rsplit("-", 1)[0]
    assert numbers(double.record) != numbers(single.record)
    with setting(torch.set_default_dtype, torch.float64, torch.float32):
        assert numbers(train(config).record) == numbers(double.record)  # served
    assert numbers(train(config).record) == numbers(single.record)


@pytest.mark.parametrize("arch", ["resmlp", "convmixer"])
def test_a_float64_run_trains_on_images(tmp_path, arch):
    """Images (MNIST's layout here; Fashion-MNIST at the experiments' cpu scale, CIFAR)
    become model inputs in the default dtype, as features do: a caller's float64 run on
    them stopped at its first forward with torch's 'mat1 and mat2 must have the same
    dtype' (a float32 batch into float64 parameters)."""
    data = write_idx_dataset(tmp_path / "mnist")
    settings = {key: value for key, value in TINY.items() if not key.startswith("data.")}
    config = RunConfig().replace(**{
        **settings, "run.out_dir": str(tmp_path / "runs"), "data.name": "mnist",
        "data.data_dir": str(data), "data.augment": True, "diagnostics.eval_samples": 32,
        "model.arch": arch, **({"model.patch": 7, "model.kernel": 3}
                               if arch == "convmixer" else {})})
    with setting(torch.set_default_dtype, torch.float64, torch.float32):
        trained = train(config)
    assert trained.status == "completed", trained.record.error
    assert trained.record.model.dtype == "float64"


def test_bf16_is_refused_for_a_float64_run(tmp_path):
    """bf16 autocast casts float32 tensors only: a float64 run's bf16 steps would be its fp32
    steps bit for bit, under another id and a record saying bf16. Refused in one line,
    before anything is written."""
    config = tiny(tmp_path).replace(**{"run.precision": "bf16"})
    with setting(torch.set_default_dtype, torch.float64, torch.float32), \
            pytest.raises(ConfigError) as error:
        train(config)
    message = str(error.value)
    assert "run.precision='bf16'" in message and "float64" in message \
        and "\n" not in message, message
    assert not any(tmp_path.rglob("record.json"))
    assert train(config).record.config.run.precision == "bf16"  # a float32 run trains


def test_a_float64_runs_diagnostics_run_in_float64_as_run_precision_says(tmp_path,
                                                                        measured_dtypes):
    """run.precision's help said 'diagnostics always fp32'; a float64 run's measure in
    float64 (never bf16), which it now says."""
    from creditaudit.config.sections import RunSettings

    seen = measured_dtypes
    with setting(torch.set_default_dtype, torch.float64, torch.float32):
        train(tiny(tmp_path, **{"diagnostics.end_of_run": False}))
    assert seen == {torch.float64}
    help_text = RunSettings.__dataclass_fields__["precision"].metadata["help"]
    assert "always fp32" not in help_text and "float64" in help_text, help_text


@pytest.mark.parametrize("command", ["train", "demo", "sweep", "experiment"])
def test_the_precision_flags_help_says_what_the_diagnostics_run_in(command, capsys):
    """--precision's help said 'diagnostics stay fp32' while run.precision's key says the
    parameters' dtype (and the end-of-run ρ and nudging run on a float64 copy)."""
    from creditaudit.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "stay fp32" not in text
    assert "the diagnostics run in the parameters' dtype" in text, text
    assert "never under autocast" in text and "ρ and nudging in float64" in text


def test_an_older_float64_run_under_a_float32_id_is_refused_naming_the_dtype(tmp_path,
                                                                            monkeypatch):
    """A run trained in float64 before the dtype joined the run id holds the float32 id: a
    float32 caller is told the dtype, not that the data changed."""
    import creditaudit.run.plan as plan

    as_before = plan.compute_run_id
    config = tiny(tmp_path)
    with monkeypatch.context() as patch, \
            setting(torch.set_default_dtype, torch.float64, torch.float32):
        patch.setattr(plan, "compute_run_id",
                      lambda *args, **kw: as_before(*args, **{**kw, "dtype": "float32"}))
        trained = train(config)
    assert trained.record.model.dtype == "float64"
    with pytest.raises(RunRecordError) as error:
        train(config)
    message = str(error.value)
    assert "default dtype float64" in message and "torch.set_default_dtype(torch.float64)" \
        in message and "\n" not in message, message


def test_a_sweeps_workers_make_its_runs_in_the_callers_default_dtype(tmp_path):
    """A Python caller's float64 sweep: its worker processes (started in float32) make the
    runs in float64, under the ids the sweep planned (they refused every run before)."""
    from creditaudit.run.plan import run_id
    from creditaudit.sweep import run_sweep
    from creditaudit.sweep.executors import LocalExecutor

    config = tiny(tmp_path)
    with setting(torch.set_default_dtype, torch.float64, torch.float32):
        result = run_sweep([config], LocalExecutor(workers=1))
        planned = run_id(config)
    assert [o["status"] for o in result.outcomes] == ["completed"], result.outcomes
    assert result.outcomes[0]["run_id"] == planned
    record = load_record(tmp_path / planned / "record.json")
    assert record.model.dtype == "float64"
