"""Flags a command accepted and then silently ignored beside another flag: each is refused
as argparse refuses two flags of a mutually exclusive group (``argument --resume: not
allowed with argument --print-config``, exit 2), and the command's help says so — or, where
it can, the command does what the flag says (``experiment --list --scale`` counts the runs
of ``--rules``/``--arch``)."""

from __future__ import annotations

import re

import pytest

from creditaudit.cli import build_parser, main
from integrity_support import assert_one_line_error


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> None:
    """``argv`` exits 2 with one line naming ``fragments``."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.out, captured.err, *fragments)


def help_of(command: str) -> str:
    """The --help text of ``command``, on one line (a flag wrapped at its hyphen joined)."""
    parser = build_parser()
    text = parser.subcommand_parser(command).format_help()  # type: ignore[attr-defined]
    return re.sub(r"(\w)-\s+", r"\1-", " ".join(text.split()))


@pytest.mark.parametrize("flag", ["--resume", "--force"])
def test_train_print_config_refuses_resume_and_force(flag, capsys):
    """train --print-config --resume/--force printed the config and exit 0: the flag did
    nothing."""
    refused(capsys, ["train", "--print-config", flag],
            f"argument {flag}: not allowed with argument --print-config",
            "see creditaudit train --help")
    assert "not with --resume or --force" in help_of("train")


@pytest.mark.parametrize("flags", [["--retry-failed"], ["--workers", "1"],
                                   ["--executor", "inline"], ["--device", "cpu"]])
def test_experiment_no_train_refuses_training_flags(flags, tmp_path, capsys):
    """experiment --no-train with a flag that only says how to train summarised and
    ignored it."""
    refused(capsys, ["experiment", "fresh_null", "--scale", "smoke", "--out", str(tmp_path),
                     "--no-train", *flags],
            f"argument {flags[0]}: not allowed with argument --no-train")
    assert not (tmp_path / "experiments").exists()
    assert ("not with --retry-failed, --workers, --executor or --device, which only say how "
            "to train") in help_of("experiment")


@pytest.mark.parametrize("flags", [["--retry-failed"], ["--workers", "1"],
                                   ["--executor", "ray"], ["--device", "cpu"]])
def test_experiment_list_refuses_training_flags(flags, tmp_path, capsys):
    """experiment --list trains nothing: it listed and ignored these."""
    refused(capsys, ["experiment", "--list", "--scale", "smoke", "--out", str(tmp_path),
                     *flags], f"argument {flags[0]}: not allowed with argument --list")


@pytest.mark.parametrize("flags", [["--rules", "dfa"], ["--arch", "mlp"],
                                   ["--dataset", "synthetic"], ["--precision", "bf16"],
                                   ["--data-dir", "x"], ["--out", "elsewhere"]])
def test_experiment_list_without_scale_refuses_counted_flags(flags, capsys):
    """Without --scale, --list counts nothing: the flags that shape the runs counted were
    ignored."""
    refused(capsys, ["experiment", "--list", *flags],
            f"argument {flags[0]}: not allowed with argument --list without --scale")
    assert "which need --scale here" in help_of("experiment")


def test_experiment_list_counts_the_chosen_rules(tmp_path, capsys):
    """experiment NAME --list --scale --rules counted the experiment's own runs, not the
    ones --rules asks for."""
    from creditaudit.study.experiments import Choices, get_experiment

    wanted = len(get_experiment("fresh_null").configs(
        "smoke", out_dir=tmp_path, choices=Choices(rules=("dfa",))))
    own = len(get_experiment("fresh_null").configs("smoke", out_dir=tmp_path))
    assert wanted != own
    assert main(["experiment", "fresh_null", "--list", "--scale", "smoke", "--out",
                 str(tmp_path), "--rules", "dfa"]) == 0
    assert f"smoke: {wanted} runs, 0 finished" in capsys.readouterr().out


def test_experiment_list_of_several_refuses_rules(tmp_path, capsys):
    """--rules with --list --scale and no single experiment: refused as running them is."""
    refused(capsys, ["experiment", "--list", "--scale", "smoke", "--out", str(tmp_path),
                     "--rules", "dfa"], "--rules applies to one experiment")


def test_defaults_given_are_no_conflict(tmp_path, capsys):
    """A flag given at its default value changes nothing, as in argparse's groups."""
    assert main(["experiment", "fresh_null", "--list", "--scale", "smoke", "--out",
                 str(tmp_path), "--executor", "local"]) == 0


@pytest.mark.parametrize("flags", [[], ["--dataset", "mnist1d"]])
@pytest.mark.parametrize("mode", [["fresh_null", "--no-train"], ["fresh_null", "--list"]])
def test_experiment_refuses_a_data_dir_for_generated_data(mode, flags, tmp_path, capsys):
    """experiment --data-dir with a generated dataset (smoke's synthetic, mnist1d) was
    accepted and ignored; train refuses it."""
    refused(capsys, ["experiment", *mode, "--scale", "smoke", "--out", str(tmp_path),
                     "--data-dir", str(tmp_path), *flags],
            f"--data-dir {tmp_path}: the dataset", "is generated from its seed",
            "drop --data-dir")
    assert not (tmp_path / "experiments").exists()


# --- the same refusals from Python ----------------------------------------------------------
@pytest.mark.parametrize("call", [{"retry_failed": True}, {"workers": 1},
                                  {"executor": "inline"}, {"device": "cpu"}])
def test_run_experiment_with_train_false_refuses_training_options(call, tmp_path):
    """run_experiment(train=False, retry_failed=True) (or workers, executor, device)
    summarised and ignored the option, which the command line refuses with --no-train."""
    from creditaudit.errors import ConfigError
    from creditaudit.study.experiments import run_experiment

    [name] = call
    with pytest.raises(ConfigError, match=rf"^{name} only says how to train, and "
                                          rf"train=False trains nothing: drop {name}$"):
        run_experiment("fresh_null", scale="smoke", out_dir=tmp_path, train=False, **call)
    assert not (tmp_path / "experiments").exists()


@pytest.mark.parametrize("dataset", [None, "mnist1d"])
@pytest.mark.parametrize("train", [False, True])
def test_run_experiment_refuses_a_data_dir_for_generated_data(dataset, train, tmp_path):
    """run_experiment(data_dir=…) with a generated dataset (smoke's synthetic, mnist1d)
    trained and summarised, ignoring it; the command line refuses --data-dir there."""
    from creditaudit.errors import ConfigError
    from creditaudit.study.experiments import run_experiment

    with pytest.raises(ConfigError, match=rf"^data_dir {re.escape(str(tmp_path))}: the "
                                          r"dataset \w+ is generated from its seed, not read "
                                          r"from a folder: drop data_dir$"):
        run_experiment("fresh_null", scale="smoke", out_dir=tmp_path, dataset=dataset,
                       data_dir=str(tmp_path), train=train)
    assert not (tmp_path / "experiments").exists()
