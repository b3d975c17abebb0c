"""What a plugin diagnostic is handed and what it hands back, past the conformance suite's
tiny cases, on a run's own evidence: its own copy of the evidence — what it changes in it
reaches neither the record's numbers (the norms, the per-layer cosines computed from the
same gradients) nor another diagnostic —; details a record cannot hold (numpy, tensors)
make its result "not evaluated", saying why, not a run that cannot write its record."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from creditaudit.config import opt
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    DiagnosticResult,
    Evidence,
    Protocol,
    ProtocolDiagnostic,
)
from door_support import guests

EATER = "late_evidence_eater"


def _evidence() -> Evidence:
    """A 3-state run's evidence (the eater changes evidence of any depth but the suite's 5)."""
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(16, 4, generator=generator, dtype=torch.float64) for _ in range(3)]
    return Evidence(hidden_norms=[1.0, 1.5, 2.0], grad_norms=[1e-3, 1e-3, 1e-3],
                    g_L_zero_fraction=0.0, g_L_nonzero_median=1e-3, grads=grads,
                    logits=torch.randn(16, 4, generator=generator),
                    labels=torch.arange(16) % 4, headline_acc=0.8, terminal_ln=True)


def test_a_diagnostic_that_changes_its_evidence_changes_nothing_else(tmp_path):
    evidence = _evidence()
    norms, grad_norms = list(evidence.hidden_norms), list(evidence.grad_norms)
    grads = [g.clone() for g in evidence.grads]
    with guests(tmp_path / "site", EATER):
        built = Protocol.of(["a", "b", EATER]).diagnostics
        twice = Protocol((*built, type(built[-1])(built[-1].options)))  # the second eater
        first, second = twice.evaluate(evidence)[-2:]  # sees a copy of its own too
    assert evidence.hidden_norms == norms and evidence.grad_norms == grad_norms
    assert all(torch.equal(g, before) for g, before in zip(evidence.grads, grads, strict=True))
    assert first.value == second.value == 2.0


def test_details_a_record_cannot_hold_are_not_evaluated(tmp_path):
    with guests(tmp_path / "site", "late_numpy_details"):
        protocol = Protocol.of(["a", "late_numpy_details"])
        result = protocol.evaluate(_evidence())[-1]
        odd = protocol.diagnostics[-1].checked(DiagnosticResult(
            "late_numpy_details", "Numpy details", 2.0, 1.0, "fired", "grown", None))
    assert result.status == NOT_EVALUATED and result.value is None
    assert result.reason.startswith("its details are not plain JSON (Object of type bool"), \
        result.reason
    assert result.reason.endswith("(it said 'fired': largest norm 2)")
    assert json.loads(json.dumps(result.to_dict()))["details"] == {"claimed": "fired"}
    assert odd.status == NOT_EVALUATED and "a NoneType, not a dict" in odd.reason


def test_details_naming_one_key_twice_in_json_are_not_evaluated():
    """``{1: …, "1": …}`` is plain JSON to json.dumps, which writes the key "1" twice: the
    record would lose a number and be refused on reading as not written by creditaudit."""
    from creditaudit.files import strict_json

    diagnostic = Protocol.of(["a"]).diagnostics[0]
    result = diagnostic.checked(DiagnosticResult(
        diagnostic.name, "Scale", 60.0, 50.0, "fired", "grown", {"per_state": {1: 0.5, "1": 0.7}}))
    assert result.status == NOT_EVALUATED and result.value is None
    assert result.reason.startswith("its details are not plain JSON (the keys 1 and '1' of one "
                                    "object are both written '1')"), result.reason
    text = json.dumps(result.to_dict())
    assert json.loads(text, object_pairs_hook=strict_json.unique_keys)["details"] == {
        "claimed": "fired"}


@dataclass
class _LimitOptions:
    limit: float = opt(1.0, "fires when the statistic exceeds this")


class _Contradicts(ProtocolDiagnostic[_LimitOptions]):
    """Says the opposite of what its statistic and threshold say (a pass of 5 at "> 1")."""

    name, label, statistic, hint = "contradicts", "contradicts", "five", "never fires"
    operator, threshold = ">", "limit"
    status = PASSED

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        return self.result(5.0 if self.status == PASSED else 0.5, self.status, "all good")


class _FiresBelow(_Contradicts):
    status = FIRED


def test_a_status_its_threshold_contradicts_is_not_evaluated():
    """Verdicts read a result's status, threshold sensitivity and re-judging read its value
    (``status_of``): a diagnostic whose "passed" its own threshold calls fired would be a
    silently recorded pass that every other reading contradicts."""
    evidence = _evidence()
    for cls, said, does in ((_Contradicts, "passed", "fires"),
                            (_FiresBelow, "fired", "does not fire")):
        diagnostic = cls(_LimitOptions())
        result = Protocol((diagnostic,)).evaluate(evidence)[0]
        assert result.status == NOT_EVALUATED and result.value is None, result
        assert result.reason == (f"its statistic {5 if said == 'passed' else 0.5} {does} at "
                                 f"its threshold > 1 (it said {said!r}: all good)")
        assert result.details == {"claimed": said}


class _Judges(_Contradicts):
    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        return self.judge(5.0, "judged")


def test_a_non_finite_threshold_judges_nothing():
    """A plugin's own ``Options`` are not checked in Python as a config's table is: at a
    NaN threshold ``fires`` is never true, at ``> inf`` neither — every statistic passed."""
    for limit in (float("nan"), float("inf")):
        result = Protocol((_Judges(_LimitOptions(limit)),)).evaluate(_evidence())[0]
        assert result.status == NOT_EVALUATED and result.value is None, result
        assert result.reason == (f"its threshold limit={limit} is not a finite number "
                                 "(options _LimitOptions) (it said 'passed': judged)")


class _StatesAnother(_Contradicts):
    """Judges at its options' threshold but states another one in its result."""

    def evaluate(self, evidence: Evidence) -> DiagnosticResult:
        return DiagnosticResult(self.name, self.label, 0.5, 0.1, PASSED, "below 0.1?")


def test_a_result_stating_another_threshold_than_it_judges_at_is_not_evaluated():
    # a passed 0.5 recorded beside "threshold 0.1": the record read as 0.5 > 0.1 passing
    result = Protocol((_StatesAnother(_LimitOptions()),)).evaluate(_evidence())[0]
    assert result.status == NOT_EVALUATED and result.value is None, result
    assert result.reason.startswith("it states the threshold 0.1, but it judges at limit=1 "
                                    "(build results with self.result() or self.judge())")
