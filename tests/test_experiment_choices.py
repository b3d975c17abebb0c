"""What a user chooses instead of an experiment's own lists (``Choices``, ``--rules``): one
name given as a str is that name, not its letters; a --rules list that leaves an experiment
only the frozen-blocks baseline is refused in one line naming the experiment."""

from __future__ import annotations

import pytest

from creditaudit.cli import main
from creditaudit.study.experiments import Choices, get_experiment


def test_one_name_as_a_str_is_that_name():
    """``Choices(rules="dfa")`` was split into letters ("'d' is not a known credit rule");
    it is one name, as ``adapt(states="h")`` takes one."""
    assert Choices(rules="dfa", archs="resmlp") == Choices(rules=("dfa",), archs=("resmlp",))
    assert Choices(rules=["dfa", "kp"]).rules == ("dfa", "kp")
    experiment = get_experiment("penalty_sweep")
    assert experiment.configs("smoke", out_dir="r", choices=Choices(rules="kp")) == \
        experiment.configs("smoke", out_dir="r", choices=Choices(rules=("kp",)))
    assert Choices(rules="dfa").tag() == "rules=dfa"


@pytest.mark.parametrize("name", ["penalty_sweep", "depth_ladder", "audit_table"])
def test_rules_naming_only_the_baseline_are_refused(name, tmp_path, capsys):
    """``--rules frozen`` was accepted and gave an empty table (the baseline is added by the
    experiment itself, and a penalty or a ladder of trainable blocks changes nothing in it)."""
    assert main(["experiment", name, "--scale", "smoke", "--rules", "frozen",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"experiment {name} needs a rule that trains the blocks" in err
    assert "--rules frozen names no rule but the frozen-blocks baseline" in err
    assert not (tmp_path / "experiments").exists()  # nothing trained, nothing written
    # with another rule beside it, the baseline is fine (it is added once)
    configs = get_experiment(name).configs("smoke", out_dir="r",
                                           choices=Choices(rules=("dfa", "frozen")))
    assert {c.method.name for c in configs} == {"dfa", "frozen"}


@pytest.mark.parametrize("call, python, command_line", [
    (dict(name="all", choices=Choices(rules="dfa")),
     "Choices(rules=…) applies to one experiment", "--rules applies to one experiment"),
    (dict(name="capacity_cost", choices=Choices(rules="dfa")),
     "takes no Choices(rules=…): it separates", "takes no --rules: it separates"),
    (dict(name="audit_table", choices=Choices(archs=("resmlp", "vit"))),
     "give Choices(archs=…) one name", "give --arch one name"),
    (dict(name="audit_table", choices=Choices(archs="student-noLN")),
     "use Choices(archs=('student',))", "use --arch student"),
    (dict(name="fresh_null", workers=-1, executor="local"),
     "workers must be >= 0, got -1", "--workers must be >= 0, got -1"),
])
def test_a_python_caller_is_told_its_own_arguments(call, python, command_line, tmp_path):
    """run_experiment's refusals named the command line's flags (--rules, --arch,
    --workers, "see creditaudit experiment --list") to a Python caller, who passed
    Choices(...) and keyword arguments; the command line keeps its flags."""
    from creditaudit.caller import for_command_line
    from creditaudit.errors import ConfigError
    from creditaudit.study.experiments import run_experiment

    call = dict(call)
    name = call.pop("name")
    with pytest.raises(ConfigError) as python_error:
        run_experiment(name, scale="smoke", out_dir=tmp_path, **call)
    assert python in str(python_error.value)
    assert "--" not in str(python_error.value)
    with for_command_line(), pytest.raises(ConfigError) as flag_error:
        run_experiment(name, scale="smoke", out_dir=tmp_path, **call)
    assert command_line in str(flag_error.value)
    assert not (tmp_path / "experiments").exists()
