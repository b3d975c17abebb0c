"""A plugin rule that declares a stacked step is stacked like a built-in once the door has
run its conformance checks, ``stacked_step_is_the_rule_step`` among them (the stacked step
of two tiny runs equals each run's own train_step); one whose declared step is not its own
is refused at the door in one line naming it; one that declares that check a failure by
design trains alone. The guests are tests/guest_pkg's ``h5_rules``."""

from __future__ import annotations

import re

import pytest

from creditaudit.config import RunConfig
from creditaudit.errors import GuestError
from creditaudit.methods.stacked import STACKED_CHECK
from creditaudit.records import comparable
from creditaudit.run.plan import plan_run
from creditaudit.run.stacked import train_stacked
from creditaudit.run.trainer import train
from creditaudit.testing.rule_stacking import stacked_step_is_the_rule_step
from door_support import ORIGIN, cli_args, error_line, guests, site_with
from plugin_support import cli
from test_stacked import TINY, TOLERANCE, relative_gap

pytestmark = pytest.mark.usefixtures("single_thread")

GUESTS = ("h5-stacked-dfa", "h5-sign-dfa", "h5-waived-sign-dfa")


def configs(out, method):
    """Two tiny runs on the built-in teacher-student data that may share a stack (seed and
    λ differ)."""
    return [RunConfig().replace(**{**TINY, "run.out_dir": str(out), "method.name": method,
                                   "run.seed": seed, "method.penalty": penalty})
            for seed, penalty in ((1, 0.0), (2, 0.01))]


def test_the_check_is_the_one_stacking_names():
    assert stacked_step_is_the_rule_step.__name__ == STACKED_CHECK


def test_a_plugin_rule_that_passed_the_door_is_stacked_like_a_builtin(tmp_path, float64):
    with guests(tmp_path / "site", *GUESTS):
        alone = [train(c) for c in configs(tmp_path / "alone", "h5-stacked-dfa")]
        stacked = train_stacked(configs(tmp_path / "stacked", "h5-stacked-dfa"))
    for a, s in zip(alone, stacked, strict=True):
        assert s.status == a.status == "completed"
        assert s.record.environment["execution"]["stacked_runs"] == 2
        method = s.record.environment["components"]["method"]
        assert method["origin"] == ORIGIN and f"{STACKED_CHECK}[resmlp]" in method["checks"]
        assert relative_gap(comparable(a.record), comparable(s.record)) < TOLERANCE


def test_a_plugin_whose_declared_stacked_step_is_not_its_own_is_refused_at_the_door(
        tmp_path):
    with guests(tmp_path / "site", *GUESTS), pytest.raises(GuestError) as err:
        plan_run(configs(tmp_path / "runs", "h5-sign-dfa")[0])
    message = str(err.value)
    assert message.startswith(f"credit rule plugin 'h5-sign-dfa' ({ORIGIN}) fails the "
                              f"conformance check {STACKED_CHECK}[resmlp]: sign-feedback DFA "
                              "declares stacked_step 'projected', but its train_step updates")
    assert "\n" not in message and re.search(r"differs by \S+ \(rel\.\)", message)


def test_the_command_line_refuses_it_in_one_line(tmp_path):
    site = site_with(tmp_path, *GUESTS, "door-mixture")
    out = tmp_path / "runs"
    done = cli(site, "train", *cli_args(out, **{"method.name": "h5-sign-dfa"}), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: credit rule plugin 'h5-sign-dfa' ({ORIGIN}) "
                           f"fails the conformance check {STACKED_CHECK}[resmlp]: "), line
    assert not list(out.glob("*/record.json"))


def test_a_plugin_that_declares_its_stacked_step_failing_trains_alone(tmp_path, float64):
    with guests(tmp_path / "site", *GUESTS):
        results = train_stacked(configs(tmp_path / "runs", "h5-waived-sign-dfa"))
    for result in results:
        assert result.status == "completed"
        assert result.record.environment["execution"]["stacked_runs"] == 1
        method = result.record.environment["components"]["method"]
        assert f"{STACKED_CHECK}[resmlp]" not in method["checks"]
