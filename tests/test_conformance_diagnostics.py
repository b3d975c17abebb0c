"""Every registered protocol diagnostic passes the public diagnostic suite
(check_diagnostic), check by check; and the suite catches diagnostics that misreport."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DepthUtility,
    Evidence,
    ResidualStreamScale,
    Thresholds,
)
from creditaudit.protocol.diagnostics import (
    DepthOptions,
    GrowthOptions,
    ReferenceOptions,
    ReferenceValidity,
)
from creditaudit.registry import DIAGNOSTICS
from creditaudit.testing import check_diagnostic, diagnostic_checks
from creditaudit.testing.diagnostics import evidence_cases

CASES = [(cls.name, check) for cls in DIAGNOSTICS.classes() for check in diagnostic_checks(cls)]


@pytest.mark.parametrize("name,check", CASES, ids=[f"{n}-{c.id}" for n, c in CASES])
def test_diagnostic_conforms(name, check):
    check()


def test_the_builtins_conform_with_the_protocols_thresholds_too():
    for cls in DIAGNOSTICS.classes():
        check_diagnostic(cls, Thresholds(growth=10.0, stability=0.5))


def test_the_evidence_makes_every_builtin_fire_and_pass():
    """The fixed evidence exercises both outcomes of each built-in, so the consistency and
    threshold checks see both."""
    for cls in DIAGNOSTICS.classes():
        if cls.default:
            statuses = {cls().evaluate(e).status for e in evidence_cases().values()}
            assert {FIRED, PASSED, NOT_EVALUATED} <= statuses, cls.name


def test_builtins_without_evidence_are_not_evaluated():
    """Regressions: (a) passed empty evidence (growth 1.0), (b) raised IndexError on it, (d)
    passed NaN accuracies with a NaN margin."""
    empty = Evidence(hidden_norms=[], grad_norms=[])
    assert ResidualStreamScale(GrowthOptions()).evaluate(empty).status == NOT_EVALUATED
    assert ReferenceValidity(ReferenceOptions()).evaluate(empty).status == NOT_EVALUATED
    nan = Evidence([], [], headline_acc=float("nan"), frozen_acc=0.5)
    result = DepthUtility(DepthOptions()).evaluate(nan)
    assert result.status == NOT_EVALUATED and result.value is None


# Spelled the older way on purpose (classmethods taking the options, super().evaluate(evidence,
# options)): the suite must catch such diagnostics too.
class PassesOnNothing(ResidualStreamScale):
    """(a) as it was: no states, no blocks, largest growth 1.0 — passed."""

    name = "passes_on_nothing"

    @classmethod
    def evaluate(cls, evidence, options):
        if len(evidence.hidden_norms) < 2:
            return cls.judge(1.0, options, "largest block growth 1×")
        return super().evaluate(evidence, options)


class PassesOnNaN(DepthUtility):
    """(d) as it was: a NaN margin is not below the threshold, so it passed."""

    name = "passes_on_nan"

    @classmethod
    def evaluate(cls, evidence, options):
        if evidence.headline_acc is not None and evidence.frozen_acc is not None:
            margin = 100.0 * (evidence.headline_acc - evidence.frozen_acc)
            return cls.judge(margin, options, "margin")
        return super().evaluate(evidence, options)


class IgnoresItsThreshold(ResidualStreamScale):
    """Judges with the default threshold whatever its options say."""

    name = "ignores_threshold"

    @classmethod
    def evaluate(cls, evidence, options):
        result = super().evaluate(evidence, GrowthOptions())
        result.threshold = cls.limit(options)
        return result


class AnotherId(ResidualStreamScale):
    name = "another_id"

    @classmethod
    def evaluate(cls, evidence, options):
        result = super().evaluate(evidence, options)
        result.id = "a"
        return result


class SortsTheEvidence(ResidualStreamScale):
    name = "sorts"

    @classmethod
    def evaluate(cls, evidence, options):
        evidence.hidden_norms.sort(reverse=True)
        return super().evaluate(evidence, options)


class Moody(ResidualStreamScale):
    name = "moody"

    @classmethod
    def evaluate(cls, evidence, options):
        result = super().evaluate(evidence, options)
        result.reason += f" ({random.random():.3f})"
        return result


class ReseedsTorch(ResidualStreamScale):
    """Seeds torch for a 'reproducible' projection: every evaluation between epochs resets
    the RNG training goes on drawing from (deterministic, so the determinism check passes)."""

    name = "reseeds_torch"

    @classmethod
    def evaluate(cls, evidence, options):
        torch.manual_seed(0)
        return super().evaluate(evidence, options)


class DrawsFromNumpy(ResidualStreamScale):
    name = "draws_numpy"

    @classmethod
    def evaluate(cls, evidence, options):
        np.random.seed(0)
        np.random.rand()
        return super().evaluate(evidence, options)


class NoStatistic(ResidualStreamScale):
    name = "no_statistic"
    statistic = ""


@pytest.mark.parametrize("cls,check", [
    (PassesOnNothing, "never_passes_without_evidence"),
    (PassesOnNaN, "never_passes_without_evidence"),
    (PassesOnNaN, "results_are_its_own_and_consistent"),
    (IgnoresItsThreshold, "threshold_decides_the_status"),
    (AnotherId, "results_are_its_own_and_consistent"),
    (SortsTheEvidence, "is_deterministic_and_leaves_the_evidence_alone"),
    (Moody, "is_deterministic_and_leaves_the_evidence_alone"),
    (NoStatistic, "describes_itself"),
    (ReseedsTorch, "leaves_global_rngs_untouched"),
    (DrawsFromNumpy, "leaves_global_rngs_untouched"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_the_suite_catches_diagnostics_that_misreport(cls, check):
    with pytest.raises(AssertionError) as err:
        check_diagnostic(cls)
    assert f"- {check}:" in str(err.value)


def test_a_diagnostic_that_reseeds_a_global_rng_fails_only_that_check():
    rng = torch.get_rng_state()
    with pytest.raises(AssertionError) as err:
        check_diagnostic(ReseedsTorch)
    message = str(err.value)
    assert "fails 1 conformance check:" in message, message
    assert "evaluate() moved or reseeded torch's global RNG" in message
    assert torch.equal(torch.get_rng_state(), rng)  # the suite puts it back
