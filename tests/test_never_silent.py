"""Never a silent pass: a diagnostic whose statistic is NaN, Inf, None or no number at all is
"not evaluated" with the reason — in the protocol's evaluation, in records (old ones included,
on read) and in reports — and a diagnostic listed twice is refused in one line.

The guests (tests/guest_pkg/creditaudit_guests/data_diagnostics.py) each return such a
statistic with the status "passed".
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from creditaudit.audit.diagnose import diagnose
from creditaudit.cli import main
from creditaudit.config import RunConfig, config_from_dict
from creditaudit.errors import ConfigError
from creditaudit.measures.gradients import median
from creditaudit.protocol import (
    FIRED,
    NOT_EVALUATED,
    PASSED,
    TRUSTWORTHY,
    DiagnosticReport,
    Evidence,
    Protocol,
    ReferenceValidity,
    ResidualStreamScale,
    evaluate_protocol,
)
from creditaudit.protocol.records import record_report, record_verdict
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.registry import reload_plugins
from creditaudit.report import render
from creditaudit.run.trainer import train
from integrity_support import as_written, assert_one_line_error, toml_of
from plugin_support import GUESTS
from test_protocol import make_sg

pytestmark = pytest.mark.usefixtures("single_thread")

GUEST_NAMES = ["data_nan", "data_inf", "data_none", "data_text"]
TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "diagnostics.frozen_acc": 0.0, "run.progress": False}


@pytest.fixture
def guests(tmp_path, monkeypatch):
    site = GUESTS.install(tmp_path / "site", only=GUEST_NAMES)
    monkeypatch.syspath_prepend(str(site))
    reload_plugins()
    yield
    monkeypatch.undo()
    GUESTS.forget()
    reload_plugins()


def healthy_evidence() -> Evidence:
    """Evidence on which the four built-ins are evaluated and none fires."""
    return Evidence(hidden_norms=[1.0, 1.1, 1.2], grad_norms=[1e-3, 1e-3, 1e-3],
                    g_L_zero_fraction=0.0, g_L_nonzero_median=1e-3, headline_acc=0.9,
                    frozen_acc=0.5)


def test_a_statistic_that_is_no_finite_number_is_not_evaluated_never_passed(guests):
    protocol = Protocol.of(GUEST_NAMES)
    results = {r.id: r for r in protocol.evaluate(healthy_evidence())}
    assert {r.status for r in results.values()} == {NOT_EVALUATED}
    assert "nan" in results["data_nan"].reason and "not a finite number" in \
        results["data_nan"].reason
    assert "inf" in results["data_inf"].reason
    assert "None" in results["data_none"].reason
    assert "str" in results["data_text"].reason
    assert all(r.value is None for r in results.values())


def test_an_overflowed_stream_still_fires_a_but_an_infinite_gradient_never_passes_b():
    """(a) fires on NaN/Inf states (what it exists to catch); (b) on an infinite ‖g_L‖
    used to pass ("≥ floor"): it is not evaluated."""
    protocol = Protocol.default()
    overflowed = Evidence(hidden_norms=[1.0, math.inf], grad_norms=[1e-3, math.inf])
    results = {r.id: r for r in protocol.evaluate(overflowed)}
    assert results["a"].status == FIRED
    assert results["b"].status == NOT_EVALUATED and "inf" in results["b"].reason
    validity = ReferenceValidity(ReferenceValidity.Options())
    assert validity.status_of(math.inf) == NOT_EVALUATED
    assert validity.status_of(1e-3) == PASSED
    assert ResidualStreamScale().status_of(math.inf) == FIRED


def test_a_run_with_such_a_diagnostic_records_and_reports_it_not_evaluated(guests, tmp_path,
                                                                            monkeypatch):
    """The door refuses these guests on its typical evidence (tests/test_door.py); a
    diagnostic whose statistic turns NaN only on a run's real evidence meets the second guard,
    which this test reaches by letting them through the door."""
    from creditaudit.run import door
    monkeypatch.setattr(door, "diagnostic_door", lambda diagnostic, guest: door.Admission(
        checks=(), declared_failures={}))
    config = RunConfig().replace(**TINY, **{
        "run.out_dir": str(tmp_path), "diagnostics.protocol": ["a", "b", "c", "d", *GUEST_NAMES]})
    record = train(config).record
    stored = record.protocol.report["diagnostics"]
    for name in GUEST_NAMES:
        assert stored[name]["status"] == NOT_EVALUATED, name
        assert record.log[-1].protocol[name] == NOT_EVALUATED
    assert record.protocol.verdict != TRUSTWORTHY
    verdict = record_verdict(load_record(tmp_path / record.run_id))
    assert set(GUEST_NAMES) <= set(verdict.not_evaluated)
    text = render(record_report(record), "text")
    assert "data_nan" in text and "not evaluated" in text


def test_a_record_that_stored_a_pass_without_a_number_reads_as_not_evaluated(tmp_path):
    """Records written before this check: a 'passed' whose value is null, NaN or Inf (strict
    JSON: null plus a non_finite mark) is read as not evaluated, and the verdict follows."""
    config = RunConfig().replace(**TINY, **{"run.out_dir": str(tmp_path)})
    run = train(config)
    assert record_verdict(run.record).statuses["b"] == PASSED
    path = run.run_dir / RECORD_FILE
    raw = json.loads(path.read_text())
    raw["protocol"]["report"]["diagnostics"]["c"].update(status=PASSED, value=None)
    raw["protocol"]["report"]["diagnostics"]["b"].update(status=PASSED, value=None)
    raw.setdefault("non_finite", {})["/protocol/report/diagnostics/b/value"] = "Infinity"
    path.write_text(as_written(raw, digest=False))  # as an earlier version wrote it
    record = load_record(path)
    verdict = record_verdict(record)
    assert verdict.statuses["b"] == verdict.statuses["c"] == NOT_EVALUATED
    assert verdict.verdict != TRUSTWORTHY
    report = record_report(record)
    assert report.diagnostic("b").status == report.diagnostic("c").status == NOT_EVALUATED
    assert {"b", "c"} <= set(report.not_evaluated) and report.verdict != TRUSTWORTHY
    again = DiagnosticReport.from_dict(json.loads(report.to_json()))
    assert again.diagnostic("c").status == NOT_EVALUATED


def test_a_diagnostic_listed_twice_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="lists 'a' twice"):
        config_from_dict({"diagnostics": {"protocol": ["a", "b", "a"]}})
    with pytest.raises(ConfigError, match="lists 'b' twice"):
        Protocol.of(["a", "b", "b"])
    path = tmp_path / "twice.toml"
    path.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path),
                             "diagnostics.protocol": ["a", "b", "c", "d", "a"]}))
    capsys.readouterr()
    assert main(["train", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "diagnostics.protocol lists 'a' twice")


class _OverflowingSamples(torch.nn.Module):
    """A stream that overflows to ±inf for the few samples whose h_0 is large (expm1 of
    ~100), elsewhere growing 1.01×; its tanh readout keeps every logit and loss finite."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

    def states(self, x):
        h0 = self.embed(x)
        h1 = h0 + torch.expm1(h0) * 0.01
        return [h0, h1], self.head(torch.tanh(h1))

    def forward(self, x):
        return self.states(x)[1]


def test_a_stream_overflowed_in_a_few_samples_is_no_finite_median_and_fires_a():
    """The median over samples used to step over a tenth of them at inf: (a) passed at
    1.01×, (b) passed, and the verdict read "no walk-back in (a)(b)(d)"."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 4, generator=generator)
    x[-100:] *= 100.0
    y = torch.randint(0, 3, (1024,), generator=generator)
    model = _OverflowingSamples()
    assert torch.isinf(model.states(x)[0][1]).any()
    report = diagnose(model, x, y, states_fn=model.states, headline_acc=0.5, frozen_acc=0.3)
    assert report.hidden_norms[-1] == math.inf
    assert report.diagnostic("a").status == FIRED
    for id_ in ("b", "c"):
        assert report.diagnostic(id_).status == NOT_EVALUATED
        assert "NaN/Inf" in report.diagnostic(id_).reason
    assert report.verdict_text == "needs walk-back (a); (b)(c) not evaluated"
    assert json.loads(report.to_json())["hidden_norms"][-1] is None  # strict JSON


def test_an_infinite_reference_gradient_in_a_few_samples_never_passes_b():
    """Their cosines were already marked gradient_not_finite, while (b) passed on the median
    of the other samples."""
    assert median(torch.tensor([1.0, math.inf, 2.0, 3.0])) == math.inf
    assert math.isnan(median(torch.tensor([-math.inf, 1.0, math.inf])))
    sg = make_sg(n=1024, d=8, h_norms=(5.0, 5.0, 5.0), g_norms=(1e-3, 1e-3, 1e-3))
    sg.grads[-1][:100, 0] = math.inf
    report = evaluate_protocol(sg, headline_acc=0.5, frozen_acc=0.3)
    b = report.diagnostic("b")
    assert b.status == NOT_EVALUATED and "inf for some samples" in b.reason
    assert report.verdict_text != TRUSTWORTHY


def test_a_nan_layer_norm_is_shown_as_nan_never_as_not_measured():
    """The per-layer table wrote a NaN ‖g_0‖ as "—", the mark of a number not measured."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 4, generator=generator)
    x[-100:] *= 100.0
    y = torch.randint(0, 3, (1024,), generator=generator)
    model = _OverflowingSamples()
    report = diagnose(model, x, y, states_fn=model.states)
    assert math.isnan(report.grad_norms[0])
    for form in ("text", "md"):
        row = next(line for line in render(report, form).splitlines()
                   if "at some samples" in line)
        assert "NaN" in row and "‖g‖ NaN/Inf at some samples" in row
