"""A protocol of some of the diagnostics (``diagnostics.protocol = ["b"]``) is selected the
same way by ``--set``, by a config file and in Python: ``replace()`` keeps only the option
tables of the diagnostics the new protocol lists (as selecting another rule keeps only its
options), where it used to refuse the dropped ones as unknown keys (``unknown key
diagnostics.a``, a key the user never set). An empty protocol names no diagnostic and is
refused in one line (it used to run the default four while the record said ``[]``)."""

from __future__ import annotations

import logging

import pytest

from creditaudit.cli import main
from creditaudit.config import RunConfig, config_from_dict, load_config
from creditaudit.errors import ConfigError
from creditaudit.protocol import Protocol
from creditaudit.records import load_record
from creditaudit.sweep.grid import expand_grid
from integrity_support import toml_of

pytestmark = pytest.mark.usefixtures("single_thread")

SUBSETS = [["b"], ["a", "b", "c"], ["d", "a"]]
TINY = ["--method", "dfa", "--width", "16", "--blocks", "2", "--set", "data.n_train=256",
        "--set", "data.n_test=256", "--set", "diagnostics.eval_samples=128",
        "--set", "diagnostics.end_of_run=false", "--epochs", "1", "-q"]


def _selected(config: RunConfig) -> list[str]:
    return [d.name for d in Protocol.from_config(config.diagnostics).diagnostics]


@pytest.mark.parametrize("names", SUBSETS, ids=lambda n: "".join(n))
def test_a_subset_by_replace_equals_the_same_subset_by_file(tmp_path, names):
    by_replace = RunConfig().replace(**{"diagnostics.protocol": names})
    path = tmp_path / "c.toml"
    path.write_text(toml_of({"diagnostics.protocol": names}))
    by_file = load_config(path)
    assert by_replace == by_file
    assert _selected(by_replace) == sorted(names)
    assert {"a", "b", "c", "d"} - set(names) == {
        t for t in "abcd" if not hasattr(by_replace.diagnostics, t)}
    # from one subset to another, and back to the default four
    other = by_replace.replace(**{"diagnostics.protocol": ["c"]})
    assert _selected(other) == ["c"]
    assert _selected(other.replace(**{"diagnostics.protocol": None})) == ["a", "b", "c", "d"]


def test_a_subset_keeps_the_options_of_the_diagnostics_it_lists(caplog):
    tuned = RunConfig().replace(**{"diagnostics.a.growth": 10.0,
                                   "diagnostics.b.grad_floor": 1e-6})
    with caplog.at_level(logging.WARNING):
        kept = tuned.replace(**{"diagnostics.protocol": ["a", "b"]})
    assert (kept.diagnostics.a.growth, kept.diagnostics.b.grad_floor) == (10.0, 1e-6)
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        only_b = tuned.replace(**{"diagnostics.protocol": ["b"]})
    assert only_b.diagnostics.b.grad_floor == 1e-6 and not hasattr(only_b.diagnostics, "a")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("warning: diagnostics.a={'growth': 10.0}") and "left out" in warning


def test_options_of_a_diagnostic_the_protocol_leaves_out_are_refused_naming_the_fix(tmp_path):
    """Set together with the protocol (or in one file), they are the user's own mistake."""
    path = tmp_path / "c.toml"
    path.write_text('[diagnostics]\nprotocol = ["b"]\n[diagnostics.a]\ngrowth = 10.0\n')
    for make in (lambda: load_config(path),
                 lambda: RunConfig().replace(**{"diagnostics.protocol": ["b"],
                                                "diagnostics.a.growth": 10.0})):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == (
            'diagnostics.a holds the options of diagnostic (a), which diagnostics.protocol '
            'does not list: add "a" to diagnostics.protocol or drop [diagnostics.a]')


def test_a_sweep_grid_over_subsets_and_a_base_table_it_leaves_out():
    configs = expand_grid(RunConfig(), {"diagnostics.protocol": [["b"], ["a", "c"]]})
    assert [_selected(c) for c in configs] == [["b"], ["a", "c"]]
    with pytest.raises(ConfigError, match=r"^\[base\] diagnostics.a=.* does not list"):
        expand_grid({"diagnostics": {"a": {"growth": 9.0}}},
                    {"diagnostics.protocol": [["b"], ["a", "c"]]})


EMPTY = ('diagnostics.protocol=[] names no diagnostic: name at least one, e.g. ["a", "b"]; '
         'leave the key out for the default 4 (a b c d)')


def test_an_empty_protocol_is_refused_by_replace_and_by_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[diagnostics]\nprotocol = []\n")
    for make in (lambda: load_config(path),
                 lambda: RunConfig().replace(**{"diagnostics.protocol": []}),
                 lambda: RunConfig().replace(**{"diagnostics.protocol": ["b"]}).replace(
                     **{"diagnostics.protocol": []})):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == EMPTY


def test_a_record_written_with_an_empty_protocol_still_reads():
    """Runs recorded before the refusal ran the default four; their record stays readable."""
    config = config_from_dict({"diagnostics": {"protocol": []}}, strict=False)
    assert _selected(config) == ["a", "b", "c", "d"]


def test_the_cli_trains_a_subset_and_refuses_an_empty_one(tmp_path, capsys):
    out = str(tmp_path / "runs")
    code = main(["train", *TINY, "--out", out, "--set", 'diagnostics.protocol=["b"]'])
    assert code == 0, capsys.readouterr().err
    (folder,) = (tmp_path / "runs").iterdir()
    record = load_record(folder)
    assert record.config.diagnostics.protocol == ["b"]
    assert [sorted(e.protocol) for e in record.log if e.protocol] == [["b"]]
    capsys.readouterr()
    code = main(["train", *TINY, "--out", out, "--set", "diagnostics.protocol=[]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"creditaudit: error: {EMPTY}"


def test_an_empty_protocol_is_refused_in_python():
    """``Protocol.of([])`` judged nothing and called the run trustworthy (``diagnose(…,
    protocol=Protocol.of([]))`` said so of any model), where the config's ``protocol = []``
    is refused."""
    for make in (lambda: Protocol.of([]), lambda: Protocol(())):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == (
            'a protocol of no diagnostic judges nothing (its verdict would be trustworthy): '
            'name at least one, e.g. Protocol.of(["a", "b"]), or take Protocol.default()')
