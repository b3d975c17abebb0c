"""Audit rebuilds a run with the code it trained with, or not at all: each guest's code (a
``module`` factory's, a plugin's) is compared with the digest its record keeps, and an edit
since training is refused in one line naming the guest; a record from before digests is
audited with a warning, its guests checked at the door as training checks them.
"""

from __future__ import annotations

import json
import logging

import pytest

from creditaudit.audit import audit_run, load_run
from creditaudit.errors import GuestError, RunRecordError
from creditaudit.guests import make_guest
from creditaudit.records import RECORD_FILE, RunRecord, load_record
from creditaudit.registry import reload_plugins
from creditaudit.run.folder import RunResult
from creditaudit.run.resume import check_same_code
from creditaudit.run.trainer import train
from door_support import cli_args, guests, image_run, tiny_config
from integrity_support import as_written, write_idx_dataset
from plugin_support import GUESTS, cli

NET = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = nn.Linear(d, d)

    def forward(self, h):
        return h + torch.tanh(self.linear(h))


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.b1, self.b2, self.head = Block(4), Block(4), nn.Linear(4, n_classes)

    def forward(self, x):
        return self.head(self.b2(self.b1(self.stem(x))))


def make(n_classes=10):
    return Net(n_classes)
'''


def _one_line_error(result) -> str:
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert err[-1].startswith("creditaudit: error:"), result.stderr
    return err[-1]


def _strip_digests(run_dir, *, components: bool = False) -> None:
    """Make the run's record look written before code digests: without ``code_digest``
    (and ``checks``) in its code block, or (``components``) without the block at all."""
    path = run_dir / RECORD_FILE
    raw = json.loads(path.read_text())
    block = raw["environment"]["components"]
    if components:
        del raw["environment"]["components"]
    else:
        for entry in [block["method"], block["model"], block["data"],
                      *block.get("diagnostics", [])]:
            entry.pop("code_digest", None)
            entry.pop("checks", None)
    path.write_text(as_written(raw, digest=False))


def test_an_edited_factory_is_refused_by_audit_and_the_restored_one_audited(tmp_path):
    """The probe's case: tanh → relu in the factory's file after training. Audit used to
    load the tanh run's weights into the relu network and report its numbers as the
    run's."""
    (tmp_path / "mynet.py").write_text(NET)
    data = write_idx_dataset(tmp_path / "mnist")
    trained = cli(None, "train", "--arch", "module:mynet:make",
                  *cli_args(tmp_path / "runs", **image_run(data)), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    (run_dir,) = (p.parent for p in (tmp_path / "runs").glob(f"*/{RECORD_FILE}"))
    audit = ["audit", str(run_dir), "--no-metrics", "--format", "json", "-q"]
    before = cli(None, *audit, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    (tmp_path / "mynet.py").write_text(NET.replace("torch.tanh", "torch.relu"))
    edited = cli(None, *audit, cwd=tmp_path)
    line = _one_line_error(edited)
    assert "model factory 'mynet:make'" in line and run_dir.name in line
    assert "restore the code the run was trained with" in line and "train it again" in line
    assert edited.stdout == "[]\n"  # no report of the relu network: none audited
    (tmp_path / "mynet.py").write_text(NET)  # the code it trained with: audited as before
    restored = cli(None, *audit, cwd=tmp_path)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout) == json.loads(before.stdout)


@pytest.fixture
def plugin_run(tmp_path):
    """A finished tiny run of the plugin rule ``fx2-bp`` on the plugin data door-mixture,
    the plugins installed in this process; yields (site, run folder)."""
    with guests(tmp_path / "site", "fx2-bp", "door-mixture") as site:
        result = train(tiny_config(tmp_path / "runs", **{"method.name": "fx2-bp"}))
        assert result.status == "completed"
        yield site, result.run_dir


def _edit_rule(site, old: str, new: str) -> None:
    """Edit the installed rule's module, as a reinstall under the same version does."""
    module = site / GUESTS.module / "fx2_rules.py"
    source = module.read_text()
    assert old in source
    module.write_text(source.replace(old, new))
    GUESTS.forget()
    reload_plugins()


def test_an_edited_plugin_rule_is_refused_by_audit_and_by_a_rebuilt_result(plugin_run):
    site, run_dir = plugin_run
    report = audit_run(run_dir, metrics=False)  # unchanged: audited
    assert report.metadata["run_id"] == run_dir.name
    _edit_rule(site, 'label = "plain BP"', 'label = "plain BP, reinstalled"')
    for rebuild in (lambda: audit_run(run_dir, metrics=False), lambda: load_run(run_dir),
                    lambda: RunResult(run_dir, load_record(run_dir)).rule):
        with pytest.raises(RunRecordError, match=r"other code of credit rule plugin "
                                                 r"'fx2-bp' \(creditaudit-guests==0\.1\.0\)"
                                                 r".*restore the code the run was trained"):
            rebuild()


def test_a_plugin_rule_whose_load_state_dict_fails_is_named_not_its_checkpoint(plugin_run,
                                                                             monkeypatch):
    """A plugin rule's load_state_dict that raised on its own run's checkpoint (whose state
    fits the rule's, and is of this run) was reported as "checkpoint … cannot be loaded into
    this run (RuntimeError: …); it belongs to another run: start this one again with
    --force": the file blamed, and advice that throws the run away. The plugin is named."""
    from creditaudit.registry import RULES

    _, run_dir = plugin_run

    def broken(self, state):
        raise RuntimeError("no such buffer")

    monkeypatch.setattr(RULES.find("fx2-bp"), "load_state_dict", broken)
    with pytest.raises(GuestError, match=r"^credit rule plugin 'fx2-bp' "
                                         r"\(creditaudit-guests==0\.1\.0\) raised RuntimeError: "
                                         r"no such buffer") as caught:
        audit_run(run_dir, metrics=False)
    assert "--force" not in str(caught.value) and "checkpoint" not in str(caught.value)


@pytest.mark.parametrize("components", [False, True], ids=["no-digests", "no-code-block"])
def test_a_record_from_before_code_digests_is_audited_with_a_warning(plugin_run, caplog,
                                                                     components):
    site, run_dir = plugin_run
    expected = audit_run(run_dir, metrics=False)
    _strip_digests(run_dir, components=components)
    with caplog.at_level(logging.WARNING, logger="creditaudit.run.resume"):
        report = audit_run(run_dir, metrics=False)
    assert report.to_dict()["diagnostics"] == expected.to_dict()["diagnostics"]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "creditaudit.run.resume"]
    assert "credit rule plugin 'fx2-bp'" in warning and "dataset plugin 'door-mixture'" in warning
    assert "unchecked against the code the run trained with" in warning


def test_a_record_without_digests_still_sends_its_guests_through_the_door(plugin_run):
    """Audit runs the checks training ran: code that now fails them is refused even where
    the record cannot say whether it changed."""
    site, run_dir = plugin_run
    _strip_digests(run_dir)
    _edit_rule(site, 'label = "plain BP"', 'label = "plain BP"\n\n'
                                           '    def train_step(self, x, y, optimizer):\n'
                                           '        raise RuntimeError("edited")')
    with pytest.raises(GuestError, match="credit rule plugin 'fx2-bp'.*conformance check"):
        audit_run(run_dir, metrics=False)


def _record(components: dict) -> RunRecord:
    return RunRecord(run_id="x-run", environment={"components": components})


def test_check_same_code_reads_every_component_of_the_code_block(tmp_path):
    source = tmp_path / "diag.py"
    source.write_text("X = 1\n")
    guest = make_guest("diagnostic plugin 'e' (d==1)", tmp_path, [source])
    digest = guest.digest
    builtin = {"name": "bp", "origin": "creditaudit"}
    block = {"method": builtin, "model": builtin, "data": builtin,
             "diagnostics": [{"name": "a"}, {"name": "e", "code_digest": digest}]}
    check_same_code(_record(block), {"diagnostic:e": guest})  # the same code
    source.write_text("X = 2\n")
    with pytest.raises(RunRecordError, match="other code of diagnostic plugin 'e'"):
        check_same_code(_record(block), {"diagnostic:e": guest})
    # Guest code then, creditaudit's own now: not the code the run trained with either.
    with pytest.raises(RunRecordError, match="outside code for its diagnostic e"):
        check_same_code(_record(block), {})
    # A free-form environment that holds no digest is read as a record from before them.
    check_same_code(_record({"method": "bp", "diagnostics": ["e", None]}), {})



@pytest.mark.slow
def test_resume_after_the_factory_changed_names_the_run_of_the_old_code(tmp_path):
    """`train --resume` after an edit of the factory's file said "cannot resume: no run at
    …" (the run id covers the code), not that the run of this config had other code."""
    (tmp_path / "mynet.py").write_text(NET)
    data = write_idx_dataset(tmp_path / "mnist")
    argv = ["train", "--arch", "module:mynet:make",
            *cli_args(tmp_path / "runs", **image_run(data))]
    trained = cli(None, *argv, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    (run_dir,) = (p.parent for p in (tmp_path / "runs").glob(f"*/{RECORD_FILE}"))
    (tmp_path / "mynet.py").write_text(NET.replace("torch.tanh", "torch.relu"))
    line = _one_line_error(cli(None, *argv, "--resume", cwd=tmp_path))
    assert str(run_dir) in line and "other code of its model" in line
    assert "restore the code the run was trained with" in line


def test_a_run_whose_plugins_were_uninstalled_names_them_and_how_to_install(tmp_path):
    # The run's rule and data came from a plugin package since uninstalled: audit names the
    # package to install again (before: "not a known credit rule; choose one of bp, …",
    # advice no finished run can follow).
    with guests(tmp_path / "site", "fx2-bp", "door-mixture"):
        result = train(tiny_config(tmp_path / "runs", **{"method.name": "fx2-bp"}))
    assert result.status == "completed"
    with pytest.raises(RunRecordError) as err:
        audit_run(result.run_dir, metrics=False)
    message = str(err.value)
    assert "\n" not in message and result.run_dir.name in message
    assert "credit rule 'fx2-bp' of the plugin creditaudit-guests==0.1.0" in message
    assert "pip install 'creditaudit-guests==0.1.0'" in message and "choose one" not in message
