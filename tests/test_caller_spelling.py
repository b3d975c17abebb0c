"""A message raised to a Python caller (a script, a notebook) names the Python arguments
(``resume=True``, ``force=True``, ``RunConfig.replace(**{...})``, ``data.data_dir``), not
command-line flags it cannot pass; the command line keeps its flags, word for word."""

from __future__ import annotations

import pytest

from creditaudit import RunConfig, train
from creditaudit.cli import main
from creditaudit.errors import ConfigError, RunRecordError
from integrity_support import interrupted_at, toml_of

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}


def cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, " ".join(capsys.readouterr().err.split())


def test_an_option_is_spelled_for_the_caller_now_and_the_caller_is_put_back():
    from creditaudit.caller import FORCE, RESUME, for_command_line, on_command_line

    assert not on_command_line()
    assert (str(RESUME), f"{FORCE}") == ("resume=True", "force=True")
    with for_command_line():
        assert (str(RESUME), f"{FORCE}") == ("--resume", "--force")
        with for_command_line(False):
            assert str(RESUME) == "resume=True"
        assert str(RESUME) == "--resume"
    assert not on_command_line()
    assert FORCE.named_in("… with --force") and FORCE.named_in("… with force=True")


def test_interrupted_then_unfinished_run_says_resume_true_in_python_and_the_flags_in_the_cli(
        tmp_path, capsys, monkeypatch):
    config = RunConfig().replace(**TINY, **{"run.out_dir": str(tmp_path / "runs")})
    with monkeypatch.context() as patch:
        interrupted_at(patch, 2)
        with pytest.raises(KeyboardInterrupt) as stopped:
            train(config)
    assert stopped.value.__notes__[-1].endswith(
        "stopped after epoch 1, which is checkpointed: continue with resume=True")
    with pytest.raises(RunRecordError, match=r"pass resume=True to continue it or force=True "
                                             r"to start over$"):
        train(config)
    path = tmp_path / "run.toml"
    path.write_text(toml_of({**TINY, "run.out_dir": str(tmp_path / "runs")}))
    code, err = cli(capsys, ["train", "--config", str(path)])
    assert code == 2 and err.endswith("pass --resume to continue it or --force to start over")
    with pytest.raises(RunRecordError, match="pass resume=True"):  # main() put the caller back
        train(config)
    assert train(config, resume=True).status == "completed"  # the advice works


def test_resume_without_its_run_says_without_resume_true(tmp_path, capsys):
    out = str(tmp_path / "runs")
    train(RunConfig().replace(**TINY, **{"run.out_dir": out}))
    longer = RunConfig().replace(**{**TINY, "run.out_dir": out, "optim.epochs": 3})
    with pytest.raises(RunRecordError, match=r"train this config without resume=True$"):
        train(longer, resume=True)
    path = tmp_path / "run.toml"
    path.write_text(toml_of({**TINY, "run.out_dir": out, "optim.epochs": 3}))
    code, err = cli(capsys, ["train", "--config", str(path), "--resume"])
    assert code == 2 and err.endswith("train this config without --resume"), err


def test_replace_hints_name_replace_and_the_cli_names_set(tmp_path, capsys):
    with pytest.raises(ConfigError) as refused:
        RunConfig().replace(**{"run.out_dir": 2024})
    assert "quote it to mean the text: RunConfig.replace(**{'run.out_dir': '2024'})" \
        in str(refused.value)
    assert "--set" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"drop data\.data_dir$"):
        RunConfig().replace(**{"data.data_dir": str(tmp_path)})
    code, err = cli(capsys, ["train", "--set", "run.out_dir=2024"])
    assert code == 2 and """quote it to mean the text: --set 'run.out_dir="2024"'""" in err, err
    code, err = cli(capsys, ["train", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    assert code == 2 and err.endswith("drop --data-dir"), err


def test_a_sweeps_worker_spells_for_the_sweeps_caller(monkeypatch):
    """A sweep's runs train in other threads, processes or hosts, which the command line's
    context does not reach: the task carries it (the runner passes ``command_line``)."""
    import creditaudit.sweep.worker as worker
    from creditaudit.caller import FORCE

    monkeypatch.setattr(worker, "_run_task", lambda task, **kwargs: f"with {FORCE}")
    assert worker.run_task({}, command_line=True) == "with --force"
    assert worker.run_task({}) == "with force=True"
