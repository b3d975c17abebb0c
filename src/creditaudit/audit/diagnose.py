"""The protocol on a live model: :func:`diagnose`, for contract models and any ``nn.Module``.

It probes the arguments on two samples (one-line errors naming the argument), verifies
that the model's backward is the gradient of its forward (the reference every number is
measured against; :mod:`creditaudit.measures.reference_check`), computes the state
gradients and the credits in eval mode under a forked RNG, optionally the
credit-quality block (ρ, nudging, the fresh-feedback null), and hands them to
:func:`creditaudit.protocol.evaluate_protocol`. ``creditaudit.diagnose`` is this function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.errors import ConfigError, ModelContractError
from creditaudit.measures.epoch import rule_credits
from creditaudit.measures.gradients import StatesFn, state_gradients
from creditaudit.measures.quality import credit_quality
from creditaudit.measures.reference_check import SKIPPED, checked_reference
from creditaudit.measures.reference_modules import FIX
from creditaudit.measures.user_models import (
    ForwardFrom,
    StatesNet,
    check_credits,
    check_forward_from,
    check_inputs,
    dtype_name,
    probe_states,
)
from creditaudit.methods.base import CreditRule
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet, summary_vectors
from creditaudit.protocol import (
    NO_FROZEN_REASON,
    NOT_EVALUATED,
    CreditFn,
    DiagnosticReport,
    Protocol,
    ReferenceValidity,
    Thresholds,
    evaluate_protocol,
)


class _FunctionCredit:
    """Adapts a credit function ``(x, y) -> [a_0 … a_L]`` to the rule interface."""

    name = "custom"

    def __init__(self, model: nn.Module, fn: CreditFn) -> None:
        self.model, self.fn = model, fn

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        return [a.detach() for a in self.fn(x, y)]


METRIC_OPTIONS = ("rho_samples", "rho_directions", "eps", "null_draws", "null_seed", "etas",
                  "seed", "rho_flops", "memory_gb")


def diagnose(model: nn.Module, eval_x: Tensor, eval_y: Tensor, *,
             credit: CreditRule | CreditFn | None = None, states_fn: StatesFn | None = None,
             forward_from: ForwardFrom | None = None,
             headline_acc: float | None = None, frozen_acc: float | None = None,
             thresholds: Thresholds | None = None, metrics: bool = False,
             metric_options: dict[str, Any] | None = None,
             metadata: dict[str, Any] | None = None,
             progress: Callable[[str], None] | None = None,
             verify_reference: bool = True, protocol: Protocol | None = None,
             allow_unverified_reference: bool = False, reference_fix: str = FIX,
             initial_hidden_norms: Sequence[float] | None = None) -> DiagnosticReport:
    """Run the four-diagnostic protocol on ``model`` over a held-out evaluation set.

    ``eval_x`` ``(N, …)`` model inputs, ``eval_y`` ``(N,)`` integer class labels; use
    N ≥ 1024 (8 batches of 128) for (c). ``states_fn(x) -> ([h_0 … h_L], logits)`` audits
    any module (states ``(B, d)``, ``(B, T, d)`` → CLS token, ``(B, C, H, W)`` → pooled,
    all in the autograd graph); by default ``model.forward_states``. ``credit``: a
    CreditRule or a function ``(x, y) -> [a_0 … a_L]`` (each ``a_l`` shaped like ``h_l``)
    adds per-layer cosines and Γ. ``headline_acc``/``frozen_acc``: test accuracies as
    fractions for (d); ``thresholds`` default to :class:`Thresholds` (). ``protocol``: the
    diagnostics to run and their options (e.g. ``Protocol.from_config(config.diagnostics)``,
    which adds the diagnostics a config lists; default: the built-in four with
    ``thresholds``). ``initial_hidden_norms``: the ``hidden_norms`` of a report on the same
    network at initialisation, on the same evaluation set; with them (a) also judges the
    segment before h_0 (embedding, stem), which no ratio of two states sees.

    ``metrics=True`` adds the credit-quality block (ρ, nudging; the fresh-feedback null for
    rules with fixed random feedback, FA and DFA). It needs a credit and a way to run the
    network on from a state: ``forward_from(layer, h) -> logits`` (blocks ``layer … L−1``
    and the head), by default ``model.forward_from``. ρ and nudging run on a float64 copy
    of the model when it can be copied with its functions (contract models, or
    ``states_fn``/``forward_from`` that are bound methods of ``model``), else on the model
    in its own precision (the report's ``metrics_precision`` says which).
    ``metric_options`` are passed to :func:`diagnostics.quality.credit_quality`;
    ``progress`` (e.g. ``print``) receives one line as each metric stage starts.

    Bad arguments raise a one-line ModelContractError or ConfigError naming the argument,
    from a two-sample probe before any real work; an exception your own ``credit`` or
    ``states_fn`` raises propagates unchanged (your code, with your traceback). Then the
    reference gradient is verified: autograd's ∂CE/∂h_l must be the gradient of the
    forward (float64 central differences on four samples,
    :func:`~creditaudit.measures.reference_check.check_reference`); a model whose
    backward is not (a BioTorch layer, a ``torch.autograd.Function`` with its
    own backward) raises a one-line ReferenceGradientError naming the module.
    ``verify_reference=False`` skips that, and the report says the reference was not
    verified (metadata ``reference_check``, and the reason of (b));
    ``allow_unverified_reference=True`` checks and, instead of raising, reports where it
    failed (``how="failed"``; the verdict is then *unverified*). ``reference_fix``: the way
    out the refusal names (a caller's own option). Leaves every
    parameter, buffer, ``.grad`` field and RNG state (global CPU, and CUDA when the inputs
    are on a GPU) unchanged: runs in eval mode under a forked RNG, takes gradients w.r.t.
    states only, and restores the model's training flag.
    """
    if protocol is not None and not isinstance(protocol, Protocol):
        raise ConfigError(f"protocol= must be a creditaudit.protocol.Protocol (e.g. "
                          f"Protocol.from_config(config.diagnostics)) or None for the built-in "
                          f"four, got {type(protocol).__name__} {protocol!r:.40}")
    if credit is not None and not isinstance(credit, CreditRule) and not callable(credit):
        raise ConfigError(f"credit= must be a CreditRule, a function (x, y) -> [a_0, …, a_L] "
                          f"or None, got {type(credit).__name__} {credit!r:.40}")
    if thresholds is None:
        thresholds = protocol.thresholds() if protocol is not None else Thresholds()
    if states_fn is None:
        if not hasattr(model, "forward_states"):
            raise ModelContractError(
                f"{type(model).__name__} has no forward_states: pass states_fn=lambda x: "
                "([h_0, …, h_L], logits) to diagnose()")
        states_fn = model.forward_states  # type: ignore[assignment]
    check_inputs(model, eval_x, eval_y)
    if isinstance(credit, CreditRule) and credit.model is not model:
        raise ModelContractError(
            f"credit= is a rule bound to another model ({type(credit.model).__name__}), not "
            f"the {type(model).__name__} given: its credits would not be this model's; pass "
            "the rule's own model (credit.model) or a rule bound to this one")
    initial = check_norms("initial_hidden_norms", initial_hidden_norms)
    options = dict(metric_options or {})
    unknown = sorted(set(options) - set(METRIC_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown metric option {unknown[0]!r}; allowed: "
                          f"{', '.join(METRIC_OPTIONS)}")
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
    devices = [eval_x.device] if eval_x.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            states, logits = probe_states(states_fn, eval_x, eval_y)
            if metrics and forward_from is not None:  # (metrics without one was refused)
                check_forward_from(forward_from, states, logits)
            if credit is not None and not isinstance(credit, CreditRule):
                check_credits(credit, eval_x, eval_y, states)
            reference = (checked_reference(model, states_fn, eval_x, eval_y,
                                           forward_from=forward_from,
                                           allow=allow_unverified_reference, fix=reference_fix)
                         if verify_reference else SKIPPED)
            rule, metrics_model = _credit_and_model(model, credit, states_fn, forward_from)
            sg = state_gradients(states_fn, eval_x, eval_y)
            summaries = None
            if isinstance(rule, CreditRule):
                summaries = rule_credits(rule, eval_x, eval_y)
            elif rule is not None:
                summaries = [summary_vectors(a) for a in rule.credits(eval_x, eval_y)]
            quality = None
            precision = None
            if metrics:
                dtype = (torch.float64 if not isinstance(metrics_model, StatesNet)
                         or metrics_model.copyable else None)
                precision = "float64" if dtype is not None else dtype_name(logits.dtype)
                quality = credit_quality(rule, eval_x, eval_y,
                                         grad_floor=thresholds.grad_floor, dtype=dtype,
                                         progress=progress, **options)
    finally:
        model.train(was_training)
    # A contract model declares whether it ends in a LayerNorm, an adapted one as declared
    # or probed; a plain module may not.
    if isinstance(model, ResidualNet):
        terminal_ln: bool | None = bool(model.terminal_ln)
    elif isinstance(model, AdaptedModel):
        terminal_ln = model.terminal_ln
    else:
        terminal_ln = (model.out_ln is not None) if hasattr(model, "out_ln") else None
    # An adapted model is named as it describes itself (the user's class, its package and
    # states), not as the wrapper class "AdaptedModel".
    name = model.describe().label if isinstance(model, AdaptedModel) else type(model).__name__
    meta: dict[str, Any] = {"model": name,
                            "method": getattr(rule, "name", None)}
    if precision is not None:
        meta["metrics_precision"] = precision
    meta.update(metadata or {})
    terminal_ln = meta.pop("terminal_ln", terminal_ln)
    report = evaluate_protocol(sg, headline_acc=headline_acc, frozen_acc=frozen_acc,
                               thresholds=thresholds, terminal_ln=terminal_ln,
                               credits=summaries, metrics=quality, metadata=meta,
                               protocol=protocol, reference=reference.to_dict(),
                               initial_hidden_norms=initial)
    # (b) judges the reference: its reason says it is unchecked
    b = ReferenceValidity.name
    if not reference.verified and any(r.id == b for r in report.diagnostics):
        validity = report.diagnostic(b)
        found = "failed its check: " if reference.how == "failed" else ""
        validity.reason = f"{validity.reason}; reference gradient {found}{reference.detail}"
    return with_frozen_hint(report, DIAGNOSE_FROZEN_HINT)


DIAGNOSE_FROZEN_HINT = "pass frozen_acc=, the frozen-blocks test accuracy as a fraction"


def with_frozen_hint(report: DiagnosticReport, hint: str) -> DiagnosticReport:
    """``report`` with (d)'s "no frozen-blocks accuracy given" saying how to give it on the
    surface that shows the report (``diagnose(frozen_acc=…)``, ``audit --frozen …``);
    a hint an inner surface added is replaced."""
    for result in report.diagnostics:
        if result.status == NOT_EVALUATED and result.reason.startswith(NO_FROZEN_REASON):
            result.reason = f"{NO_FROZEN_REASON} ({hint})"
    return report


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


def _credit_and_model(model: nn.Module, credit: CreditRule | CreditFn | None,
                      states_fn: StatesFn, forward_from: ForwardFrom | None
                      ) -> tuple[Any, nn.Module]:
    """(the credit as a rule, the module the metrics run): the model itself when it is a
    contract model run through its own methods, else the model behind a StatesNet."""
    if isinstance(credit, CreditRule):
        return credit, credit.model
    own = (states_fn == getattr(model, "forward_states", None)
           and forward_from == getattr(model, "forward_from", None))
    work: nn.Module = model
    if not own and forward_from is not None:
        work = StatesNet(model, states_fn, forward_from)
    return (_FunctionCredit(work, credit) if credit is not None else None), work


__all__ = ["diagnose", "METRIC_OPTIONS"]
