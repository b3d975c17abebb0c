"""Protocol diagnostics are instances holding their options (issue #36), as rules are: the
protocol a config selects is built of them, every caller in creditaudit uses them, and a
diagnostic written for the older interface (classmethods taking the options) judges exactly
as its new-style twin — through the protocol, the conformance suite, the door and a run."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.protocol import (
    FIRED,
    PASSED,
    DepthUtility,
    DirectionStability,
    Evidence,
    Protocol,
    ProtocolDiagnostic,
    ReferenceValidity,
    ResidualStreamScale,
    Thresholds,
    protocol,
)
from creditaudit.protocol.diagnostics import GrowthOptions, StabilityOptions
from creditaudit.registry import DIAGNOSTICS, older_hook, reload_plugins
from creditaudit.run.trainer import train
from creditaudit.study.experiments.threshold_sensitivity import status_at
from creditaudit.testing import check_diagnostic, diagnostic_checks
from creditaudit.testing.diagnostics import evidence_cases
from plugin_support import GUESTS, PLUGINS

pytestmark = pytest.mark.usefixtures("single_thread")

OLDER = "h9_older_e"
TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "diagnostics.frozen_acc": 0.3, "run.progress": False}
# creditaudit's own message when a hook is called the older way (registry/component.py)
OLDER_SPELLING = r".*is the older spelling of"


@pytest.fixture
def twins(tmp_path, monkeypatch):
    """(e) of tests/plugin_pkg (new style) and its older-style twin (tests/guest_pkg),
    installed through their entry points."""
    site = PLUGINS.install(tmp_path / "site", only=["e"])
    GUESTS.install(site, only=[OLDER])
    monkeypatch.syspath_prepend(str(site))
    reload_plugins()
    yield DIAGNOSTICS.get("e"), DIAGNOSTICS.get(OLDER)
    monkeypatch.undo()
    PLUGINS.forget()
    GUESTS.forget()
    reload_plugins()


def _logits_cases() -> list[Evidence]:
    generator = torch.Generator().manual_seed(3)
    cases = [Evidence([], [], logits=torch.randn(64, 4, generator=generator) * scale)
             for scale in (0.5, 4.0, 40.0)]
    nan = torch.full((8, 4), float("nan"))
    return [*cases, Evidence([], [], logits=nan), *evidence_cases().values()]


def _same(result, twin) -> dict:
    """A result as its twin would state it (only the id differs)."""
    return {**dataclasses.asdict(result), "id": twin.name}


def test_the_protocol_is_built_of_instances_holding_the_configs_options():
    config = RunConfig().replace(**{"diagnostics.a.growth": 10.0,
                                    "diagnostics.c.stability": 0.5})
    built = Protocol.from_config(config.diagnostics)
    assert [type(d) for d in built.diagnostics] == [ResidualStreamScale, ReferenceValidity,
                                                     DirectionStability, DepthUtility]
    a, _, c, _ = built.diagnostics
    assert a.options is config.diagnostics.a and c.options is config.diagnostics.c
    assert (a.limit(), c.limit()) == (10.0, 0.5)
    assert built.options["a"] is a.options  # the older view of the same options
    assert repr(a) == "ResidualStreamScale(growth=10.0)"
    assert all(isinstance(d, ProtocolDiagnostic) for d in protocol())
    assert [d.limit() for d in protocol()] == [50.0, 1e-7, 0.30, 2.0]
    chosen = protocol(["c", "a"], {"a": GrowthOptions(growth=3.0)})
    assert [d.name for d in chosen] == ["a", "c"]  # listing order
    assert chosen[0].limit() == 3.0 and chosen[1].options == StabilityOptions()
    default = Protocol.default(Thresholds(growth=7.0))
    assert default.diagnostic("a").limit() == 7.0
    assert default.thresholds() == Thresholds(growth=7.0)


def test_with_threshold_gives_another_instance_and_leaves_the_first_alone():
    c = DirectionStability(StabilityOptions(stability=0.3, stability_batches=4))
    moved = c.with_threshold(0.9)
    assert type(moved) is DirectionStability and moved is not c
    assert (c.limit(), moved.limit()) == (0.3, 0.9)
    assert moved.options.stability_batches == 4  # its other options kept
    assert (c.status_of(0.5), moved.status_of(0.5)) == (FIRED, PASSED)
    with pytest.warns(DeprecationWarning, match=r"with_threshold"):  # the older spelling
        options = DirectionStability.with_threshold(c.options, 0.9)
    assert options == moved.options


def test_the_protocol_and_a_run_call_no_hook_the_older_way(tmp_path):
    """Every caller in creditaudit uses instances: evaluating the protocol, threshold
    sensitivity's re-judging, the conformance suite and a tiny training run (protocol
    every epoch, (d) against a frozen accuracy) raise on creditaudit's older-spelling
    warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=OLDER_SPELLING, category=DeprecationWarning)
        for evidence in evidence_cases().values():
            Protocol.default().evaluate(evidence)
        stats = {"values": {"a": 60.0, "d": 1.0}, "statuses": {"a": FIRED, "d": FIRED}}
        assert status_at("a", stats, 100.0) == PASSED and status_at("d", stats) == FIRED
        for cls in DIAGNOSTICS.builtin_classes():
            check_diagnostic(cls)
        config = RunConfig().replace(**TINY, **{"run.out_dir": str(tmp_path)})
        record = train(config).record
    assert record.protocol.report is not None
    assert set(record.log[-1].protocol) == {"a", "b", "c", "d"}


def test_check_diagnostic_takes_a_class_or_an_instance_with_its_options():
    held = ResidualStreamScale(GrowthOptions(growth=10.0))
    checks = diagnostic_checks(held)
    assert all(check.cls is ResidualStreamScale for check in checks)
    assert all(check.args[0].options.growth == 10.0 for check in checks)
    assert diagnostic_checks(held, {"growth": 20.0})[0].args[0].limit() == 20.0
    assert diagnostic_checks(ResidualStreamScale)[0].args[0].limit() == 50.0
    check_diagnostic(held)
    check_diagnostic(DepthUtility(Thresholds(margin_pp=5.0)))


def test_an_older_style_diagnostic_judges_as_its_new_style_twin(twins):
    new, older = twins
    assert isinstance(older.__dict__["evaluate"], older_hook)
    for options in (new.Options(), new.Options(max_share=0.2, confidence=0.5),
                    new.Options(max_share=0.9, confidence=0.99)):
        mine, theirs = new(options), older(options)
        for evidence in _logits_cases():
            result = mine.evaluate(evidence)
            assert dataclasses.asdict(theirs.evaluate(evidence)) == _same(result, older)
            with pytest.warns(DeprecationWarning):  # its own calls of the base's helpers
                assert dataclasses.asdict(older.evaluate(evidence, options)) == \
                    _same(result, older)
            with pytest.warns(DeprecationWarning, match=r"SoftmaxSaturation\(options\)"):
                assert new.evaluate(evidence, options) == result  # new, called the old way
            if result.value is not None:
                with pytest.warns(DeprecationWarning):
                    assert older.fires(result.value, options) == mine.fires(result.value)
                    assert older.limit(options) == mine.limit()
                    assert older.status_of(result.value, options) == \
                        mine.status_of(result.value)
                    assert older.judge(result.value, options, "r").status == result.status
    check_diagnostic(older)
    check_diagnostic(older(older.Options(max_share=0.2)))


def test_an_older_style_diagnostic_passes_the_door_and_records_as_its_twin(twins, tmp_path):
    """Both twins in one run, with the same options: the door admits the older one with its
    checks, and the record holds the same result for each."""
    config = RunConfig().replace(**TINY, **{
        "run.out_dir": str(tmp_path), "diagnostics.protocol": ["a", "b", "c", "d", "e", OLDER],
        "diagnostics.e.confidence": 0.3, f"diagnostics.{OLDER}.confidence": 0.3})
    run = train(config)
    stored = run.record.protocol.report["diagnostics"]
    assert {**stored[OLDER], "id": "e"} == stored["e"]
    assert stored["e"]["status"] in (FIRED, PASSED)
    components = run.record.environment["components"]
    admitted = next(c for c in components["diagnostics"] if c["name"] == OLDER)
    assert admitted["origin"].startswith("creditaudit-guests==")
    assert "threshold_decides_the_status" in admitted["checks"]


def test_a_diagnostic_names_its_options_once_as_its_bases_parameter():
    class Named(ProtocolDiagnostic[GrowthOptions]):
        name, label, statistic, hint, threshold = "named", "N", "s", "h", "growth"

        def evaluate(self, evidence):
            return self.judge(1.0, "one")

    assert Named.Options is GrowthOptions and Named().options == GrowthOptions()
    DIAGNOSTICS.validate(Named, "test")

    class Twice(ProtocolDiagnostic[GrowthOptions]):
        name, label, statistic, hint, threshold = "twice", "T", "s", "h", "growth"
        Options = StabilityOptions

    with pytest.raises(ConfigError, match=r"^test \(twice\) sets Options = StabilityOptions "
                                          r"but its base is parameterised by GrowthOptions"):
        DIAGNOSTICS.validate(Twice, "test")
