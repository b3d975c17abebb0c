"""The conformance suite of protocol diagnostics — ``check_diagnostic(DiagnosticClass)``, or
of an instance holding its options, ``check_diagnostic(MyDiagnostic(options))``.

Verdicts, reports, audit panels and records read a diagnostic through what it declares and
the :class:`~creditaudit.protocol.DiagnosticResult` it returns. The suite evaluates it on a
fixed set of evidence (:func:`evidence_cases`, 5 states, d = 8, 1280 samples): ``typical``
(a healthy run), ``failing`` (a grown stream, a gradient at the floor, batch gradients
sharing one direction, a 1 pp depth margin), ``partial`` (per-sample gradients and the
frozen accuracy missing), ``empty`` (nothing measured) and ``nan`` (every number NaN, as
after a divergence)::

    from creditaudit.testing import check_diagnostic
    check_diagnostic(MyDiagnostic)                   # AssertionError naming what failed
    check_diagnostic(MyDiagnostic, {"limit": 0.5})   # with other options
    check_diagnostic(MyDiagnostic(my_options))       # the options an instance holds

The checks:

- ``describes_itself``: the registry accepts the class (``statistic``, ``hint``, an
  ``operator`` of ``>``/``<``, a ``threshold`` naming one of its options, ``evaluate``); the
  threshold is a finite number, ``unit`` a string, and ``value_text`` / ``threshold_text``
  render — every report prints them;
- ``results_are_its_own_and_consistent``: on every case ``evaluate`` returns a
  DiagnosticResult with the diagnostic's own id and label, the threshold of its options, a
  status among fired / passed / not evaluated, a reason, plain-JSON details, and a value
  that is None or finite (an infinite one only when fired: an overflowed stream); fired and
  passed carry a value, and ``fires(value)`` says which — verdicts and threshold
  sensitivity recompute the status from the value;
- ``threshold_decides_the_status`` (``Options`` a dataclass): moving the threshold past a
  finite value flips fired ↔ passed — the status must come from the threshold it reports;
- ``never_passes_without_evidence``: ``empty`` evidence is not evaluated, ``nan`` evidence
  is never passed — a diagnostic that cannot look must not vouch for a run;
- ``is_deterministic_and_leaves_the_evidence_alone``: two evaluations agree and the evidence
  (lists, tensors) is unchanged — one evidence object is shared by every diagnostic;
- ``leaves_global_rngs_untouched``: ``evaluate`` neither draws from nor reseeds torch's,
  numpy's or Python's global RNG — diagnostics run between epochs and training goes on
  drawing from torch's (a checkpoint saves its state), so a diagnostic that moved one would
  make a run's weights depend on whether, and how often, it was measured.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import torch

from creditaudit.errors import ConfigError
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DiagnosticResult,
    Evidence,
    ProtocolDiagnostic,
)
from creditaudit.protocol.diagnostics import OPERATORS
from creditaudit.registry import DIAGNOSTICS
from creditaudit.testing.common import (
    Check,
    Report,
    declared_failures,
    moved_rngs,
    reason_for,
    resolve_options,
    run_checks,
    same_state,
    watched_global_rngs,
)

STATUSES = (FIRED, PASSED, NOT_EVALUATED)
N_STATES, WIDTH, SAMPLES, N_CLASSES = 5, 8, 1280, 10


def evidence_cases(seed: int = 0) -> dict[str, Evidence]:
    """The evidence every diagnostic is evaluated on, by name (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    labels = torch.randint(0, N_CLASSES, (SAMPLES,), generator=generator)
    scattered = [randn(SAMPLES, WIDTH) * 1e-3 for _ in range(N_STATES)]
    shared = randn(WIDTH)
    aligned = [shared + 0.1 * randn(SAMPLES, WIDTH) for _ in range(N_STATES)]
    nan = float("nan")
    return {
        "typical": Evidence(
            hidden_norms=[1.0, 1.4, 1.9, 2.3, 2.8], grad_norms=[2e-3, 1.8e-3, 1.5e-3, 1.2e-3,
                                                                 1e-3],
            g_L_zero_fraction=0.0, g_L_nonzero_median=1e-3, grads=scattered,
            logits=randn(SAMPLES, N_CLASSES), labels=labels, headline_acc=0.84,
            frozen_acc=0.71, terminal_ln=True),
        "failing": Evidence(
            hidden_norms=[1.0, 1.2, 900.0, 950.0, 990.0], grad_norms=[1e-6, 1e-7, 1e-9,
                                                                      1e-9, 1e-9],
            g_L_zero_fraction=0.1, g_L_nonzero_median=1e-9, grads=aligned,
            logits=randn(SAMPLES, N_CLASSES) * 50, labels=labels, headline_acc=0.72,
            frozen_acc=0.71, terminal_ln=True),
        "partial": Evidence(hidden_norms=[1.0, 1.1, 1.2, 1.3, 1.4],
                            grad_norms=[1e-3, 1e-3, 1e-3, 1e-3, 1e-3], headline_acc=0.8),
        "empty": Evidence(hidden_norms=[], grad_norms=[]),
        "nan": Evidence(
            hidden_norms=[nan] * N_STATES, grad_norms=[nan] * N_STATES, g_L_zero_fraction=nan,
            g_L_nonzero_median=nan, grads=[torch.full((SAMPLES, WIDTH), nan)] * N_STATES,
            logits=torch.full((SAMPLES, N_CLASSES), nan), labels=labels, headline_acc=nan,
            frozen_acc=nan, terminal_ln=True),
    }


def _results(diagnostic: ProtocolDiagnostic[Any]) -> dict[str, DiagnosticResult]:
    return {name: diagnostic.evaluate(evidence) for name, evidence in evidence_cases().items()}


# --- the checks ---------------------------------------------------------------------------
def describes_itself(cls: type[ProtocolDiagnostic[Any]], diagnostic: ProtocolDiagnostic[Any]
                     ) -> None:
    try:
        DIAGNOSTICS.validate(cls, cls.__qualname__)
    except ConfigError as err:
        raise AssertionError(str(err)) from None
    assert cls.operator in OPERATORS, f"operator {cls.operator!r} is not one of {OPERATORS}"
    assert isinstance(cls.unit, str), f"unit is a {type(cls.unit).__name__}, not a string"
    limit = diagnostic.limit()
    assert math.isfinite(limit), f"the threshold {cls.threshold} is {limit}, not finite"
    for text in (cls.value_text(1.0), cls.value_text(None), cls.threshold_text(limit),
                 cls.id_label()):
        assert isinstance(text, str) and text, "value_text / threshold_text / id_label " \
                                               "must render non-empty strings"


def results_are_its_own_and_consistent(cls: type[ProtocolDiagnostic[Any]],
                                       diagnostic: ProtocolDiagnostic[Any]) -> None:
    for case, result in _results(diagnostic).items():
        where = f"on {case} evidence"
        assert isinstance(result, DiagnosticResult), \
            f"{where} evaluate() returned a {type(result).__name__}, not a DiagnosticResult"
        assert result.id == cls.name and result.name == cls.label, \
            f"{where} the result is ({result.id}) {result.name!r}, not ({cls.name}) " \
            f"{cls.label!r}"
        assert result.status in STATUSES, \
            f"{where} the status is {result.status!r}, not one of {', '.join(STATUSES)}"
        assert result.threshold == diagnostic.limit(), \
            f"{where} the result reports threshold {result.threshold}, its options " \
            f"{diagnostic.limit()}"
        assert isinstance(result.reason, str) and result.reason, f"{where} no reason given"
        try:
            json.dumps(result.details)
        except (TypeError, ValueError) as err:
            raise AssertionError(f"{where} the details are not plain JSON: {err}") from None
        value = result.value
        if value is not None:
            assert isinstance(value, float | int) and not isinstance(value, bool), \
                f"{where} the value is a {type(value).__name__}, not a number"
            assert not math.isnan(value), f"{where} the value is NaN (use None: not evaluated)"
            assert math.isfinite(value) or result.status == FIRED, \
                f"{where} the value is {value} with status {result.status!r}"
        if result.status in (FIRED, PASSED):
            assert value is not None, f"{where} {result.status} without a value"
            fires = diagnostic.fires(value)
            assert fires == (result.status == FIRED), \
                f"{where} the status is {result.status!r}, but fires({value:g}) is {fires}"


def threshold_decides_the_status(cls: type[ProtocolDiagnostic[Any]],
                                 diagnostic: ProtocolDiagnostic[Any]) -> None:
    if not dataclasses.is_dataclass(diagnostic.options):
        return
    for case, result in _results(diagnostic).items():
        value = result.value
        if result.status not in (FIRED, PASSED) or value is None or not math.isfinite(value):
            continue
        above = result.status == FIRED if cls.operator == ">" else result.status == PASSED
        moved = value + abs(value) + 1.0 if above else value - abs(value) - 1.0
        flipped = _past_its_range(diagnostic, moved).evaluate(evidence_cases()[case])
        want = PASSED if result.status == FIRED else FIRED
        assert flipped.status == want, \
            f"on {case} evidence the value {value:g} {result.status} at threshold " \
            f"{result.threshold:g}, and is still {flipped.status!r} at {moved:g}"


def _past_its_range(diagnostic: ProtocolDiagnostic[Any], threshold: float
                    ) -> ProtocolDiagnostic[Any]:
    """``diagnostic`` with its threshold option set to ``threshold`` on a copy of its
    options, unchecked: the threshold moved past the statistic may lie outside the range
    its options accept (a stability above 1), which is what flipping the status needs."""
    options = copy.copy(diagnostic.options)
    object.__setattr__(options, diagnostic.threshold, threshold)  # frozen ones too
    return type(diagnostic)(options)


def never_passes_without_evidence(cls: type[ProtocolDiagnostic[Any]],
                                  diagnostic: ProtocolDiagnostic[Any]) -> None:
    results = _results(diagnostic)
    assert results["empty"].status == NOT_EVALUATED, \
        f"on empty evidence the status is {results['empty'].status!r}, not 'not evaluated'"
    assert results["nan"].status != PASSED, "on NaN evidence the diagnostic passed"


def is_deterministic_and_leaves_the_evidence_alone(cls: type[ProtocolDiagnostic[Any]],
                                                   diagnostic: ProtocolDiagnostic[Any]) -> None:
    for case, evidence in evidence_cases().items():
        before = copy.deepcopy(dataclasses.asdict(evidence))
        first, again = diagnostic.evaluate(evidence), diagnostic.evaluate(evidence)
        differ = same_state(first.to_dict(), again.to_dict())
        assert not differ, f"on {case} evidence two evaluations differ at {differ[0]}"
        changed = same_state(before, dataclasses.asdict(evidence))
        assert not changed, f"evaluate() changed the {case} evidence at {changed[0]}"


def leaves_global_rngs_untouched(cls: type[ProtocolDiagnostic[Any]],
                                 diagnostic: ProtocolDiagnostic[Any]) -> None:
    for case, evidence in evidence_cases().items():
        with watched_global_rngs() as states:
            diagnostic.evaluate(evidence)
            moved = moved_rngs(states)
        assert not moved, (
            f"on {case} evidence evaluate() moved or reseeded {' and '.join(moved)} global "
            "RNG, which training draws from after it: draw from a torch.Generator of its "
            "own")


DIAGNOSTIC_CHECKS = (
    describes_itself, results_are_its_own_and_consistent, threshold_decides_the_status,
    never_passes_without_evidence, is_deterministic_and_leaves_the_evidence_alone,
    leaves_global_rngs_untouched)


def diagnostic_checks(diagnostic: type[ProtocolDiagnostic[Any]] | ProtocolDiagnostic[Any],
                      options: Mapping[str, Any] | Any = None, *,
                      expected_failures: Mapping[str, str] | None = None) -> list[Check]:
    """The checks of ``diagnostic``, one by one (see :func:`check_diagnostic`)."""
    cls, checked = _instance(diagnostic, options)
    failures = declared_failures(cls, expected_failures,
                                 (c.__name__ for c in DIAGNOSTIC_CHECKS))
    return [Check(check, cls, checked, expected_failure=reason_for(failures, check, ""))
            for check in DIAGNOSTIC_CHECKS]


def _instance(diagnostic: type[ProtocolDiagnostic[Any]] | ProtocolDiagnostic[Any],
              options: Any) -> tuple[type[ProtocolDiagnostic[Any]], ProtocolDiagnostic[Any]]:
    """(its class, the instance checked): a class with ``options`` (None: its defaults), an
    instance with its own options unless ``options`` are given."""
    if isinstance(diagnostic, ProtocolDiagnostic):
        cls = type(diagnostic)
        return cls, diagnostic if options is None else cls(resolve_options(cls, options))
    return diagnostic, diagnostic(resolve_options(diagnostic, options))


def check_diagnostic(diagnostic: type[ProtocolDiagnostic[Any]] | ProtocolDiagnostic[Any],
                     options: Mapping[str, Any] | Any = None, *,
                     expected_failures: Mapping[str, str] | None = None) -> Report:
    """Evaluate the protocol diagnostic ``diagnostic`` — a class, or an instance holding its
    options — on fixed evidence and check its results (the module docstring lists the
    checks); AssertionError listing every check that failed, else a
    :class:`~creditaudit.testing.common.Report`.

    ``options``: its ``Options`` fields (a mapping, or any object carrying them; None = the
    defaults, or an instance's own); ``expected_failures``: ``{check name: reason}`` of
    checks it fails by design.
    """
    checks = diagnostic_checks(diagnostic, options, expected_failures=expected_failures)
    cls = diagnostic if isinstance(diagnostic, type) else type(diagnostic)
    return run_checks(checks, f"{cls.__name__} ({cls.name})")


__all__ = ["check_diagnostic", "diagnostic_checks", "DIAGNOSTIC_CHECKS", "evidence_cases"]
