"""The integrity guarantees, each proved on real files and real processes:

- no code runs from a file: planted pickle payloads in a checkpoint, an init file and a CIFAR
  batch never run under ``audit``, ``train --resume``, ``figures`` or ``train``;
- a run id means the same data: the same bytes in another folder are the same run, one
  changed byte is another run, and audit/resume of the old run against changed files stop;
- records are strict JSON (null plus a reason for NaN and ±inf);
- OS errors (read-only folder, full disk) end in one line naming the path, with no partial
  file, and an unreadable record is skipped with one warning by every reader;
- a sweep whose parent dies (kill -9) takes its workers down, and its runs resume.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.files.strict_json import check_strict
from creditaudit.records import (
    CHECKPOINT_FILE,
    INIT_FILE,
    RECORD_FILE,
    EpochEntry,
    EpochMeasures,
    FinalResults,
    load_record,
    new_record,
    save_record,
)
from creditaudit.run.plan import run_id
from creditaudit.sweep import CLAIM_FILE, SWEEP_LOG_FILE
from integrity_support import (
    Payload,
    alive,
    assert_one_line_error,
    children,
    finished_dfa_run,
    snapshot,
    sweep_toml,
    tiny_config,
    toml_of,
    write_cifar10,
)

TEST_IMAGES = "t10k-images-idx3-ubyte"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, single_thread) -> SimpleNamespace:
    """One finished tiny DFA run on tiny MNIST-layout IDX files, shared by the module."""
    return finished_dfa_run(tmp_path_factory.mktemp("integrity"))


def config_file(tmp: Path, overrides: dict) -> str:
    path = tmp / "config.toml"
    path.write_text(toml_of(overrides))
    return str(path)


def torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def flip_byte(path: Path, *, keep_mtime: bool = False) -> None:
    """Change the last byte of ``path`` (a pixel or a label 0..9: the file stays valid)."""
    stat = path.stat()
    content = bytearray(path.read_bytes())
    content[-1] = (content[-1] + 1) % 10
    path.write_bytes(bytes(content))
    if keep_mtime:  # as `cp -p` or `touch -r` would leave it
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- no code runs from a file -------------------------------------------------------------------
def test_the_planted_payload_runs_under_a_plain_unpickler(tmp_path):
    """The control: the payload is live, so its absence below means the reader refused it."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "by_pickle")))
    torch.load(io.BytesIO(torch_bytes({"x": Payload(tmp_path / "by_torch")})),
               weights_only=False)
    assert (tmp_path / "by_pickle").exists() and (tmp_path / "by_torch").exists()


def test_planted_payloads_never_run(finished, tmp_path, capsys, kill_run_at):
    marker = tmp_path / "marker"
    # audit and figures over a run whose checkpoint and init file are payloads
    results = tmp_path / "results"
    copy = results / finished.run.run_dir.name
    shutil.copytree(finished.run.run_dir, copy)
    real = torch.load(copy / CHECKPOINT_FILE, weights_only=True)
    (copy / CHECKPOINT_FILE).write_bytes(torch_bytes({**real, "model": Payload(marker)}))
    (copy / INIT_FILE).write_bytes(torch_bytes({"blocks.0.weight": Payload(marker)}))
    code, out, err = run_cli(capsys, ["audit", str(copy)])
    assert code == 2
    assert_one_line_error(out, err, "checkpoint", "never unpickles")
    code, out, err = run_cli(capsys, ["figures", str(results), "--out", str(tmp_path / "f")])
    assert code == 0, err  # figures read the records only
    # train --resume of an interrupted run: a payload checkpoint, then a payload init file
    overrides = tiny_config(finished.data, tmp_path / "resume", **{"optim.epochs": 2})
    config = RunConfig().replace(**overrides)
    kill_run_at(config, epoch=2)
    run_dir = tmp_path / "resume" / run_id(config)
    good_checkpoint = (run_dir / CHECKPOINT_FILE).read_bytes()
    (run_dir / CHECKPOINT_FILE).write_bytes(torch_bytes({"epoch": 1, "x": Payload(marker)}))
    argv = ["train", "--config", config_file(tmp_path, overrides), "--resume"]
    code, out, err = run_cli(capsys, argv)
    assert code == 2
    assert_one_line_error(out, err, "never unpickles")
    (run_dir / CHECKPOINT_FILE).write_bytes(good_checkpoint)
    (run_dir / INIT_FILE).write_bytes(torch_bytes({"blocks.0.weight": Payload(marker)}))
    code, out, err = run_cli(capsys, argv)  # init.pt is checked before epoch 2 trains
    assert code == 2
    assert_one_line_error(out, err, "parameter file", "never unpickles")
    assert load_record(run_dir).status == "interrupted"
    # train on a CIFAR folder with a payload batch
    folder = write_cifar10(tmp_path / "cifar")
    (folder / "data_batch_3").write_bytes(pickle.dumps(
        {b"data": Payload(marker), b"labels": [0, 1]}))
    code, out, err = run_cli(capsys, [
        "train", "--dataset", "cifar10", "--data-dir", str(folder), "--out",
        str(tmp_path / "c"), "--set", "diagnostics.eval_samples=4"])
    assert code == 2
    assert_one_line_error(out, err, "data_batch_3", "refusing to load")
    assert not marker.exists()


# --- a run id means the same data --------------------------------------------------------------
def test_the_same_data_in_another_folder_is_the_same_run(finished, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(finished.data, copy)
    gzipped = tmp_path / "gz"
    gzipped.mkdir()
    for path in finished.data.iterdir():
        (gzipped / f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
    ids = {run_id(finished.config.replace(**{"data.data_dir": str(folder)}))
           for folder in (finished.data, copy, gzipped)}
    assert ids == {finished.run.run_dir.name}
    before = snapshot(finished.results)
    code, out, _ = run_cli(capsys, ["train", "--config", config_file(tmp_path, {
        **finished.overrides, "data.data_dir": str(copy)})])
    assert code == 0 and str(finished.run.run_dir) in out  # found, not trained again
    assert snapshot(finished.results) == before


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["edited", "edited-mtime-restored"])
def test_one_changed_byte_is_another_run(finished, tmp_path, keep_mtime):
    copy = tmp_path / "copy"
    shutil.copytree(finished.data, copy)
    config = finished.config.replace(**{"data.data_dir": str(copy)})
    assert run_id(config) == finished.run.run_dir.name
    flip_byte(copy / TEST_IMAGES, keep_mtime=keep_mtime)
    assert run_id(config) != finished.run.run_dir.name


def test_options_that_change_no_weight_keep_the_run_id(finished, tmp_path):
    base = run_id(finished.config)
    same = [{"diagnostics.frozen_acc": 0.3}, {"run.progress": True}, {"run.threads": 1},
            {"run.device": "cpu"}, {"run.out_dir": str(tmp_path)},
            {"run.tensorboard": str(tmp_path)}, {"run.wandb_project": "p"}]
    for overrides in same:
        assert run_id(finished.config.replace(**overrides)) == base, overrides
    for overrides in ({"optim.lr": 2e-3}, {"run.seed": 7}, {"diagnostics.eval_samples": 16}):
        assert run_id(finished.config.replace(**overrides)) != base, overrides


def test_audit_and_resume_refuse_data_that_changed(finished, tmp_path, capsys, kill_run_at):
    data = tmp_path / "data"
    shutil.copytree(finished.data, data)
    overrides = tiny_config(data, tmp_path / "out", **{"optim.epochs": 2})
    config = RunConfig().replace(**overrides)
    kill_run_at(config, epoch=2)  # an interrupted run with epoch 1 checkpointed
    run_dir = tmp_path / "out" / run_id(config)
    flip_byte(data / TEST_IMAGES)
    before = snapshot(tmp_path / "out")
    code, out, err = run_cli(capsys, ["audit", str(run_dir), "--no-metrics"])
    assert code == 2
    # the file that changed is named (the record keeps each file's digest), and audit's own
    # way to point at the data (it said "point data.data_dir", a key audit cannot set)
    line = assert_one_line_error(out, err, "fingerprint", f"other data: {TEST_IMAGES} "
                                 "differs); pass --data-dir DIR")
    assert "data.data_dir" not in line
    code, out, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, overrides),
                                      "--resume"])
    assert code == 2
    assert_one_line_error(out, err, "cannot resume", run_dir.name, "not that data any more",
                          f"{TEST_IMAGES} differs;")
    assert snapshot(tmp_path / "out") == before


def test_a_failed_run_is_retried_only_when_its_config_or_data_changed(
        finished, tmp_path, capsys, monkeypatch):
    from creditaudit.run.trainer import Trainer

    data = tmp_path / "data"
    shutil.copytree(finished.data, data)
    out = tmp_path / "out"
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(tiny_config(data, out)))

    def boom(self, epoch):  # noqa: ANN001
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_epoch", boom)
        code, _, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert code == 1
    failed = out / run_id(RunConfig().replace(**tiny_config(data, out)))
    assert load_record(failed).status == "failed"
    code, stdout, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert code == 1 and "--retry-failed" in stdout  # unchanged: skipped, with the hint
    starts = [json.loads(line) for line in (out / SWEEP_LOG_FILE).read_text().splitlines()
              if json.loads(line)["event"] == "start"]
    assert len(starts) == 1
    flip_byte(data / TEST_IMAGES)  # other data: another run, trained
    code, _, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert code == 0
    sweep.write_text(sweep_toml(tiny_config(data, out, **{"optim.lr": 2e-3})))
    code, _, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])  # other config
    assert code == 0
    statuses = sorted(load_record(p).status for p in out.glob(f"*/{RECORD_FILE}"))
    assert statuses == ["completed", "completed", "failed"]


# --- strict JSON ---------------------------------------------------------------------------------
def test_non_finite_numbers_are_null_plus_a_reason(finished, tmp_path):
    record = new_record(finished.config, device="cpu")
    measures = EpochMeasures(hidden_norms=[1.0, 2.0], bp_grad_norms_per_sample_med=[0.1, 0.1],
                             g_L_zero_fraction=0.0, g_L_nonzero_median=0.1,
                             cos_per_layer=[1.0, math.nan])
    record.log.append(EpochEntry(epoch=0, test_loss=math.inf, measures=measures,
                                 extras={"energy_gap": -math.inf}))  # a rule's own value
    record.final = FinalResults(epochs_completed=0, deep_cos=math.nan)
    path = save_record(tmp_path, record)
    text = path.read_text()
    raw = check_strict(text)  # a strict parser reads it
    assert raw["final"]["deep_cos"] is None and raw["log"][0]["cos_per_layer"][1] is None
    assert raw["non_finite"] == {"/log/0/test_loss": "Infinity",
                                 "/log/0/cos_per_layer/1": "NaN",
                                 "/log/0/energy_gap": "-Infinity",
                                 "/final/deep_cos": "NaN"}
    loaded = load_record(path)  # the round trip is lossless
    assert math.isnan(loaded.final.deep_cos) and loaded.log[0].test_loss == math.inf
    assert loaded.log[0].extras["energy_gap"] == -math.inf


def test_bare_nan_tokens_are_refused_by_the_strict_check_but_still_load(finished, tmp_path,
                                                                        plant):
    good = save_record(tmp_path / "good", new_record(finished.config, device="cpu"))
    legacy = json.loads(good.read_text())
    legacy["final"] = {"epochs_completed": 0, "deep_cos": math.nan}
    del legacy["content_sha256"]  # written before records kept a digest of their content
    path = plant(tmp_path / "legacy" / RECORD_FILE, json.dumps(legacy))  # bare NaN token
    with pytest.raises(ValueError, match="NaN"):
        check_strict(path.read_text())
    assert math.isnan(load_record(path).final.deep_cos)


INNER_TEST = '''
from creditaudit.records import RECORD_FILE

def test_writes_a_record(tmp_path):
    (tmp_path / RECORD_FILE).write_text('{"schema": "creditaudit.run/2", "deep_cos": %s}')
'''


@pytest.mark.parametrize("value", ["NaN", "null"])
def test_a_record_with_a_nan_token_fails_the_session(tmp_path, plant, value):
    """The session check in conftest.py: one record.json with a NaN token anywhere under
    pytest's temp folder fails a run whose tests all passed."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), project / "conftest.py")
    (project / "test_inner.py").write_text(INNER_TEST % value)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             f"--basetemp={tmp_path / 'inner'}", str(project)],
                            capture_output=True, text=True, timeout=120)
    plant.register(*(tmp_path / "inner").rglob(RECORD_FILE))
    if value == "NaN":
        assert result.returncode != 0, result.stdout
        assert "1 passed" in result.stdout and "not strict JSON" in result.stdout
    else:
        assert result.returncode == 0, result.stdout + result.stderr


# --- files and folders -------------------------------------------------------------------------
def _failing(monkeypatch, name: str, code: int, *, when=lambda *args: True) -> None:  # noqa: ANN001
    """Make ``os.<name>`` / ``tempfile.<name>`` raise OSError(code) when ``when(*args)``."""
    module = tempfile if name == "mkstemp" else os
    original = getattr(module, name)

    def broken(*args, **kwargs):
        if when(*args):
            raise OSError(code, os.strerror(code))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, broken)


def no_partial_files(folder: Path) -> None:
    """No temporary file is left, and every record and checkpoint loads."""
    from creditaudit.records import load_checkpoint

    leftovers = [p for p in folder.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []
    for path in folder.rglob(RECORD_FILE):
        load_record(path)
    for path in folder.rglob(CHECKPOINT_FILE):
        load_checkpoint(path)


@pytest.mark.parametrize(("name", "code", "reason"), [
    ("mkstemp", errno.EROFS, "read-only"),
    ("replace", errno.EROFS, "read-only"),
    ("fsync", errno.ENOSPC, "no space left"),
])
def test_a_read_only_or_full_disk_is_one_line_and_leaves_no_partial_file(
        finished, tmp_path, capsys, monkeypatch, name, code, reason):
    out = tmp_path / "out"
    argv = ["train", "--config", config_file(tmp_path, tiny_config(finished.data, out))]
    with monkeypatch.context() as patch:
        _failing(patch, name, code)
        status, stdout, err = run_cli(capsys, argv)
    assert status == 2
    assert_one_line_error(stdout, err, str(out), reason)
    no_partial_files(tmp_path)
    report = tmp_path / "report.md"
    with monkeypatch.context() as patch:
        _failing(patch, name, code)
        status, stdout, err = run_cli(capsys, ["audit", str(finished.run.run_dir), "-q",
                                               "--no-metrics", "--output", str(report)])
    assert status == 2
    assert_one_line_error(stdout, err, str(report) if name != "mkstemp" else str(tmp_path),
                          reason)
    assert not report.exists()
    no_partial_files(tmp_path)


def test_a_disk_that_fills_mid_run_leaves_a_resumable_run(finished, tmp_path, capsys,
                                                          monkeypatch):
    """The record write after epoch 1 fails: one line, the epoch-0 record is intact, the
    epoch-1 checkpoint is whole, and --resume finishes the run."""
    overrides = tiny_config(finished.data, tmp_path / "out", **{"optim.epochs": 2})
    argv = ["train", "--config", config_file(tmp_path, overrides)]
    writes = []

    def record_write(src, dst):  # noqa: ANN001
        writes.append(dst)
        return Path(dst).name == RECORD_FILE and len(
            [w for w in writes if Path(w).name == RECORD_FILE]) >= 2

    with monkeypatch.context() as patch:
        _failing(patch, "replace", errno.ENOSPC, when=record_write)
        status, stdout, err = run_cli(capsys, argv)
    assert status == 2
    assert_one_line_error(stdout, err, RECORD_FILE, "no space left")
    no_partial_files(tmp_path)
    run_dir = tmp_path / "out" / run_id(RunConfig().replace(**overrides))
    assert [e.epoch for e in load_record(run_dir).log] == [0]
    status, _, _ = run_cli(capsys, [*argv, "--resume"])
    assert status == 0
    assert [e.epoch for e in load_record(run_dir).log] == [0, 1, 2]


def test_a_claim_that_cannot_be_written_is_one_line_and_removed(finished, tmp_path, capsys,
                                                                monkeypatch):
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(tiny_config(finished.data, tmp_path / "out")))
    with monkeypatch.context() as patch:
        _failing(patch, "write", errno.ENOSPC)
        status, stdout, err = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert status == 2
    assert_one_line_error(stdout, err, CLAIM_FILE, "no space left", progress="sweep: ")
    assert not list(tmp_path.rglob(CLAIM_FILE))


def test_a_full_disk_in_a_sweep_is_said_as_train_says_it(finished, tmp_path, capsys,
                                                         monkeypatch):
    """A sweep's run stopped by a full disk was listed 'interrupted: RUN: DiskFullError:
    cannot write …' (progress line, table, summary), naming the exception's class where
    train says the plain sentence; it now says what train says: what and how to fix it."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(tiny_config(finished.data, tmp_path / "out")))
    with monkeypatch.context() as patch:
        _failing(patch, "replace", errno.ENOSPC,
                 when=lambda src, dst, *rest: Path(dst).name == CHECKPOINT_FILE)
        status, stdout, err = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert "Error" not in stdout + err, stdout + err
    (run_dir,) = (tmp_path / "out").glob("*/")
    said = (f"interrupted: {run_dir.name}: cannot write {run_dir / CHECKPOINT_FILE}: no space "
            "left on the device: free some space and retry")
    assert said in stdout, stdout
    summary = json.loads((tmp_path / "out" / "sweep_summary.json").read_text())
    assert [run["error"] for run in summary["runs"]] == [said.split(": ", 2)[2]]


BAD_RECORDS = {
    "binary": bytes(range(256)),
    "not-utf8": b'{"schema": "creditaudit.run/2", "note": "\xff"}',
    "wrong-schema": b'{"schema": "someone.else/1"}',
}


@pytest.mark.parametrize("kind", BAD_RECORDS)
def test_an_unreadable_record_is_named_in_one_warning_and_skipped(
        finished, tmp_path, capsys, caplog, plant, kind):
    results = tmp_path / "results"
    shutil.copytree(finished.results, results)
    bad = plant(results / "broken-run" / RECORD_FILE, BAD_RECORDS[kind])
    sweep = tmp_path / "s.toml"
    sweep_out = tmp_path / "sweep"
    sweep.write_text(sweep_toml(tiny_config(finished.data, sweep_out)))
    own = sweep_out / run_id(RunConfig().replace(**tiny_config(finished.data, sweep_out)))
    plant(own / RECORD_FILE, BAD_RECORDS[kind])  # the sweep's own run: started over
    commands = {
        "figures": (["figures", str(results)], bad),
        "report": (["report", str(results)], bad),
        "export": (["export", str(results), str(tmp_path / "export")], bad),
        "audit": (["audit", str(results / finished.run.run_dir.name), "-q", "--no-metrics"],
                  bad),
        "sweep": (["sweep", str(sweep), "--workers", "0"], own / RECORD_FILE),
    }
    for command, (argv, named) in commands.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            status, _, err = run_cli(capsys, argv)
        assert status == 0, f"{command}: {err}"
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len([w for w in warnings if str(named) in w]) == 1, (command, warnings)
    assert load_record(own).status == "completed"


# --- processes --------------------------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_killing_the_sweep_parent_takes_its_workers_down(finished, tmp_path, capsys):
    out = tmp_path / "out"
    base = tiny_config(finished.data, out, **{"optim.epochs": 250})
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(base, '[grid]\n"method.name" = ["bp", "dfa"]\n'))
    configs = [RunConfig().replace(**{**base, "method.name": m}) for m in ("bp", "dfa")]
    run_dirs = [out / run_id(c) for c in configs]
    parent = subprocess.Popen(
        [sys.executable, "-m", "creditaudit", "sweep", str(sweep), "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline:  # both runs past epoch 2, neither finished
            states = [load_record(d) if (d / CHECKPOINT_FILE).exists() else None
                      for d in run_dirs]
            if all(s is not None and s.status == "running" and len(s.log) >= 3
                   for s in states):
                break
            assert parent.poll() is None, "the sweep ended before both runs were under way"
            time.sleep(0.05)
        else:
            pytest.fail("the sweep never had both runs under way")
        workers = children(parent.pid)
        assert len(workers) >= 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 10
        while any(map(alive, workers)) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(map(alive, workers)), "workers outlived their parent by 10 s"
    finally:
        for pid in [parent.pid, *workers]:  # only the processes this test started
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    for run_dir in run_dirs:
        assert load_record(run_dir).status == "interrupted"
        assert not (run_dir / CLAIM_FILE).exists()
    status, _, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert status == 0
    for run_dir in run_dirs:
        record = load_record(run_dir)
        assert record.status == "completed"
        assert [e.epoch for e in record.log] == list(range(251))
    actions = [json.loads(line)["action"] for line in (out / SWEEP_LOG_FILE).read_text()
               .splitlines() if json.loads(line)["event"] == "start"]
    assert actions == ["trained", "trained", "resumed", "resumed"]
