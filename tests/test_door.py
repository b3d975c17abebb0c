"""Guests at the door: the first time a command uses a plugin (rule, architecture, dataset,
diagnostic) or a ``module`` factory from outside creditaudit, the conformance checks that
catch a lie run on a tiny input; a liar is refused in one line naming it, its distribution
and the check, before anything trains. A pass is remembered per guest identity in a signed
cache (once per machine), the record lists the checks each guest passed, and built-ins are
never checked at run time (the test suite checks them).
"""

from __future__ import annotations

import json
import re

import pytest

from creditaudit.errors import GuestError
from creditaudit.files.cache import cache_dir
from creditaudit.run import door
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train
from creditaudit.testing.common import Check
from door_support import (
    FACTORIES,
    ORIGIN,
    cli_args,
    error_line,
    guests,
    image_run,
    site_with,
    tiny_config,
)
from integrity_support import write_idx_dataset
from plugin_support import cli

# (entry point, what it is, the settings that use it, the check it fails, a word of why)
LIARS = [
    ("door-twelve-logits", "architecture", {"model.arch": "door-twelve-logits"},
     "builds_a_contract_model", "n_classes=12"),
    ("door-hidden-ln", "architecture", {"model.arch": "door-hidden-ln"},
     "terminal_ln_is_what_the_readout_does", "hides a terminal LayerNorm"),
    ("door-mlp-head", "architecture", {"model.arch": "door-mlp-head"},
     "readout_is_a_linear_head", "hides layers the blocks do not declare"),
    ("door-nan-features", "dataset", {"data.name": "door-nan-features"},
     "loads_what_it_declares", "NaN or infinite values"),
    ("door-shifting", "dataset", {"data.name": "door-shifting"},
     "load_is_deterministic_and_leaves_global_rngs_untouched", "two loads"),
    ("door-readout-liar", "credit rule", {"method.name": "door-readout-liar"},
     "blocks_train_on_the_reported_credit[resmlp]", "does not train the blocks"),
    ("door_nan", "protocol diagnostic",
     {"diagnostics.protocol": ["a", "b", "c", "d", "door_nan"]},
     "results_are_its_own_and_consistent", "NaN"),
]
NEEDS = {"door-twelve-logits": ["door-mixture"], "door-hidden-ln": ["door-mixture"],
         "door-mlp-head": ["door-mixture"],
         "door-readout-liar": ["door-mixture"], "door_nan": ["door-mixture"]}


@pytest.mark.parametrize("name,noun,settings,check,why", LIARS, ids=[c[0] for c in LIARS])
def test_a_liar_is_refused_at_the_door_by_the_command_line(tmp_path, name, noun, settings,
                                                             check, why):
    site = site_with(tmp_path, name, *NEEDS.get(name, []))
    out = tmp_path / "runs"
    done = cli(site, "train", *cli_args(out, **settings), cwd=tmp_path)
    line = error_line(done)
    assert line.startswith(f"creditaudit: error: {noun} plugin {name!r} ({ORIGIN}) fails the "
                           f"conformance check {check}: "), line
    assert why in line
    assert not list(out.glob("*/record.json"))  # nothing trained, nothing recorded


@pytest.mark.parametrize("name,noun,settings,check,why", LIARS, ids=[c[0] for c in LIARS])
def test_a_liar_is_refused_at_the_door_by_the_python_api(tmp_path, name, noun, settings,
                                                           check, why):
    with guests(tmp_path / "site", name, *NEEDS.get(name, [])):
        config = tiny_config(tmp_path / "runs", **settings)
        with pytest.raises(GuestError, match=re.escape(f"the conformance check {check}:")
                           ) as err:
            plan_run(config)
    assert str(err.value).startswith(f"{noun} plugin {name!r} ({ORIGIN})")
    assert why in str(err.value) and "\n" not in str(err.value)


def test_a_factory_whose_declared_terminal_ln_is_false_is_refused(tmp_path):
    """model.terminal_ln=false on a network whose head normalises h_L: (b) would name the
    wrong cause. adapt() trusts a declaration; the door probes it."""
    data = write_idx_dataset(tmp_path / "mnist")
    done = cli(site_with(tmp_path), "train", "--arch", f"module:{FACTORIES}:ImageNet",
               *cli_args(tmp_path / "runs", **image_run(data, **{
                   "model.args.head_ln": True, "model.terminal_ln": False})),
               cwd=tmp_path)
    line = error_line(done)
    # adapt() itself refuses a declaration its probe contradicts, so the door's build check
    # is the first to fail (its own terminal-LN check words it "hides a terminal LayerNorm")
    assert f"model factory '{FACTORIES}:ImageNet' fails the conformance check " in line
    assert ("terminal_ln=False, but the probe finds that ImageNet's readout normalises h_L"
            in line or "hides a terminal LayerNorm" in line)


def _count_checks(monkeypatch):
    runs = []
    original = Check.run

    def counted(self):
        runs.append(self.id)
        return original(self)

    monkeypatch.setattr(Check, "run", counted)
    return runs


def test_a_pass_is_remembered_per_machine_in_a_signed_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CREDITAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(door, "_MEMORY", {})
    runs = _count_checks(monkeypatch)
    with guests(tmp_path / "site", "door-mixture", "door-step-raises"):
        config = tiny_config(tmp_path / "runs", **{"method.name": "door-step-raises"})
        first = plan_run(config)
        assert runs and {r.split("[")[0] for r in runs} >= {"loads_what_it_declares",
                                                            "credits_have_no_side_effects"}
        runs.clear()
        monkeypatch.setattr(door, "_MEMORY", {})  # a new process: only the file remembers
        second = plan_run(config)
        assert runs == []
        assert second.code.to_dict() == first.code.to_dict()
        # An entry edited without the machine's key does not verify: checked again.
        path = cache_dir() / door.DOOR_CACHE
        cache = json.loads(path.read_text())
        for entry in cache.values():
            entry["checks"] = entry["checks"][:1]
        path.write_text(json.dumps(cache))
        monkeypatch.setattr(door, "_MEMORY", {})
        plan_run(config)
        assert runs
    assert first.code.data.checks and first.code.method.checks


def test_a_pass_is_found_for_an_option_of_minus_zero(tmp_path, monkeypatch):
    """A diagnostic's option -0.0 is its option 0.0 (one value, as in run ids): the pass
    remembered for one is the other's, not a second run of the checks in one sweep."""
    monkeypatch.setenv("CREDITAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(door, "_MEMORY", {})
    runs = _count_checks(monkeypatch)
    with guests(tmp_path / "site", "door-mixture", "door_raises"):
        protocol = {"diagnostics.protocol": ["a", "b", "c", "d", "door_raises"]}
        plan_run(tiny_config(tmp_path / "runs", **protocol,
                             **{"diagnostics.door_raises.limit": 0.0}))
        assert runs
        runs.clear()
        plan_run(tiny_config(tmp_path / "runs", **protocol, **{
            "diagnostics.door_raises.limit": -0.0, "run.seed": 7}))
        assert runs == []


def test_the_record_lists_the_checks_each_guest_passed(tmp_path):
    with guests(tmp_path / "site", "door-mixture"):
        record = train(tiny_config(tmp_path / "runs")).record
    components = record.environment["components"]
    data = components["data"]
    assert data["origin"] == ORIGIN and len(data["code_digest"]) == 64
    assert "loads_what_it_declares" in data["checks"]
    assert "load_is_deterministic_and_leaves_global_rngs_untouched" in data["checks"]
    # The built-in rule, architecture and diagnostics: checked by the test suite, not here.
    for part in (components["method"], components["model"], *components["diagnostics"]):
        assert "checks" not in part and "code_digest" not in part


def test_builtins_are_not_checked_at_run_time(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the door ran for a built-in")

    monkeypatch.setattr(door, "admit", refuse)
    plan = plan_run(tiny_config(tmp_path / "runs", **{"data.name": "synthetic"}))
    assert "checks" not in json.dumps(plan.code.to_dict())



def test_the_refusal_the_docs_show_is_the_one_the_door_gives(tmp_path):
    from docs_support import doc_blocks

    shown = next(b.text for b in doc_blocks() if b.doc == "docs/extending.md"
                 and b.lang == "text" and "fails the conformance check" in b.text).strip()
    shown = shown.removeprefix("creditaudit: error: ").removesuffix("; …")
    shown = shown.replace("'my-mlp' (my-plugins==0.1.0)", f"'door-hidden-ln' ({ORIGIN})")
    with guests(tmp_path / "site", "door-hidden-ln", "door-mixture"), \
            pytest.raises(GuestError) as err:
        plan_run(tiny_config(tmp_path / "runs", **{"model.arch": "door-hidden-ln"}))
    assert str(err.value).startswith(shown), (str(err.value), shown)


def test_a_rule_is_checked_on_the_tiny_version_of_the_runs_own_architecture(tmp_path):
    """A plugin rule honest on flat states but lying on a ViT's tokens passes the door of a
    ResidualMLP run and is refused at the door of a ViT-Mini run, the check naming [vit]."""
    with guests(tmp_path / "site", "door-token-liar", "door-mixture"):
        plan_run(tiny_config(tmp_path / "runs", **{"method.name": "door-token-liar"}))
        vit = tiny_config(tmp_path / "runs", **{
            "method.name": "door-token-liar", "model.arch": "vit", "model.heads": 2,
            "data.name": "synthetic", "data.in_dim": 3072})
        with pytest.raises(GuestError, match=re.escape(
                "the conformance check blocks_train_on_the_reported_credit[vit]:")):
            plan_run(vit)


def test_a_rule_on_a_plugin_architecture_is_checked_on_states_of_its_layout(tmp_path):
    """A plugin rule honest on flat states but lying on token states is refused at the door
    of a run on a plugin architecture with token states (no tiny version of its own): it is
    checked on the tiny architecture of the built model's layout, ViT-Mini's."""
    with guests(tmp_path / "site", "door-token-liar", "door-own-vit"):
        vit = tiny_config(tmp_path / "runs", **{
            "method.name": "door-token-liar", "model.arch": "door-own-vit", "model.heads": 2,
            "data.name": "synthetic", "data.in_dim": 3072})
        with pytest.raises(GuestError, match=re.escape(
                "the conformance check blocks_train_on_the_reported_credit[vit]:")):
            plan_run(vit)


def test_a_recorders_plugin_rule_is_checked_on_states_of_its_models_layout(tmp_path):
    """A Recorder's plugin rule bound to a ViT-Mini is checked on token states too."""
    import torch

    from creditaudit import Recorder, rule
    from creditaudit.models import ViTMini

    with guests(tmp_path / "site", "door-token-liar"):
        torch.manual_seed(0)
        model = ViTMini(n_classes=4, d=8, n_blocks=2, heads=2, mlp_ratio=2, patch=4,
                        image_shape=(2, 8, 8))
        x = torch.randn(16, 2, 8, 8, generator=torch.Generator().manual_seed(1))
        y = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(2))
        with pytest.raises(GuestError, match=re.escape(
                "the conformance check blocks_train_on_the_reported_credit[vit]:")):
            Recorder(rule("door-token-liar", model), x, y, out=tmp_path / "runs",
                     progress=False)


def test_a_recorders_plugin_rule_is_checked_on_every_layout_of_an_adapted_models_states(
        tmp_path):
    """An adapted model whose token states are pooled into a vector state has no one layout
    (describe().layout is None): its plugin rule was checked on flat states and an adapted
    ResNet's only, so a rule lying on token states was admitted. It is checked on the tiny
    architecture of each layout its states have: ViT-Mini's for the tokens."""
    import torch
    from torch import nn

    from creditaudit import Recorder, adapt, rule

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.mix = nn.Linear(4, 8), nn.Linear(8, 8)
            self.pool, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = torch.tanh(self.mix(self.embed(x)))  # (B, T, 8) tokens
            return self.head(torch.tanh(self.pool(h.mean(dim=1))))  # (B, 8) vector

    torch.manual_seed(0)
    x = torch.randn(16, 5, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))
    model = adapt(Pooled(), ["embed", "mix", "pool"], example=x[:4])
    assert model.describe().layout is None
    with guests(tmp_path / "site", "door-token-state-liar"), pytest.raises(
            GuestError, match=re.escape(
                "the conformance check blocks_train_on_the_reported_credit[vit]:")):
        Recorder(rule("door-token-state-liar", model), x, y, out=tmp_path / "runs",
                 progress=False)
