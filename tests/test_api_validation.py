"""The Python API at its boundaries — ``adapt``, ``rule``, ``Recorder``, ``diagnose`` — refuses
what cannot work with one CreditAuditError line naming the argument: inputs of another dtype
or shape than the model takes, no samples, NaN/Inf, labels outside the model's classes, a
declared fact (terminal LayerNorm, class count) that the probe contradicts, weights that are
NaN, a rule bound to another model, and models whose parameters are replaced on every
forward (BioTorch's uSF and brSF layers) — never a raw torch error, never a wrong cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from creditaudit import Recorder, adapt, diagnose, rule
from creditaudit.errors import ConfigError, CreditAuditError
from creditaudit.models import PlainMLP, ResidualMLP
from creditaudit.protocol import Protocol, Thresholds

pytestmark = pytest.mark.usefixtures("single_thread")


class Net(nn.Module):
    """Two states and a head; ``norm`` between the last state and the head."""

    def __init__(self, norm: bool = False, classes: int = 10) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.norm = nn.LayerNorm(16) if norm else nn.Identity()
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.b(self.a(x))))


def net(**kwargs) -> Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Net(**kwargs)


def with_nan_weight() -> Net:
    model = net()
    with torch.no_grad():
        model.b[0].weight[3, 3] = float("nan")
    return model


X = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(2))
STATES = ["a", "b"]


def adapted(**kwargs):
    return adapt(net(**kwargs), STATES, example=X)


def biotorch(mode: str) -> nn.Module:
    biomodule = pytest.importorskip("biotorch.module.biomodule")
    return biomodule.BioModule(net(), mode=mode)


def recorder(tmp_path, x, y=Y):
    return Recorder(rule("dfa", adapted()), x, y, out=tmp_path, name="run")


ADAPT = [
    ("example of another float dtype", lambda: adapt(net(), STATES, example=X.double()),
     "example is float64 but Net's parameters are float32"),
    ("integer example", lambda: adapt(net(), STATES, example=X.long()),
     "adapt() ran Net on example (int64, shape (4, 8)) and it raised RuntimeError"),
    ("example of another shape", lambda: adapt(net(), STATES, example=torch.randn(4, 9)),
     "adapt() ran Net on example (float32, shape (4, 9)) and it raised RuntimeError"),
    ("input_shape of another shape", lambda: adapt(net(), STATES, input_shape=(9,)),
     "adapt() ran Net on input_shape=(9,) (float32, shape (4, 9)) and it raised"),
    ("input_shape not a shape", lambda: adapt(net(), STATES, input_shape=("8",)),
     "input_shape must be one input's shape, positive integers such as (3, 32, 32)"),
    ("example with NaN", lambda: adapt(net(), STATES, example=X.clone().fill_(float("nan"))),
     "example holds NaN/Inf"),
    ("NaN weights", lambda: adapt(with_nan_weight(), STATES, example=X),
     "Net gives NaN/Inf logits on the probe batch: its parameter 'b.0.weight' holds NaN/Inf"),
    ("terminal LN declared away", lambda: adapt(net(norm=True), STATES, example=X,
                                                terminal_ln=False),
     "terminal_ln=False, but the probe finds that Net's readout normalises h_L"),
    ("terminal LN declared in", lambda: adapt(net(), STATES, example=X, terminal_ln=True),
     "terminal_ln=True, but the probe finds that Net's readout does not normalise h_L"),
    ("class count contradicted", lambda: adapt(net(), STATES, example=X, n_classes=12),
     "n_classes=12, but Net returns 10 logits"),
    ("class count not a number", lambda: adapt(net(), STATES, example=X, n_classes="10"),
     "n_classes must be a positive integer"),
    ("BioTorch uSF", lambda: adapt(biotorch("usf"), ["module.a", "module.b"], example=X),
     "replaces its parameter 'module.a.weight_backward' with a new one on every forward"),
    ("BioTorch brSF", lambda: adapt(biotorch("brsf"), ["module.a", "module.b"], example=X),
     "replaces its parameter 'module.a.weight_backward' with a new one on every forward"),
]
RULE = [
    ("negative seed", lambda: rule("dfa", adapted(), seed=-1), "seed=-1 must be an integer"),
    ("seed not a number", lambda: rule("dfa", adapted(), seed="a"), "seed='a' must be an"),
    ("class count not a number", lambda: rule("dfa", adapted(), n_classes="10"),
     "n_classes='10' must be a positive integer"),
    ("trainable blocks of the frozen baseline", lambda: rule("frozen", adapted(),
                                                             trainable_blocks=1),
     "method.trainable_blocks=1 has no effect with method.name='frozen'"),
    ("penalty of the frozen baseline", lambda: rule("frozen", adapted(), penalty=0.1),
     "method.penalty=0.1 has no effect with method.name='frozen', where no block trains"),
    ("a contract model without blocks", lambda: rule("dfa", ResidualMLP(8, 16, 4, 0)),
     "ResidualMLP has no blocks (n_blocks=0)"),
    ("a plain MLP without blocks", lambda: rule("bp", PlainMLP(8, 16, 4, 0)),
     "PlainMLP has no blocks (n_blocks=0)"),
    ("feedback scale of the Credit Bridge without warm-up", lambda: rule(
        "credit-bridge", contract_model(), warmup_fraction=0.0, feedback_scale=2.0),
     "method.feedback_scale=2.0 has no effect with method.name='credit-bridge'"),
    ("soft-min copies of the Credit Bridge without noise", lambda: rule(
        "credit-bridge", contract_model(), bridge_noise=0.0, bridge_copies=4),
     "method.bridge_copies=4 has no effect with method.name='credit-bridge': with "
     "method.bridge_noise=0"),
    ("soft-min temperature of the Credit Bridge with one copy", lambda: rule(
        "credit-bridge", contract_model(), bridge_copies=1, bridge_temperature=1.0),
     "method.bridge_temperature=1.0 has no effect with method.name='credit-bridge': with "
     "method.bridge_copies=1"),
    ("penalty where no block trains", lambda: rule("dfa", contract_model(), penalty=0.1,
                                                   trainable_blocks=0),
     "method.penalty=0.1 has no effect with method.trainable_blocks=0"),
]
DIAGNOSE = [
    ("inputs of another float dtype", lambda: diagnose(adapted(), X.double(), Y),
     "eval_x is float64 but the model's parameters are float32"),
    ("integer inputs", lambda: diagnose(adapted(), X.long(), Y),
     "eval_x is int64 but the model takes float32 inputs"),
    ("inputs of another shape", lambda: diagnose(adapted(), torch.randn(32, 9), Y),
     "eval_x holds samples of shape (9,) but the model takes (8,)"),
    ("no samples", lambda: diagnose(adapted(), X[:0], Y[:0]), "eval_x holds no samples"),
    # one sample without its batch dimension was told its labels were wrong
    ("one sample unbatched", lambda: diagnose(adapted(), X[0], Y[:1]),
     "eval_x is one sample of shape (8,), not a batch: pass inputs (N, 8), the batch first"),
    ("a contract model's sample unbatched", lambda: diagnose(contract_model(), X[0], Y[:1]),
     "eval_x is one sample of shape (8,), not a batch"),
    ("not a tensor", lambda: diagnose(adapted(), X.tolist(), Y),
     "eval_x must be a tensor of model inputs (N, …), got list"),
    ("NaN inputs", lambda: diagnose(adapted(), X.clone().fill_(float("nan")), Y),
     "eval_x holds NaN/Inf"),
    ("labels out of range", lambda: diagnose(adapted(), X, Y + 10),
     "eval_y holds labels 10 … 19 but the model has 10 logits"),
    ("a rule of another model", lambda: diagnose(adapted(), X, Y, credit=rule("dfa", adapted())),
     "credit= is a rule bound to another model"),
    ("thresholds not a Thresholds", lambda: diagnose(adapted(), X, Y, thresholds={"growth": 3}),
     "thresholds= must be a creditaudit.protocol.Thresholds"),
    # a NaN threshold never fires: (a) passed every stream, (d) every margin
    ("a NaN growth threshold", lambda: diagnose(adapted(), X, Y,
                                                thresholds=Thresholds(growth=float("nan"))),
     "Thresholds.growth=nan is not a finite number"),
    ("an infinite margin", lambda: Thresholds(margin_pp=float("inf")),
     "Thresholds.margin_pp=inf is not a finite number"),
    ("a threshold as text", lambda: Thresholds(stability="0.3"),
     "Thresholds.stability must be a number, got '0.3'"),
    ("a fractional batch count", lambda: Thresholds(stability_batches=8.5),
     "Thresholds.stability_batches must be an integer, got 8.5"),
    # out of its range a threshold keeps its diagnostic from ever firing (or always fires)
    # given both, the protocol judges by its own: the report would record the others
    ("thresholds the protocol contradicts", lambda: diagnose(
        adapted(), X, Y, thresholds=Thresholds(growth=100.0), protocol=Protocol.default()),
     "thresholds= and protocol= disagree: growth=100.0 (its (a) holds 50.0)"),
    ("a stability above 1", lambda: diagnose(adapted(), X, Y,
                                             thresholds=Thresholds(stability=1.5)),
     "Thresholds.stability=1.5 is out of range: it must be in [-1, 1)"),
    ("a negative gradient floor", lambda: Thresholds(grad_floor=-1e-7),
     "Thresholds.grad_floor=-1e-07 is out of range: it must be > 0"),
    ("a growth of 0", lambda: Thresholds(growth=0.0),
     "Thresholds.growth=0.0 is out of range: it must be >= 1"),
    ("a margin past 100 pp", lambda: Thresholds(margin_pp=-150.0),
     "Thresholds.margin_pp=-150.0 is out of range: it must be in (-100, 100]"),
    ("one batch for (c)", lambda: Thresholds(stability_batches=1),
     "Thresholds.stability_batches=1 is out of range: it must be >= 2"),
    ("no ρ directions", lambda: diagnose(adapted(), X, Y, metric_options={"rho_directions": 0}),
     "metric_options['rho_directions'] must be an integer ≥ 1, got int 0"),
    ("negative ρ samples", lambda: diagnose(adapted(), X, Y, metric_options={"rho_samples": -1}),
     "metric_options['rho_samples'] must be an integer ≥ 1, got int -1"),
    ("one nudging step as text", lambda: diagnose(adapted(), X, Y,
                                                  metric_options={"etas": "0.1"}),
     "metric_options['etas'] must be a list of step sizes > 0"),
    ("a seed as text", lambda: diagnose(adapted(), X, Y, metric_options={"seed": "a"}),
     "metric_options['seed'] must be an integer, got str 'a'"),
    ("one null draw", lambda: diagnose(adapted(), X, Y, metric_options={"null_draws": 1}),
     "metric_options['null_draws'] must be an integer ≥ 2"),
    ("initial norms of another network", lambda: diagnose(adapted(), X, Y,
                                                          initial_hidden_norms=[1.0]),
     "initial_hidden_norms holds 1 norms but the model has 2 states h_0 … h_1"),
    ("a contract model's input shape", lambda: diagnose(
        contract_model(), torch.randn(32, 9), Y[:32] % 4),
     "eval_x holds samples of shape (9,) but the model takes (8,)"),
]


def contract_model() -> ResidualMLP:
    from creditaudit.config import RunConfig
    from creditaudit.models import build_model

    config = RunConfig().replace(**{"model.d": 8, "model.n_blocks": 2})
    return build_model(config.model, input_shape=(8,), n_classes=4)


@pytest.mark.parametrize(("call", "fragment"), [case[1:] for case in ADAPT + RULE + DIAGNOSE],
                         ids=[case[0] for case in ADAPT + RULE + DIAGNOSE])
def test_a_bad_argument_is_one_line_naming_it(call, fragment):
    with pytest.raises(CreditAuditError) as error:
        call()
    message = str(error.value)
    assert fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize(("x", "fragment"), [
    (X.double(), "eval_x is float64 but the model's parameters are float32"),
    (torch.randn(32, 9), "eval_x holds samples of shape (9,) but the model takes (8,)"),
    (X[:0], "eval_x holds no samples"),
    (X.tolist(), "eval_x must be a tensor of model inputs (N, …), got list"),
], ids=["float64", "shape", "empty", "list"])
def test_the_recorder_refuses_inputs_the_model_cannot_take(tmp_path, x, fragment):
    with pytest.raises(CreditAuditError) as error:
        recorder(tmp_path, x, Y[:len(x)] if hasattr(x, "__len__") else Y)
    assert fragment in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_a_declaration_the_probe_confirms_is_kept():
    assert adapt(net(norm=True), STATES, example=X, terminal_ln=True).terminal_ln is True
    assert adapt(net(), STATES, example=X, terminal_ln=False, n_classes=10).terminal_ln is False
    with torch.device("meta"):  # no values: nothing to probe, the declaration stands
        planned = adapt(Net(), STATES, input_shape=(8,), terminal_ln=True, n_classes=10)
    assert planned.terminal_ln is True


def test_train_refuses_resume_and_force_together(tmp_path):
    """force deletes the checkpoint resume would continue from: one of them, not both."""
    from creditaudit import RunConfig, train
    from creditaudit.errors import ConfigError

    config = RunConfig().replace(**{"run.out_dir": str(tmp_path), "run.progress": False})
    with pytest.raises(ConfigError, match="resume=True and force=True contradict each other"):
        train(config, resume=True, force=True)
    assert not list(tmp_path.iterdir())


def test_diagnose_takes_the_accuracy_a_loop_computes_and_refuses_no_dict_of_options():
    """A numpy or one-element tensor or array accuracy (np.float32(0.5),
    (pred == y).float().mean(), np.array(0.5)) was refused as "must be an accuracy fraction
    in [0, 1]" though it was one, and the Recorder takes it; metric_options=[…] raised
    TypeError from dict()."""
    import numpy as np

    model = adapted()
    for value in (np.float32(0.5), torch.tensor(0.5), np.array(0.5), np.array([0.5])):
        report = diagnose(model, X, Y, credit=rule("dfa", model), headline_acc=value,
                          frozen_acc=np.float64(0.25))
        assert report.metadata["headline_acc"] == 0.5
        assert type(report.metadata["headline_acc"]) is float
    for value in (float("nan"), torch.tensor([0.5, 0.5]), np.array([0.5, 0.5]), True):
        with pytest.raises(ConfigError, match="must be an accuracy fraction in"):
            diagnose(model, X, Y, headline_acc=value)
    with pytest.raises(ConfigError, match=r"^metric_options= must be a dict of options .* "
                                          r"got list$"):
        diagnose(model, X, Y, credit=rule("dfa", model), metrics=True,
                 metric_options=[("rho_samples", 8)])


def test_an_accuracy_on_the_meta_device_is_refused_in_one_line():
    """A meta tensor holds no value: diagnose(headline_acc=…) (and the Recorder's numbers,
    read alike) raised torch's RuntimeError 'Tensor.item() cannot be called on meta
    tensors'."""
    from creditaudit.scalar_values import recordable_number

    meta = torch.tensor(0.5, device="meta")
    assert recordable_number(meta) is None
    with pytest.raises(ConfigError, match="must be an accuracy fraction in"):
        diagnose(adapted(), X, Y, headline_acc=meta)


@pytest.mark.parametrize("accuracies", [{"headline_acc": 74.1}, {"frozen_acc": 34.9}])
def test_diagnose_refuses_a_percentage_before_the_metrics_run(accuracies):
    """An accuracy given in percent was refused only once the report was assembled, after
    ρ, nudging and the null had run (minutes on a real model); diagnose's docstring
    promises its bad arguments are refused before any real work."""
    model = adapted()
    stages: list[str] = []
    with pytest.raises(CreditAuditError, match="must be an accuracy fraction in"):
        diagnose(model, X, Y, credit=rule("dfa", model), metrics=True, progress=stages.append,
                 metric_options={"rho_samples": 8, "rho_directions": 2, "null_draws": 2,
                                 "etas": [0.01]}, **accuracies)
    assert stages == []


@pytest.mark.parametrize(("key", "value", "said"), [
    ("diagnostics.c.stability", 1.5, "in [-1, 1)"),
    ("diagnostics.c.stability", 1.0, "in [-1, 1)"),
    ("diagnostics.b.grad_floor", -1e-7, "> 0"),
    ("diagnostics.b.grad_floor", 0.0, "> 0"),
    ("diagnostics.a.growth", 0.5, ">= 1"),
    ("diagnostics.d.margin_pp", 101.0, "in (-100, 100]"),
])
def test_a_config_refuses_a_threshold_out_of_its_range_as_python_does(key, value, said):
    """The config accepted stability 1 (max inclusive), a grad_floor of 0, a growth below 1
    and any margin: each keeps its diagnostic from ever firing, or fires it always."""
    from creditaudit.config import RunConfig

    with pytest.raises(CreditAuditError) as err:
        RunConfig().replace(**{key: value})
    message = str(err.value)
    assert message.startswith(f"{key}={value!r} is out of range: it must be {said} (")
    assert "\n" not in message
