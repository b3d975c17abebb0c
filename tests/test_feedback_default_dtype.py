"""A rule's own random tensors do not depend on the caller's default dtype: feedback
matrices, their fresh draws for the null, auxiliary nets and the random-credit control are
drawn in the dtype of the parameters they pair with (float32, or float64 for a float64
model), so ``rule("fa", model)`` of a float32 model made under
``torch.set_default_dtype(torch.float64)`` trains and is audited with the feedback the
same seed gives otherwise (it drew float64 numbers: another run under the same seed)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from creditaudit import diagnose, rule
from creditaudit.models import ResidualMLP

pytestmark = pytest.mark.usefixtures("single_thread")

RULES = ["fa", "dfa", "drtp", "fa-linear", "frsf", "brsf", "kp", "credit-bridge",
         "state-bridge", "local-ce"]


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def model(dtype: torch.dtype = torch.float32) -> ResidualMLP:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ResidualMLP(8, 16, 4, 2).to(dtype)


def tensors(value: object) -> list[torch.Tensor]:
    """The tensors of nested dicts, lists and tuples, in key order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in tensors(value[key])]
    if isinstance(value, list | tuple):
        return [t for item in value for t in tensors(item)]
    return []


def same(first: object, second: object) -> bool:
    a, b = tensors(first), tensors(second)
    return len(a) == len(b) and all(u.dtype == v.dtype and torch.equal(u, v)
                                    for u, v in zip(a, b, strict=True))


def drawn(name: str, net: ResidualMLP) -> tuple[object, object]:
    """The rule's state (feedback, auxiliary nets) and, for fixed random feedback, a fresh
    draw as the null makes one."""
    credit = rule(name, net, seed=3)
    fresh = (credit.draw_feedback(torch.Generator().manual_seed(5))
             if credit.feedback_kind == "fixed_random" else None)
    return credit.state_dict(), fresh


@pytest.mark.parametrize("name", RULES)
def test_a_float32_models_rule_draws_the_same_under_a_float64_default(name):
    net = model()
    plain = drawn(name, net)
    with default_dtype(torch.float64):
        caller = drawn(name, net)
    assert tensors(plain[0]), name
    assert same(plain, caller), name


@pytest.mark.parametrize("name", ["fa", "fa-linear", "credit-bridge"])
def test_a_float64_models_rule_draws_in_float64_whatever_the_default(name):
    """A float64 model's feedback is float64 (a float64 run's, as before), the same numbers
    under either default dtype."""
    with default_dtype(torch.float64):
        caller = drawn(name, model(torch.float64))
    plain = drawn(name, model(torch.float64))
    floats = [t for t in tensors(plain) if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float64 for t in floats)
    assert same(plain, caller)


def test_diagnoses_nulls_and_random_control_ignore_the_callers_default_dtype():
    """The fresh-feedback null and the random-credit control of a float32 model's audit
    are the numbers a float32 default gives."""
    net = model()
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, 8, generator=generator), torch.randint(0, 4, (128,),
                                                                 generator=generator)
    options = {"rho_samples": 32, "rho_directions": 4, "null_draws": 3}

    def audit() -> dict:
        report = diagnose(net, x, y, credit=rule("fa", net, seed=3), metrics=True,
                          metric_options=options)
        return {key: report.metrics[key] for key in ("fresh_b_null", "cosine_controls")}

    plain = audit()
    with default_dtype(torch.float64):
        caller = audit()
    assert caller == plain
