"""The measures do not depend on the caller's torch settings, nor on how their random draws
are made: ``credit_quality``, an epoch's measures and a ``Recorder`` in the caller's loop
record the same numbers under its ``torch.no_grad()``, inference mode, autocast, default
dtype or default device, draw nothing from its random stream, and leave every setting as
it was; a sample's directions of ρ do not depend on how many samples one draw takes, and a
float32 network's block (random controls included) is its float64 twin's.
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

import creditaudit
from creditaudit.errors import ConfigError
from creditaudit.measures import perturbation
from creditaudit.measures.directions import unit_directions
from creditaudit.measures.epoch import epoch_diagnostics
from creditaudit.measures.perturbation import rho_table
from creditaudit.measures.quality import credit_quality
from creditaudit.methods import DFA, BackpropRule, bp_state_gradients
from creditaudit.models.contract import measurement_mode
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
