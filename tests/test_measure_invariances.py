"""Every recorded measure is invariant, up to rounding, to what is not part of its definition.

Property tests on tiny float64 networks: the per-layer cosines, Γ, the cosine table, ρ with
its error and controls, nudging with its controls, the fresh-feedback null and the epoch's
measures do not change with the chunk sizes and memory cap (chunks that do not divide N
included), a uniform rescaling of the credit (batch-mean or per-sample, ×1e-8, ×1e8), the
evaluation samples beyond those a measure uses, the model's dtype (a float32 model measured
in its float64 working copy), the order of the samples a per-sample credit is called on,
and the caller's torch settings (default dtype and device, grad and inference mode, global
random stream) — which every measure leaves as they were. BP's own credit scores the
positive controls through every public entry point.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn import functional as F

import creditaudit
from creditaudit.errors import ConfigError
from creditaudit.measures import perturbation, quality
from creditaudit.measures.directions import unit_directions
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.measures.perturbation import rho_table
from creditaudit.measures.quality import credit_quality
from creditaudit.measures.working import measure_footprint
from creditaudit.methods import DFA, BackpropRule, bp_state_gradients
from creditaudit.models.contract import measurement_mode
from creditaudit.registry import RULES
from creditaudit.testing import make_rule, tiny_batch

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
OPTIONS = {"rho_samples": 27, "rho_directions": 3, "null_draws": 3, "rho_flops": None}
FEW = settings(max_examples=8, deadline=None)


def _samples(arch: str = "resmlp", dtype: torch.dtype = F64) -> tuple[Tensor, Tensor]:
    """27 samples (three tiny batches): chunks of 2, 4, 8 … never divide them."""
    parts = [tiny_batch(seed=seed, arch=arch, dtype=dtype) for seed in (1, 2, 3)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


class NoisyGradient:
    """A credit whose samples are independent: each sample's BP gradient plus a fixed
    function of its input (so ρ and the cosines lie well inside (0, 1), where a mixed scale
    or a misplaced sample shows), times ``scale``; divided by the batch size when
    ``batch_mean`` (the convention of ∂ mean CE/∂h)."""

    name = "noisy-gradient"

    def __init__(self, model: nn.Module, *, batch_mean: bool = True, scale: float = 1.0
                 ) -> None:
        self.model, self.batch_mean, self.scale = model, batch_mean, scale

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        grads = bp_state_gradients(self.model, x, y)  # ∂ mean CE/∂h: per-sample / B
        b = x.shape[0]
        out = []
        for layer, g in enumerate(grads):
            per_sample = g.flatten(1) * b
            inputs = x.flatten(1).to(g.dtype)
            mix = torch.sin(inputs @ torch.ones(inputs.shape[1], per_sample.shape[1],
                                                dtype=g.dtype) * (layer + 1)
                            + torch.arange(per_sample.shape[1], dtype=g.dtype))
            a = (per_sample + 0.05 * mix).view_as(g) * self.scale
            out.append(a / b if self.batch_mean else a)
        return out


def _gap(a: Any, b: Any, tol: float = 1e-9, path: str = "") -> list[str]:
    """Where nested dicts/lists of floats differ by more than ``tol`` (absolute and
    relative; float64 rounding by default), NaN equal to NaN."""
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [gap for key in a for gap in _gap(a[key], b[key], tol, f"{path}.{key}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length"]
        return [gap for i, (u, v) in enumerate(zip(a, b))
                for gap in _gap(u, v, tol, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        same = (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol + tol * abs(a)
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.fixture(scope="module")
def dfa() -> tuple[Any, Tensor, Tensor, dict[str, Any]]:
    """A DFA rule on the tiny float64 ResidualMLP, its 27 samples and its block."""
    rule = make_rule(DFA)
    x, y = _samples()
    return rule, x, y, credit_quality(rule, x, y, **OPTIONS)


def _per_sample_bytes(model: nn.Module, x: Tensor, y: Tensor) -> int:
    footprint = measure_footprint(model.forward_states, x, y)
    return 2 * footprint.graph_bytes + 3 * footprint.state_bytes


# --- the caller's torch settings ----------------------------------------------------------
@contextlib.contextmanager
def _setting(write: Callable[[Any], Any], value: Any, default: Any) -> Iterator[None]:
    write(value)
    try:
        yield
    finally:
        write(default)


CALLER = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "default_dtype_float64": lambda: _setting(torch.set_default_dtype, F64, torch.float32),
    # what torch.set_default_device("cuda") does to a CPU generator's draw, on any machine
    "default_device_meta": lambda: _setting(torch.set_default_device, "meta", None),
}


def _settings_now() -> tuple[Any, ...]:
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.get_default_dtype(), torch.get_default_device(),
            torch.is_autocast_enabled("cpu"))


@pytest.mark.parametrize("name", list(CALLER))
def test_the_block_is_the_same_whatever_the_caller_set(dfa, name):
    """credit_quality under the caller's no_grad, inference mode, autocast, default dtype or
    default device gives the block it gives without, and leaves them as they were. Before:
    inference mode failed in torch's RuntimeError ("Inference tensors cannot be saved for
    backward"), a default device in a draw from a CPU generator."""
    rule, x, y, plain = dfa
    with CALLER[name]():
        inside = _settings_now()
        block = credit_quality(rule, x, y, **OPTIONS)
        assert _settings_now() == inside
    assert not _gap(plain, block)


@pytest.mark.parametrize("name", list(CALLER))
def test_an_epochs_measures_are_the_same_whatever_the_caller_set(dfa, name):
    rule, x, y, _ = dfa
    with measurement_mode(rule.model):
        plain = epoch_diagnostics(rule, x, y)[0]
    with CALLER[name](), measurement_mode(rule.model):
        inside = epoch_diagnostics(rule, x, y)[0]
    assert not _gap(plain.__dict__, inside.__dict__)


def test_the_block_draws_nothing_from_the_callers_random_stream(dfa):
    rule, x, y, plain = dfa
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    block = credit_quality(rule, x, y, **OPTIONS)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(12)  # another state of the caller's stream: the same block
    assert not _gap(plain, credit_quality(rule, x, y, **OPTIONS))
    assert not _gap(plain, block)


# --- a Recorder in the caller's loop ------------------------------------------------------
@pytest.mark.parametrize("name", ["inference_mode", "default_device_meta"])
def test_a_recorder_records_the_same_run_whatever_the_loop_set(tmp_path, name):
    """rec.epoch() and rec.finish() inside the loop's evaluation block (inference mode) or
    under its default device: before, torch's RuntimeError (inference tensors cannot be
    saved for backward) or a CPU generator's draw on the default device."""
    x, y = _samples()

    def recorded(folder: str, context: Callable[[], Any]) -> Any:
        rule = make_rule(DFA)
        rec = creditaudit.Recorder(rule, x, y, out=str(tmp_path), name=folder, data="mine",
                                   config={"diagnostics.rho_samples": 20,
                                           "diagnostics.rho_directions": 3,
                                           "diagnostics.null_draws": 3},
                                   progress=False)
        with context():
            rec.epoch(0)
            rec.epoch(1, test_acc=0.5)
            return rec.finish()

    plain, inside = recorded("plain", contextlib.nullcontext), recorded(name, CALLER[name])
    assert not _gap(plain.log[-1].measures.__dict__, inside.log[-1].measures.__dict__)
    for key in ("perturbation_rho", "nudging", "fresh_b_null", "cosine_controls"):
        assert not _gap(getattr(plain.diagnostics, key), getattr(inside.diagnostics, key)), key


@pytest.mark.parametrize("made_inside", ["eval_x", "eval_y"])
def test_a_recorder_refuses_evaluation_tensors_made_in_inference_mode(tmp_path, made_inside):
    """They failed at the first epoch, in torch's RuntimeError from the first backward."""
    x, y = _samples()
    with torch.inference_mode():
        inside = (x if made_inside == "eval_x" else y).clone()
    given = {"eval_x": x, "eval_y": y, made_inside: inside}
    with pytest.raises(ConfigError, match=rf"^{made_inside} was made inside "
                                                      r"torch.inference_mode\(\).*\.clone\(\)"):
        creditaudit.Recorder(make_rule(DFA), given["eval_x"], given["eval_y"],
                             out=str(tmp_path), name="r", data="mine", progress=False)


# --- random draws: how many samples one takes, in what dtype ----------------------------
@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 9), width=st.integers(1, 12),
       sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_a_samples_directions_do_not_depend_on_the_draw_it_is_in(m, width, sizes):
    """Drawn alone or with others, in any slices: sample i gets the same directions (torch
    draws normals in blocks of 16, and m·width need not be a multiple of it)."""
    def draw(generator: torch.Generator, b: int) -> Tensor:
        return unit_directions(b, m, (width,), generator=generator, dtype=F64,
                               device=torch.device("cpu"))

    whole = draw(torch.Generator().manual_seed(3), sum(sizes))
    generator = torch.Generator().manual_seed(3)
    sliced = torch.cat([draw(generator, b) for b in sizes])
    assert torch.equal(whole, sliced)


@FEW
@given(directions=st.integers(1, 7), max_elements=st.sampled_from([1, 24, 100, 1 << 19]))
def test_rho_does_not_depend_on_how_many_samples_one_draw_takes(directions, max_elements):
    """ρ's block of samples per draw (MAX_ELEMENTS) bounds memory only: with M·d not a
    multiple of 16 (M odd, d = 8) it drew other directions, and ρ moved by up to 0.34."""
    rule, x, y, _ = (make_rule(BackpropRule), *_samples(), None)
    credit = NoisyGradient(rule.model).credits(x, y)

    def table(elements: int) -> dict[str, Any]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(perturbation, "MAX_ELEMENTS", elements)
            out = rho_table(rule.model, x, y, credit, n_directions=directions, n_samples=16,
                            seed=4)
        return {key: out[key] for key in ("rho", "se", "bp", "random")}

    assert not _gap(table(1 << 23), table(max_elements))


def test_a_float32_model_measures_as_its_float64_twin():
    """The block of a float32 network, measured in its float64 working copy, is its float64
    twin's up to float32 rounding — the random controls included (they were drawn in the
    credit's dtype: another draw, 0.17 apart in cosine, for the same network)."""
    rule64 = make_rule(BackpropRule)
    rule32 = make_rule(BackpropRule, dtype=torch.float32)
    x, y = _samples()
    twin = credit_quality(rule64, x, y, **OPTIONS)
    single = credit_quality(rule32, x.float(), y, **OPTIONS)
    for key in ("bp_cosine", "gamma", "perturbation_rho", "rho_se", "rho_controls",
                "nudging", "nudging_controls", "cosine_controls"):
        assert not _gap(twin[key], single[key], tol=1e-5), key


def test_the_twin_models_of_the_dtype_test_are_one_network():
    """The float32 and float64 tiny models are the same weights (the dtype test compares
    one network measured two ways, not two networks)."""
    a, b = make_rule(BackpropRule).model, make_rule(BackpropRule, dtype=torch.float32).model
    for p, q in zip(a.parameters(), copy.deepcopy(b).double().parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


# --- chunks and memory cap ----------------------------------------------------------------
@FEW
@given(samples_per_chunk=st.integers(1, 30), cosine_chunk=st.sampled_from([1, 2, 4, 8, 512]))
def test_no_chunking_changes_a_value_of_the_block(dfa, samples_per_chunk, cosine_chunk):
    """The memory cap (chunks of the float64 pass, perturbed rows) and the cosines' chunk,
    dividing the 27 samples or not, change no value of the block beyond rounding."""
    rule, x, y, whole = dfa
    memory_gb = samples_per_chunk * _per_sample_bytes(rule.model, x, y) / 1e9
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quality, "COSINE_CHUNK", cosine_chunk)
        chunked = credit_quality(rule, x, y, memory_gb=memory_gb, **OPTIONS)
    assert not _gap(whole, chunked)


# --- the credit's scale -------------------------------------------------------------------
@FEW
@given(scale=st.sampled_from([1e-8, 1.0, 1e8]), batch_mean=st.booleans(),
       samples_per_chunk=st.sampled_from([3, 5, 100]))
def test_a_uniform_rescaling_of_the_credit_changes_no_value(scale, batch_mean,
                                                            samples_per_chunk):
    """Batch-mean or per-sample, ×1e-8 or ×1e8, in chunks that do not divide N: the
    cosines, Γ, the table, ρ with its error and nudging are those of the credit itself."""
    model = make_rule(BackpropRule).model
    x, y = _samples()
    memory_gb = samples_per_chunk * _per_sample_bytes(model, x, y) / 1e9
    base = credit_quality(NoisyGradient(model), x, y, **OPTIONS)
    scaled = credit_quality(NoisyGradient(model, batch_mean=batch_mean, scale=scale), x, y,
                            memory_gb=memory_gb, **OPTIONS)
    assert not _gap(base, scaled)
    assert min(base["perturbation_rho"]) > 0.2 and max(base["perturbation_rho"]) < 0.999


# --- the samples a measure uses -----------------------------------------------------------
@FEW
@given(n=st.integers(8, 27))
def test_rho_on_fewer_samples_than_given_is_rho_on_those_samples(n):
    model = make_rule(BackpropRule).model
    x, y = _samples()
    credit = NoisyGradient(model)
    fewer = credit_quality(credit, x, y, **{**OPTIONS, "rho_samples": n})
    alone = credit_quality(credit, x[:n], y[:n], **{**OPTIONS, "rho_samples": n})
    for key in ("perturbation_rho", "rho_se", "rho_controls", "rho_samples"):
        assert not _gap(fewer[key], alone[key]), key


@pytest.mark.parametrize("name", [n for n in RULES.names() if n != "local-ce"])
def test_a_built_in_rules_credits_follow_their_samples(name):
    """Every built-in rule's credit of a sample depends on that sample alone, up to the
    batch's one scale: reordered, or in a batch padded with repeats (what the credit
    passes do to keep one scale), a sample gets the same direction and every sample the
    same factor. (local-ce gives no credit to the states: all zero.)"""
    rule = make_rule(RULES.find(name))
    rule.model.eval()
    x, y = _samples()
    order = torch.randperm(27, generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.arange(27), torch.arange(10)])
    plain = rule.credits(x, y)
    for index, kept in ((order, 27), (padded, 27)):
        other = rule.credits(x[index], y[index])
        for a, b in zip(plain, other):
            a, b = a[index[:kept]].flatten(1), b[:kept].flatten(1)
            ratio = torch.linalg.vector_norm(b, dim=1) / torch.linalg.vector_norm(a, dim=1)
            torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))
            torch.testing.assert_close(b, a * ratio[:1], rtol=1e-9, atol=1e-15)


# --- BP's own credit: the positive controls through every entry point ----------------------
def _positive(block: dict[str, Any]) -> None:
    """BP's credit scores its own positive controls: cos 1, ρ = its control, nudging = its
    control."""
    assert block["bp_cosine"] == pytest.approx([1.0] * len(block["bp_cosine"]), abs=1e-12)
    assert block["perturbation_rho"] == pytest.approx(block["rho_controls"]["bp"], abs=1e-9)
    for eta, values in block["nudging"].items():
        assert values == pytest.approx(block["nudging_controls"]["bp"][eta], rel=1e-7,
                                       abs=1e-12)


@pytest.mark.parametrize("samples_per_chunk", [2, 5, 1000])
def test_bps_credit_scores_its_controls_in_credit_quality(samples_per_chunk):
    rule = make_rule(BackpropRule)
    x, y = _samples()
    memory_gb = samples_per_chunk * _per_sample_bytes(rule.model, x, y) / 1e9
    _positive(credit_quality(rule, x, y, memory_gb=memory_gb, **OPTIONS))


class _Net(nn.Module):
    """A user's residual network with its own states and forward-from."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 4)

    def states(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        h = self.inp(x)
        hs = [h]
        for block in self.blocks:
            h = h + torch.tanh(block(h))
            hs.append(h)
        return hs, self.head(h)

    def forward_from(self, layer: int, h: Tensor) -> Tensor:
        for block in self.blocks[layer:]:
            h = h + torch.tanh(block(h))
        return self.head(h)

    def forward(self, x: Tensor) -> Tensor:
        return self.states(x)[1]


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_bps_credit_scores_its_controls_in_diagnose_of_a_users_module(dtype):
    """A user's module and a credit function returning ∂ mean CE/∂h (batch-mean), on 37
    samples in chunks that do not divide them."""
    torch.manual_seed(0)
    net = _Net().to(dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(37, 6, generator=generator, dtype=dtype)
    y = torch.randint(0, 4, (37,), generator=generator)

    def credit(xb: Tensor, yb: Tensor) -> list[Tensor]:
        with torch.enable_grad():
            hs, logits = net.states(xb)
            return list(torch.autograd.grad(F.cross_entropy(logits, yb), hs))

    per_sample = _per_sample_bytes(creditaudit.measures.reference_check.StatesNet(
        net, net.states, net.forward_from), x, y)
    report = creditaudit.diagnose(net, x, y, credit=credit, states_fn=net.states,
                                  forward_from=net.forward_from, metrics=True,
                                  metric_options={**OPTIONS, "rho_samples": 37,
                                                  "memory_gb": 5 * per_sample / 1e9})
    assert report.metadata["metrics_precision"] == "float64"
    _positive(report.metrics)


def test_bps_credit_scores_its_controls_at_the_end_of_a_run(tmp_path):
    """The end-of-run block of `train` on 600 evaluation samples (chunks of 512 and 88)."""
    config = creditaudit.RunConfig().replace(**{
        "data.n_train": 128, "data.n_test": 600, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "method.name": "bp", "diagnostics.eval_samples": 600, "diagnostics.rho_samples": 600,
        "diagnostics.rho_directions": 3, "diagnostics.null_draws": 2, "run.progress": False,
        "run.out_dir": str(tmp_path)})
    record = creditaudit.train(config).record
    block = record.diagnostics
    _positive({"bp_cosine": block.bp_cosine, "perturbation_rho": block.perturbation_rho,
               "rho_controls": block.rho_controls, "nudging": block.nudging,
               "nudging_controls": block.nudging_controls})
    assert record.log[-1].measures.cos_per_layer == pytest.approx([1.0] * 3, abs=1e-12)
