"""The command line's flags as a user types them: where they may stand, what a misspelled
one is told, and flags a command would otherwise accept and silently drop."""

from __future__ import annotations

import pytest

from creditaudit.cli import main
from integrity_support import assert_one_line_error


@pytest.mark.parametrize("argv", [
    ["train", "--print-config", "--verbose"],
    ["train", "-v", "--print-config"],
    ["-v", "train", "--print-config"],
])
def test_verbose_is_taken_after_the_command_too(argv, capsys):
    """"rerun with --verbose for the traceback" (an internal error's advice) was a usage
    error when appended to the command: -v/--verbose was the top level's only."""
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("[data]")


def test_verbose_after_the_command_shows_the_traceback(monkeypatch):
    """--verbose after the command does what it does before it: the traceback of an
    unexpected error is raised, not folded into one line."""
    import creditaudit.cli.train as train_cli

    def broken(args):  # noqa: ANN001, ANN202 - a bug of ours
        raise RuntimeError("a bug")

    monkeypatch.setattr(train_cli, "run", broken)
    assert main(["train"]) == 1  # one line asking for a report
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", "--verbose"])


@pytest.mark.parametrize("argv, fragments", [
    (["train", "--epoks", "1"], ["unrecognized arguments: --epoks 1",
                                 "did you mean --epochs?", "see creditaudit train --help"]),
    (["sweep", "x.toml", "--dryrun"], ["did you mean --dry-run?",
                                       "see creditaudit sweep --help"]),
    (["audit", "r", "--formt=json"], ["did you mean --format?",
                                      "see creditaudit audit --help"]),
    (["train", "--zzz"], ["unrecognized arguments: --zzz", "see creditaudit train --help"]),
    (["--versoin", "train"], ["did you mean --version?"]),  # a flag of the top level's
    (["trian"], ["invalid choice: 'trian'; did you mean train?"]),
])
def test_an_unknown_flag_is_told_its_commands_help_and_the_closest_flag(argv, fragments,
                                                                         capsys):
    """A misspelled flag of a subcommand pointed at the top level's help (which lists no
    flag of the subcommand) and suggested nothing."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = assert_one_line_error(captured.out, captured.err, *fragments)
    if argv[-1] == "--zzz":
        assert "did you mean" not in line


@pytest.mark.parametrize("flags, fragment", [
    (["--executor", "ray", "--workers", "2"], "--workers is for the local executor; Ray"),
    (["--executor", "inline", "--workers", "2"], "--workers 2 is for the local executor"),
    (["--executor", "inline", "--workers", "-1"], "--workers must be >= 0"),
])
def test_experiment_refuses_workers_its_executor_drops(flags, fragment, tmp_path, capsys):
    """experiment --executor ray/inline --workers N trained with the executor's own count
    and never said N was dropped (sweep refuses --workers with Ray); a negative count
    passed when nothing was left to train."""
    argv = ["experiment", "fresh_null", "--scale", "smoke", "--out", str(tmp_path), *flags]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, fragment)
    assert not (tmp_path / "experiments").exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--epochs", "-1"], "argument --epochs: -1 is out of range; it must be >= 0"),
    (["--n-train", "0"], "argument --n-train: 0 is out of range; it must be >= 1"),
    (["--seed", "-1"], "argument --seed: -1 is out of range"),
])
def test_demo_refuses_its_flags_by_their_names(flags, fragment, tmp_path, capsys):
    """demo --epochs -1 was refused as 'optim.epochs=-1 is out of range': a config key the
    demo has no flag for (it takes no --set), not the flag the user gave."""
    assert main(["demo", "--out", str(tmp_path / "d"), *flags]) == 2
    captured = capsys.readouterr()
    line = assert_one_line_error(captured.out, captured.err, fragment)
    assert "optim." not in line and "data." not in line and "run." not in line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flags, start", [
    (["--width", "0"], "--width 0: model.d=0 is out of range"),
    (["--epochs", "-1"], "--epochs -1: optim.epochs=-1 is out of range"),
    (["--arch", "student", "--width", "4"], "--width 4: model.d is not read by student"),
    (["--arch", "student", "--no-out-ln"], "--no-out-ln: model.out_ln is not read by student"),
    (["--arch", "resmlp:pkg.mod:f"], "--arch resmlp:pkg.mod:f: model.factory is not read"),
    (["--out", ""], "--out '': run.out_dir='' is an empty path"),
])
def test_a_flags_refused_value_is_named_by_the_flag(flags, start, capsys):
    """train --width 0 was refused as 'model.d=0 is out of range' alone, naming a key the
    command line had not spelled; a --set value is still named by its key."""
    assert main(["train", *flags, "--print-config"]) == 2
    captured = capsys.readouterr()
    line = assert_one_line_error(captured.out, captured.err)
    assert line.startswith(f"creditaudit: error: {start}"), line
    assert main(["train", "--set", "model.d=0", "--print-config"]) == 2
    assert capsys.readouterr().err.startswith("creditaudit: error: model.d=0 is out of range")


def test_experiment_list_with_a_name_lists_that_one(capsys):
    """experiment NAME --list listed every experiment and ignored NAME, also a misspelled
    one."""
    assert main(["experiment", "fresh_null", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fresh_null\n") and "\naudit_table" not in out
    assert main(["experiment", "fresh_nul", "--list"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, "unknown experiment 'fresh_nul'")


def test_creditaudit_set_comes_after_sweeps_out_as_after_trains(tmp_path, monkeypatch,
                                                                capsys):
    """docs/configuration.md: CREDITAUDIT_SET is applied after the flags. train did so;
    sweep let its --out beat a run.out_dir of CREDITAUDIT_SET."""
    sweep = tmp_path / "s.toml"
    sweep.write_text('[base]\ndata.n_train = 64\ndata.n_test = 64\nmodel.d = 8\n'
                     '[grid]\nrun.seed = [1, 2]\n')
    monkeypatch.setenv("CREDITAUDIT_SET", f"run.out_dir={tmp_path / 'env'}")
    assert main(["train", "--out", str(tmp_path / "flag"), "--print-config"]) == 0
    assert f'out_dir = "{tmp_path / "env"}"' in capsys.readouterr().out
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "flag"), "--dry-run"]) == 0
    assert f"(results in {tmp_path / 'env'})" in capsys.readouterr().out


def test_an_experiment_says_creditaudit_set_does_not_shrink_its_runs(monkeypatch, capsys):
    """docs/configuration.md: CREDITAUDIT_SET shrinks the runs of train, sweep and demo. An
    experiment ignored it without a word, so `CREDITAUDIT_SET=… creditaudit experiment
    audit_table --scale cpu`, meant as a quick try, trained hours of full-size runs."""
    import creditaudit.study.experiments as experiments

    asked = []
    monkeypatch.setattr(experiments, "run_experiments",
                        lambda names, **options: asked.append(options["scale"]) or {})
    monkeypatch.setenv("CREDITAUDIT_SET", "optim.epochs=1")
    assert main(["experiment", "fresh_null", "--scale", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "warning: CREDITAUDIT_SET is not applied to an experiment's runs" in err
    assert "--scale cpu runs" in err and asked == ["cpu"]
    assert main(["experiment", "fresh_null", "--scale", "cpu", "--no-train"]) == 0
    assert "CREDITAUDIT_SET" not in capsys.readouterr().err  # nothing trains: nothing to say
    monkeypatch.delenv("CREDITAUDIT_SET")
    assert main(["experiment", "fresh_null", "--scale", "cpu"]) == 0
    assert "warning" not in capsys.readouterr().err

def test_a_sweep_file_given_to_train_is_named_as_one(tmp_path, capsys):
    """train --config SWEEP.toml said "unknown config section 'base'", as if a section
    were misspelled, not that the file is a sweep file for creditaudit sweep."""
    sweep = tmp_path / "s.toml"
    sweep.write_text('[base]\nmodel.d = 8\n[grid]\nrun.seed = [1, 2]\n')
    assert main(["train", "--config", str(sweep), "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, "is a sweep file ([base], [grid])",
                          f"run it with creditaudit sweep {sweep}")
    from creditaudit.config import load_config
    from creditaudit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"creditaudit\.sweep\.load_sweep\("):
        load_config(sweep)  # a Python caller is told the Python call


# --- refusals of the run's planning name the flag typed, not its config key -----------------
@pytest.mark.parametrize(("argv", "said", "kept"), [
    (["--arch", "vit", "--width", "30", "--set", "data.in_dim=3072"],
     "error: --width 30 is not divisible by model.heads=4", None),
    (["--arch", "vit", "--dataset", "synthetic"],
     "error: --arch vit needs images", "such as model.arch='resmlp'; --dataset synthetic: "),
    (["--seed", "5000000000", "--dataset", "mnist1d"],
     "error: --seed 5000000000 is also the data seed", None),
])
def test_train_names_the_flag_in_a_refusal_of_its_planning(argv, said, kept, tmp_path,
                                                           capsys):
    """Refused once the config was built (while the run is planned), the line named the
    config key (model.d=30, model.arch='vit', run.seed=…) the user never typed."""
    assert main(["train", *argv, "--epochs", "1", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    line = assert_one_line_error(captured.out, captured.err, said)
    assert kept is None or kept in line  # advice of another value keeps the key
    assert not list(tmp_path.iterdir())


def test_the_python_api_still_names_the_config_key(tmp_path):
    from creditaudit import RunConfig, train
    from creditaudit.errors import ConfigError

    config = RunConfig().replace(**{"model.arch": "vit", "model.d": 30, "data.in_dim": 3072,
                                    "run.out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^model\.d=30 is not divisible by model\.heads=4"):
        train(config)


@pytest.mark.parametrize("command", [
    ["train", "--epochs", "1"], ["demo", "--workers", "0", "-q", "--epochs", "1"],
    ["sweep", "SWEEP", "--workers", "0"], ["experiment", "fresh_null", "--scale", "smoke"]])
def test_a_missing_gpu_names_the_device_flag(command, tmp_path, capsys, monkeypatch):
    """``--device cuda`` on a machine without CUDA: run.device='cuda' (the key) before;
    sweep and experiment said so after train and demo named the flag."""
    import torch

    from sweep_files import write_tiny_sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sweep_file = str(write_tiny_sweep(tmp_path / "s.toml", tmp_path / "runs"))
    command = [sweep_file if word == "SWEEP" else word for word in command]
    assert main([*command, "--device", "cuda", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err,
                          "error: --device cuda but no CUDA device is available")


def test_a_flags_value_is_replaced_only_where_the_message_gives_that_value():
    from creditaudit.cli.common import in_flags

    typed = {"model.d": (30, "--width 30"), "model.arch": ("vit", "--arch vit")}
    assert in_flags("model.d=30 and model.d=300, model.d=30.5; model.arch='vit', "
                    "model.arch='resmlp', model.d=30.", typed) == (
        "--width 30 and model.d=300, model.d=30.5; --arch vit, model.arch='resmlp', "
        "--width 30.")



def test_the_stack_help_says_what_sweeps_md_and_the_refusal_say():
    """`--stack` is refused with the Ray executor, and its help said it was not yet measured
    on a GPU, where docs/benchmarks.md has the stacked runs' table."""
    import argparse

    from creditaudit.cli import build_parser

    sweep = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["sweep"]
    stack = next(a for a in sweep._actions if "--stack" in a.option_strings)
    assert "local executor only" in stack.help and "not yet measured" not in stack.help


@pytest.mark.parametrize("argv, flag", [
    (["--stop-on-walkback", "--set", "diagnostics.protocol_every=0"], "--stop-on-walkback: "),
    (["--set", "diagnostics.stop_on_walkback=true", "--set", "diagnostics.protocol_every=0"],
     "error: diagnostics.stop_on_walkback=true"),
])
def test_stop_on_walkback_without_the_protocol_is_refused(argv, flag, capsys):
    """With the protocol off (protocol_every=0) no verdict is ever reached: the run was
    trained to the end under another run id, the stop asked for accepted and never acted
    on."""
    assert main(["train", *argv, "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, flag, "diagnostics.protocol_every=0 turns the protocol off")


@pytest.mark.parametrize("fix, want", [
    ("diagnostics.protocol_every=1", "protocol_every = 1"),
    ("diagnostics.stop_on_walkback=false", "stop_on_walkback = false"),
])
def test_a_config_file_with_stop_on_walkback_and_no_protocol_is_amended_by_set(
        fix, want, tmp_path, capsys):
    """The refusal says to set protocol_every or drop stop_on_walkback; a config file with
    the pair (an earlier run's config.toml) amended with --set doing just that was refused
    all the same, the file checked before the flags were laid over it."""
    path = tmp_path / "config.toml"
    path.write_text("[diagnostics]\nstop_on_walkback = true\nprotocol_every = 0\n")
    assert main(["train", "--config", str(path), "--set", fix, "--print-config"]) == 0
    assert want in capsys.readouterr().out.splitlines()
    assert main(["train", "--config", str(path), "--print-config"]) == 2  # unamended
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "diagnostics.protocol_every=0 turns the protocol off")


def test_a_config_file_past_its_blocks_is_amended_by_a_flag(tmp_path, capsys):
    """method.trainable_blocks above model.n_blocks in the file, --blocks raising n_blocks:
    the config the run gets is checked, not the file before the flag."""
    path = tmp_path / "config.toml"
    path.write_text("[method]\ntrainable_blocks = 6\n")
    assert main(["train", "--config", str(path), "--blocks", "6", "--print-config"]) == 0
    assert "trainable_blocks = 6" in capsys.readouterr().out.splitlines()


def test_a_record_of_stop_on_walkback_without_the_protocol_still_reads():
    """The refusal is a config's: a run recorded with the pair before it stays readable."""
    from creditaudit.config import RunConfig, config_from_dict

    raw = RunConfig().to_dict()
    raw["diagnostics"].update(stop_on_walkback=True, protocol_every=0)
    assert config_from_dict(raw, strict=False).diagnostics.stop_on_walkback is True


def test_demo_refuses_a_count_past_64_bits_naming_its_flag(capsys, tmp_path):
    """``demo --epochs 10**30`` has no upper bound of its own: it reached the config and was
    refused naming optim.epochs, a key demo has no flag for (before the 64-bit bound, it
    was accepted and the demo trained its runs on for ever)."""
    assert main(["demo", "--epochs", str(10**30), "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "argument --epochs: ", "is out of range")


def test_of_two_sets_of_a_key_with_a_flag_the_last_counts(capsys):
    """docs/configuration.md: of two --set of one key, the last counts. For a key a named
    flag also sets (optim.epochs, model.d, run.seed, …) the second --set was refused as
    '--epochs and --set optim.epochs=3 give optim.epochs two values' with no --epochs given;
    a flag given is still held against every --set of its key."""
    assert main(["train", "--set", "optim.epochs=2", "--set", "optim.epochs=3",
                 "--set", "model.d=8", "--set", "model.d=16", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "epochs = 3\n" in out and "d = 16\n" in out
    assert main(["train", "--epochs", "2", "--set", "optim.epochs=2", "--set",
                 "optim.epochs=3", "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, "--epochs and --set optim.epochs=3 give "
                                                      "optim.epochs two values (2 and 3)")


def test_a_misspelt_experiment_is_told_so_before_the_scale_is_asked_for(capsys):
    """experiment audit_tabel (no --scale) said 'choose --scale smoke, cpu or paper': the
    user added a scale only to be told then that the name was wrong."""
    assert main(["experiment", "audit_tabel"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, "unknown experiment 'audit_tabel'")
    assert main(["experiment", "audit_table"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, "choose --scale smoke, cpu or paper")


def test_a_run_folder_given_to_config_is_told_the_file_to_pass(tmp_path, capsys):
    """audit takes a run's folder; train --config RUN said only that RUN 'is a folder, not a
    file: creditaudit reads only regular files', not which file of the folder to pass."""
    run = tmp_path / "bp-resmlp-synthetic-s42-0123456789"
    run.mkdir()
    (run / "config.toml").write_text("[optim]\nepochs = 1\n")
    assert main(["train", "--config", str(run), "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err,
                          f"config file {run} is a run folder, not a file: pass the run's "
                          f"config in it, {run / 'config.toml'}")
    assert main(["train", "--config", str(run / "config.toml"), "--print-config"]) == 0


@pytest.mark.parametrize("item, said", [
    ("model.epochs=3", "unknown key model.epochs for resmlp (model.arch); did you mean "
                       "optim.epochs? allowed keys in [model]: arch, d,"),
    ("run.lr=0.1", "unknown key run.lr; did you mean optim.lr? allowed keys in [run]:"),
    ("model.ep_beta=0.5", "did you mean method.ep_beta? allowed keys in [model]:"),
    ("run.name=x", "did you mean data.name or method.name? allowed keys in [run]:"),
    ("optim.nope=1", "unknown key optim.nope; allowed keys in [optim]:"),
])
def test_a_key_of_another_section_is_told_where_it_is(item, said, tmp_path, capsys):
    """A key set in the wrong section (--set model.epochs=3, [model] epochs = 3) was refused
    with the section's allowed keys alone, not the section the key is in."""
    assert main(["train", "--set", item, "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, said)
    section, _, rest = item.partition(".")
    key, _, value = rest.partition("=")
    path = tmp_path / "c.toml"
    path.write_text(f"[{section}]\n{key} = {value if value != 'x' else repr(value)}\n")
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, said)


@pytest.mark.parametrize("value, said", [
    (".001", "optim.lr must be a number, got '.001' (TOML needs a digit each side of the "
             "point: 0.001)"),
    ("3.", "got '3.' (TOML needs a digit each side of the point: 3.0)"),
])
def test_a_number_toml_cannot_read_is_told_how_to_write_it(value, said, capsys):
    """--set optim.lr=.001 read as the text '.001' (TOML wants 0.001) and was refused as
    'optim.lr must be a number, got '.001'', a number to the eye of whoever typed it."""
    assert main(["train", "--set", f"optim.lr={value}", "--print-config"]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, said)


def test_an_architecture_that_builds_nothing_is_offered_nowhere(tmp_path, capsys):
    """`own-loop` only describes a Recorder's run and `train --arch own-loop` refuses it, yet
    `train --help` and the refusal of a misspelt architecture offered it as a choice."""
    import argparse

    from creditaudit.cli import build_parser

    train = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["train"]
    arch = next(a for a in train._actions if "--arch" in a.option_strings)
    assert "resmlp, vit, convmixer, student, module (model.arch)" in arch.help
    assert "own-loop" not in arch.help

    assert main(["train", "--arch", "resmpl", "--print-config"]) == 2
    line = assert_one_line_error(*capsys.readouterr(), "choose one of resmlp, vit")
    assert "own-loop" not in line
    assert main(["train", "--arch", "own-loop", "--out", str(tmp_path), "-q"]) == 2  # why
    assert_one_line_error(*capsys.readouterr(), "--arch own-loop: it was trained in its own "
                          "loop")


@pytest.mark.parametrize("key, said", [
    ("model.states", "model.states is not read by resmlp (model.arch): it is an option of "
                     "module; drop it"),
    ("model.module", "unknown key model.module for resmlp (model.arch); allowed keys"),
])
def test_an_option_of_an_architecture_that_builds_nothing_offers_no_choice(key, said, capsys):
    """A key of another architecture is refused naming the architectures that read it — and
    named own-loop ('it is an option of module, own-loop'; model.module: 'of own-loop'),
    which train refuses: it only describes a Recorder's run."""
    assert main(["train", "--arch", "resmlp", "--set", f"{key}=a", "--print-config"]) == 2
    line = assert_one_line_error(*capsys.readouterr(), said)
    assert "own-loop" not in line
