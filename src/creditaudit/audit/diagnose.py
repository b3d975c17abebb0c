"""The protocol on a live model: :func:`diagnose`, for contract models and any ``nn.Module``.

``diagnose`` reads top to bottom as its steps, each a function below it:

1. **arguments** — checked, with their defaults (:mod:`creditaudit.audit.arguments`);
2. **probe** — what ``states_fn``, ``forward_from`` and a credit function return, on two
   samples (one-line errors naming the argument);
3. **reference check** — that the model's backward is the gradient of its forward, the
   reference every number is measured against, on the float64 working copy of the model
   (:mod:`creditaudit.measures.reference_check`);
4. **gradients and credit** — the state gradients, and the credit as a rule with the module
   the metrics run;
5. **metrics** — optionally the credit-quality block (ρ, nudging, the fresh-feedback null);
6. **report** — the protocol evaluated on them (:func:`creditaudit.protocol.evaluate_protocol`).

Steps 2–5 run in eval mode under a forked RNG, step 6 under one too (a plugin diagnostic
may draw from it). ``creditaudit.diagnose`` is this function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from creditaudit.audit.arguments import METRIC_OPTIONS, Arguments, checked_arguments
from creditaudit.errors import ConfigError
from creditaudit.guests.settings import settings_kept
from creditaudit.measures.epoch import rule_credits
from creditaudit.measures.gradients import StateGradients, StatesFn, state_gradients
from creditaudit.measures.model_copies import StatesNet
from creditaudit.measures.quality import credit_quality
from creditaudit.measures.reference_check import SKIPPED, ReferenceCheck, checked_reference
from creditaudit.measures.reference_modules import FIX
from creditaudit.measures.user_models import (
    ForwardFrom,
    check_credit_output,
    check_credits,
    check_forward_from,
    dtype_name,
    probe_states,
)
from creditaudit.methods.base import CreditRule
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet, measurement_mode, summary_vectors
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
from creditaudit.registry import RULES
from creditaudit.run.data_writes import data_left_alone


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
             initial_hidden_norms: Sequence[float] | None = None,
             trained: bool = True, watch_data: bool = True) -> DiagnosticReport:
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
    ``thresholds``; given both, a threshold they set apart is refused in one line).
    ``initial_hidden_norms``: the ``hidden_norms`` of a report on the same network at
    initialisation, on the same evaluation set; with them (a) also judges the
    segment before h_0 (embedding, stem), which no ratio of two states sees. ``trained``:
    False for a network before any training step, on which (d) is not evaluated (it would
    compare an untrained network with a trained baseline).

    ``metrics=True`` adds the credit-quality block (ρ, nudging; the fresh-feedback null for
    rules with fixed random feedback, FA and DFA). It needs a credit and a way to run the
    network on from a state: ``forward_from(layer, h) -> logits`` (blocks ``layer … L−1``
    and the head), by default ``model.forward_from``. ρ and nudging run on a float64 copy
    of the model when it can be copied with its functions (contract models, or
    ``states_fn``/``forward_from`` that are bound methods of ``model``), else on the model
    in its own precision (the report's ``metrics_precision`` says which).
    ``metric_options`` are passed to :func:`diagnostics.quality.credit_quality`;
    ``progress`` (e.g. ``print``) receives one line as each metric stage starts.
    ``metadata``: plain JSON values the report keeps (``{"arch": …, "dataset": …}``; a
    ``terminal_ln`` bool overrides the model's own); a key the report states itself
    (``headline_acc``, ``frozen_acc``, ``n_samples``, ``thresholds``, …) is refused.

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
    states only, and restores every submodule's training flag. Leaves torch's settings
    (grad mode, default dtype and device, thread count, deterministic mode, …) as the caller
    had them, on return and on every error: a model, credit, ``states_fn``,
    ``forward_from`` or diagnostic that changes one is refused in one line naming it (the
    setting put back). Leaves ``eval_x`` and
    ``eval_y`` unchanged too: a model or credit that writes them in place (its input) raises
    a one-line GuestError naming the model's class and the credit, rather than return
    numbers of other data; ``watch_data=False`` is for a caller that watches them itself
    (``creditaudit audit``, naming the run's network and rule).
    """
    args = checked_arguments(model, eval_x, eval_y, credit=credit, states_fn=states_fn,
                             forward_from=forward_from, thresholds=thresholds,
                             protocol=protocol, metrics=metrics, metric_options=metric_options,
                             initial_hidden_norms=initial_hidden_norms,
                             headline_acc=headline_acc, frozen_acc=frozen_acc,
                             metadata=metadata)
    # inputs a caller left requiring grad (``x.requires_grad_()``) are measured as data:
    # every gradient here is taken w.r.t. states, and the reference check's own copy
    eval_x = eval_x.detach()  # the same storage: the watch below still sees writes to it
    devices = [eval_x.device] if eval_x.device.type == "cuda" else []
    suspects = _suspects(model, credit, args)
    watch = (data_left_alone((eval_x, eval_y), suspects,
                             "diagnose() measured them", data="eval_x or eval_y",
                             stops="its numbers would be of other data than those given and "
                                   "diagnose() stops")
             if watch_data else contextlib.nullcontext())
    # torch's settings (grad mode, default dtype, threads, …) are the caller's afterwards,
    # also after an error: code of the model or the credit that changed one is refused
    with settings_kept(suspects), measurement_mode(model), \
            torch.random.fork_rng(devices=devices), watch:
        logits, layout = _probe(args, credit, eval_x, eval_y, metrics=metrics)
        reference = (checked_reference(model, args.states_fn, eval_x, eval_y,
                                       forward_from=args.forward_from,
                                       allow=allow_unverified_reference, fix=reference_fix)
                     if verify_reference else SKIPPED)
        measured = _credit(model, credit, args, eval_x, eval_y, layout)
        quality, precision = (_metrics(measured, logits, args, eval_x, eval_y, progress)
                              if metrics else (None, None))
    meta, terminal_ln = _metadata(model, measured.rule, precision, metadata)
    # under the forked RNG too: a plugin diagnostic may draw from it
    with torch.random.fork_rng(devices=devices):
        return _report(measured, meta, terminal_ln, reference, args, quality=quality,
                       headline_acc=headline_acc, frozen_acc=frozen_acc, protocol=protocol,
                       trained=trained)


def _suspects(model: nn.Module, credit: CreditRule | CreditFn | None, args: Arguments
              ) -> str:
    """How a write to the evaluation data names the code that ran on it: the model by its
    class, the credit rule by its name (a plugin's guest code with it) or the credit
    function by its own, and ``states_fn``/``forward_from`` where they are the caller's."""
    names = [f"the model ({type(model).__module__}:{type(model).__qualname__})"]
    if isinstance(credit, CreditRule):
        guest = RULES.guest(credit.name)
        names.append(f"the credit rule ({credit.name!r})"
                     + (f" ({guest.what})" if guest is not None else ""))
    elif credit is not None:
        names.append(f"the credit function ({_qualname(credit)})")
    for what, fn, own in (("states_fn", args.states_fn, "forward_states"),
                          ("forward_from", args.forward_from, "forward_from")):
        if fn is not None and fn != getattr(model, own, None):
            names.append(f"{what} ({_qualname(fn)})")
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def _qualname(fn: Any) -> str:
    """``module:qualname`` of a function (of its class, for a callable object)."""
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}:{named.__qualname__}"


def _probe(args: Arguments, credit: CreditRule | CreditFn | None, eval_x: Tensor,
           eval_y: Tensor, *, metrics: bool) -> tuple[Tensor, list[tuple[Any, Any]]]:
    """Step 2: the user's functions on two samples (one-line errors naming the one at
    fault); returns the probe's logits ``(2, C)``, whose dtype is the model's precision,
    and each state's one-sample shape and device (what a credit function must return)."""
    states, logits = probe_states(args.states_fn, eval_x, eval_y)
    if args.initial is not None and len(args.initial) != len(states):
        raise ConfigError(f"initial_hidden_norms holds {len(args.initial)} norms but the model "
                          f"has {len(states)} states h_0 … h_{len(states) - 1}: pass the "
                          "hidden_norms of a report on this network at initialisation")
    if metrics and args.forward_from is not None:  # (metrics without one was refused)
        check_forward_from(args.forward_from, states, logits)
    if credit is not None and not isinstance(credit, CreditRule):
        check_credits(credit, eval_x, eval_y, states)
    return logits, [(h.shape[1:], h.device) for h in states]


class _FunctionCredit:
    """Adapts a credit function ``(x, y) -> [a_0 … a_L]`` to the rule interface; what it
    returns on every batch is checked against ``layout`` (each state's one-sample shape and
    device, as probed), as it was on the probe's two samples."""

    name = "custom"

    def __init__(self, model: nn.Module, fn: CreditFn, layout: list[tuple[Any, Any]]
                 ) -> None:
        self.model, self.fn, self.layout = model, fn, layout

    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        out = self.fn(x, y)
        check_credit_output(out, [((x.shape[0], *shape), device)
                                  for shape, device in self.layout],
                            batch=f" on a batch of {x.shape[0]} samples")
        return [a.detach() for a in out]


@dataclass
class _Measured:
    """Step 4's results: the state gradients ``sg`` on the evaluation set, the credit as a
    ``rule`` (None without one), the module ``work`` the metrics run, and the credits'
    per-sample ``summaries`` (``(N, d)`` per state; None without a credit)."""

    sg: StateGradients
    rule: Any  # a CreditRule, a _FunctionCredit (what the metrics call of a rule) or None
    work: nn.Module
    summaries: list[Tensor] | None


def _credit(model: nn.Module, credit: CreditRule | CreditFn | None, args: Arguments,
            eval_x: Tensor, eval_y: Tensor, layout: list[tuple[Any, Any]]) -> _Measured:
    """Step 4: the state gradients g_l, and the credit a_l as a rule with its summaries."""
    rule, work = _credit_and_model(model, credit, args.states_fn, args.forward_from, layout)
    sg = state_gradients(args.states_fn, eval_x, eval_y)
    summaries = None
    if isinstance(rule, CreditRule):
        summaries = rule_credits(rule, eval_x, eval_y)
    elif rule is not None:
        summaries = [summary_vectors(a) for a in rule.credits(eval_x, eval_y)]
    return _Measured(sg, rule, work, summaries)


def _credit_and_model(model: nn.Module, credit: CreditRule | CreditFn | None,
                      states_fn: StatesFn, forward_from: ForwardFrom | None,
                      layout: list[tuple[Any, Any]]) -> tuple[Any, nn.Module]:
    """(the credit as a rule, the module the metrics run): the model itself when it is a
    contract model run through its own methods, else the model behind a StatesNet."""
    if isinstance(credit, CreditRule):
        return credit, credit.model
    own = (states_fn == getattr(model, "forward_states", None)
           and forward_from == getattr(model, "forward_from", None))
    work: nn.Module = model
    if not own and forward_from is not None:
        work = StatesNet(model, states_fn, forward_from)
    return (_FunctionCredit(work, credit, layout) if credit is not None else None), work


def _metrics(measured: _Measured, logits: Tensor, args: Arguments, eval_x: Tensor,
             eval_y: Tensor, progress: Callable[[str], None] | None
             ) -> tuple[dict[str, Any], str]:
    """Step 5: the credit-quality block, and the precision it ran in: float64 on a copy
    unless the metrics module is a StatesNet whose functions cannot follow a copy (then the
    model's own, read from the probe's ``logits``)."""
    work = measured.work
    dtype = (torch.float64 if not isinstance(work, StatesNet) or work.copyable else None)
    precision = "float64" if dtype is not None else dtype_name(logits.dtype)
    quality = credit_quality(measured.rule, eval_x, eval_y,
                             grad_floor=args.thresholds.grad_floor, dtype=dtype,
                             progress=progress, **args.metric_options)
    return quality, precision


def _metadata(model: nn.Module, rule: Any,
              precision: str | None, metadata: dict[str, Any] | None
              ) -> tuple[dict[str, Any], bool | None]:
    """(the report's metadata: the model as it names itself, the credit's name, the metrics'
    precision, then the caller's ``metadata``; whether the model ends in a LayerNorm, as
    the caller's ``metadata`` says or else :func:`_terminal_ln`)."""
    # An adapted model is named as it describes itself (the user's class, its package and
    # states), not as the wrapper class "AdaptedModel".
    name = model.describe().label if isinstance(model, AdaptedModel) else type(model).__name__
    meta: dict[str, Any] = {"model": name,
                            "method": getattr(rule, "name", None)}
    if precision is not None:
        meta["metrics_precision"] = precision
    meta.update(metadata or {})
    return meta, meta.pop("terminal_ln", _terminal_ln(model))


def _terminal_ln(model: nn.Module) -> bool | None:
    """Whether the model ends in a LayerNorm: a contract model declares it, an adapted one
    as declared or probed; a plain module may not say (None)."""
    if isinstance(model, ResidualNet):
        return bool(model.terminal_ln)
    if isinstance(model, AdaptedModel):
        return model.terminal_ln
    return (model.out_ln is not None) if hasattr(model, "out_ln") else None


def _report(measured: _Measured, meta: dict[str, Any], terminal_ln: bool | None,
            reference: ReferenceCheck, args: Arguments, *, quality: dict[str, Any] | None,
            headline_acc: float | None, frozen_acc: float | None,
            protocol: Protocol | None, trained: bool) -> DiagnosticReport:
    """Step 6: the protocol evaluated on the measurements; (b) says when the reference is
    unchecked, (d) how to give a frozen-blocks accuracy."""
    report = evaluate_protocol(measured.sg, headline_acc=headline_acc, frozen_acc=frozen_acc,
                               thresholds=args.thresholds, terminal_ln=terminal_ln,
                               credits=measured.summaries, metrics=quality, metadata=meta,
                               protocol=protocol, reference=reference.to_dict(),
                               initial_hidden_norms=args.initial, trained=trained)
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


__all__ = ["diagnose", "METRIC_OPTIONS"]
