"""The Python API: train() returns the run with its model and rule; diagnose() measures a
user's own module (ρ, nudging) through states_fn and forward_from, with one-line errors that
name the argument; the package ships py.typed."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import creditaudit
from creditaudit import RunConfig, adapt, diagnose, train
from creditaudit.config import MethodConfig
from creditaudit.errors import ModelContractError
from creditaudit.methods import build_rule
from creditaudit.models import ResidualMLP
from creditaudit.records import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread")

OPTIONS = {"rho_samples": 64, "rho_directions": 8, "null_draws": 3}


class MyNet(nn.Module):
    """A user's network: not a ResidualNet, forward() returns logits only. It wraps a
    ResidualMLP's layers so its function is known exactly."""

    def __init__(self, inner: ResidualMLP) -> None:
        super().__init__()
        self.inner = inner

    def states(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return self.inner.forward_states(x)

    def run_from(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.inner.forward_from(layer, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.states(x)[1]


def flat(value: object) -> list[float]:
    """The numbers of nested dicts and lists, in key order."""
    if isinstance(value, dict):
        return [n for key in sorted(value) for n in flat(value[key])]
    if isinstance(value, list):
        return [n for item in value for n in flat(item)]
    return [float(value)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    inner = ResidualMLP(12, 16, 4, 3)
    rule = build_rule(inner, MethodConfig(name="dfa"), n_classes=4, seed=0)
    x, y = torch.randn(256, 12), torch.randint(0, 4, (256,))
    return MyNet(inner), rule, x, y


def test_own_module_metrics_equal_the_contract_models(setup):
    """The same network seen as a plain module (bound-method states_fn and forward_from,
    a credit function) gets exactly the metrics of the contract path, in float64."""
    net, rule, x, y = setup
    reference = diagnose(net.inner, x, y, credit=rule, metrics=True, metric_options=OPTIONS)
    own = diagnose(net, x, y, states_fn=net.states, forward_from=net.run_from,
                   credit=lambda xb, yb: rule.credits(xb, yb), metrics=True,
                   metric_options=OPTIONS)
    assert own.metadata["metrics_precision"] == "float64"
    assert own.metadata["method"] == "custom" and own.metadata["model"] == "MyNet"
    for key in ("perturbation_rho", "rho_controls", "nudging", "nudging_controls", "bp_cosine"):
        assert flat(own.metrics[key]) == pytest.approx(flat(reference.metrics[key]), rel=1e-9,
                                                       abs=1e-12), key
    # The fresh-feedback null needs the rule's feedback matrices: a function has none.
    assert "fresh_b_null" in reference.metrics and "fresh_b_null" not in own.metrics


def test_exact_gradient_credit_scores_like_the_bp_control(setup):
    """A credit function returning the exact gradient ∂CE/∂h_l (any batch scale) must nudge
    exactly like the BP control and reach its ρ."""
    net, _, x, y = setup

    def gradient(xb: torch.Tensor, yb: torch.Tensor) -> list[torch.Tensor]:
        with torch.enable_grad():
            states, logits = net.states(xb)
            return list(torch.autograd.grad(F.cross_entropy(logits, yb), states))

    report = diagnose(net, x, y, states_fn=net.states, forward_from=net.run_from,
                      credit=gradient, metrics=True, metric_options=OPTIONS)
    quality = report.metrics
    for eta, deltas in quality["nudging"].items():
        assert deltas == pytest.approx(quality["nudging_controls"]["bp"][eta], rel=1e-4)
        assert all(delta < 0 for delta in deltas)  # a descent direction at every layer
    assert quality["perturbation_rho"] == pytest.approx(quality["rho_controls"]["bp"], abs=1e-6)
    assert quality["bp_cosine"] == pytest.approx([1.0] * 4, abs=1e-5)


def test_closures_run_in_the_models_own_precision(setup):
    net, rule, x, y = setup
    report = diagnose(net, x, y, states_fn=lambda xb: net.inner.forward_states(xb),
                      forward_from=lambda layer, h: net.inner.forward_from(layer, h),
                      credit=lambda xb, yb: rule.credits(xb, yb), metrics=True,
                      metric_options=OPTIONS)
    assert report.metadata["metrics_precision"] == "float32"
    assert all(rho > 0.9 for rho in report.metrics["rho_controls"]["bp"])  # measurable here
    assert all(abs(rho) < 0.3 for rho in report.metrics["rho_controls"]["random"])


def test_own_module_is_left_untouched(setup):
    net, rule, x, y = setup
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    torch.manual_seed(5)
    rng = torch.get_rng_state()
    diagnose(net, x, y, states_fn=net.states, forward_from=net.run_from,
             credit=lambda xb, yb: rule.credits(xb, yb), metrics=True, metric_options=OPTIONS)
    assert net.training and net.inner.training
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key]), key


def _detached(net: MyNet):
    def states_fn(x: torch.Tensor):
        states, logits = net.states(x)
        return [h.detach() for h in states], logits
    return states_fn


def _off_by_one(net: MyNet):
    return lambda layer, h: net.inner.forward_from(layer + 1, h)


@pytest.mark.parametrize(("name", "build", "fragment"), [
    ("detached states", lambda net, rule, x, y: dict(states_fn=_detached(net)),
     "states_fn returned states without a graph (detached): h_0"),
    ("float labels", lambda net, rule, x, y: dict(eval_y=y.float()),
     "eval_y must hold integer class labels, got float32"),
    ("int32 labels", lambda net, rule, x, y: dict(eval_y=y.int()),
     "eval_y is int32, but class labels are int64 (what cross-entropy takes): pass eval_y.long()"),
    ("one-hot labels", lambda net, rule, x, y: dict(eval_y=F.one_hot(y, 4)),
     "eval_y must be (256,) labels"),
    ("labels out of range", lambda net, rule, x, y: dict(eval_y=y + 4),
     "eval_y holds labels 4 … 7 but the model has 4 logits"),
    ("no forward_from", lambda net, rule, x, y: dict(forward_from=None, metrics=True),
     "metrics=True needs forward_from=(layer, h) -> logits: MyNet has no forward_from"),
    ("forward_from off by one", lambda net, rule, x, y: dict(forward_from=_off_by_one(net),
                                                            metrics=True),
     "forward_from(0, h_0) does not reproduce the logits of states_fn"),
    ("forward_from raises", lambda net, rule, x, y: dict(forward_from=lambda layer, h: h[99],
                                                        metrics=True),
     "forward_from(0, h_0) raised IndexError"),
    ("states_fn returns logits only", lambda net, rule, x, y: dict(states_fn=net.forward),
     "states_fn must return ([h_0, …, h_L], logits), got a tensor of shape (2, 4)"),
    ("credit misses a layer", lambda net, rule, x, y: dict(
        credit=lambda xb, yb: rule.credits(xb, yb)[:-1]),
     "credit(x, y) must return 4 tensors"),
    ("credit as summaries", lambda net, rule, x, y: dict(
        credit=lambda xb, yb: [a[:, :3] for a in rule.credits(xb, yb)]),
     "credit(x, y)[0] must have the shape of h_0 (2, 16), got a tensor of shape (2, 3)"),
    ("metrics without credit", lambda net, rule, x, y: dict(credit=None, metrics=True),
     "metrics=True needs credit="),
])
def test_bad_arguments_are_one_line_naming_the_argument(setup, name, build, fragment):
    net, rule, x, y = setup
    kwargs = dict(eval_y=y, states_fn=net.states, forward_from=net.run_from,
                  credit=lambda xb, yb: rule.credits(xb, yb), metric_options=OPTIONS)
    kwargs.update(build(net, rule, x, y))
    eval_y = kwargs.pop("eval_y")
    with pytest.raises(ModelContractError) as error:
        diagnose(net, x, eval_y, **kwargs)
    message = str(error.value)
    assert fragment in message, message
    assert "\n" not in message


# --- train() -----------------------------------------------------------------------------------
def test_train_returns_the_model_and_rule_and_reloads_them_when_finished(tmp_path):
    config = RunConfig().replace(**{
        "method.name": "dfa", "data.n_train": 256, "data.n_test": 128, "data.in_dim": 8,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False, "run.out_dir": str(tmp_path), "run.device": "cpu"})
    result = creditaudit.train(config)  # (the GPU case: tests/test_cuda.py)
    assert result.status == "completed" and result.model is result.rule.model
    saved = load_checkpoint(result.run_dir / CHECKPOINT_FILE)
    for key, value in result.model.state_dict().items():
        assert torch.equal(value, saved["model"][key]), key

    again = train(config)  # finished: not rerun, rebuilt from the checkpoint on first use
    assert again.record.log == result.record.log
    assert again._rule is None
    for key, value in again.model.state_dict().items():
        assert torch.equal(value, result.model.state_dict()[key]), key
    for mine, theirs in zip(again.rule.feedback, result.rule.feedback):
        assert torch.equal(mine, theirs)
    x = torch.randn(5, 8)
    assert torch.equal(again.model.eval()(x), result.model.eval()(x))


def test_the_package_ships_py_typed():
    assert importlib.resources.files("creditaudit").joinpath("py.typed").is_file()
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'creditaudit = ["py.typed"]' in pyproject


class TokenNet(nn.Module):
    """Token ids in, logits out: what adapt() probes with an integer example."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(ids)).mean(dim=1))


def test_float_inputs_for_a_model_of_token_ids_are_one_line(tmp_path):
    # float32 ids passed the dtype check (the parameters are float32) and reached the
    # embedding, which raised inside the diagnostics with a torch traceback
    torch.manual_seed(0)
    ids, labels = torch.randint(0, 16, (16, 6)), torch.randint(0, 4, (16,))
    model = adapt(TokenNet(), ["embed", "block"], example=ids[:8])
    bound = creditaudit.rule("dfa", model)
    fragment = ("eval_x is float32 but the model takes int64 inputs (as adapt() probed it: "
                "token ids or other indices): pass eval_x.to(torch.int64)")
    with pytest.raises(ModelContractError, match=re.escape(fragment)):
        diagnose(model, ids.float(), labels, credit=bound)
    with pytest.raises(ModelContractError, match=re.escape(fragment)):
        creditaudit.Recorder(bound, ids.float(), labels, out=tmp_path, progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("bad_id", [16, -1])
def test_token_ids_outside_the_vocabulary_are_one_line(tmp_path, bad_id):
    # an id past the embedding's 16 rows raised the embedding's bare IndexError inside the
    # Recorder's reference check (a device-side assert on CUDA)
    torch.manual_seed(0)
    ids, labels = torch.randint(0, 16, (16, 6)), torch.randint(0, 4, (16,))
    model = adapt(TokenNet(), ["embed", "block"], example=ids[:8])
    bound = creditaudit.rule("dfa", model)
    bad = ids.clone()
    bad[5, 2] = bad_id
    fragment = (f"eval_x holds token id {bad_id}, but the model's embedding 'embed' has 16 "
                "rows: token ids must be 0 … 15")
    with pytest.raises(ModelContractError, match=re.escape(fragment)):
        diagnose(model, bad, labels, credit=bound)
    with pytest.raises(ModelContractError, match=re.escape(fragment)):
        creditaudit.Recorder(bound, bad, labels, out=tmp_path, progress=False)
    assert not list(tmp_path.iterdir())

