"""Plugin rules wrong only where the door did not look (tests/guest_pkg's opts_rules): under
an option of their own the run sets, for a batch of one sample, in their step's use of
torch's global random stream, from their second step on, and at the embedding. The suite
catches each, and the door refuses each in one line naming the plugin, before anything is
recorded."""

from __future__ import annotations

import pytest
import torch

from creditaudit import Recorder, adapt, rule
from creditaudit.errors import ConfigError, GuestError
from creditaudit.methods.registry import rule_class
from creditaudit.run.trainer import train
from creditaudit.testing import check_rule, rule_checks
from door_support import ORIGIN, Net, guests, tiny_config

pytestmark = pytest.mark.usefixtures("single_thread")

SHARED = "opts-shared-feedback"


def _fails(name: str, check: str, says: str, **options: object) -> None:
    """``name``'s ``check`` on the tiny ResidualMLP fails, saying ``says``."""
    given = {"options": options} if options else {}
    checks = [c for c in rule_checks(rule_class(name), ("resmlp",), **given)
              if c.__name__ == check]
    assert len(checks) == 1
    with pytest.raises(AssertionError) as err:
        checks[0]()
    assert says in str(err.value)


def test_a_rule_wrong_under_one_of_its_options_fails_the_suite_given_it(tmp_path):
    """check_rule had no options: the rule passed under its defaults, the only ones any
    caller (the door included) could check it with."""
    with guests(tmp_path / "site", SHARED):
        cls = rule_class(SHARED)
        check_rule(cls, archs=("resmlp",))
        _fails(SHARED, "local_update_is_the_surrogate_gradient",
               "the step's gradient differs from the surrogate's", share=True)
        with pytest.raises(ConfigError, match="has no option 'shared'"):
            rule_checks(cls, options={"shared": True})


def test_a_rule_wrong_under_its_runs_options_is_refused_at_the_door(tmp_path):
    """It passed the door under its defaults and recorded credits that did not train the
    network (deep cos −0.045 where its step's own credit gave +0.037)."""
    out = tmp_path / "runs"
    with guests(tmp_path / "site", SHARED, "door-mixture"):
        with pytest.raises(GuestError) as err:
            train(tiny_config(out, **{"method.name": SHARED, "method.share": True}))
        assert not list(out.rglob("record.json"))
        line = str(err.value)
        assert line.startswith(
            f"credit rule plugin '{SHARED}' ({ORIGIN}) fails the conformance check "
            "local_update_is_the_surrogate_gradient[resmlp] under method.share=true: "), line
        assert "\n" not in line
        done = train(tiny_config(out, **{"method.name": SHARED}))  # its default: DFA
        assert done.record.status == "completed"


def test_a_recorders_plugin_rule_is_checked_under_its_options(tmp_path):
    with guests(tmp_path / "site", SHARED):
        torch.manual_seed(0)
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
        y = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2))
        model = adapt(Net(), ["stem", "b1"], example=x[:8])
        with pytest.raises(GuestError, match=f"'{SHARED}' .* under method.share=true"):
            Recorder(rule(SHARED, model, share=True), x, y, out=tmp_path / "runs",
                     progress=False)


# (plugin, the check it fails, what the failure says)
MUTANTS = [
    ("opts-squeezed", "credits_are_detached_and_shaped_like_the_states",
     "for a batch of one sample credit 0 has shape (8,), its state (1, 8)"),
    ("opts-reseeds", "step_reports_its_batch", "train_step() moved or reseeded torch's global RNG"),
    ("opts-second-step-flips", "blocks_train_on_the_reported_credit",
     "blocks.0.w2.weight differs from Σ_b a ⊗ u by 2.00e+00 (rel.)"),
    ("opts-negated-embedding", "embedding_trains_on_the_reported_credit",
     "the training step gives the embedding's embed.weight another gradient than the "
     "credit it reports for h_0 implies (by 2.00e+00 rel.)"),
]


@pytest.mark.parametrize("name,check,says", MUTANTS, ids=[case[0] for case in MUTANTS])
def test_the_suite_catches_a_rule_wrong_beside_its_batch(tmp_path, name, check, says):
    with guests(tmp_path / "site", name):
        _fails(name, check, says)


@pytest.mark.parametrize("name,check,says", MUTANTS, ids=[case[0] for case in MUTANTS])
def test_a_rule_wrong_beside_its_batch_is_refused_at_the_door(tmp_path, name, check, says):
    """The squeezed rule passed the door and then stopped a run whose evaluation set left a
    last chunk of one sample with "a state of shape (16,) is not supported", naming no one."""
    out = tmp_path / "runs"
    with guests(tmp_path / "site", name, "door-mixture"), pytest.raises(GuestError) as err:
        train(tiny_config(out, **{"method.name": name}))
    line = str(err.value)
    assert line.startswith(f"credit rule plugin '{name}' ({ORIGIN}) fails the conformance "
                           f"check {check}[resmlp]: "), line
    assert says in line and "\n" not in line
    assert not list(out.rglob("record.json"))
