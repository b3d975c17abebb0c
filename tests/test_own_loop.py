"""Your network, your loop — the second half: what an adapted model says it is, the
``module`` architecture (any nn.Module from the command line, sweeps and audits included), and
the :class:`creditaudit.Recorder` that writes the command line's run record from a loop of
your own."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import tomli_w
import torch
from torch import Tensor, nn

from creditaudit import Recorder, RunConfig, adapt, diagnose, load_record, rule
from creditaudit.cli import main
from creditaudit.data import load_dataset
from creditaudit.errors import (
    ConfigError,
    CreditAuditError,
    ModelContractError,
    OutputError,
    RunRecordError,
)
from creditaudit.figures import RunIndex
from creditaudit.figures.audit_panels import category
from creditaudit.loggers import RunLogger
from creditaudit.models.contract import measurement_mode
from creditaudit.protocol.records import RecordSet
from creditaudit.records import CHECKPOINT_FILE, INIT_FILE, comparable
from creditaudit.report import format_run_summary
from creditaudit.results import arch_label
from creditaudit.run.plan import plan_run
from creditaudit.run.recorder import OWN_DATA, array_fingerprint
from creditaudit.run.results import epoch_record
from creditaudit.run.trainer import RunResult, train
from creditaudit.sweep import load_sweep
from creditaudit.sweep.distinct import run_key
from creditaudit.testing.zoo import CifarResNet, TransformerClassifier
from docs_support import ROOT
from integrity_support import write_idx_dataset

pytestmark = pytest.mark.usefixtures("single_thread")

IMAGE = (1, 28, 28)
RESNET_STATES = ["stem", "layer1.0", "layer2.0", "layer3.0"]
TRANSFORMER_STATES = ["encoder.layers.0", "encoder.layers.1"]
PROOF_RULES = ["bp", "fa-linear", "usf", "kp", "dfa", "frozen"]
# Tiny runs of the command line: one epoch on 64 images, the protocol on 32 test images.
TINY = {"optim.epochs": 1, "optim.batch_size": 32, "diagnostics.eval_samples": 32,
        "diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
        "diagnostics.null_draws": 2, "run.progress": False}
# ResNet-20's structure (three stages of 3 BasicBlocks, 20 weight layers) at 4/8/8 channels,
# and a two-layer encoder: the same code as the results' networks, sized for CI.
RESNET20 = {"model.arch": "module", "model.factory": "creditaudit.testing.zoo:CifarResNet",
            "model.args": {"n": 3, "widths": [4, 8, 8], "in_channels": 1},
            "model.states": ["stem", *(f"layer{s}.{b}" for s in (1, 2, 3) for b in range(3))]}
TRANSFORMER = {"model.arch": "module",
               "model.factory": "creditaudit.testing.zoo:TransformerClassifier",
               "model.args": {"image_shape": [1, 28, 28], "patch": 7, "d": 8, "depth": 2,
                              "heads": 2, "mlp_ratio": 2},
               "model.states": TRANSFORMER_STATES}
MODELS = {"resnet20": RESNET20, "transformer": TRANSFORMER}


def seeded(make, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def resnet(seed: int = 0) -> CifarResNet:
    return seeded(lambda: CifarResNet(1, (4, 8, 8), in_channels=1), seed)


def transformer(seed: int = 0) -> TransformerClassifier:
    return seeded(lambda: TransformerClassifier(IMAGE, patch=7, d=8, depth=2, heads=2,
                                                mlp_ratio=2), seed)


def images(n: int = 16, seed: int = 0) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, *IMAGE, generator=generator),
            torch.randint(0, 10, (n,), generator=generator))


@pytest.fixture(scope="module")
def idx(tmp_path_factory) -> Path:
    """MNIST-layout IDX files: 64 training and 32 test images of 28×28."""
    return write_idx_dataset(tmp_path_factory.mktemp("idx"))


def cli_config(idx: Path, out: Path, model: dict, **overrides) -> RunConfig:
    return RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(idx), **TINY,
                                  **model, "run.out_dir": str(out), **overrides})


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("creditaudit: error:"), err
    return err


# --- what an adapted model says it is ---------------------------------------------------------
def test_an_adapted_model_describes_itself():
    net = resnet()
    described = adapt(net, RESNET_STATES, input_shape=IMAGE).describe()
    assert described.label == "CifarResNet d=4–8, 4 states h_0…h_3"
    assert described.short_label == "CifarResNet"
    assert (described.d, described.n_blocks, described.layout) == (None, 3, "maps")
    assert described.terminal_ln is False and described.residual is None
    assert described.input_shape == list(IMAGE) and described.arch == "adapted"
    assert described.parameters == sum(p.numel() for p in net.parameters())
    tokens = adapt(transformer(), TRANSFORMER_STATES, input_shape=IMAGE).describe()
    assert (tokens.label, tokens.d, tokens.layout) == (
        "TransformerClassifier d=8, 2 states h_0…h_1", 8, "tokens")
    assert tokens.terminal_ln is True  # probed: LayerNorm(h_L[:, 0]) → head


class Normalised(nn.Module):
    """An MLP whose head reads h_L through ``norm`` (a LayerNorm, a plain scale, or none)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.norm, self.head = norm, nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(self.block(self.embed(x))))


@pytest.mark.parametrize("norm,expected", [(nn.LayerNorm(8), True), (nn.Identity(), False),
                                           (nn.LayerNorm(8, elementwise_affine=False), True),
                                           (nn.Tanh(), False)])
def test_terminal_ln_is_probed_from_what_the_readout_does(norm, expected):
    model = adapt(seeded(lambda: Normalised(norm)), ["embed", "block"], input_shape=(6,))
    assert model.terminal_ln is expected and model.describe().terminal_ln is expected


def test_a_declared_terminal_ln_is_kept_when_the_probe_agrees_and_must_be_a_bool():
    net = seeded(lambda: Normalised(nn.Identity()))
    assert adapt(net, ["embed", "block"], input_shape=(6,), terminal_ln=False).terminal_ln \
        is False
    with pytest.raises(ModelContractError, match="terminal_ln=True, but the probe finds"):
        adapt(net, ["embed", "block"], input_shape=(6,), terminal_ln=True)
    with pytest.raises(ModelContractError, match="terminal_ln must be True, False or None"):
        adapt(net, ["embed", "block"], input_shape=(6,), terminal_ln="yes")


class ZeroLastState(nn.Module):
    """h_L is the output of a zero-initialised Linear (no skip): exactly 0 at init; the head
    is a plain Linear, or reads h_L through a LayerNorm."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(6, 8), nn.Linear(8, 8)
        nn.init.zeros_(self.block.weight)
        nn.init.zeros_(self.block.bias)
        self.norm, self.head = norm, nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(self.block(torch.relu(self.embed(x)))))


@pytest.mark.parametrize("norm,expected", [(nn.Identity(), False), (nn.LayerNorm(8), True)])
def test_terminal_ln_is_probed_where_h_L_starts_at_exactly_zero(norm, expected):
    """A zero h_L scales to itself: the probe read every such readout as normalising h_L (a
    record saying terminal_ln true of a network without a LayerNorm, and a declared
    terminal_ln=False refused)."""
    net = seeded(lambda: ZeroLastState(norm))
    model = adapt(net, ["embed", "block"], input_shape=(6,))
    assert model.terminal_ln is expected and model.describe().terminal_ln is expected
    assert adapt(net, ["embed", "block"], input_shape=(6,),
                 terminal_ln=expected).terminal_ln is expected


class Scale(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, h: Tensor) -> Tensor:
        return h * self.scale


class ScaledLastState(nn.Module):
    """h_L is a Linear's output times ``scale`` (1e-20: its squares underflow in float32;
    1e20: they overflow); the head is a plain Linear, or reads h_L through a LayerNorm."""

    def __init__(self, scale: float, norm: nn.Module) -> None:
        super().__init__()
        self.embed, self.block = nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), Scale(scale))
        self.norm, self.head = norm, nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(self.block(torch.relu(self.embed(x)))))


@pytest.mark.parametrize("scale,norm,expected", [
    (1e-20, nn.Identity(), False), (1e-30, nn.Identity(), False), (1e20, nn.Identity(), False),
    (1e-20, nn.LayerNorm(8), True), (1e-30, nn.LayerNorm(8), True)])
def test_terminal_ln_is_probed_where_h_L_is_far_from_unit_scale(scale, norm, expected):
    """The probe brought h_L to unit RMS through its squares: at 1e-20 they underflowed (h_L
    was left ~1e-10, the head's bias hid it) and at 1e20 overflowed (h_L became 0), and a
    plain Linear head read as normalising h_L. (A LayerNorm of an h_L of 1e20 overflows
    itself: adapt refuses that network.)"""
    net = seeded(lambda: ScaledLastState(scale, norm))
    assert adapt(net, ["embed", "block"], input_shape=(6,)).terminal_ln is expected


def test_on_the_meta_device_adapt_learns_the_shapes_without_values():
    real = adapt(resnet(), RESNET_STATES, input_shape=IMAGE).describe()
    with torch.device("meta"):
        net = CifarResNet(1, (4, 8, 8), in_channels=1)
    planned = adapt(net, RESNET_STATES, input_shape=IMAGE)
    assert planned.terminal_ln is None  # a fact of values: unknown before the weights exist
    assert {**vars(planned.describe()), "terminal_ln": False} == vars(real)


def test_diagnose_reads_the_adapted_models_terminal_ln():
    x, y = images(8)
    adapted = adapt(transformer(), TRANSFORMER_STATES, example=x)
    report = diagnose(adapted, x, y, verify_reference=False)
    assert report.metadata["terminal_ln"] is True


# --- the module architecture: any nn.Module from the command line ------------------------------
def test_the_run_id_covers_the_factory_and_its_options(idx, tmp_path):
    base = cli_config(idx, tmp_path, RESNET20)
    ids = {plan_run(base).run_id}
    for key, value in [("model.factory", "creditaudit.testing.zoo:resnet20"),
                       ("model.args", {**RESNET20["model.args"], "n": 2}),
                       ("model.states", RESNET20["model.states"][:-1]),
                       ("model.readout", ["fc"]), ("model.terminal_ln", False)]:
        overrides = {key: value}
        if key == "model.factory":
            overrides["model.args"] = {"in_channels": 1}
        if key == "model.args":
            overrides["model.states"] = ["stem", "layer1.0", "layer1.1", "layer2.0",
                                         "layer2.1", "layer3.0", "layer3.1"]
        ids.add(plan_run(base.replace(**overrides)).run_id)
    assert len(ids) == 6
    assert plan_run(cli_config(idx, tmp_path, RESNET20)).run_id == plan_run(base).run_id
    planned = plan_run(base)
    assert planned.model.label == "CifarResNet d=4–8, 10 states h_0…h_9" and not planned.flatten


REFUSALS = [
    ("no factory", {"model.factory": ""}, ConfigError, "needs model.factory"),
    ("not a path", {"model.factory": "not a path!"}, ConfigError, "is not a module path"),
    ("not importable", {"model.factory": "no_such_package.nets:Net"}, ConfigError,
     "no module named 'no_such_package'; install its package or put its folder on PYTHONPATH"),
    ("no attribute", {"model.factory": "creditaudit.testing.zoo:ResNet99"}, ConfigError,
     "has no attribute 'ResNet99'"),
    ("not callable", {"model.factory": "creditaudit.testing.zoo:SHORTCUTS"}, ConfigError,
     "is a tuple, not callable"),
    ("states not submodules", {"model.states": ["stem", "layer9.0"]}, ModelContractError,
     "states: 'layer9.0' is not a submodule of CifarResNet"),
    ("states a string", {"model.states": "stem"}, ConfigError,
     "model.states must be a list, got 'stem'"),
    ("states not names", {"model.states": ["stem", 3]}, ConfigError,
     "model.states must be a list of submodule names"),
    ("one state", {"model.states": ["stem"]}, ConfigError, "at least two names"),
    ("args not a table", {"model.args": "n=3"}, ConfigError, "model.args must be a table"),
    ("args refused", {"model.args": {"n": 3, "depth": 4}}, ConfigError,
     "raised TypeError: CifarResNet.__init__() got an unexpected keyword argument 'depth'"),
    ("factory fails", {"model.args": {"n": 3, "shortcut": "C"}}, ConfigError,
     "raised ValueError: shortcut 'C' is not one of A, B"),
    ("other classes", {"model.args": {"n": 3, "in_channels": 1, "n_classes": 3}}, ConfigError,
     "CifarResNet returns 3 logits but the data has 10 classes"),
]


@pytest.mark.parametrize("overrides,error,fragment", [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_the_module_architecture_refuses_what_cannot_work_in_one_line(idx, tmp_path, overrides,
                                                                       error, fragment):
    with pytest.raises(error) as err:
        plan_run(cli_config(idx, tmp_path, {**RESNET20, **overrides}))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_command_line_says_a_factory_error_in_one_line(idx, tmp_path, capsys):
    argv = ["train", "--arch", "module:no_such_package:Net", "--dataset", "mnist",
            "--data-dir", str(idx), "--out", str(tmp_path), "-q",
            "--set", 'model.states=["a", "b"]']
    assert main(argv) == 2
    assert "no module named 'no_such_package'" in one_line(capsys)
    assert not list(tmp_path.iterdir())  # refused before any folder was made


def test_arch_module_colon_is_the_factory_option(idx, tmp_path, capsys):
    common = ["train", "--dataset", "mnist", "--data-dir", str(idx), "--out", str(tmp_path),
              "--set", "model.args={n = 3, widths = [4, 8, 8], in_channels = 1}",
              "--set", f"model.states={json.dumps(RESNET20['model.states'])}",
              "--print-config"]
    assert main([*common, "--arch", "module:creditaudit.testing.zoo:CifarResNet"]) == 0
    short = capsys.readouterr().out
    assert main([*common, "--arch", "module", "--set",
                 "model.factory=creditaudit.testing.zoo:CifarResNet"]) == 0
    assert capsys.readouterr().out == short
    assert 'factory = "creditaudit.testing.zoo:CifarResNet"' in short


class StopAfterFirstEpoch(RunLogger):
    def log_epoch(self, entry) -> None:
        if entry.epoch == 1:
            raise KeyboardInterrupt


def test_train_resume_and_audit_rebuild_the_model_from_the_factory(idx, tmp_path, capsys):
    config = cli_config(idx, tmp_path / "a", TRANSFORMER, **{"method.name": "dfa",
                                                             "optim.epochs": 2})
    whole = train(config)
    assert whole.status == "completed" and whole.record.model.arch == "module"
    assert whole.record.model.terminal_ln is True and whole.record.model.layout == "tokens"
    # the run rebuilt from its folder is the trained one
    live = {n: p.detach().clone() for n, p in whole.model.named_parameters()}
    again = RunResult(whole.run_dir, load_record(whole.run_dir))
    assert all(torch.equal(p, live[n]) for n, p in again.model.named_parameters())
    # killed after epoch 1 and resumed: the same record as the uninterrupted run
    cut = cli_config(idx, tmp_path / "b", TRANSFORMER, **{"method.name": "dfa",
                                                          "optim.epochs": 2})
    with pytest.raises(KeyboardInterrupt):
        train(cut, loggers=[StopAfterFirstEpoch()])
    resumed = train(cut, resume=True)
    assert resumed.run_dir.name == whole.run_dir.name
    assert comparable(resumed.record) == comparable(whole.record)
    assert main(["audit", str(whole.run_dir), "--format", "json", "-q", "--no-metrics"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hidden_norms"] == pytest.approx(whole.record.log[-1].value("hidden_norms"),
                                                rel=1e-5)
    assert report["metadata"]["arch"] == "TransformerClassifier d=8, 2 states h_0…h_1"


def sweep_file(path: Path, idx: Path, model: dict, rules: list[str], **overrides) -> Path:
    """A sweep file: ``model`` (dotted model keys) on the tiny IDX data, one run per rule."""
    base: dict = {"data": {"name": "mnist", "data_dir": str(idx)}}
    for key, value in {**model, **TINY, **overrides}.items():
        section, name = key.split(".", 1)
        base.setdefault(section, {})[name] = value
    path.write_text(tomli_w.dumps({"base": base, "grid": {"method.name": rules}}))
    return path


def cli_sweep_and_audit(idx: Path, out: Path, model: str, rules: list[str], capsys, *,
                        metrics: bool) -> list:
    """Sweep ``rules`` on ``model`` through the command line, then audit each run from its
    folder (the model rebuilt from the factory); ``metrics``: with the end-of-run block and
    the audit's credit-quality metrics."""
    sweep = sweep_file(out.parent / f"{model}.toml", idx, MODELS[model], rules,
                       **{"diagnostics.end_of_run": metrics})
    assert main(["sweep", str(sweep), "--workers", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    runs = list(RecordSet.from_folder(out))
    assert sorted(r.method for r in runs) == sorted(rules)
    for record in runs:
        assert record.status == "completed" and record.model.arch == "module"
        assert record.model.n_blocks == len(MODELS[model]["model.states"]) - 1
        argv = ["audit", str(out / record.run_id), "--format", "json", "-q"]
        assert main(argv if metrics else [*argv, "--no-metrics"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert set(report["diagnostics"]) == {"a", "b", "c", "d"}
        assert report["metadata"]["method"] == record.method
        assert report["hidden_norms"] == pytest.approx(record.log[-1].value("hidden_norms"),
                                                    rel=1e-4)
        if record.method != "frozen":  # (d) against the frozen run beside it
            assert report["metadata"]["frozen_from_runs"] == 1
            assert report["diagnostics"]["d"]["status"] != "not evaluated"
        if record.method in ("bp", "frozen"):
            assert all(abs(c["cos"] - 1) < 1e-6 for c in report["layer_cosines"])
    return runs


@pytest.mark.parametrize("model", MODELS)
def test_a_cli_sweep_trains_and_audits_an_outside_model(model, idx, tmp_path, capsys):
    cli_sweep_and_audit(idx, tmp_path / "out", model, ["dfa", "frozen"], capsys, metrics=False)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_rule_of_the_proof_through_the_cli(model, idx, tmp_path, capsys):
    """bp, fa-linear, usf, kp, dfa and frozen through `sweep`, `audit` (with the
    credit-quality metrics) and `report`."""
    out = tmp_path / "out"
    runs = cli_sweep_and_audit(idx, out, model, PROOF_RULES, capsys, metrics=True)
    assert {r.method for r in runs} == set(PROOF_RULES)
    assert main(["report", str(out)]) == 0
    table = (out / "report" / "report.md").read_text()
    assert all(record.run_id in table for record in runs)



@pytest.mark.parametrize("name", ["own_resnet20_fashion", "own_transformer_mnist1d"])
def test_the_outside_model_sweep_files_hold_six_rules_by_three_seeds(name):
    """examples/sweeps/own_*.toml (what docs/your_model.md says they hold): 18 distinct runs
    of the module architecture, each rule of the proof on three seeds."""
    configs = load_sweep(ROOT / f"examples/sweeps/{name}.toml").configs()
    assert len(configs) == 18 == len({run_key(c) for c in configs})
    assert {c.model.arch for c in configs} == {"module"}
    assert sorted((c.method.name, c.run.seed) for c in configs) == sorted(
        (method, seed) for method in PROOF_RULES for seed in (42, 123, 456))

# --- the Recorder: the command line's record from your own loop ----------------------------------
METRIC_KEYS = {"diagnostics.rho_samples": 8, "diagnostics.rho_directions": 2,
               "diagnostics.null_draws": 2}


def own_loop(make, states: list[str], name: str, epochs: int = 2, recorder=None,
             eval_set=None, **options):
    """Train ``make()`` with rule ``name`` for ``epochs`` epochs of 4 steps in a plain loop;
    ``recorder(rule, eval_x, eval_y)`` (optional) is called once before training and its
    ``epoch`` after every epoch; ``eval_set``: (eval_x, eval_y), default 32 random images.
    Returns (rule, recorder or None)."""
    x, y = images(96, seed=3)
    eval_x, eval_y = eval_set if eval_set is not None else (x[:32], y[:32])
    model = adapt(make(), states, example=x[:8])
    trained = rule(name, model, **options)
    optimizer = torch.optim.AdamW(trained.trainable_parameters(), lr=1e-2)
    rec = recorder(trained, eval_x, eval_y) if recorder is not None else None
    if rec is not None:
        rec.epoch(0)
    generator = torch.Generator().manual_seed(7)
    model.train()
    for epoch in range(1, epochs + 1):
        losses = []
        for _ in range(4):
            batch = torch.randint(32, 96, (16,), generator=generator)
            losses.append(trained.train_step(x[batch], y[batch], optimizer).loss)
        if rec is not None:
            model.eval()
            with torch.no_grad():
                accuracy = float((model(eval_x).argmax(1) == eval_y).float().mean())
            model.train()
            rec.epoch(epoch, test_acc=accuracy, test_loss=2.3, train_loss=sum(losses) / 4)
    return trained, rec


def test_the_recorder_writes_the_command_lines_record_from_your_loop(tmp_path, capsys):
    out = tmp_path / "runs"
    config = {"optim.lr": 1e-2, "optim.batch_size": 16, "run.seed": 7, **METRIC_KEYS}

    def recorder(r, x, y):
        rec = Recorder(r, x, y, out=out, name="resnet-dfa", data="my-images", config=config)
        first = load_record(out / "resnet-dfa")  # written at once, before any epoch
        assert first.status == "running" and first.log == []
        return rec

    dfa, rec = own_loop(resnet, RESNET_STATES, "dfa", recorder=recorder, penalty=1e-3)
    record = rec.finish()
    assert record is rec.record and record.status == "completed"
    on_disk = load_record(out / "resnet-dfa")
    assert comparable(on_disk) == comparable(record)
    # the model, the rule, the data and the code, as they are
    assert record.model == dataclasses.replace(dfa.model.describe(), arch="own-loop",
                                               frozen_parameters={})  # nothing frozen
    assert record.model.label == "CifarResNet d=4–8, 4 states h_0…h_3"
    assert record.model.terminal_ln is False
    assert dataclasses.asdict(record.config.method) == dataclasses.asdict(dfa.config)
    assert record.config.method.penalty == 1e-3
    model = record.config.model
    assert (model.arch, model.module, model.states) == (
        "own-loop", "creditaudit.testing.zoo:CifarResNet", RESNET_STATES)
    assert (record.config.optim.lr, record.config.run.seed, record.epochs) == (1e-2, 7, 2)
    eval_x, eval_y = images(96, seed=3)[0][:32], images(96, seed=3)[1][:32]
    fingerprint = array_fingerprint(eval_x, eval_y)
    assert record.data.name == record.dataset == "my-images"
    assert record.data.fingerprint == record.data.source == fingerprint
    assert "evaluation arrays" in record.data.provenance["identifies"]
    moved = eval_x.clone()
    moved[0, 0, 0, 0] += 1e-3
    assert array_fingerprint(moved, eval_y) != fingerprint
    components = record.environment["components"]
    assert components["method"]["name"] == "dfa"
    assert components["model"]["module"] == "creditaudit.testing.zoo:CifarResNet"
    assert components["model"]["module_origin"].startswith("creditaudit==")
    # each epoch: the training loop's measures and protocol; the end-of-run block
    assert [e.epoch for e in record.log] == [0, 1, 2]
    assert record.log[0].protocol is None and record.log[2].protocol is not None
    assert record.log[2].protocol["d"] == "not evaluated"  # no frozen baseline given
    with measurement_mode(dfa.model):  # what `creditaudit train` records (in eval mode: BatchNorm)
        fields, _ = epoch_record(dfa, eval_x, eval_y)
    last = record.log[-1]
    assert "test_acc" not in fields  # the loop's accuracy, not a measure
    assert {k: last.value(k) for k in fields} == fields
    assert record.final.test_acc == last.acc_eval and record.final.epochs_completed == 2
    assert record.diagnostics.drift and record.diagnostics.bp_cosine is not None
    assert record.diagnostics.fresh_b_null["n"] == 2
    # read by the folder commands' indexes; refused by those that rebuild, in one line
    index = RunIndex.from_dir(out)
    runs = index.select(standard=True)  # an adapted model has no config.model.residual
    assert [run.run_id for run in runs] == ["resnet-dfa"]
    assert arch_label(runs[0]) == "CifarResNet"  # figures name an adapted network by its class
    assert category(runs[0], multi_arch=True, multi_data=False) == "DFA λ=0.001\nCifarResNet"
    assert "dfa" in format_run_summary([on_disk])
    capsys.readouterr()  # the recorder's progress lines on stderr
    assert main(["audit", str(out / "resnet-dfa")]) == 2
    assert "trained in its own loop (creditaudit.Recorder)" in one_line(capsys)
    assert main(["train", "--config", str(out / "resnet-dfa" / "record.json")]) == 2
    assert "trained in its own loop (creditaudit.Recorder)" in one_line(capsys)


def test_recording_changes_nothing_of_training(tmp_path):
    """The same loop with and without a recorder: bit-identical weights, BatchNorm
    statistics and global RNG state."""
    ends = []
    for record in (False, True):
        torch.manual_seed(11)
        recorder = (lambda r, x, y: Recorder(r, x, y, out=tmp_path, name="twin",
                                             config=METRIC_KEYS)) if record else None
        trained, rec = own_loop(resnet, RESNET_STATES, "fa-linear", recorder=recorder)
        if rec is not None:
            rec.finish()
        ends.append(({n: t.clone() for n, t in [*trained.model.net.named_parameters(),
                                                 *trained.model.net.named_buffers()]},
                     torch.get_rng_state()))
    (a, rng_a), (b, rng_b) = ends
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(rng_a, rng_b)


def test_a_known_dataset_is_identified_as_the_command_line_identifies_it(idx, tmp_path, capsys):
    data = {"name": "mnist", "data_dir": str(idx)}
    test = load_dataset(cli_config(idx, tmp_path, TRANSFORMER).data, seed=0)
    eval_set = (test.prepare(test.test_x, flatten=False), test.test_y)  # its test split
    runs = {}
    for name in ("dfa", "frozen"):
        def recorder(r, x, y, name=name):
            return Recorder(r, x, y, out=tmp_path, name=f"{name}-run", data=data,
                            config={"diagnostics.end_of_run": False})

        _, runs[name] = own_loop(transformer, TRANSFORMER_STATES, name, recorder=recorder,
                                 eval_set=eval_set)
        runs[name].finish()
    record = runs["dfa"].record
    planned = plan_run(cli_config(idx, tmp_path, TRANSFORMER)).identity
    assert record.data.fingerprint == planned.fingerprint and record.dataset == "mnist"
    assert record.data.provenance["files"] == planned.provenance["files"]
    assert record.data.provenance["evaluation_arrays"]["samples"] == 32
    # two loop runs of one recipe: the frozen one is the other's (d) baseline
    verdict = RecordSet.from_folder(tmp_path).verdict(load_record(tmp_path / "dfa-run"))
    assert verdict.frozen_acc == runs["frozen"].record.final_acc
    assert verdict.statuses["d"] != "not evaluated"
    # data the command line can load: the run is still not rebuilt (nor retrained, resumed)
    capsys.readouterr()  # the recorders' progress lines on stderr
    for argv in (["train", "--config", str(tmp_path / "dfa-run" / "record.json")],
                 ["train", "--config", str(tmp_path / "dfa-run" / "record.json"), "--resume"],
                 ["audit", str(tmp_path / "dfa-run")]):
        assert main(argv) == 2
        assert "trained in its own loop (creditaudit.Recorder)" in one_line(capsys)


def test_the_protocol_runs_when_the_config_says(tmp_path):
    config = {"optim.epochs": 3, "diagnostics.protocol_every": 2,
              "diagnostics.frozen_acc": 0.05, "diagnostics.end_of_run": False}
    _, rec = own_loop(transformer, TRANSFORMER_STATES, "bp", epochs=3, recorder=lambda r, x, y:
                      Recorder(r, x, y, out=tmp_path, name="bp", config=config))
    record = rec.finish()
    assert [e.protocol is not None for e in record.log] == [False, False, True, True]
    assert record.log[2].protocol["d"] != "not evaluated" and record.epochs == 3
    assert record.diagnostics.is_empty  # end_of_run off


@pytest.fixture
def small():
    x, y = images(32, seed=4)
    return rule("bp", adapt(transformer(), TRANSFORMER_STATES, example=x)), x, y


RECORDER_REFUSALS = [
    ("config sets the rule", {"config": {"method.penalty": 0.1}},
     "config sets method.penalty: bind it to the rule: rule(name, model, penalty=…)"),
    ("config sets the model", {"config": {"model": {"d": 8}}}, "config sets model.d"),
    ("unknown config key", {"config": {"optim.lrr": 0.1}}, "unknown key optim.lrr"),
    ("bad data name", {"data": "My Images"}, "use lower-case letters, digits, - and _"),
    ("options of no dataset", {"data": {"name": "scans", "size": 3}},
     "'scans' is no dataset creditaudit knows, so it has no option 'size'"),
    ("a path as name", {"name": "a/b"}, "must be one folder name"),
]


@pytest.mark.parametrize("options,fragment", [r[1:] for r in RECORDER_REFUSALS],
                         ids=[r[0] for r in RECORDER_REFUSALS])
def test_the_recorder_refuses_in_one_line(small, tmp_path, options, fragment):
    with pytest.raises(CreditAuditError) as err:
        Recorder(*small, out=tmp_path, **{"name": "x", **options})
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "x").exists()


def test_the_recorder_refuses_what_it_cannot_record(small, tmp_path):
    trained, x, y = small
    with pytest.raises(ModelContractError, match="eval_y must hold integer class labels"):
        Recorder(trained, x, y.float(), out=tmp_path)
    with pytest.raises(ModelContractError, match="eval_y is uint8, but class labels are int64"):
        Recorder(trained, x, y.to(torch.uint8), out=tmp_path)
    with pytest.raises(ConfigError, match="labels outside 0 … 9"):
        Recorder(trained, x, y + 10, out=tmp_path)
    with pytest.raises(ConfigError, match="records a credit rule, got AdaptedModel"):
        Recorder(trained.model, x, y, out=tmp_path)
    rec = Recorder(trained, x, y, out=tmp_path, name="run",
                   config={"diagnostics.end_of_run": False})
    with pytest.raises(RunRecordError, match="holds a run record already: pass another name="):
        Recorder(trained, x, y, out=tmp_path, name="run")
    with pytest.raises(ConfigError, match="finish\\(\\) before any epoch"):
        rec.finish()
    with pytest.raises(ConfigError, match="test_acc=34.9 is not a fraction in \\[0, 1\\]"):
        rec.epoch(1, test_acc=34.9)
    with pytest.raises(ConfigError, match="test_loss=-1 is negative"):
        rec.epoch(1, test_loss=-1)
    rec.epoch(1, test_acc=0.5)
    with pytest.raises(ConfigError, match="after the last recorded epoch 1"):
        rec.epoch(1)
    assert [e.epoch for e in load_record(tmp_path / "run").log] == [1]
    (tmp_path / "run" / CHECKPOINT_FILE).mkdir()  # a folder under a run file's name
    with pytest.raises(OutputError, match=f"{CHECKPOINT_FILE} is a folder where the run keeps "
                                          "its own .* file: move it away, then create the "
                                          "Recorder again, or pass another name="):
        Recorder(trained, x, y, out=tmp_path, name="run", overwrite=True)
    assert [e.epoch for e in load_record(tmp_path / "run").log] == [1]  # removed nothing
    (tmp_path / "run" / CHECKPOINT_FILE).rmdir()
    Recorder(trained, x, y, out=tmp_path, name="run", overwrite=True)
    assert load_record(tmp_path / "run").log == []


@pytest.mark.parametrize("given", ["record.json", "folder"])
def test_train_resume_of_an_own_loop_record_says_it_trained_in_its_own_loop(small, tmp_path,
                                                                            capsys, given):
    """Its data (own-data) is no dataset a config names: the line is audit's, not the
    config's first unknown value — and says how its record reaches TensorBoard (it said
    nothing of it, and the way in, creditaudit.loggers.replay, was documented nowhere)."""
    trained, x, y = small
    rec = Recorder(trained, x, y, out=tmp_path, name="run", progress=False,
                   config={"diagnostics.end_of_run": False})
    rec.epoch(1, test_acc=0.5)
    path = tmp_path / "run" / ("record.json" if given == "record.json" else "")
    capsys.readouterr()
    for argv in (["train", "--resume", "--config", str(path)], ["train", "--config", str(path)],
                 ["train", "--config", str(path), "--tensorboard", str(tmp_path / "tb")]):
        assert main(argv) == 2
        assert one_line(capsys) == (
            f"creditaudit: error: cannot rebuild {tmp_path / 'run'}: it was trained in its own "
            "loop (creditaudit.Recorder), and only runs the command line trained can be "
            "rebuilt; audit it in that loop with creditaudit.diagnose; to log its record to "
            "TensorBoard or W&B, replay it with creditaudit.loggers.replay (docs/logging.md)")
    assert not (tmp_path / "tb").exists()


def test_a_config_that_is_no_record_keeps_its_own_error(tmp_path, capsys):
    (tmp_path / "c.toml").write_text('[data]\nname = "own-data"\n')
    assert main(["train", "--config", str(tmp_path / "c.toml")]) == 2
    assert "data.name='own-data' is not a known dataset" in one_line(capsys)
    assert main(["train", "--config", str(tmp_path)]) == 2
    assert "is a folder, not a file" in one_line(capsys)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_the_recorder_clears_another_runs_files_from_a_folder_without_a_record(
        small, tmp_path, checkpoint):
    # no record.json, but a checkpoint and initial weights of some other run: an audit or a
    # resume must never take them for the new record's
    trained, x, y = small
    folder = tmp_path / "run"
    folder.mkdir()
    for name in (CHECKPOINT_FILE, INIT_FILE, "config.toml"):
        (folder / name).write_bytes(b"another run's")
    Recorder(trained, x, y, out=tmp_path, name="run", checkpoint=checkpoint,
             config={"diagnostics.end_of_run": False})
    for name in (CHECKPOINT_FILE, INIT_FILE, "config.toml"):
        assert not (folder / name).exists() or (folder / name).read_bytes() != b"another run's"
    assert (folder / INIT_FILE).exists() == checkpoint


def test_the_recorder_refuses_evaluation_arrays_changed_in_place(small, tmp_path):
    # the record's data fingerprint was of the arrays as given, the epochs measured others
    trained, x, y = small
    x = x.clone()
    rec = Recorder(trained, x, y, out=tmp_path, name="run",
                   config={"diagnostics.end_of_run": False})
    rec.epoch(0)
    x.mul_(100.0)
    with pytest.raises(ConfigError, match="eval_x or eval_y was changed in place since the "
                                          "Recorder was created"):
        rec.epoch(1)
    with pytest.raises(ConfigError, match="changed in place"):
        rec.finish()
    assert [e.epoch for e in load_record(tmp_path / "run").log] == [0]


def test_the_recorder_refuses_an_epoch_past_the_optim_epochs_it_was_given(small, tmp_path):
    # the record would say a 1-epoch recipe while its log and final results run to epoch 2
    rec = Recorder(*small, out=tmp_path, name="run",
                   config={"optim.epochs": 1, "diagnostics.end_of_run": False})
    rec.epoch(0)
    rec.epoch(1, test_acc=0.5)
    with pytest.raises(ConfigError, match="epoch=2 is past optim.epochs=1"):
        rec.epoch(2, test_acc=0.5)
    record = rec.finish()
    assert record.config.optim.epochs == 1 and record.final.epochs_completed == 1


def test_a_recorder_finished_before_its_optim_epochs_says_it_stopped_early(small, tmp_path):
    # the record's recipe says 3 epochs; the loop (early stopping) ran 1
    rec = Recorder(*small, out=tmp_path, name="early",
                   config={"optim.epochs": 3, "diagnostics.end_of_run": False})
    rec.epoch(0)
    rec.epoch(1, test_acc=0.5)
    record = rec.finish()
    assert record.status == "completed" and record.final.epochs_completed == 1
    assert record.stopped_early == {"epoch": 1,
                                    "reason": "finish() after epoch 1 of optim.epochs=3"}
    assert load_record(tmp_path / "early").stopped_early == record.stopped_early
    whole = Recorder(*small, out=tmp_path, name="whole",
                     config={"optim.epochs": 1, "diagnostics.end_of_run": False})
    whole.epoch(0)
    whole.epoch(1, test_acc=0.5)
    assert whole.finish().stopped_early is None


def test_a_loop_that_fails_leaves_a_failed_record_and_a_diverged_one_says_so(small, tmp_path):
    trained, x, y = small
    with pytest.raises(RuntimeError), Recorder(trained, x, y, out=tmp_path, name="failed") as rec:
        rec.epoch(0)
        raise RuntimeError("out of memory")
    failed = load_record(tmp_path / "failed")
    assert failed.status == "failed" and failed.error == "RuntimeError: out of memory"
    with Recorder(trained, x, y, out=tmp_path, name="nan",
                  config={"diagnostics.end_of_run": False}) as rec:
        rec.epoch(1, test_loss=math.nan, test_acc=0.1)
    diverged = load_record(tmp_path / "nan")
    assert diverged.status == "diverged" and diverged.divergence["epoch"] == 1


def test_the_recorder_and_the_training_loop_share_one_finite_check(small, tmp_path):
    """A loss the loop does not pass says nothing: a run recorded without test numbers
    completes and its final results are its last epoch's; a training loss that overflowed
    makes the run diverged, its final results those of the last finite epoch."""
    trained, x, y = small
    off = {"diagnostics.end_of_run": False}
    with Recorder(trained, x, y, out=tmp_path, name="quiet", config=off) as rec:
        rec.epoch(0)
        rec.epoch(1, train_loss=0.5)
    quiet = load_record(tmp_path / "quiet")
    assert quiet.status == "completed" and quiet.final.from_epoch is None
    assert quiet.final.h_L_norm == quiet.log[-1].value("h_L_norm") is not None
    with Recorder(trained, x, y, out=tmp_path, name="overflow", config=off) as rec:
        rec.epoch(0, test_loss=2.0, test_acc=0.25)
        rec.epoch(1, test_loss=1.0, test_acc=0.5, train_loss=math.inf)
    overflow = load_record(tmp_path / "overflow")
    assert overflow.status == "diverged" and overflow.divergence["epoch"] == 1
    assert overflow.final.from_epoch == 0 and overflow.final.test_acc == 0.25


def test_checkpoints_hold_tensors_only(small, tmp_path):
    trained, x, y = small
    rec = Recorder(trained, x, y, out=tmp_path, name="ckpt", checkpoint=True,
                   config={"diagnostics.end_of_run": False})
    rec.epoch(0)
    state = torch.load(tmp_path / "ckpt" / CHECKPOINT_FILE, weights_only=True)
    assert state["epoch"] == 0 and state["method"] == "bp"
    assert all(torch.equal(v, trained.model.state_dict()[k]) for k, v in state["model"].items())
    initial = torch.load(tmp_path / "ckpt" / INIT_FILE, weights_only=True)
    assert initial.keys() == dict(trained.model.named_parameters()).keys()
    assert rec.record.dataset == OWN_DATA
