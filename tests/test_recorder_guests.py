"""A Recorder's plugin diagnostics (and plugin rule) are guests like a command's: checked at
the door before any file is written, and identified by content in the record and the run
id (``environment.components.diagnostics``: origin, code digest, the checks passed)."""

from __future__ import annotations

import pytest
import torch

from creditaudit import Recorder, adapt, rule
from creditaudit.errors import GuestError
from creditaudit.records import load_record
from creditaudit.registry import DIAGNOSTICS
from door_support import ORIGIN, Net, guests
from plugin_support import one_module_plugin

X = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2))


def recorder(out, diagnostic: str) -> Recorder:  # noqa: ANN001
    torch.manual_seed(0)
    model = adapt(Net(), ["stem", "b1"], example=X[:8])
    return Recorder(rule("dfa", model), X, Y, out=out, progress=False,
                    config={"diagnostics.protocol": ["a", "b", diagnostic]})


def test_a_recorders_plugin_diagnostic_is_recorded_by_its_code(tmp_path):
    with guests(tmp_path / "site", "h9_older_e"):
        rec = recorder(tmp_path / "runs", "h9_older_e")
        rec.epoch(0)
        rec.finish()
        guest = DIAGNOSTICS.guest("h9_older_e")
        assert guest is not None
        record = load_record(rec.run_dir / "record.json")
        entries = {d["name"]: d for d in record.environment["components"]["diagnostics"]}
        assert entries["h9_older_e"]["origin"] == ORIGIN
        assert entries["h9_older_e"]["code_digest"] == guest.digest
        assert entries["h9_older_e"]["checks"]
        assert "code_digest" not in entries["a"]


def test_a_recorders_plugin_diagnostic_that_fails_the_door_is_refused(tmp_path):
    with guests(tmp_path / "site", "door_nan"), \
            pytest.raises(GuestError, match="'door_nan'.*conformance check"):
        recorder(tmp_path / "runs", "door_nan")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


LIAR = '''
from creditaudit.methods import rule_class

BP = rule_class("bp")


class Liar(BP):
    """Backprop's step, but it reports twice the gradient as its credit."""

    name = "doubled-liar"
    label = "Doubled liar"
    adapted_models = True

    def credits(self, x, y):
        return [2 * c for c in super().credits(x, y)]
'''


def test_a_recorders_plugin_rule_that_fails_check_rule_is_refused(tmp_path):
    with one_module_plugin(tmp_path / "site", "creditaudit.rules",
                           "doubled-liar = doubled_liar:Liar", {"doubled_liar": LIAR}):
        model = adapt(Net(), ["stem", "b1"], example=X[:8])
        with pytest.raises(GuestError, match="'doubled-liar' .*conformance check"):
            Recorder(rule("doubled-liar", model), X, Y, out=tmp_path / "runs",
                     progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
