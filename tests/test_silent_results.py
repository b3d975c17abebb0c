"""No silently wrong result: the outside tester's cases where a run recorded something other
than what it claims, each reproduced and shown fixed.

- a poisoned MNIST-1D cache (zeroed labels, NaN features) is never trained on;
- an edited ``fingerprints.json`` cannot make other data reuse a finished run;
- ``--resume`` never changes what the remaining epochs record (``--frozen-acc``);
- a run killed between its epoch-0 record and its first checkpoint starts again without
  ``--force``;
- a full disk interrupts a run (resumable) instead of failing it;
- a diverged run's headline accuracy is its last finite epoch's, and says so.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.data import identity, load_dataset
from creditaudit.data import mnist1d as m1d
from creditaudit.descriptions import CONTENT_DIGEST, DataIdentity
from creditaudit.errors import RunRecordError
from creditaudit.files import cache as user_cache
from creditaudit.records import (
    CHECKPOINT_FILE,
    RECORD_FILE,
    comparable,
    load_checkpoint,
    load_record,
    new_record,
)
from creditaudit.report import format_run_summary
from creditaudit.run.plan import run_id
from creditaudit.run.resume import check_same_data
from creditaudit.run.trainer import Trainer, train
from creditaudit.sweep import SWEEP_LOG_FILE
from integrity_support import (
    assert_one_line_error,
    nan_weights_after,
    snapshot,
    sweep_toml,
    tiny_config,
    toml_of,
    write_idx_dataset,
)
from test_data_decoders import READS, counted_read

pytestmark = pytest.mark.usefixtures("single_thread")

# A tiny synthetic run: about a second per run on the 2-core machine.
TINY = {"data.n_train": 256, "data.n_test": 128, "data.in_dim": 8, "data.teacher_width": 16,
        "model.d": 16, "model.n_blocks": 2, "optim.epochs": 2, "optim.batch_size": 64,
        "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
        "run.progress": False}
MNIST1D = {"data.name": "mnist1d", "data.n_train": 600, "data.n_test": 200, "model.d": 16,
           "model.n_blocks": 2, "optim.epochs": 1, "optim.batch_size": 64,
           "diagnostics.eval_samples": 128, "diagnostics.end_of_run": False,
           "run.progress": False}


def tiny(out: Path, **overrides: object) -> dict[str, object]:
    return {**TINY, "run.out_dir": str(out), **overrides}


def config_file(folder: Path, overrides: dict[str, object]) -> str:
    path = folder / "config.toml"
    path.write_text(toml_of(overrides))
    return str(path)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh user cache folder (generated data, fingerprints, the signing key)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CREDITAUDIT_CACHE", str(folder))
    return folder


# --- 1. a poisoned generated-data cache ----------------------------------------------------
def poison(path: Path, how: str) -> None:
    """Damage the arrays of an MNIST-1D cache file so that it still loads (same shapes and
    dtypes): the tester's attacks."""
    with np.load(path) as npz:
        arrays = {key: npz[key].copy() for key in npz.files}
    if how == "labels":
        arrays["train_y"][:] = 0
        arrays["test_y"][:] = 0
    else:
        arrays["train_x"][:5] = np.nan
    np.savez(path, **arrays)


def mnist1d_arrays(dataset) -> list[np.ndarray]:  # noqa: ANN001
    return [t.numpy() for t in (dataset.train_x, dataset.train_y, dataset.test_x,
                                dataset.test_y)]


@pytest.mark.parametrize("digest", ["kept", "edited-to-match", "deleted"])
@pytest.mark.parametrize("how", ["labels", "nan-features"])
def test_a_poisoned_mnist1d_cache_is_regenerated_with_one_warning(cache, caplog, how, digest):
    """Whatever the attacker does to the digest beside the file (leave it, write the
    poisoned arrays' digest into it, delete it), the arrays returned are the generator's."""
    options = RunConfig().replace(**MNIST1D).data
    clean = load_dataset(options, seed=42)
    (path,) = cache.glob("mnist1d-*.npz")
    poison(path, how)
    digest_file = m1d.digest_path(path)
    if digest == "edited-to-match":
        with np.load(path) as npz:
            poisoned = tuple(npz[key] for key in ("train_x", "train_y", "test_x", "test_y"))
        entry = json.loads(digest_file.read_text())
        digest_file.write_text(json.dumps({**entry, "sha256": m1d.arrays_digest(poisoned)}))
    elif digest == "deleted":
        digest_file.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="creditaudit.data.mnist1d"):
        again = load_dataset(options, seed=42)
    for got, expected in zip(mnist1d_arrays(again), mnist1d_arrays(clean)):
        np.testing.assert_array_equal(got, expected)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0], warnings
    assert again.provenance[CONTENT_DIGEST] == clean.provenance[CONTENT_DIGEST]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="creditaudit.data.mnist1d"):
        load_dataset(options, seed=42)  # the cache was repaired: silent from now on
    assert not caplog.records


def test_a_cache_without_a_digest_is_checked_once_then_trusted(cache, monkeypatch, caplog):
    options = RunConfig().replace(**MNIST1D).data
    first = load_dataset(options, seed=42)
    (path,) = cache.glob("mnist1d-*.npz")
    m1d.digest_path(path).unlink()  # as a cache written before digests existed
    calls = []
    real = m1d.generate_mnist1d
    monkeypatch.setattr(m1d, "generate_mnist1d", lambda args: calls.append(1) or real(args))
    with caplog.at_level(logging.WARNING, logger="creditaudit.data.mnist1d"):
        second = load_dataset(options, seed=42)  # generated once more to compare
        third = load_dataset(options, seed=42)   # then its digest is trusted
    assert len(calls) == 1 and not caplog.records
    assert m1d.digest_path(path).exists()
    assert first.provenance[CONTENT_DIGEST] == second.provenance[CONTENT_DIGEST] \
        == third.provenance[CONTENT_DIGEST] == m1d.arrays_digest(
            m1d.generate_mnist1d(first.provenance["args"]))


def test_a_poisoned_cache_cannot_change_a_runs_result(cache, tmp_path):
    """The tester's run: labels zeroed in the cache changed test accuracy under the same
    run id. Now a rerun on the poisoned cache gives the identical record, and the record
    names the arrays it trained on."""
    config = RunConfig().replace(**MNIST1D, **{"run.out_dir": str(tmp_path / "out")})
    clean = train(config)
    (path,) = cache.glob("mnist1d-*.npz")
    poison(path, "labels")
    again = train(config, force=True)
    assert again.run_dir == clean.run_dir
    assert comparable(again.record) == comparable(clean.record)
    recorded = load_record(again.run_dir).data.provenance[CONTENT_DIGEST]
    assert recorded == m1d.arrays_digest(m1d.generate_mnist1d(
        m1d.mnist1d_generator_args(config.data, 42)))


def test_resume_and_audit_refuse_arrays_other_than_those_trained_on(tmp_path):
    """Same generator arguments (same run id), other arrays (another numpy build, say):
    the content digest in the record tells them apart."""
    record = new_record(RunConfig(), device="cpu")
    provenance = {"args": {"seed": 1}}
    record.data = DataIdentity("mnist1d", "f" * 64, "s" * 64,
                               provenance={**provenance, CONTENT_DIGEST: "a" * 64})
    same = DataIdentity("mnist1d", "f" * 64, "s" * 64,
                        provenance={**provenance, CONTENT_DIGEST: "a" * 64})
    check_same_data(record, same, tmp_path)
    check_same_data(record, DataIdentity("mnist1d", "f" * 64, "s" * 64,
                                         provenance=provenance), tmp_path)  # not loaded
    other = DataIdentity("mnist1d", "f" * 64, "s" * 64,
                         provenance={**provenance, CONTENT_DIGEST: "b" * 64})
    with pytest.raises(RunRecordError, match="aaaaaaaaaaaa.*bbbbbbbbbbbb"):
        check_same_data(record, other, tmp_path)


# --- 2. a tampered fingerprints.json ------------------------------------------------------
@pytest.fixture
def fingerprints(cache, monkeypatch) -> Path:
    """The fingerprint cache, caching even files written a moment ago, and an empty
    in-memory cache (as in a new process)."""
    monkeypatch.setattr(identity, "RACY_SECONDS", -1.0)
    monkeypatch.setattr(identity, "_MEMORY", {})
    return cache / identity.FINGERPRINT_CACHE


def forge(entry: object, digest_of: object) -> object:
    """``entry`` with its digest replaced by that of ``digest_of`` — one JSON value
    edited, whatever the entries look like."""
    if isinstance(entry, dict) and isinstance(digest_of, dict):
        return {**entry, "sha256": digest_of["sha256"]}
    return digest_of


def test_a_tampered_fingerprint_cache_cannot_make_other_data_reuse_a_run(
        fingerprints, tmp_path, capsys, monkeypatch):
    ours = write_idx_dataset(tmp_path / "ours", seed=0)
    other = write_idx_dataset(tmp_path / "other", seed=1)
    overrides = tiny_config(ours, tmp_path / "out")
    finished = train(RunConfig().replace(**overrides))
    other_overrides = {**overrides, "data.data_dir": str(other)}
    honest = run_id(RunConfig().replace(**other_overrides))
    assert honest != finished.run_dir.name
    # Paste each of our files' digests over the same file's entry of the other folder.
    entries = json.loads(fingerprints.read_text())
    by_name = {Path(k.split("|")[0]).name: v for k, v in entries.items()
               if k.startswith(str(ours.resolve()))}
    forged = {k: forge(v, by_name[Path(k.split("|")[0]).name])
              if k.startswith(str(other.resolve())) else v for k, v in entries.items()}
    assert len(by_name) == 4 and forged != entries
    fingerprints.write_text(json.dumps(forged))
    monkeypatch.setattr(identity, "_MEMORY", {})
    assert run_id(RunConfig().replace(**other_overrides)) == honest
    before = snapshot(tmp_path / "out")
    code, out, err = run_cli(capsys, ["train", "--config", config_file(tmp_path,
                                                                        other_overrides)])
    assert code == 0, err
    assert str(tmp_path / "out" / honest) in out  # trained as its own run
    assert load_record(tmp_path / "out" / honest).status == "completed"
    assert {k: v for k, v in snapshot(tmp_path / "out").items() if k in before} == before


def test_fingerprint_cache_entries_are_signed_verified_and_recomputed_quietly(
        fingerprints, tmp_path, monkeypatch, caplog):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x01\x02\x03")
    reads = READS  # counted_read's: a module's function is what a digest is cached under
    reads.clear()
    decode = counted_read
    digest = identity.file_digest(path, decode)
    entry = next(iter(json.loads(fingerprints.read_text()).values()))
    assert entry["sha256"] == digest and len(entry["mac"]) == 64
    monkeypatch.setattr(identity, "_MEMORY", {})
    assert identity.file_digest(path, decode) == digest and len(reads) == 1  # trusted
    bad_entries = [{**entry, "sha256": "0" * 64}, {**entry, "mac": "0" * 64},
                   entry["sha256"], {"sha256": entry["sha256"]}, [1, 2], None]
    for bad in bad_entries:
        key = next(iter(json.loads(fingerprints.read_text())))
        fingerprints.write_text(json.dumps({key: bad}))
        monkeypatch.setattr(identity, "_MEMORY", {})
        with caplog.at_level(logging.INFO):
            assert identity.file_digest(path, decode) == digest, bad
        assert not [r for r in caplog.records if r.levelno >= logging.INFO], bad
    assert len(reads) == 1 + len(bad_entries)  # each bad entry: hashed again


@pytest.mark.parametrize("plant", ["named-pipe", "deep-nesting"])
def test_a_fingerprint_cache_that_is_no_json_file_only_means_hashing_again(
        fingerprints, tmp_path, plant):
    """The cache is never required: a named pipe there blocked every run forever (opening it
    waits for a writer), and 200 000 nested ``[`` ended in RecursionError."""
    import hashlib
    import threading

    path = tmp_path / "data.bin"
    path.write_bytes(b"\x01\x02\x03")
    fingerprints.parent.mkdir(parents=True, exist_ok=True)
    if plant == "named-pipe":
        os.mkfifo(fingerprints)
    else:
        fingerprints.write_text("[" * 200_000)
    found: list[object] = []

    def digest() -> None:
        try:
            found.append(identity.file_digest(path))
        except BaseException as err:  # noqa: BLE001 - the test reports it
            found.append(err)

    worker = threading.Thread(target=digest, daemon=True)
    worker.start()
    worker.join(timeout=10)
    blocked = worker.is_alive()
    if blocked:  # opening the pipe: give it a writer, so that the thread ends
        os.close(os.open(fingerprints, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=10)
    assert not blocked
    assert found == [hashlib.sha256(b"\x01\x02\x03").hexdigest()]


def test_a_files_digest_is_cached_by_how_it_is_read(fingerprints, tmp_path, monkeypatch):
    """A gzip file hashed gunzipped (the IDX loader) is not served as the digest of its raw
    bytes to a dataset reading it raw, in this process or the next: a plugin's fingerprint
    must not depend on what another dataset hashed first."""
    import gzip
    import hashlib

    from creditaudit.data.idx import read_idx_bytes

    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x02\x07\x09"))
    raw = hashlib.sha256(path.read_bytes()).hexdigest()
    decoded = identity.file_digest(path, read_idx_bytes)
    assert decoded == hashlib.sha256(read_idx_bytes(path)).hexdigest() != raw
    assert identity.file_digest(path) == raw
    monkeypatch.setattr(identity, "_MEMORY", {})  # a new process: only the file remembers
    assert identity.file_digest(path) == raw
    assert identity.file_digest(path, read_idx_bytes) == decoded
    # a decoder without a name of its own is never cached under another's
    assert identity.file_digest(path, lambda p: b"x") == hashlib.sha256(b"x").hexdigest()


def test_the_signing_key_is_private_and_a_shared_one_is_replaced(cache, monkeypatch):
    monkeypatch.setattr(user_cache, "_KEYS", {})
    mac = user_cache.sign("a", "b")
    key_file = cache / user_cache.KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert user_cache.verify(mac, "a", "b") and not user_cache.verify(mac, "ab", "")
    assert not user_cache.verify(mac, "a", "c") and not user_cache.verify(None, "a", "b")
    os.chmod(key_file, 0o644)  # readable by others: anyone could sign with it
    monkeypatch.setattr(user_cache, "_KEYS", {})
    assert not user_cache.verify(mac, "a", "b")  # a new key: old signatures void
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


# --- 3. resume never changes the question -------------------------------------------------
@pytest.mark.parametrize(("started", "resumed"), [(None, 0.9), (0.5, None), (0.5, 0.6)])
def test_resume_refuses_a_record_option_that_differs(tmp_path, capsys, kill_run_at, started,
                                                     resumed):
    base = tiny(tmp_path / "out", **{"optim.epochs": 3})
    first = {**base, **({"diagnostics.frozen_acc": started} if started is not None else {})}
    config = RunConfig().replace(**first)
    kill_run_at(config, epoch=2)
    run_dir = tmp_path / "out" / run_id(config)
    again = {**base, **({"diagnostics.frozen_acc": resumed} if resumed is not None else {})}
    assert run_id(RunConfig().replace(**again)) == run_dir.name  # a "record" option
    before = snapshot(tmp_path / "out")
    code, out, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, again),
                                      "--resume"])
    assert code == 2
    assert_one_line_error(out, err, "cannot resume", f"diagnostics.frozen_acc={resumed!r}",
                          f"diagnostics.frozen_acc={started!r}", "--force")
    with pytest.raises(RunRecordError, match="diagnostics.frozen_acc"):
        Trainer(RunConfig().replace(**again)).run(resume=True)  # the Python API too
    assert snapshot(tmp_path / "out") == before
    # With the record's value (and a "place" option changed) the run resumes, and the
    # record's config is the config of every epoch.
    code, _, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, first),
                                    "--resume", "--threads", "1"])
    assert code == 0, err
    record = load_record(run_dir)
    assert record.status == "completed" and record.config.diagnostics.frozen_acc == started
    d_statuses = [e.protocol["d"] for e in record.log if e.protocol]
    assert len(d_statuses) == 3
    if started is None:
        assert set(d_statuses) == {"not evaluated"}
    else:
        assert "not evaluated" not in d_statuses


@pytest.mark.parametrize(("trained", "given"), [(None, 0.9), (0.5, None), (0.5, 0.6)])
def test_a_finished_run_is_not_served_for_a_record_option_that_differs(tmp_path, capsys,
                                                                        trained, given):
    base = tiny(tmp_path / "out", **{"optim.epochs": 1})
    first = {**base, **({"diagnostics.frozen_acc": trained} if trained is not None else {})}
    again = {**base, **({"diagnostics.frozen_acc": given} if given is not None else {})}
    code, _, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, first)])
    assert code == 0, err
    run_dir = tmp_path / "out" / run_id(RunConfig().replace(**first))
    assert run_id(RunConfig().replace(**again)) == run_dir.name  # a "record" option
    before = snapshot(tmp_path / "out")
    code, out, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, again)])
    assert code == 2
    fix = [f"creditaudit audit {run_dir} --frozen {given}"] if given is not None else []
    assert_one_line_error(out, err, "already completed", f"diagnostics.frozen_acc={given!r}",
                          f"diagnostics.frozen_acc={trained!r}", "--force", *fix)
    with pytest.raises(RunRecordError, match="diagnostics.frozen_acc"):
        train(RunConfig().replace(**again))  # the Python API too
    assert snapshot(tmp_path / "out") == before
    if given is not None:  # the advice works: (d) of the finished run against the value
        code, out, err = run_cli(capsys, ["audit", str(run_dir), "--frozen", str(given),
                                          "--no-metrics", "--format", "json", "-q"])
        assert code == 0, err
        assert json.loads(out)["diagnostics"]["d"]["status"] != "not evaluated"
    # The recorded value is served as ever.
    served = train(RunConfig().replace(**first))
    assert served.run_dir == run_dir and served.record.config.diagnostics.frozen_acc == trained
    assert snapshot(tmp_path / "out") == before


# --- 4. the epoch-0 window ----------------------------------------------------------------
@pytest.mark.parametrize("resume", [False, True], ids=["train", "train-resume"])
def test_a_kill_before_the_first_checkpoint_restarts_without_force(tmp_path, capsys,
                                                                   monkeypatch, resume):
    overrides = tiny(tmp_path / "out")
    straight = train(RunConfig().replace(**tiny(tmp_path / "straight")))
    original = Trainer.checkpoint

    def killed(self, epoch):  # noqa: ANN001 - a kill after the epoch-0 record
        if epoch == 0:
            raise KeyboardInterrupt
        return original(self, epoch)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "checkpoint", killed)
        with pytest.raises(KeyboardInterrupt):
            train(RunConfig().replace(**overrides))
    run_dir = tmp_path / "out" / straight.run_dir.name
    record = load_record(run_dir)
    # the stop is recorded (it used to leave 'running'); nothing trained is saved
    assert record.status == "interrupted" and [e.epoch for e in record.log] == [0]
    assert not (run_dir / CHECKPOINT_FILE).exists()
    argv = ["train", "--config", config_file(tmp_path, overrides)]
    code, _, err = run_cli(capsys, [*argv, "--resume"] if resume else argv)
    assert code == 0, err
    assert comparable(load_record(run_dir)) == comparable(straight.record)
    a, b = load_checkpoint(run_dir / CHECKPOINT_FILE), load_checkpoint(
        straight.run_dir / CHECKPOINT_FILE)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


@pytest.mark.parametrize("resume", [False, True], ids=["train", "train-resume"])
def test_a_kill_before_the_first_record_restarts_with_or_without_resume(tmp_path, capsys,
                                                                        monkeypatch, resume):
    # killed while its epoch 0 was measured: config.toml and init.pt, no record.json;
    # `train --resume` said "cannot resume: no run at …" of the folder holding them
    overrides = tiny(tmp_path / "out")
    straight = train(RunConfig().replace(**tiny(tmp_path / "straight")))

    def killed(self, epoch):  # noqa: ANN001 - a kill in the epoch-0 measurement
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "measure", killed)
        with pytest.raises(KeyboardInterrupt):
            train(RunConfig().replace(**overrides))
    run_dir = tmp_path / "out" / straight.run_dir.name
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.toml", "init.pt"]
    argv = ["train", "--config", config_file(tmp_path, overrides)]
    code, _, err = run_cli(capsys, [*argv, "--resume"] if resume else argv)
    assert code == 0, err
    assert comparable(load_record(run_dir)) == comparable(straight.record)


def test_resume_of_a_folder_without_run_files_still_says_there_is_no_run(tmp_path, capsys):
    overrides = tiny(tmp_path / "out")
    straight = train(RunConfig().replace(**tiny(tmp_path / "straight")))
    (tmp_path / "out" / straight.run_dir.name).mkdir(parents=True)
    code, _, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, overrides),
                                    "--resume"])
    assert code == 2 and "cannot resume: no run at" in err


def test_temporary_files_left_by_a_kill_mid_write_go_when_the_run_goes_on(tmp_path,
                                                                          kill_run_at):
    # kill -9 between a write's temporary file and its rename leaves `.checkpoint.pt.….tmp`
    # (a checkpoint's size) that no later command removed, resumed or started over
    config = RunConfig().replace(**tiny(tmp_path / "out", **{"optim.epochs": 3}))
    kill_run_at(config)
    run_dir = next((tmp_path / "out").iterdir())
    left = [run_dir / ".checkpoint.pt.k3naa1x_.tmp", run_dir / ".record.json._vv7nm1u.tmp",
            run_dir / ".init.pt.fk_xcl1d.tmp"]
    for path in left:
        path.write_bytes(b"half a file")
    mine = run_dir / ".notes.tmp"
    mine.write_text("not creditaudit's")
    assert train(config, resume=True).status == "completed"
    assert not any(path.exists() for path in left) and mine.exists()


# --- 5. a full disk -------------------------------------------------------------------------
def test_a_full_disk_interrupts_the_run_and_the_next_sweep_resumes_it(tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "out"
    overrides = tiny(out)
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(overrides))
    straight = train(RunConfig().replace(**tiny(tmp_path / "straight")))
    run_dir = out / straight.run_dir.name
    checkpoints: list[str] = []
    real_replace = os.replace

    def full_at_epoch_1(src, dst):  # noqa: ANN001 - os.replace's arguments
        if Path(dst).name == CHECKPOINT_FILE:
            checkpoints.append(dst)
            if len(checkpoints) == 2:  # the checkpoint of epoch 1: the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full_at_epoch_1)
        code, _, _ = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    assert code != 0
    assert load_record(run_dir).status == "interrupted"  # not "failed"
    assert load_checkpoint(run_dir / CHECKPOINT_FILE)["epoch"] == 0
    code, _, err = run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])  # space freed
    assert code == 0, err
    events = [json.loads(line) for line in (out / SWEEP_LOG_FILE).read_text().splitlines()]
    assert [e["status"] for e in events if e["event"] == "end"] == ["interrupted",
                                                                     "completed"]
    assert [e["action"] for e in events if e["event"] == "start"] == ["trained", "resumed"]
    assert comparable(load_record(run_dir)) == comparable(straight.record)


def test_a_full_disk_under_train_is_one_line_and_an_interrupted_run(tmp_path, capsys,
                                                                    monkeypatch):
    overrides = tiny(tmp_path / "out")
    argv = ["train", "--config", config_file(tmp_path, overrides)]
    real_replace = os.replace
    checkpoints: list[str] = []

    def full(src, dst):  # noqa: ANN001 - the quota is reached at the checkpoint of epoch 2
        if Path(dst).name == CHECKPOINT_FILE:
            checkpoints.append(dst)
            if len(checkpoints) == 3:
                raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_replace(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", full)
        code, out, err = run_cli(capsys, argv)
    assert code == 2
    assert_one_line_error(out, err, CHECKPOINT_FILE, "quota exceeded")
    run_dir = tmp_path / "out" / run_id(RunConfig().replace(**overrides))
    assert load_record(run_dir).status == "interrupted"
    assert load_checkpoint(run_dir / CHECKPOINT_FILE)["epoch"] == 1
    code, _, err = run_cli(capsys, [*argv, "--resume"])
    assert code == 0, err
    assert [e.epoch for e in load_record(run_dir).log] == [0, 1, 2]


def _fails_then_disk_full(monkeypatch) -> None:
    """Epoch 2 raises RuntimeError('boom'); from then on no record.json can be written."""
    failed: list[bool] = []
    real_train_epoch, real_replace = Trainer.train_epoch, os.replace

    def train_epoch(self, epoch):  # noqa: ANN001, ANN202 - Trainer.train_epoch's arguments
        if epoch == 2:
            failed.append(True)
            raise RuntimeError("boom")
        return real_train_epoch(self, epoch)

    def replace(src, dst):  # noqa: ANN001, ANN202 - os.replace's arguments
        if failed and Path(dst).name == RECORD_FILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_replace(src, dst)

    monkeypatch.setattr(Trainer, "train_epoch", train_epoch)
    monkeypatch.setattr(os, "replace", replace)


def test_a_failed_run_whose_record_cannot_be_written_names_its_cause_first(
        tmp_path, capsys, monkeypatch):
    overrides = tiny(tmp_path / "out")
    with monkeypatch.context() as patch:
        _fails_then_disk_full(patch)
        code, _, err = run_cli(capsys, ["train", "--config", config_file(tmp_path, overrides)])
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert "RuntimeError: boom" in err and "no space left" in err.lower(), err
    assert err.index("RuntimeError: boom") < err.index("could not be marked failed"), err
    run_dir = tmp_path / "out" / run_id(RunConfig().replace(**overrides))
    assert load_record(run_dir).status == "running"  # its last state, which resumes


def test_a_sweep_run_that_fails_on_a_full_disk_is_failed_with_its_cause(
        tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    sweep = tmp_path / "s.toml"
    sweep.write_text(sweep_toml(tiny(out)))
    with monkeypatch.context() as patch:
        _fails_then_disk_full(patch)
        run_cli(capsys, ["sweep", str(sweep), "--workers", "0"])
    events = [json.loads(line) for line in (out / SWEEP_LOG_FILE).read_text().splitlines()]
    [end] = [e for e in events if e["event"] == "end"]
    assert end["status"] == "failed", end
    assert end["error"].startswith("RuntimeError: boom; "), end
    assert "could not be marked failed" in end["error"], end
    assert "no space left" in end["error"].lower(), end


# --- 6. a diverged run's final accuracy ----------------------------------------------------
def test_a_diverged_runs_headline_numbers_are_its_last_finite_epochs(tmp_path, capsys,
                                                                     monkeypatch):
    """Epoch 2's steps are finite but leave the weights NaN (an overflow in the last
    update): its evaluation is the NaN network's, which predicts one class."""
    monkeypatch.setattr(Trainer, "train_epoch", nan_weights_after(2))
    out = tmp_path / "out"
    result = train(RunConfig().replace(**tiny(out, **{"optim.epochs": 3})))
    record = load_record(result.run_dir)
    assert record.status == "diverged" and record.divergence["epoch"] == 2
    assert [e.epoch for e in record.log] == [0, 1, 2]
    last_finite = record.log[1]
    assert record.final.test_acc == last_finite.acc_eval == record.final_acc
    assert record.final.test_loss == last_finite.test_loss
    assert record.final.from_epoch == 1 and record.final.epochs_completed == 2
    assert record.log[2].acc_eval != last_finite.acc_eval  # the NaN network's share
    said = "diverged in epoch 2: ‡ numbers of epoch 1, the last whose evaluation was finite"
    summary = format_run_summary([record])
    assert f"{record.final_acc:.3f}‡" in summary and f"bp {said}" in summary
    code, _, err = run_cli(capsys, ["report", str(out), "--out", str(tmp_path / "report")])
    assert code == 0, err
    assert said in (tmp_path / "report" / "report.md").read_text()


def test_a_diverged_run_without_a_finite_epoch_has_no_headline_accuracy(tmp_path,
                                                                        monkeypatch):
    """With no finite evaluation to fall back on, the headline accuracy is None, not the
    overflowed network's share of one class from the log."""
    for home in ("creditaudit.run.trainer", "creditaudit.run.results"):
        monkeypatch.setattr(f"{home}.finite_entry", lambda entry: False)
    result = train(RunConfig().replace(**tiny(tmp_path / "out")))
    record = load_record(result.run_dir)
    assert record.status == "diverged" and record.log[-1].acc_eval is not None
    assert record.final.test_acc is None and record.final_acc is None
    assert "diverged in epoch 1: no epoch's evaluation was finite" in format_run_summary(
        [record])


def test_a_completed_runs_final_block_is_unchanged(tmp_path):
    """Only diverged runs whose last epoch is not finite get ``from_epoch``: records of
    every other run stay as they were."""
    result = train(RunConfig().replace(**tiny(tmp_path)))
    raw = json.loads((result.run_dir / RECORD_FILE).read_text())
    assert raw["final"] == {"epochs_completed": 2, "numbers_from": 2}  # the last epoch's
    final = load_record(result.run_dir).final
    assert final.from_epoch is None and final.test_acc == raw["log"][-1]["acc_eval"]
