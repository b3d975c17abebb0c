"""The first step of :func:`~creditaudit.audit.diagnose.diagnose`: its arguments checked, and
the defaults they leave filled in.

Each check raises a one-line :class:`~creditaudit.errors.ConfigError` or
:class:`~creditaudit.errors.ModelContractError` naming the argument, before the model runs
(what the model returns is probed in the next step, on two samples).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.measures.gradients import StatesFn
from creditaudit.measures.user_models import ForwardFrom, check_inputs, check_same_device
from creditaudit.methods.base import CreditRule
from creditaudit.protocol import CreditFn, Protocol, Thresholds
from creditaudit.protocol.evaluate import check_fraction

METRIC_OPTIONS = ("rho_samples", "rho_directions", "eps", "null_draws", "null_seed", "etas",
                  "seed", "rho_flops", "memory_gb")


@dataclass(frozen=True)
class Arguments:
    """What ``diagnose`` runs with once its arguments are checked: the ``states_fn`` and
    ``forward_from`` (the model's own methods unless given; ``forward_from`` None where the
    model has none and no metrics were asked for), the ``thresholds`` (the protocol's —
    refused where ``thresholds=`` sets one apart —, else those given, else the defaults),
    the ``initial`` hidden norms as floats, and the ``metric_options``."""

    states_fn: StatesFn
    forward_from: ForwardFrom | None
    thresholds: Thresholds
    initial: list[float] | None
    metric_options: dict[str, Any]


def checked_arguments(model: nn.Module, eval_x: Tensor, eval_y: Tensor, *,
                      credit: CreditRule | CreditFn | None, states_fn: StatesFn | None,
                      forward_from: ForwardFrom | None, thresholds: Thresholds | None,
                      protocol: Protocol | None, metrics: bool,
                      metric_options: dict[str, Any] | None,
                      initial_hidden_norms: Sequence[float] | None,
                      headline_acc: float | None = None,
                      frozen_acc: float | None = None,
                      metadata: Mapping[str, Any] | None = None) -> Arguments:
    """``diagnose``'s arguments (as it documents them) checked, with their defaults."""
    # the accuracies before the metrics' minutes, not when the report is assembled
    check_fraction("headline_acc", headline_acc)
    check_fraction("frozen_acc", frozen_acc)
    check_metadata(metadata)
    if protocol is not None and not isinstance(protocol, Protocol):
        raise ConfigError(f"protocol= must be a creditaudit.protocol.Protocol (e.g. "
                          f"Protocol.from_config(config.diagnostics)) or None for the built-in "
                          f"four, got {type(protocol).__name__} {protocol!r:.40}")
    if credit is not None and not isinstance(credit, CreditRule) and not callable(credit):
        raise ConfigError(f"credit= must be a CreditRule, a function (x, y) -> [a_0, …, a_L] "
                          f"or None, got {type(credit).__name__} {credit!r:.40}")
    if thresholds is not None and not isinstance(thresholds, Thresholds):
        raise ConfigError(f"thresholds= must be a creditaudit.protocol.Thresholds (e.g. "
                          f"Thresholds(growth=100.0)) or None for the defaults, got "
                          f"{type(thresholds).__name__} {thresholds!r:.40}")
    if protocol is not None:
        thresholds = protocol.agreeing(thresholds)
    elif thresholds is None:
        thresholds = Thresholds()
    if states_fn is None:
        if not hasattr(model, "forward_states"):
            raise ModelContractError(
                f"{type(model).__name__} has no forward_states: pass states_fn=lambda x: "
                "([h_0, …, h_L], logits) to diagnose()")
        states_fn = model.forward_states  # type: ignore[assignment]
    check_gradients_possible()
    check_inputs(model, eval_x, eval_y)
    check_same_device(model, eval_x, eval_y)
    if isinstance(credit, CreditRule) and credit.model is not model:
        raise ModelContractError(
            f"credit= is a rule bound to another model ({type(credit.model).__name__}), not "
            f"the {type(model).__name__} given: its credits would not be this model's; pass "
            "the rule's own model (credit.model) or a rule bound to this one")
    initial = check_norms("initial_hidden_norms", initial_hidden_norms)
    if metric_options is not None and not isinstance(metric_options, Mapping):
        raise ConfigError(f"metric_options= must be a dict of options (e.g. "
                          f"{{'rho_samples': 64}}) or None, got {type(metric_options).__name__}")
    options = dict(metric_options or {})
    unknown = sorted(set(options) - set(METRIC_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown metric option {unknown[0]!r}; allowed: "
                          f"{', '.join(METRIC_OPTIONS)}")
    if _listable(options.get("etas")):
        options["etas"] = list(options["etas"])  # an iterator is read once: by the check
    for name, value in options.items():
        check_metric_option(name, value)
    if forward_from is None:
        forward_from = getattr(model, "forward_from", None)
    if metrics and credit is None:
        raise ModelContractError(
            "metrics=True needs credit= (a CreditRule or a function (x, y) -> [a_0, …, a_L]) "
            "to measure; pass metrics=False to run the four diagnostics only")
    if metrics and forward_from is None:
        raise ModelContractError(
            f"metrics=True needs forward_from=(layer, h) -> logits: {type(model).__name__} has "
            "no forward_from, and ρ and nudging run the network on from a moved state; pass "
            "metrics=False to run the four diagnostics only")
    return Arguments(states_fn, forward_from, thresholds, initial, options)


# What each metric option must be: (whether its value is one, what it must be).
_COUNT = "an integer ≥ {}"
_OPTION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "rho_samples": (lambda v: _integer(v) and v >= 1, _COUNT.format(1)),
    "rho_directions": (lambda v: _integer(v) and v >= 1, _COUNT.format(1)),
    "null_draws": (lambda v: _integer(v) and v >= 2, _COUNT.format(2)),
    "null_seed": (lambda v: _integer(v), "an integer"),
    "seed": (lambda v: _integer(v), "an integer"),
    "eps": (lambda v: _number(v) and v > 0, "a finite number > 0"),
    "etas": (lambda v: _listable(v) and all(_number(eta) and eta > 0 for eta in v),
             "a list of step sizes > 0, e.g. [0.01, 0.1]"),
    "rho_flops": (lambda v: v is None or (_number(v) and v >= 0),
                  "a number of floating-point operations ≥ 0, or None for no budget"),
    "memory_gb": (lambda v: _number(v) and v > 0, "a finite number of GB > 0"),
}


def _listable(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def check_metric_option(name: str, value: Any) -> None:
    """A one-line ConfigError naming metric option ``name`` unless ``value`` is what it must
    be (before the metrics run, which would fail on it deep inside, or after minutes)."""
    valid, want = _OPTION_RULES[name]
    if not valid(value):
        raise ConfigError(f"metric_options[{name!r}] must be {want}, got "
                          f"{type(value).__name__} {value!r:.40}")


# Metadata the report states of what it measured: a caller's value would contradict it
# (metadata={"frozen_acc": 0.3} showed a frozen accuracy that (d) was never given).
MEASURED_METADATA = {"headline_acc": "pass headline_acc=", "frozen_acc": "pass frozen_acc=",
                     "thresholds": "pass thresholds=", "protocol": "pass protocol="}
MEASURED_METADATA.update({key: "the report measures it" for key in (
    "n_samples", "layout", "headline_gamma_aggregation", "reference_check",
    "metrics_precision")})


def check_metadata(metadata: Mapping[str, Any] | None) -> None:
    """A one-line ConfigError unless ``metadata`` is a dict of plain JSON values (what a
    report's JSON holds) naming none of what the report measures itself, with
    ``terminal_ln`` (when given) True, False or None."""
    if metadata is None:
        return
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise ConfigError(f"metadata= must be a dict of names to plain values (e.g. "
                          f"{{'arch': 'MyNet d=128'}}) or None, got {metadata!r:.60}")
    for key, value in metadata.items():
        if key in MEASURED_METADATA:
            raise ConfigError(f"metadata[{key!r}] is what the report states itself "
                              f"({MEASURED_METADATA[key]}): leave it out of metadata=")
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ConfigError(f"metadata[{key!r}] must be a plain JSON value (a str, number, "
                              f"bool, None, list or dict of them: the report's JSON holds "
                              f"it; e.g. float(value)), got {type(value).__name__} "
                              f"{value!r:.40}") from None
    terminal_ln = metadata.get("terminal_ln")
    if terminal_ln is not None and not isinstance(terminal_ln, bool):
        raise ConfigError(f"metadata['terminal_ln'] must be True, False or None (whether the "
                          f"model ends in a LayerNorm), got {metadata['terminal_ln']!r:.40}")


def check_gradients_possible() -> None:
    """A one-line ConfigError unless autograd can take gradients here: not inside
    ``torch.inference_mode()`` (a states_fn's states would come back without a graph).
    Evaluation tensors made inside it are refused by
    :func:`~creditaudit.measures.user_models.check_inputs`."""
    if torch.is_inference_mode_enabled():
        raise ConfigError("diagnose() takes gradients of the loss, which torch.inference_mode() "
                          "turns off: call it outside inference mode (torch.no_grad() around "
                          "it is fine)")


def check_norms(name: str, norms: Sequence[float] | None) -> list[float] | None:
    """``norms`` as a list of floats; a one-line ConfigError naming ``name`` unless it is a
    non-empty sequence of numbers ≥ 0 (NaN/Inf allowed: a diverged network's norms)."""
    if norms is None:
        return None
    if isinstance(norms, str | bytes) or not isinstance(norms, Sequence) or not norms or not all(
            isinstance(v, int | float) and not isinstance(v, bool)
            and (math.isnan(v) or v >= 0) for v in norms):
        raise ConfigError(f"{name} must be a list of median state norms (numbers ≥ 0, "
                          f"h_0 first), e.g. diagnose(initial_model, …).hidden_norms; got "
                          f"{norms!r:.80}")
    return [float(v) for v in norms]
