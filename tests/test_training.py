"""Training loop, run records, configs and the CLI on tiny synthetic runs."""

from __future__ import annotations

import copy
import json
import math
import os
import shlex
from pathlib import Path

import pytest
import torch

from creditaudit import records as runs
from creditaudit.config import (
    RunConfig,
    apply_overrides,
    config_from_dict,
    load_config,
    parse_override,
)
from creditaudit.errors import ConfigError, OutputError, RunRecordError
from creditaudit.methods.base import StepResult
from creditaudit.records import (
    CHECKPOINT_FILE,
    INIT_FILE,
    RECORD_FILE,
    SCHEMA,
    RunRecord,
    atomic_write_json,
    comparable,
    load_checkpoint,
    load_record,
)
from creditaudit.report import format_run_summary
from creditaudit.run.plan import run_id
from creditaudit.run.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {
    "data.n_train": 512, "data.n_test": 256, "data.in_dim": 8, "data.teacher_width": 32,
    "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
    "diagnostics.eval_samples": 256, "diagnostics.end_of_run": False, "run.progress": False,
}
EPOCH_KEYS = ("epoch", "train_loss", "train_acc", "test_loss", "acc_eval", "hidden_norms",
              "bp_grad_norms_per_sample_med", "h_L_norm", "g_2_norm", "cos_per_layer",
              "cos_defined", "lr", "seconds")
LAYER_KEYS = ("hidden_norms", "bp_grad_norms_per_sample_med", "cos_per_layer", "cos_defined")


def tiny(out_dir: Path | str, **overrides) -> RunConfig:
    return RunConfig().replace(**{**TINY, "run.out_dir": str(out_dir), **overrides})


def checkpoint(run_dir: Path) -> dict:
    return load_checkpoint(run_dir / CHECKPOINT_FILE)


def assert_state_dicts_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# --- the per-epoch record -----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["bp", "dfa"])
def test_record_has_every_epoch_and_key(tmp_path, method):
    config = tiny(tmp_path, **{"method.name": method, "diagnostics.end_of_run": True})
    result = train(config)
    record = result.record.to_dict()
    assert result.status == record["status"] == "completed"
    assert result.run_dir == tmp_path / run_id(config)
    log = record["log"]
    assert [e["epoch"] for e in log] == [0, 1, 2]
    L = config.model.n_blocks
    for entry in log:
        train_keys = ("train_loss", "train_acc")
        for key in EPOCH_KEYS:
            if entry["epoch"] == 0 and key in train_keys:
                continue  # nothing has been trained at initialisation
            assert key in entry, (entry["epoch"], key)
        for key in LAYER_KEYS:
            assert len(entry[key]) == L + 1, key
        assert entry["h_L_norm"] == entry["hidden_norms"][-1]
        assert entry["g_2_norm"] == entry["bp_grad_norms_per_sample_med"][2]
        assert 0.0 <= entry["acc_eval"] <= 1.0 and math.isfinite(entry["test_loss"])
        assert entry["seconds"] >= 0.0
    for entry in log[1:]:
        assert 0.0 <= entry["train_acc"] <= 1.0 and math.isfinite(entry["train_loss"])
    assert log[0]["lr"] == pytest.approx(1e-3)
    assert log[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine schedule ends at 0
    if method == "bp":
        for entry in log:
            for c in entry["cos_per_layer"]:
                assert c == pytest.approx(1.0, abs=1e-5)
    else:
        assert abs(result.record.log[-1].value("deep_cos")) < 0.9
    # Each number is stored once: values derived from the stored ones are not written
    # (the original study's key names h_L_norm, g_2_norm and test_acc aside).
    for entry in log:
        assert not {"g_L_norm", "max_block_growth", "deep_cos", "deep_cos_valid"} & set(entry)
        assert entry["test_acc"] == entry["acc_eval"]
    # the file on disk is the returned record, and it validates
    on_disk = load_record(result.run_dir)
    assert comparable(on_disk) == comparable(result.record)
    for name in (RECORD_FILE, CHECKPOINT_FILE, INIT_FILE):
        assert (result.run_dir / name).exists()
    assert record["final"]["epochs_completed"] == 2
    assert record["final"]["test_acc"] == log[-1]["acc_eval"]
    assert set(record["diagnostics"]["drift"]) == set(checkpoint(result.run_dir)["model"])


def test_run_summary_marks_a_cosine_over_fewer_than_all_samples(tmp_path):
    """The summary table marks a deep cosine that left out zero credits (†), with the
    smallest share it averaged over; a full one stays unmarked."""
    raw = train(tiny(tmp_path)).record.to_dict()
    assert raw["log"][-1]["cos_defined"] == [1.0, 1.0, 1.0]
    assert "†" not in format_run_summary([RunRecord.from_dict(raw)])
    raw["log"][-1]["cos_defined"] = [1.0, 0.8, 1.0]
    record = RunRecord.from_dict(raw)
    assert record.deep_cos_coverage == 0.8
    text = format_run_summary([record])
    assert "†" in text.splitlines()[2]
    assert "as few as 80%" in text


def test_diagnostics_do_not_change_training(tmp_path):
    base = {"method.name": "dfa", "optim.epochs": 3}
    every = train(tiny(tmp_path, **base, **{"diagnostics.every": 1,
                                             "diagnostics.protocol_every": 1}))
    rarely = train(tiny(tmp_path, **base, **{"diagnostics.every": 100,
                                              "diagnostics.protocol_every": 0}))
    assert every.run_dir != rarely.run_dir
    assert [e.has_diagnostics for e in rarely.record.log] == [True, False, False, True]
    assert all(e.has_diagnostics for e in every.record.log)
    a, b = checkpoint(every.run_dir), checkpoint(rarely.run_dir)
    assert_state_dicts_equal(a["model"], b["model"])
    for fa, fb in zip(a["rule"]["feedback"], b["rule"]["feedback"]):
        assert torch.equal(fa, fb)
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    for ea, eb in zip(every.record.log, rarely.record.log):
        assert ea.value("train_loss" if ea.epoch else "test_loss") == \
            eb.value("train_loss" if eb.epoch else "test_loss")


def test_same_seed_same_record_different_seed_differs(tmp_path):
    a = train(tiny(tmp_path / "a", **{"method.name": "dfa"}))
    b = train(tiny(tmp_path / "b", **{"method.name": "dfa"}))
    c = train(tiny(tmp_path / "c", **{"method.name": "dfa", "run.seed": 43}))
    assert comparable(a.record) == comparable(b.record)
    assert_state_dicts_equal(checkpoint(a.run_dir)["model"], checkpoint(b.run_dir)["model"])
    assert comparable(a.record)["log"] != comparable(c.record)["log"]


def test_comparable_ignores_output_folder(tmp_path):
    a = train(tiny(tmp_path / "a", **{"optim.epochs": 1}))
    b = train(tiny(tmp_path / "b", **{"optim.epochs": 1}))
    assert comparable(a.record) == comparable(b.record)


# --- kill and resume ----------------------------------------------------------------------------
def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path, kill_run_at):
    options = {"method.name": "dfa", "optim.epochs": 3}
    straight = train(tiny(tmp_path / "a", **options))
    config = tiny(tmp_path / "b", **options)
    kill_run_at(config)
    run_dir = tmp_path / "b" / run_id(config)
    interrupted = load_record(run_dir)
    assert interrupted.status == "interrupted"
    assert [e.epoch for e in interrupted.log] == [0, 1]
    assert checkpoint(run_dir)["epoch"] == 1
    with pytest.raises(RunRecordError, match="interrupted"):
        train(config)  # neither resume nor force
    resumed = train(config, resume=True)
    assert resumed.status == "completed"
    assert comparable(resumed.record) == comparable(straight.record)
    assert comparable(load_record(run_dir)) == comparable(straight.record)
    a, b = checkpoint(straight.run_dir), checkpoint(run_dir)
    assert_state_dicts_equal(a["model"], b["model"])
    assert a["epoch"] == b["epoch"] == 3


@pytest.mark.parametrize("killed_in", ["checkpoint", "finish"])
def test_a_run_stopped_on_walk_back_and_killed_resumes_to_the_same_stop(tmp_path, monkeypatch,
                                                                       killed_in):
    # killed after the stopping epoch's checkpoint, or in the end-of-run work: the record
    # holds stopped_early, and resuming only finishes the run (it trains no further epoch)
    options = {"optim.epochs": 3, "diagnostics.frozen_acc": 1.0,
               "diagnostics.stop_on_walkback": True}
    straight = train(tiny(tmp_path / "a", **options))
    assert [e.epoch for e in straight.record.log] == [0, 1]
    original = getattr(Trainer, killed_in)

    def killed(self, *args):
        if killed_in == "checkpoint":
            original(self, *args)
            if args[0] < 1:
                return
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, killed_in, killed)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(tmp_path / "b", **options))
    monkeypatch.setattr(Trainer, killed_in, original)
    resumed = train(tiny(tmp_path / "b", **options), resume=True)
    assert [e.epoch for e in resumed.record.log] == [0, 1]
    assert comparable(resumed.record) == comparable(straight.record)


class Killed(BaseException):
    """A kill -9 in a test: no handler of the run sees it, so nothing more is written."""


def test_a_run_diverged_on_its_evaluation_and_killed_in_its_end_resumes_to_its_results(
        tmp_path, monkeypatch):
    # non-finite evaluation at epoch 2 (close_epoch's divergence), then killed in the
    # end-of-run metrics: record.json said 'diverged' with no final results and no
    # end-of-run metrics, and --resume served it as finished
    from creditaudit.run import trainer as trainer_module

    finite = trainer_module.finite_entry
    monkeypatch.setattr(trainer_module, "finite_entry",
                        lambda entry: entry.epoch != 2 and finite(entry))
    options = {"optim.epochs": 3, "diagnostics.end_of_run": True,
               "diagnostics.rho_samples": 16, "diagnostics.rho_directions": 2,
               "diagnostics.null_draws": 2}
    straight = train(tiny(tmp_path / "a", **options))
    assert straight.status == "diverged" and straight.record.final is not None
    from creditaudit.run import record_keeping  # where the trainer finishes its record

    metrics = record_keeping.end_of_run_metrics

    def killed(*args, **kwargs):  # noqa: ANN002, ANN003 - end_of_run_metrics's arguments
        raise Killed

    monkeypatch.setattr(record_keeping, "end_of_run_metrics", killed)
    with pytest.raises(Killed):
        train(tiny(tmp_path / "b", **options))
    monkeypatch.setattr(record_keeping, "end_of_run_metrics", metrics)
    run_dir = tmp_path / "b" / straight.run_dir.name
    assert not load_record(run_dir).is_finished
    resumed = train(tiny(tmp_path / "b", **options), resume=True)
    assert comparable(resumed.record) == comparable(straight.record)


def test_resume_without_a_run_raises(tmp_path):
    with pytest.raises(RunRecordError, match="cannot resume"):
        train(tiny(tmp_path), resume=True)


# --- divergence ---------------------------------------------------------------------------------
def test_huge_learning_rate_diverges_without_exception(tmp_path):
    result = train(tiny(tmp_path, **{"method.name": "dfa", "optim.lr": 1e6}))
    assert result.status == "diverged"
    record = load_record(result.run_dir)
    assert record.status == "diverged"
    assert record.log[0].epoch == 0 and math.isfinite(record.log[0].value("h_L_norm"))
    assert record.divergence


def test_non_finite_step_marks_run_diverged_and_keeps_log(tmp_path, monkeypatch):
    config = tiny(tmp_path, **{"method.name": "bp", "optim.epochs": 3})
    calls = {"n": 0}
    steps_per_epoch = 512 // 64

    from creditaudit.methods.bp import BP
    original = BP.train_step

    def step(self, x, y, optimizer):
        calls["n"] += 1
        if calls["n"] == steps_per_epoch + 3:  # third step of epoch 2
            return StepResult(loss=float("nan"), correct=0, n=int(y.shape[0]), finite=False)
        return original(self, x, y, optimizer)

    monkeypatch.setattr(BP, "train_step", step)
    result = train(config)
    assert result.status == "diverged"
    record = load_record(result.run_dir)
    assert [e.epoch for e in record.log] == [0, 1]
    assert record.divergence["epoch"] == 2 and record.divergence["step"] == 2
    assert record.final.epochs_completed == 1
    monkeypatch.setattr(BP, "train_step", original)
    # a diverged run is finished: asking again returns it
    again = train(config)
    assert again.status == "diverged" and comparable(again.record) == comparable(record)


# --- existing runs ------------------------------------------------------------------------------
def test_completed_run_is_not_rerun(tmp_path, monkeypatch):
    config = tiny(tmp_path, **{"optim.epochs": 1})
    first = train(config)

    def refuse(*args, **kwargs):
        raise AssertionError("a completed run must not be rebuilt")

    monkeypatch.setattr(Trainer, "__init__", refuse)
    second = train(config)
    assert second.status == "completed"
    assert comparable(second.record) == comparable(load_record(first.run_dir))


def test_force_reruns(tmp_path):
    config = tiny(tmp_path, **{"optim.epochs": 1})
    first = train(config)
    second = train(config, force=True)
    assert second.record.created >= first.record.created
    assert comparable(second.record)["log"] == comparable(first.record)["log"]


# --- run records --------------------------------------------------------------------------------
def test_atomic_write_keeps_old_file_when_replace_fails(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    atomic_write_json(path, {"version": 1})

    def broken_replace(src, dst):
        raise OSError("disk pulled")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OutputError, match="disk pulled"):
        atomic_write_json(path, {"version": 2, "payload": "x" * 10000})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def valid_record(tmp_path) -> dict:
    record = runs.new_record(tiny(tmp_path), device="cpu")
    record.log.append(runs.EpochEntry(epoch=0))
    return record


def test_load_record_rejects_bad_files(tmp_path):
    typed = valid_record(tmp_path)
    good = tmp_path / "good" / RECORD_FILE
    runs.save_record(good.parent, typed)
    record = typed.to_dict()
    assert load_record(good.parent).run_id == record["run_id"]
    assert load_record(good).schema == SCHEMA

    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:-40])
    with pytest.raises(RunRecordError, match="truncated") as err:
        load_record(truncated)
    assert str(truncated) in str(err.value)

    foreign = dict(record, schema="someone-else/9")
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(foreign))
    with pytest.raises(RunRecordError, match="schema") as err:
        load_record(path)
    assert str(path) in str(err.value)

    for key in ("log", "config", "status"):
        broken = {k: v for k, v in record.items() if k != key}
        path = tmp_path / f"no_{key}.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(RunRecordError, match=repr(key)):
            load_record(path)

    for key, value, match in (("status", "exploded", "status"), ("log", [{"x": 1}], "epoch"),
                              ("log", {"epoch": 0}, "wrong type")):
        path = tmp_path / f"bad_{key}.json"
        path.write_text(json.dumps(dict(record, **{key: value})))
        with pytest.raises(RunRecordError, match=match):
            load_record(path)

    bad_config = copy.deepcopy(record)
    bad_config["config"]["model"]["d"] = -3
    path = tmp_path / "bad_config.json"
    path.write_text(json.dumps(bad_config))
    with pytest.raises(RunRecordError, match="model.d"):
        load_record(path)

    with pytest.raises(RunRecordError, match="no run record"):
        load_record(tmp_path / "missing")


def test_comparable_drops_wall_clock_fields(tmp_path):
    record = valid_record(tmp_path).to_dict()
    record["log"][0]["seconds"] = 1.5
    other = copy.deepcopy(record)
    other["created"], other["environment"] = "yesterday", {"python": "0"}
    other["log"][0]["seconds"] = 99.0
    assert comparable(record) == comparable(other)
    other["log"][0]["acc_eval"] = 0.5
    assert comparable(record) != comparable(other)


# --- configs ------------------------------------------------------------------------------------
def to_toml(raw: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)

    lines = []
    for section, fields in raw.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in fields.items()
                  if v is not None and not isinstance(v, dict)]
        for table, inner in fields.items():  # a diagnostic's options: [diagnostics.a]
            if isinstance(inner, dict):
                lines.append(f"[{section}.{table}]")
                lines += [f"{k} = {value(v)}" for k, v in inner.items()]
    return "\n".join(lines) + "\n"


def test_toml_round_trip(tmp_path):
    config = RunConfig().replace(**{
        "method.name": "dfa", "method.penalty": 0.01, "method.trainable_blocks": 2,
        "model.d": 64, "model.out_ln": False, "optim.lr": 3e-4, "data.alpha": 0.25,
        "run.out_dir": "somewhere", "diagnostics.every": 5, "run.seed": 123,
    })
    path = tmp_path / "config.toml"
    path.write_text(to_toml(config.to_dict()))
    loaded = load_config(path)
    assert loaded == config
    assert run_id(loaded) == run_id(config)
    partial = tmp_path / "partial.toml"
    partial.write_text('[method]\nname = "fa"\n[optim]\nlr = 1\n')
    loaded = load_config(partial)
    assert loaded.method.name == "fa" and loaded.optim.lr == 1.0
    assert isinstance(loaded.optim.lr, float)
    assert loaded.model == RunConfig().model


@pytest.mark.parametrize("raw,key", [
    ({"modle": {"d": 3}}, "modle"),
    ({"model": {"width": 3}}, "model.width"),
    ({"model": {"d": "wide"}}, "model.d"),
    ({"model": {"d": 2.5}}, "model.d"),
    ({"model": {"out_ln": 1}}, "model.out_ln"),
    ({"optim": {"lr": "fast"}}, "optim.lr"),
    ({"data": {"n_train": None}}, "data.n_train"),
    ({"model": {"d": 0}}, "model.d"),
    ({"data": {"alpha": 1.5}}, "data.alpha"),
    ({"optim": {"lr": -1e-3}}, "optim.lr"),
    ({"method": {"name": "Magic rule!"}}, "method.name"),
    ({"model": {"arch": "cnn"}}, "model.arch"),
    ({"method": {"trainable_blocks": 5}, "model": {"n_blocks": 4}}, "method.trainable_blocks"),
    ({"model": "resmlp"}, "model"),
])
def test_config_validation_errors_name_the_key(raw, key):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    message = str(err.value)
    assert key in message
    assert "\n" not in message


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nd = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_overrides():
    assert parse_override("method.penalty=1e-2") == ("method.penalty", 0.01)
    assert parse_override("model.out_ln=false") == ("model.out_ln", False)
    assert parse_override("method.name=dfa") == ("method.name", "dfa")
    assert parse_override("method.trainable_blocks=none") == ("method.trainable_blocks", None)
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("method.penalty")
    # TOML would read only the start of these; the rest is refused, not dropped.
    for text in ("optim.lr=1e-3 # fast", "optim.lr=1e-3#x", "optim.lr=1\nfoo = 2"):
        with pytest.raises(ConfigError, match="the rest dropped"):
            parse_override(text)
    assert parse_override("run.out_dir=runs/#2") == ("run.out_dir", "runs/#2")
    assert parse_override('run.name="a # b"') == ("run.name", "a # b")
    with pytest.raises(ConfigError, match="model.foo"):
        apply_overrides(RunConfig(), {"model.foo": 1})
    with pytest.raises(ConfigError, match="nosection"):
        apply_overrides(RunConfig(), {"nosection.d": 1})
    with pytest.raises(ConfigError, match="method.trainable_blocks"):
        RunConfig().replace(**{"model.n_blocks": 2, "method.trainable_blocks": 3})


def test_run_id_stable_and_comparable():
    config = RunConfig()
    assert run_id(config) == run_id(RunConfig()) == run_id(config)
    assert run_id(config).startswith("bp-resmlp-synthetic-s42-")
    for key, value in (("run.out_dir", "/elsewhere"), ("run.progress", False),
                       ("run.threads", 1), ("run.tensorboard", "tb"), ("run.device", "cpu")):
        assert run_id(config.replace(**{key: value})) == run_id(config), key
    changed = set()
    for key, value in (("method.penalty", 1e-3), ("run.seed", 1), ("model.d", 32),
                       ("optim.lr", 2e-3), ("data.alpha", 0.5), ("method.name", "dfa"),
                       ("diagnostics.every", 2), ("diagnostics.a.growth", 60.0)):
        other = run_id(config.replace(**{key: value}))
        assert other != run_id(config), key
        changed.add(other)
    assert len(changed) == 8


def test_a_component_id_version_moves_its_own_ids_only(monkeypatch):
    """A new default of one method (EP's relaxation) must not serve its old records, nor
    move another method's ids; the same for an architecture's and a dataset's own version."""
    from creditaudit.data import dataset_spec
    from creditaudit.methods import rule_class
    from creditaudit.models import architecture

    configs = {name: RunConfig().replace(**{"method.name": name}) for name in ("bp", "ep")}
    now = {name: run_id(c) for name, c in configs.items()}
    monkeypatch.setattr(rule_class("ep"), "id_version", 0)
    before = {name: run_id(c) for name, c in configs.items()}
    assert now["bp"] == before["bp"] and now["ep"] != before["ep"]
    vit = RunConfig().replace(**{"model.arch": "vit", "data.in_dim": 3072})
    plain = RunConfig()
    ids = (run_id(vit), run_id(plain))
    monkeypatch.setattr(architecture("vit"), "id_version", 1)
    assert run_id(vit) != ids[0] and run_id(plain) == ids[1]
    monkeypatch.setattr(dataset_spec("synthetic"), "id_version", 1)
    assert run_id(plain) != ids[1]


# --- CLI ----------------------------------------------------------------------------------------
def test_cli_bad_key_is_one_line_exit_2(capsys):
    from creditaudit.cli import main

    assert main(["train", "--set", "model.foo=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("creditaudit: error:")
    assert "model.foo" in err and "Traceback" not in err


def test_the_command_leaves_its_callers_signal_handlers_as_they_were(capsys):
    """main() run in-process (a notebook, a test) puts SIGTERM's handler back on its way
    out, after a refusal too; while a command runs, SIGTERM interrupts it as Ctrl-C
    does."""
    import os
    import signal

    from creditaudit.cli import main, sigterm_interrupts

    def mine(signum, frame):
        raise AssertionError("the caller's handler ran")

    kept = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["train", "--set", "model.foo=1"]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(KeyboardInterrupt), sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, kept)
    capsys.readouterr()


def test_cli_train_tiny_run(tmp_path, capsys):
    from creditaudit.cli import main

    def text(value):
        return str(value).lower() if isinstance(value, bool) else str(value)

    sets = [item for key, value in TINY.items() for item in ("--set", f"{key}={text(value)}")]
    assert main(["train", *sets, "--method", "dfa", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    config = tiny(tmp_path, **{"method.name": "dfa"})
    record = load_record(tmp_path / run_id(config))
    assert record.status == "completed"
    assert str(tmp_path / run_id(config) / RECORD_FILE) in out


def test_atomic_writes_get_the_permissions_of_a_plain_file(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    atomic_write_json(tmp_path / "atomic.json", {"a": 1})
    assert (tmp_path / "atomic.json").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_random_targets_control_trains_on_fresh_uniform_labels(tmp_path, monkeypatch):
    seen = []
    original = Trainer.train_epoch

    def spy(self, epoch):
        if epoch == 1:  # wrap the rule's step once per run
            step = self.rule.train_step

            def record_labels(x, y, optimizer):
                seen.append(y.clone())
                return step(x, y, optimizer)

            self.rule.train_step = record_labels
        return original(self, epoch)

    monkeypatch.setattr(Trainer, "train_epoch", spy)
    result = train(tiny(tmp_path, **{"data.random_targets": True, "optim.epochs": 2}))
    assert result.status == "completed"
    true_labels = Trainer(tiny(tmp_path)).dataset.train_y
    n = true_labels.shape[0]
    drawn = torch.cat(seen)
    assert drawn.shape[0] == 2 * n
    # An epoch of true labels is a permutation of the stored ones; fresh uniform draws are not
    # (and differ between epochs).
    first, second = drawn[:n], drawn[n:]
    assert not torch.equal(first.sort().values, true_labels.sort().values)
    assert not torch.equal(first, second)
    assert int(drawn.min()) >= 0 and int(drawn.max()) < 10


def test_demo_command_trains_and_summarises_four_methods(tmp_path, capsys):
    from creditaudit.cli import main

    code = main(["demo", "--epochs", "1", "--n-train", "600", "--out", str(tmp_path),
                 "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "MNIST-1D" in out
    for method in ("bp", "fa", "dfa", "frozen"):
        assert method in out.lower()
    records = [load_record(p.parent) for p in tmp_path.glob("*/record.json")]
    assert len(records) == 4
    assert {r.dataset for r in records} == {"mnist1d"}
    # (d) of each trained method against the frozen run, from the records' accuracies.
    frozen = next(r for r in records if r.method == "frozen")
    bp = next(r for r in records if r.method == "bp")
    margin = 100 * (bp.final_acc - frozen.final_acc)
    assert "(d) depth utility" in out
    assert f"bp          {margin:+7.1f} pp" in out
    assert "baseline of (d)" in out  # the baseline's own row gets no verdict
    # The next step it prints is the exact audit command of its own DFA run, and it runs.
    command = out.strip().splitlines()[-1].strip()
    dfa = next(r for r in records if r.method == "dfa")
    assert command == f"creditaudit audit {tmp_path / dfa.run_id}"
    assert "<" not in command and ">" not in command  # no placeholder
    assert main([*shlex.split(command)[1:], "--no-metrics", "-q"]) == 0
    assert "depth utility" in capsys.readouterr().out


def test_demo_refusals_speak_of_the_demos_own_flags(tmp_path, capsys, monkeypatch):
    """A seed past MNIST-1D's 32-bit data seed was refused with the advice
    '--set data.data_seed=0' (no flag of the demo's) as 'run 1'; a run the plan refuses is
    named by its method (--n-train's own refusals: tests/test_demo.py)."""
    from creditaudit.cli import main

    monkeypatch.delenv("CREDITAUDIT_SET", raising=False)
    assert main(["demo", "--seed", str(2**32), "--out", str(tmp_path / "a")]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (f"creditaudit: error: --seed {2**32} is also the seed MNIST-1D draws its "
                    "data from, a 32-bit seed: use --seed 0 … 4294967295, or --dataset "
                    "synthetic"), line
    monkeypatch.setenv("CREDITAUDIT_SET", "data.n_test=1001")  # the user's own words
    assert main(["demo", "--n-train", "100", "--out", str(tmp_path / "b")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("creditaudit: error: run name=bp: data.name='mnist1d' "), line
    assert not (tmp_path / "a").exists() and not any((tmp_path / "b").iterdir())


def test_demo_keeps_the_synthetic_task(tmp_path):
    from creditaudit.cli import build_parser
    from creditaudit.cli.demo import DEMO_TASKS, demo_config

    args = build_parser().parse_args(["demo", "--dataset", "synthetic"])
    assert args.dataset == "synthetic" and args.n_train is None
    config = demo_config("dfa", dataset="synthetic", epochs=8,
                         n_train=DEMO_TASKS["synthetic"].n_train, out_dir=str(tmp_path), seed=42)
    assert config.data.name == "synthetic" and config.data.n_train == 20000
    assert config.data.n_test == 2000 and config.method.name == "dfa"


def test_config_round_trip_through_config_toml_and_record_json(tmp_path, capsys):
    from creditaudit.cli import main

    config = tiny(tmp_path, **{"method.name": "dfa", "method.penalty": 0.01,
                               "method.trainable_blocks": 1, "data.augment": None})
    result = train(config)
    written = result.run_dir / "config.toml"
    assert load_config(written) == config
    assert runs.load_config_file(result.run_dir / RECORD_FILE) == config
    # Every optional field defaults to None, so leaving None out of the TOML is exact.
    import typing

    from creditaudit.config import SECTION_TYPES

    defaults = RunConfig().to_dict()
    for section, cls in SECTION_TYPES.items():
        for key, tp in typing.get_type_hints(cls).items():
            if type(None) in typing.get_args(tp):
                assert defaults[section][key] is None, f"{section}.{key} must default to None"
    # --print-config prints what --config reads back, and it names the same run.
    flags = ["--method", "dfa", "--penalty", "0.01", "--set", "method.trainable_blocks=1",
             *[item for key, value in TINY.items()
               for item in ("--set", f"{key}={str(value).lower() if value is False else value}")],
             "--out", str(tmp_path)]
    assert main(["train", *flags, "--print-config"]) == 0
    printed = tmp_path / "printed.toml"
    printed.write_text(capsys.readouterr().out)
    assert run_id(load_config(printed)) == run_id(config) == result.run_dir.name
    assert not list(tmp_path.glob("*/checkpoint.pt"))[1:]  # --print-config trained nothing
    bad = tmp_path / "other.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a readable creditaudit run record"):
        runs.load_config_file(bad)


def test_schedules_follow_the_closed_form():
    from creditaudit.run.setup import make_schedule

    total = 37
    for kind in ("cosine", "constant"):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
        schedule = make_schedule(optimizer, kind, total)
        for step in range(total + 1):
            expected = 2e-3 * (0.5 * (1 + math.cos(math.pi * step / total))
                               if kind == "cosine" else 1.0)
            assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, abs=1e-15)
            optimizer.step()
            schedule.step()
