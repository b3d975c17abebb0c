"""How config text is read: a file saved with a byte-order mark, a number given to a string
key."""

from __future__ import annotations

from pathlib import Path

import pytest

from creditaudit.caller import for_command_line
from creditaudit.config import (
    RunConfig,
    apply_overrides,
    config_to_toml,
    load_config,
    parse_override,
)
from creditaudit.errors import ConfigError
from creditaudit.records import load_config_file
from creditaudit.sweep import load_sweep
from sweep_files import write_tiny_sweep

BOM = "\ufeff".encode()


def test_a_config_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path):
    """Windows editors save UTF-8 with a BOM; it was "Invalid statement (at line 1,
    column 1)"."""
    config = RunConfig().replace(**{"method.name": "fa", "optim.epochs": 3})
    path = tmp_path / "config.toml"
    path.write_bytes(BOM + config_to_toml(config).encode())
    assert load_config(path) == config
    assert load_config_file(path) == config  # --config FILE reads it the same way


def test_a_sweep_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path):
    path = write_tiny_sweep(tmp_path / "s.toml", tmp_path / "runs",
                            '[grid]\n"method.name" = ["bp", "fa"]\n')
    path.write_bytes(BOM + path.read_bytes())
    assert len(load_sweep(path).configs()) == 2


@pytest.mark.parametrize("text, shown", [("2024", "2024"), ("true", "true")])
def test_a_number_for_a_string_key_says_how_to_quote_it(text: str, shown: str):
    """``--set run.out_dir=2024`` reads 2024 as a number: the refusal says how to give the
    folder name (as the command line spells it: a Python caller is told RunConfig.replace,
    test_caller_spelling)."""
    key, value = parse_override(f"run.out_dir={text}")
    with pytest.raises(ConfigError) as err, for_command_line():
        apply_overrides(RunConfig(), {key: value})
    message = str(err.value)
    assert message.startswith(f"run.out_dir must be a string, got {value!r}")
    assert f"""--set 'run.out_dir="{shown}"'""" in message
    assert f'out_dir = "{shown}" under [run]' in message
    quoted = dict([parse_override(f'run.out_dir="{shown}"')])
    assert apply_overrides(RunConfig(), quoted).run.out_dir == shown  # the advice works


def test_a_path_under_the_home_folder_is_the_home_folder(tmp_path: Path, monkeypatch):
    """``out_dir = "~/runs"`` in a config file (no shell expands it) made a folder named ``~``
    in the current folder, as did ``--set run.tensorboard=~/tb``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "c.toml"
    path.write_text('[run]\nout_dir = "~/runs"\n')
    assert load_config(path).run.out_dir == str(tmp_path / "runs")
    config = RunConfig().replace(**{"run.tensorboard": "~/tb"})
    assert config.run.tensorboard == str(tmp_path / "tb")


def test_a_record_given_as_config_keeps_a_non_finite_factory_argument(tmp_path: Path):
    """A record writes NaN as null plus a mark (strict JSON); ``--config record.json`` read
    the null, so the run's own record named another config (refused: "model.args.t is
    None") instead of the run that wrote it."""
    import math
    import shutil

    from creditaudit.records import load_record
    from creditaudit.records.files import save_record

    legacy = Path(__file__).parent / "legacy_records" / "run3_dfa.json"
    shutil.copyfile(legacy, tmp_path / "record.json")
    record = load_record(tmp_path / "record.json")
    record.config = record.config.replace(**{
        "model.arch": "module", "model.factory": "creditaudit.testing.zoo:resnet20",
        "model.args": {"t": math.nan, "n": 1}})
    save_record(tmp_path, record)
    assert "null" in (tmp_path / "record.json").read_text()  # strict JSON: NaN is marked
    args = load_config_file(tmp_path / "record.json").model.args
    assert args["n"] == 1 and math.isnan(args["t"])


def test_a_dotted_key_below_a_table_is_a_nested_table_as_in_toml(tmp_path):
    base = RunConfig().replace(**{"model.arch": "module",
                                  "model.factory": "creditaudit.testing.zoo:resnet20"})
    flags = apply_overrides(base, {"model.args.t.u": 3, "model.args.t.v": 4,
                                   "diagnostics.a.growth": 9})
    assert flags.model.args == {"t": {"u": 3, "v": 4}}
    toml = tmp_path / "c.toml"
    toml.write_text('[model]\narch = "module"\nfactory = "creditaudit.testing.zoo:resnet20"\n'
                    '[model.args]\nt.u = 3\nt.v = 4\n[diagnostics.a]\ngrowth = 9\n')
    assert load_config(toml).model.args == flags.model.args


def test_a_file_that_sets_nothing_is_refused_and_one_key_is_enough(tmp_path: Path):
    """An empty config or sweep file (or one of comments only) was read as the all-defaults
    run and trained it without a word; a file that sets one key is a config."""
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing here yet\n")
    for read in (load_config, load_config_file, load_sweep):
        with pytest.raises(ConfigError, match="empty.toml sets nothing"):
            read(empty)
    with pytest.raises(ConfigError, match="use RunConfig"):  # said for the caller
        load_config(empty)
    one = tmp_path / "one.toml"
    one.write_text("# only the seed\n[run]\nseed = 7\n")
    assert load_config_file(one) == RunConfig().replace(**{"run.seed": 7})
    sweep = tmp_path / "sweep.toml"
    sweep.write_text("[base.run]\nseed = 7\n")
    assert [c.run.seed for c in load_sweep(sweep, validate=False).configs()] == [7]


def test_an_empty_table_of_an_unknown_name_is_said_as_unknown(tmp_path: Path):
    """A misspelled empty table ([methd] in a config, [grids] in a sweep file) is an unknown
    name, not a file that sets nothing."""
    config = tmp_path / "config.toml"
    config.write_text("[methd]\n")
    with pytest.raises(ConfigError, match="unknown config section 'methd'"):
        load_config(config)
    sweep = tmp_path / "sweep.toml"
    sweep.write_text("[grids]\n")
    with pytest.raises(ConfigError, match="unknown table 'grids'"):
        load_sweep(sweep)


def test_a_toml_config_named_json_is_read_as_toml(tmp_path: Path):
    """--config FILE.json holding TOML was refused as "is JSON but not a readable run record
    (… not JSON …)": a JSON file it is not; a config it is."""
    config = RunConfig().replace(**{"method.name": "dfa", "optim.epochs": 2})
    path = tmp_path / "my_run.json"
    path.write_text(config_to_toml(config))
    assert load_config_file(path) == config
    path.write_text('{"config": ')  # a cut record stays a record's error
    with pytest.raises(ConfigError, match="not a readable creditaudit run record"):
        load_config_file(path)


def test_a_diagnostics_table_set_to_none_is_told_it_is_a_table():
    """``--set diagnostics.a=none`` was told "must be a GrowthOptions": a Python class name
    no config shows; the key is a table of options."""
    with pytest.raises(ConfigError, match=r"^diagnostics\.a must be a table of options, "
                                          r"got none$"):
        apply_overrides(RunConfig(), {"diagnostics.a": None})


@pytest.mark.parametrize("key", ["optim.lr", "method.penalty", "diagnostics.a.growth"])
@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_past_a_float_is_not_a_finite_number(key: str, sign: str):
    """TOML reads integers of any length: ``--set optim.lr=1000…0`` (400 digits) was an
    internal OverflowError converting it to a float."""
    _, value = parse_override(f"{key}={sign}1{'0' * 400}")
    with pytest.raises(ConfigError, match=r"is not a finite number; give a finite value$"):
        apply_overrides(RunConfig(), {key: value})


@pytest.mark.parametrize("key", ["model.d", "data.in_dim", "data.n_train", "optim.epochs"])
def test_an_integer_past_64_bits_is_refused(key: str):
    """Past TOML's 64-bit integers (which torch's sizes are too) ``data.n_train`` and
    ``data.in_dim`` were internal errors (an OverflowError, a TypeError of torch) once the
    run was planned; a 64-bit value stays accepted."""
    _, value = parse_override(f"{key}={2**63}")
    with pytest.raises(ConfigError, match=r"is out of range; it must be a 64-bit integer"):
        apply_overrides(RunConfig(), {key: value})
    assert apply_overrides(RunConfig(), {"optim.epochs": 2**63 - 1}).optim.epochs == 2**63 - 1


@pytest.mark.parametrize(("key", "bounds"), [("optim.epochs", f"0 … {2**63 - 1}"),
                                             ("model.d", f"1 … {2**63 - 1}")])
def test_an_integer_past_64_bits_is_told_the_fields_own_bounds(key: str, bounds: str):
    """optim.epochs=10**30 was told it must be in -9223372036854775808 … 9223372036854775807,
    a range of negative epochs the next message refuses."""
    with pytest.raises(ConfigError, match=f"must be a 64-bit integer in {bounds}$"):
        apply_overrides(RunConfig(), {key: 10**30})


@pytest.mark.parametrize(("line", "said"), [
    ("[optim]\nepochs = 1" + "0" * 400, "optim.epochs=100"),
    ("[optim]\nlr = 1" + "0" * 400, "optim.lr=inf is not a finite number"),
    ("[data]\nn_train = 99999999999999999999", "data.n_train=99999999999999999999 is out of"),
])
def test_an_integer_past_any_count_is_one_line_not_an_overflow(tmp_path: Path, line, said):
    """TOML integers have no bound: 10**400 as optim.epochs or optim.lr was an internal
    OverflowError (int too large to convert to float) once the run started, or at once."""
    path = tmp_path / "config.toml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=said) as refused:
        load_config(path)
    assert len(str(refused.value)) < 300
