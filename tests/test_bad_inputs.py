"""The bad-input battery: every subcommand, fed data, configs, overrides, records,
checkpoints, sweep files, paths and devices it must refuse.

For each case the CLI runs in-process (``creditaudit.cli.main``) and must end with a non-zero
exit, exactly one line on stderr starting ``creditaudit: error:`` (naming what is wrong:
each case lists fragments the line must contain), no traceback, and no file changed — neither
in the shared results folder (a finished run) nor in the case's own folder.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.cli import main
from creditaudit.config import RunConfig
from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE
from integrity_support import (
    Payload,
    as_written,
    assert_one_line_error,
    idx_bytes,
    snapshot,
    sweep_toml,
    tiny_config,
    toml_of,
    write_cifar10,
    write_idx_dataset,
)


@dataclass
class World:
    """Shared, read-only inputs of the battery."""

    root: Path
    data: Path          # tiny MNIST-layout IDX folder
    results: Path       # results folder holding one finished DFA run
    run_dir: Path       # that run
    config: Path        # TOML config of that run
    other_shape: Path   # checkpoint of a d=8 DFA run (another shape)
    other_method: Path  # checkpoint of a BP run of the same shape
    other_run: Path     # the d=8 run's folder (another recipe)
    a_file: Path        # a plain file, to stand where a folder should be


@pytest.fixture(scope="module")
def world(tmp_path_factory, single_thread) -> World:
    from creditaudit.run.trainer import train

    root = tmp_path_factory.mktemp("battery")
    data = write_idx_dataset(root / "mnist")
    results = root / "results"
    overrides = tiny_config(data, results, **{"method.name": "dfa"})
    run = train(RunConfig().replace(**overrides))
    assert run.status == "completed"
    config = root / "tiny.toml"
    config.write_text(toml_of(overrides))
    others = root / "others"
    shape = train(RunConfig().replace(**tiny_config(
        data, others, **{"method.name": "dfa", "model.d": 8, "optim.epochs": 0})))
    method = train(RunConfig().replace(**tiny_config(
        data, others, **{"method.name": "bp", "optim.epochs": 0})))
    a_file = root / "a_file.txt"
    a_file.write_text("not a folder\n")
    return World(root, data, results, run.run_dir, config,
                 shape.run_dir / CHECKPOINT_FILE, method.run_dir / CHECKPOINT_FILE,
                 shape.run_dir, a_file)


# --- helpers that build a case's bad inputs in its own folder -------------------------------
def train_args(w: World, *extra: str) -> list[str]:
    return ["train", "--config", str(w.config), *extra]


def copy_run(w: World, tmp: Path) -> Path:
    """A copy of the finished run in ``tmp/results`` (to be damaged by the case)."""
    copy = tmp / "results" / w.run_dir.name
    shutil.copytree(w.run_dir, copy)
    return copy


def with_record(w: World, tmp: Path, edit) -> Path:  # noqa: ANN001 - dict → dict or bytes
    """A run copy whose record.json is ``edit(record dict)`` (a dict is dumped as JSON)."""
    copy = copy_run(w, tmp)
    content = edit(json.loads((copy / RECORD_FILE).read_text()))
    path = copy / RECORD_FILE
    path.write_bytes(content if isinstance(content, bytes) else as_written(content).encode())
    return copy


def _config_edit(section: str, key: str, value: object):  # noqa: ANN202 - dict → dict
    """An edit of a record dict that sets ``config.section.key`` to ``value``."""
    def edit(record: dict) -> dict:
        record["config"][section][key] = value
        return record
    return edit


def with_checkpoint(w: World, tmp: Path, content,  # noqa: ANN001 - bytes or a Path
                    *, killed: bool = False) -> Path:
    """A run copy whose checkpoint.pt is ``content`` (bytes, or a file to copy); ``killed``:
    its record says interrupted, as a run killed after that checkpoint leaves it (only an
    unfinished run is resumed: ``--resume`` serves a finished one as it is)."""
    copy = copy_run(w, tmp)
    target = copy / CHECKPOINT_FILE
    if isinstance(content, Path):
        shutil.copyfile(content, target)
    else:
        target.write_bytes(content)
    if killed:
        record = json.loads((copy / RECORD_FILE).read_text())
        record["status"] = "interrupted"
        (copy / RECORD_FILE).write_text(as_written(record))
    return copy


def without_checkpoint(w: World, tmp: Path) -> Path:
    copy = copy_run(w, tmp)
    (copy / CHECKPOINT_FILE).unlink()
    return copy


def checkpoint_folder(w: World, tmp: Path) -> Path:
    copy = without_checkpoint(w, tmp)
    (copy / CHECKPOINT_FILE).mkdir()
    return copy


def torch_bytes(obj: object) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def checkpoint_without(w: World, key: str) -> bytes:
    state = torch.load(w.run_dir / CHECKPOINT_FILE, weights_only=True)
    del state[key]
    return torch_bytes(state)


def checkpoint_with(w: World, **entries: object) -> bytes:
    state = torch.load(w.run_dir / CHECKPOINT_FILE, weights_only=True)
    return torch_bytes({**state, **entries})


def resume_with(w: World, tmp: Path, content: bytes) -> list[str]:
    return train_args(w, "--resume", "--out", str(with_checkpoint(w, tmp, content,
                                                                  killed=True).parent))


def data_copy(w: World, tmp: Path, **files: bytes) -> Path:
    """A copy of the IDX folder with some files replaced (``name=content``; b"" deletes)."""
    folder = tmp / "data"
    shutil.copytree(w.data, folder)
    for name, content in files.items():
        path = folder / name.replace("_", "-")
        path.unlink()
        if content:
            gzipped = content.startswith(b"\x1f\x8b")
            path.with_name(path.name + ".gz" if gzipped else path.name).write_bytes(content)
    return folder


def data_args(w: World, tmp: Path, **files: bytes) -> list[str]:
    return train_args(w, "--data-dir", str(data_copy(w, tmp, **files)))


def idx_of(shape: tuple[int, ...], fill: int = 0) -> bytes:
    return idx_bytes(np.full(shape, fill, dtype=np.uint8))


def file_in(tmp: Path, name: str, content: bytes | str) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def sweep_file(w: World, tmp: Path, body: str, *, base: dict | None = None) -> Path:
    """A sweep file with the tiny run as [base] (plus ``base`` overrides) and ``body``."""
    overrides = tiny_config(w.data, tmp / "sweep_out", **(base or {}))
    return file_in(tmp, "sweep.toml", sweep_toml(overrides, body))


def cifar_with(tmp: Path, name: str, content: bytes | None) -> Path:
    folder = write_cifar10(tmp / "cifar")
    if content is None:
        (folder / name).unlink()
    else:
        (folder / name).write_bytes(content)
    return folder


def cifar_args(w: World, folder: Path) -> list[str]:
    return train_args(w, "--dataset", "cifar10", "--data-dir", str(folder),
                      "--set", "diagnostics.eval_samples=4")


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
NAN, INF = "nan", "inf"
BIG_SEED = str(2**63)

# (id, argv builder (world, case folder) → argv, fragments the error line must contain)
CASES = [
    # --- data ------------------------------------------------------------------------------
    ("data-folder-missing", lambda w, t: train_args(w, "--data-dir", str(t / "nope")),
     ["does not exist"]),
    ("data-dir-is-a-file", lambda w, t: train_args(w, "--data-dir", str(w.a_file)),
     ["a_file.txt", "is a file, not a folder"]),
    ("data-dir-unset", lambda w, t: train_args(w, "--set", "data.data_dir=none"),
     ["needs data.data_dir"]),
    ("data-folder-empty", lambda w, t: train_args(w, "--data-dir", str(file_in(t, "e/x", "")
                                                                        .parent)),
     ["is missing train-images-idx3-ubyte"]),
    ("data-idx-truncated", lambda w, t: data_args(
        w, t, train_images_idx3_ubyte=idx_of((64, 8, 8))[:-10]), ["truncated or corrupt"]),
    ("data-idx-bad-magic", lambda w, t: data_args(
        w, t, t10k_labels_idx1_ubyte=b"hello world"), ["is not an IDX file"]),
    ("data-idx-corrupt-gzip", lambda w, t: data_args(
        w, t, train_labels_idx1_ubyte=b"\x1f\x8b\x08garbage"), ["corrupt gzip"]),
    ("data-zero-images", lambda w, t: data_args(
        w, t, train_images_idx3_ubyte=idx_of((0, 8, 8)),
        train_labels_idx1_ubyte=idx_of((0,))), ["0 samples"]),
    ("data-labels-out-of-range", lambda w, t: data_args(
        w, t, t10k_labels_idx1_ubyte=idx_of((32,), fill=12)), ["expected classes 0..9"]),
    ("data-label-count-mismatch", lambda w, t: data_args(
        w, t, t10k_labels_idx1_ubyte=idx_of((31,))), ["32 images but", "31 labels"]),
    ("data-images-wrong-rank", lambda w, t: data_args(
        w, t, train_images_idx3_ubyte=idx_of((64, 64))), ["expected uint8 (N, 28, 28)"]),
    ("data-images-14x14", lambda w, t: data_args(
        w, t, train_images_idx3_ubyte=idx_of((64, 14, 14)),
        t10k_images_idx3_ubyte=idx_of((32, 14, 14))),
     ["train-images-idx3-ubyte holds 14×14 images", "has 28×28"]),
    ("data-dir-empty", lambda w, t: train_args(w, "--data-dir", ""),
     ["data.data_dir=''", "empty path"]),
    ("data-train-subset-too-large",
     lambda w, t: train_args(w, "--set", "data.train_subset=1000"),
     ["data.train_subset=1000", "64 training samples"]),
    ("data-eval-samples-too-large",
     lambda w, t: train_args(w, "--set", "diagnostics.eval_samples=1000"),
     ["diagnostics.eval_samples=1000", "32 test samples"]),
    ("data-synthetic-zero-samples",
     lambda w, t: ["train", "--set", "data.n_train=0", "--out", str(t / "o")],
     ["data.n_train=0", "out of range"]),
    ("data-cifar-missing-batch",
     lambda w, t: cifar_args(w, cifar_with(t, "test_batch", None)), ["missing test_batch"]),
    ("data-cifar-garbage",
     lambda w, t: cifar_args(w, cifar_with(t, "data_batch_2", b"\x80\x04garbage")),
     ["data_batch_2", "truncated or corrupt"]),
    ("data-cifar-payload", lambda w, t: cifar_args(w, cifar_with(t, "data_batch_1", pickle.dumps(
        {b"data": Payload(t / "marker"), b"labels": [0]}))), ["refusing to load io.open"]),
    ("data-cifar-wrong-shape", lambda w, t: cifar_args(w, cifar_with(t, "test_batch", pickle.dumps(
        {b"data": np.zeros((4, 10), np.uint8), b"labels": [0] * 4}))), ["expected (N, 3072)"]),
    ("data-cifar-not-a-dict",
     lambda w, t: cifar_args(w, cifar_with(t, "test_batch", pickle.dumps([1, 2]))),
     ["holds a list"]),
    # --- config files ----------------------------------------------------------------------
    # a run's record.json as --config: its config is checked as a config file's (a key its
    # rule does not read, or a misspelt one, was dropped without a word)
    ("config-record-unknown-key", lambda w, t: ["train", "--config", str(with_record(
        w, t, _config_edit("optim", "learning_rate", 0.5)) / RECORD_FILE), "--print-config"],
     ["(a run record): unknown key optim.learning_rate"]),
    ("config-record-other-rules-option", lambda w, t: ["train", "--config", str(with_record(
        w, t, _config_edit("method", "ep_beta", 0.5)) / RECORD_FILE), "--print-config"],
     ["(a run record): method.ep_beta is not read by dfa"]),
    ("config-missing", lambda w, t: ["train", "--config", str(t / "nope.toml")],
     ["nope.toml", "does not exist"]),
    ("config-is-a-folder", lambda w, t: ["train", "--config", str(t)], ["is a folder"]),
    ("config-not-utf8", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", b"[optim]\nlr = 0.1 # \xff\xfe\n"))], ["c.toml", "not UTF-8"]),
    ("config-bad-toml", lambda w, t: ["train", "--config", str(file_in(t, "c.toml", "[optim\n"))],
     ["not valid TOML"]),
    # a file that sets nothing trained the all-defaults run without a word (found by a probe)
    ("config-empty", lambda w, t: ["train", "--config", str(file_in(t, "c.toml", ""))],
     ["c.toml sets nothing", "to train the defaults omit --config"]),
    ("config-only-comments", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "# epochs = 3\n\n"))], ["c.toml sets nothing", "omit --config"]),
    ("config-only-empty-tables", lambda w, t: ["train", "--print-config", "--config", str(
        file_in(t, "c.toml", "[optim]\n[data]\n"))], ["c.toml sets nothing", "omit --config"]),
    ("config-unknown-section", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "[optimizer]\nlr = 1\n"))], ["unknown config section 'optimizer'"]),
    ("config-unknown-key", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "[optim]\nlearning_rate = 1\n"))], ["unknown key optim.learning_rate"]),
    ("config-nan", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "[optim]\nlr = nan\n"))], ["optim.lr", "not a finite number"]),
    ("config-inf", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "[method]\npenalty = inf\n"))], ["method.penalty", "not a finite number"]),
    ("config-string-for-int", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", '[optim]\nepochs = "ten"\n'))], ["optim.epochs must be an integer"]),
    ("config-bool-for-int", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "[optim]\nepochs = true\n"))], ["optim.epochs must be an integer"]),
    ("config-section-not-a-table", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", "optim = 3\n"))], ["'optim' must be a table"]),
    ("config-seed-too-large", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", f"[run]\nseed = {2**63}\n"))], ["run.seed", "out of range"]),
    ("config-vit-on-mnist1d", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", '[model]\narch = "vit"\n[data]\nname = "mnist1d"\n'))],
     ["model.arch='vit' needs images", "feature vectors"]),
    ("config-convmixer-on-synthetic-features", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", '[model]\narch = "convmixer"\n[data]\nin_dim = 64\n'))],
     ["3×32×32", "set data.in_dim=3072"]),
    ("config-patch-does-not-divide", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", '[model]\narch = "convmixer"\npatch = 5\n[data]\nname = "mnist"\n'
        'data_dir = "x"\n'))], ["model.patch=5", "1, 2, 4, 7, 14, 28"]),
    # --- overrides and flags ---------------------------------------------------------------
    ("set-nan", lambda w, t: train_args(w, "--set", f"optim.lr={NAN}"), ["optim.lr", "finite"]),
    ("set-minus-inf", lambda w, t: train_args(w, "--set", "method.penalty=-inf"),
     ["method.penalty", "finite"]),
    ("flag-nan", lambda w, t: train_args(w, "--penalty", NAN), ["--penalty", "finite"]),
    ("flag-inf-frozen-acc", lambda w, t: train_args(w, "--frozen-acc", INF),
     ["--frozen-acc", "finite"]),
    ("set-nan-feedback-scale", lambda w, t: train_args(w, "--set", "method.feedback_scale=nan"),
     ["method.feedback_scale", "finite"]),
    ("seed-negative", lambda w, t: train_args(w, "--seed", "-1"), ["run.seed=-1", "out of range"]),
    ("seed-2-to-the-63", lambda w, t: train_args(w, "--seed", BIG_SEED),
     ["run.seed", "out of range"]),
    ("feedback-seed-2-to-the-63",
     lambda w, t: train_args(w, "--set", f"method.feedback_seed={BIG_SEED}"),
     ["method.feedback_seed", "out of range"]),
    ("set-option-the-rule-never-reads", lambda w, t: train_args(w, "--set", "method.ep_beta=0.1"),
     ["method.ep_beta is not read by dfa"]),
    ("set-without-equals", lambda w, t: train_args(w, "--set", "optim.lr"),
     ["must look like section.key=value"]),
    ("set-unknown-section", lambda w, t: train_args(w, "--set", "optimizer.lr=1"),
     ["override key 'optimizer.lr'"]),
    # an empty key part: an argument named '' reached the factory, whose TypeError was blamed
    ("set-empty-key-part", lambda w, t: [
        "train", "--arch", "module:creditaudit.testing.zoo:resnet20", "--set",
        "model.args..d=3", "--print-config"],
     ["--set model.args..d=3: the key 'model.args..d' has an empty part"]),
    ("set-key-ending-in-a-dot", lambda w, t: [
        "train", "--arch", "module:creditaudit.testing.zoo:resnet20", "--set",
        "model.args.=3", "--print-config"],
     ["--set model.args.=3: the key 'model.args.' has an empty part"]),
    ("set-unknown-key", lambda w, t: train_args(w, "--set", "optim.learning_rate=1"),
     ["unknown key optim.learning_rate"]),
    ("set-float-for-int", lambda w, t: train_args(w, "--set", "optim.epochs=1.5"),
     ["optim.epochs must be an integer"]),
    # a named flag and --set of one key: --set used to win whatever their order, silently
    ("set-against-its-flag", lambda w, t: train_args(w, "--epochs", "2", "--set",
                                                      "optim.epochs=1"),
     ["--epochs and --set optim.epochs=1 give optim.epochs two values (2 and 1)"]),
    ("set-against-a-switch", lambda w, t: train_args(w, "-q", "--set", "run.progress=true"),
     ["--no-progress/-q and --set run.progress=true give run.progress two values"]),
    ("epochs-negative", lambda w, t: train_args(w, "--epochs", "-1"), ["optim.epochs=-1"]),
    ("threads-zero", lambda w, t: train_args(w, "--threads", "0"), ["run.threads=0"]),
    ("width-zero", lambda w, t: train_args(w, "--width", "0"), ["model.d=0"]),
    ("precision-unknown", lambda w, t: train_args(w, "--set", "run.precision=fp16"),
     ["run.precision='fp16' is not allowed"]),
    ("trainable-blocks-too-many", lambda w, t: train_args(w, "--set", "method.trainable_blocks=3"),
     ["exceeds model.n_blocks=2"]),
    ("trainable-blocks-of-frozen", lambda w, t: train_args(
        w, "--method", "frozen", "--set", "method.trainable_blocks=1"),
     # the flags as typed (--method, --penalty), a --set key as set
     ["method.trainable_blocks=1 has no effect with --method frozen", "leave it out"]),
    ("penalty-of-frozen", lambda w, t: train_args(w, "--method", "frozen", "--penalty", "0.1"),
     ["--penalty 0.1 has no effect with --method frozen", "leave it out"]),
    ("feedback-scale-of-credit-bridge-without-warm-up", lambda w, t: train_args(
        w, "--method", "credit-bridge", "--set", "method.warmup_fraction=0",
        "--set", "method.feedback_scale=0.5"),
     ["method.feedback_scale=0.5 has no effect with --method credit-bridge",
      "method.warmup_fraction=0 skips the DFA warm-up", "leave it out"]),
    ("ep-step-size-zero", lambda w, t: train_args(
        w, "--method", "ep", "--set", "method.ep_step_size=0"),
     ["method.ep_step_size=0.0 is out of range; it must be > 0.0"]),
    ("penalty-where-no-block-trains", lambda w, t: train_args(
        w, "--penalty", "0.1", "--set", "method.trainable_blocks=0"),
     ["--penalty 0.1 has no effect with method.trainable_blocks=0", "leave it out"]),
    # a None inside a table has no TOML spelling: --print-config was an internal TypeError
    ("set-none-in-a-table-printed", lambda w, t: [
        "train", "--arch", "module:creditaudit.testing.zoo:resnet20", "--set",
        "model.args.w=none", "--print-config"], ["model.args.w is None", "model.none_args"]),
    # a TOML date in a table: the run id's JSON could not hold it (an internal TypeError)
    ("set-date-in-a-table", lambda w, t: [
        "train", "--arch", "module:creditaudit.testing.zoo:resnet20", "--set",
        "model.args={when = [1979-05-27]}", "--print-config"],
     ['model.args.when[0]=1979-05-27 is a TOML date or time', 'quote it']),
    # two config files: the second replaced the first without a word (they are not merged)
    ("config-given-twice", lambda w, t: [
        "train", "--config", "a.toml", "--config", "b.toml"],
     ["--config is given twice (a.toml and b.toml)", "--set"]),
    ("set-empty-protocol", lambda w, t: train_args(w, "--set", "diagnostics.protocol=[]"),
     ["diagnostics.protocol=[] names no diagnostic", "leave the key out"]),
    ("set-options-of-unlisted-diagnostic", lambda w, t: train_args(
        w, "--set", 'diagnostics.protocol=["b"]', "--set", "diagnostics.a.growth=9"),
     ["diagnostics.a holds the options of diagnostic (a)", "drop [diagnostics.a]"]),
    ("frozen-acc-above-one", lambda w, t: train_args(w, "--frozen-acc", "34.9"),
     ["diagnostics.frozen_acc=34.9", "out of range"]),
    ("flag-not-an-int", lambda w, t: train_args(w, "--epochs", "ten"), ["invalid int value"]),
    ("flag-unknown-choice", lambda w, t: train_args(w, "--method", "sgd"),
     ["method.name='sgd' is not a known credit rule", "choose one of bp"]),
    ("flag-unknown", lambda w, t: train_args(w, "--bogus"), ["unrecognized arguments: --bogus"]),
    ("no-subcommand", lambda w, t: [], ["required"]),
    ("unknown-subcommand", lambda w, t: ["fly"], ["invalid choice: 'fly'"]),
    # --- run records (audit) ---------------------------------------------------------------
    ("record-missing", lambda w, t: ["audit", str(t / "nope")], ["no run record"]),
    ("record-folder-without-record", lambda w, t: ["audit", str(t)], ["no run record"]),
    # a folder holding only the claim of a run killed before its first record said no more
    ("record-folder-with-only-a-claim", lambda w, t: [
        "audit", str(file_in(t / "run", "claim.json", "{}").parent)],
     ["no run record", "holds claim.json of a run that has not written its record yet"]),
    ("record-not-json", lambda w, t: ["audit", str(with_record(w, t, lambda r: b"{not json"))],
     ["truncated or not JSON"]),
    ("record-empty", lambda w, t: ["audit", str(with_record(w, t, lambda r: b""))],
     ["truncated or not JSON"]),
    ("record-binary", lambda w, t: ["audit", str(with_record(w, t, lambda r: bytes(range(256))))],
     ["not UTF-8"]),
    ("record-truncated", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: json.dumps(r).encode()[:200]))], ["truncated or not JSON"]),
    ("record-is-a-list", lambda w, t: ["audit", str(with_record(w, t, lambda r: b"[1, 2]"))],
     ["must be a JSON object"]),
    ("record-foreign-schema", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "schema": "other.tool/9"}))], ["has schema 'other.tool/9'"]),
    ("record-lacks-log", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {k: v for k, v in r.items() if k != "log"}))], ["lacks the key 'log'"]),
    ("frozen-run-unfinished", lambda w, t: ["audit", str(w.run_dir), "--frozen", str(
        with_record(w, t, lambda r: {**r, "status": "interrupted", "final": None}))],
     ["is interrupted", "no final test accuracy", "--resume"]),
    ("record-bad-status", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "status": "exploded"}))], ["status 'exploded'"]),
    ("record-invalid-config", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "config": {**r["config"], "optim": {"lr": "fast"}}}))],
     ["invalid config", "optim.lr"]),
    ("record-log-entry-not-object", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "log": [3]}))], ["log entry 0 is not an object"]),
    ("record-log-epoch-not-int", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "log": [{"epoch": "1"}]}))], ["no integer 'epoch'"]),
    ("record-unknown-final-field", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "final": {"bogus": 1}}))], ["unexpected field"]),
    ("record-bad-non-finite-mark", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "non_finite": {"/nope/3": "NaN"}}))], ["non_finite"]),
    ("record-unknown-non-finite-name", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "non_finite": {"/status": "Huge"}}))], ["non_finite"]),
    ("record-other-data", lambda w, t: ["audit", str(with_record(
        w, t, lambda r: {**r, "data": {**r["data"], "fingerprint": "0" * 64}}))],
     ["fingerprint 000000000000"]),
    # --- checkpoints (audit and train --resume) --------------------------------------------
    ("checkpoint-missing", lambda w, t: ["audit", str(without_checkpoint(w, t))],
     ["no checkpoint at"]),
    ("checkpoint-empty", lambda w, t: ["audit", str(with_checkpoint(w, t, b""))],
     ["cannot be read"]),
    ("checkpoint-is-a-folder", lambda w, t: ["audit", str(checkpoint_folder(w, t))],
     ["is a folder", "start the run again with --force once the folder is removed"]),
    ("checkpoint-garbage", lambda w, t: ["audit", str(with_checkpoint(w, t, b"garbage!"))],
     ["cannot be read"]),
    ("checkpoint-truncated", lambda w, t: ["audit", str(with_checkpoint(
        w, t, (w.run_dir / CHECKPOINT_FILE).read_bytes()[:4000]))],
     ["cannot be read (PytorchStreamReader failed reading zip archive: failed finding "
      "central directory); it is truncated"]),  # torch's sentences on miniz cut mid-word
    # a text file (torch's reader raised IndexError) and a cut legacy pickle (struct.error)
    # used to end in "internal error"
    ("checkpoint-text", lambda w, t: ["audit", str(with_checkpoint(
        w, t, b"root:x:0:0:root:/root:/bin/bash\n"))], ["cannot be read"]),
    ("checkpoint-cut-legacy-pickle", lambda w, t: ["audit", str(with_checkpoint(
        w, t, pickle.dumps({"model": [1, 2.0]}, protocol=2)[:-5]))], ["cannot be read"]),
    ("checkpoint-payload", lambda w, t: ["audit", str(with_checkpoint(
        w, t, torch_bytes({"model": Payload(t / "marker")})))], ["never unpickles"]),
    ("checkpoint-plain-tensor", lambda w, t: ["audit", str(with_checkpoint(
        w, t, torch_bytes(torch.zeros(3))))], ["holds a Tensor"]),
    ("checkpoint-lacks-rule", lambda w, t: ["audit", str(with_checkpoint(
        w, t, checkpoint_without(w, "rule")))], ["'rule' entry is missing"]),
    ("checkpoint-other-shape", lambda w, t: ["audit", str(with_checkpoint(
        w, t, w.other_shape))], ["does not fit", "model."]),
    ("checkpoint-other-method", lambda w, t: ["audit", str(with_checkpoint(
        w, t, w.other_method))], ["written by method 'bp'"]),
    ("resume-other-shape", lambda w, t: train_args(
        w, "--resume", "--out", str(with_checkpoint(w, t, w.other_shape,
                                                              killed=True).parent)),
     ["does not fit"]),
    ("resume-and-force", lambda w, t: train_args(w, "--resume", "--force"),
     ["argument --force: not allowed with argument --resume"]),
    ("resume-other-method", lambda w, t: train_args(
        w, "--resume", "--out", str(with_checkpoint(w, t, w.other_method,
                                                              killed=True).parent)),
     ["written by method 'bp'"]),
    ("resume-payload", lambda w, t: train_args(w, "--resume", "--out", str(with_checkpoint(
        w, t, torch_bytes({"x": Payload(t / "marker")}), killed=True).parent)),
     ["never unpickles"]),
    ("resume-optimizer-damaged", lambda w, t: resume_with(w, t, checkpoint_with(
        w, optimizer={})), ["damaged optimiser state", "param_groups"]),
    ("resume-scheduler-damaged", lambda w, t: resume_with(w, t, checkpoint_with(
        w, scheduler={"bogus": 1})), ["cannot be loaded"]),
    ("resume-rng-wrong-size", lambda w, t: resume_with(w, t, checkpoint_with(
        w, rng={"torch": torch.zeros(3, dtype=torch.uint8),
                "data": torch.zeros(3, dtype=torch.uint8)})), ["cannot be loaded", "RNG"]),
    ("resume-epoch-out-of-range", lambda w, t: resume_with(w, t, checkpoint_with(w, epoch=-5)),
     ["epoch -5, outside this run's 0…1"]),
    ("checkpoint-epoch-out-of-range", lambda w, t: ["audit", str(with_checkpoint(
        w, t, checkpoint_with(w, epoch=7)))], ["epoch 7, outside"]),
    ("resume-record-damaged", lambda w, t: resume_with(w, t, checkpoint_with(w, record={})),
     ["run record in checkpoint", "schema None"]),
    ("resume-without-run", lambda w, t: train_args(w, "--resume", "--out", str(t / "o")),
     ["cannot resume: no run"]),
    # more epochs is another schedule, so another run id: the run of the other value is
    # named (the message used to be "no run at" alone, as if the run had been lost)
    ("resume-with-more-epochs", lambda w, t: train_args(w, "--resume", "--epochs", "3"),
     ["cannot resume: no run at", "is completed with optim.epochs=1 (not 3)",
      "train this config without --resume"]),
    # ... and on other data too: both reasons are named, not the first alone
    ("resume-with-more-epochs-on-other-data", lambda w, t: data_args(
        w, t, t10k_labels_idx1_ubyte=idx_of((32,), fill=1)) + ["--resume", "--epochs", "3"],
     ["cannot resume: no run at", "is completed with optim.epochs=1 (not 3), and trained on "
      "mnist data with fingerprint", "the data found now is",
      "train this config without --resume"]),
    ("train-over-unreadable-record", lambda w, t: train_args(w, "--out", str(with_record(
        w, t, lambda r: b"\xff\xfe binary").parent)), ["not UTF-8", "--force"]),
    # --- audit options ---------------------------------------------------------------------
    ("audit-frozen-percent", lambda w, t: ["audit", str(w.run_dir), "--frozen", "34.9"],
     ["fraction in [0, 1]"]),
    ("audit-frozen-nan", lambda w, t: ["audit", str(w.run_dir), "--frozen", NAN],
     ["fraction in [0, 1]"]),
    ("audit-frozen-inf", lambda w, t: ["audit", str(w.run_dir), "--frozen", INF],
     ["fraction in [0, 1]"]),
    ("audit-frozen-run-missing", lambda w, t: ["audit", str(w.run_dir), "--frozen",
                                               str(t / "nope")], ["no run record"]),
    ("audit-frozen-other-recipe", lambda w, t: ["audit", str(w.run_dir), "--frozen",
                                                str(w.other_run)], ["model.d: 8 vs 16"]),
    ("audit-output-is-a-folder", lambda w, t: ["audit", str(w.run_dir), "--output", str(t)],
     ["is a folder"]),
    ("audit-output-below-a-file", lambda w, t: ["audit", str(w.run_dir), "--output",
                                                str(w.a_file / "report.md")],
     ["a_file.txt", "a file stands where a folder is needed"]),
    # --- sweep files and options -----------------------------------------------------------
    ("sweep-file-missing", lambda w, t: ["sweep", str(t / "nope.toml")], ["does not exist"]),
    ("sweep-file-is-a-folder", lambda w, t: ["sweep", str(t)], ["is a folder"]),
    ("sweep-file-not-utf8", lambda w, t: ["sweep", str(file_in(t, "s.toml", b"[grid]\n\xff"))],
     ["s.toml", "not UTF-8"]),
    ("sweep-file-bad-toml", lambda w, t: ["sweep", str(file_in(t, "s.toml", "[grid\n"))],
     ["not valid TOML"]),
    ("sweep-file-empty", lambda w, t: ["sweep", str(file_in(t, "s.toml", "")), "--dry-run"],
     ["s.toml sets nothing", "creditaudit train"]),
    ("sweep-file-only-comments", lambda w, t: ["sweep", str(file_in(
        t, "s.toml", "# [grid]\n")), "--dry-run"], ["s.toml sets nothing", "creditaudit train"]),
    ("sweep-file-only-empty-tables", lambda w, t: ["sweep", str(file_in(
        t, "s.toml", "[base]\n[base.optim]\n[grid]\n")), "--dry-run"],
     ["s.toml sets nothing", "[base] and [grid]"]),
    ("sweep-unknown-table", lambda w, t: ["sweep", str(file_in(t, "s.toml", "[runs]\nx = 1\n"))],
     ["unknown table 'runs'"]),
    ("sweep-grid-key-not-a-field", lambda w, t: ["sweep", str(sweep_file(
        w, t, '[grid]\n"optim.learning_rate" = [0.1]\n'))], ["is not a config field"]),
    ("sweep-grid-not-a-list", lambda w, t: ["sweep", str(sweep_file(
        w, t, '[grid]\n"optim.lr" = 0.1\n'))], ["non-empty list"]),
    ("sweep-grid-empty-list", lambda w, t: ["sweep", str(sweep_file(
        w, t, '[grid]\n"optim.lr" = []\n'))], ["grid key 'optim.lr' lists no value"]),
    ("sweep-grid-nan", lambda w, t: ["sweep", str(sweep_file(
        w, t, '[grid]\n"optim.lr" = [0.1, nan]\n'))], ["optim.lr", "finite"]),
    ("sweep-base-invalid", lambda w, t: ["sweep", str(sweep_file(
        w, t, "", base={"optim.epochs": -3}))], ["[base]", "optim.epochs=-3"]),
    ("sweep-include-not-tables", lambda w, t: ["sweep", str(file_in(
        t, "s.toml", "include = [1, 2]\n"))], ["[[include]]"]),
    ("sweep-missing-data", lambda w, t: ["sweep", str(sweep_file(
        w, t, "", base={"data.data_dir": str(t / "nope")})), "--workers", "0"],
     ["does not exist"]),
    ("sweep-workers-negative", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                             "--workers", "-1"], ["--workers must be >= 0"]),
    ("sweep-threads-zero", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                         "--threads-per-worker", "0"], ["must be >= 1"]),
    ("sweep-stale-after-zero", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                             "--stale-after", "0"], ["--stale-after"]),
    ("sweep-stale-after-nan", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                            "--stale-after", NAN], ["--stale-after"]),
    ("sweep-stale-after-inf", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                            "--stale-after", INF], ["--stale-after"]),
    ("sweep-gpus-nan", lambda w, t: ["sweep", str(sweep_file(w, t, "")), "--executor", "ray",
                                     "--gpus-per-run", NAN], ["--gpus-per-run"]),
    ("sweep-gpus-on-local", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                          "--gpus-per-run", "1"], ["is for --executor ray"]),
    ("sweep-workers-with-ray", lambda w, t: ["sweep", str(sweep_file(w, t, "")),
                                             "--executor", "ray", "--workers", "2"],
     ["--workers is for --executor local"]),
    ("sweep-out-empty", lambda w, t: ["sweep", str(sweep_file(w, t, "")), "--out", ""],
     ["--out", "empty path"]),
    ("sweep-out-is-a-file", lambda w, t: ["sweep", str(sweep_file(w, t, "")), "--workers", "0",
                                          "--out", str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    # --- experiments, export, figures, report, demo ----------------------------------------
    ("experiment-without-name", lambda w, t: ["experiment"], ["name an experiment"]),
    ("experiment-unknown", lambda w, t: ["experiment", "nope", "--scale", "smoke"],
     ["unknown experiment 'nope'"]),
    ("experiment-without-scale", lambda w, t: ["experiment", "audit_table"], ["--scale"]),
    ("experiment-missing-data", lambda w, t: [
        "experiment", "audit_table", "--scale", "cpu", "--dataset", "fashion-mnist",
        "--data-dir", str(t / "nope"), "--no-train", "--out", str(t / "o")], ["does not exist"]),
    ("experiment-out-empty", lambda w, t: ["experiment", "audit_table", "--scale", "smoke",
                                           "--out", ""], ["--out", "empty path"]),
    ("experiment-out-is-a-file", lambda w, t: [
        "experiment", "audit_table", "--scale", "smoke", "--no-train", "--out", str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("export-results-missing", lambda w, t: ["export", str(t / "nope"), str(t / "o")],
     ["does not exist"]),
    ("export-results-is-a-file", lambda w, t: ["export", str(w.a_file), str(t / "o")],
     ["a_file.txt", "is a file, not a folder"]),
    ("export-results-empty", lambda w, t: ["export", "", str(t / "o")],
     ["RESULTS_DIR", "empty path"]),
    ("export-dataset-unknown", lambda w, t: ["export", str(w.results), str(t / "o"),
                                             "--dataset", "nosuch"],
     ["'nosuch'", "it holds: mnist"]),
    ("export-out-empty", lambda w, t: ["export", str(w.results), ""], ["OUT", "empty path"]),
    ("export-out-is-a-file", lambda w, t: ["export", str(w.results), str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("figures-results-missing", lambda w, t: ["figures", str(t / "nope")], ["does not exist"]),
    ("figures-results-is-a-file", lambda w, t: ["figures", str(w.a_file)],
     ["a_file.txt", "is a file, not a folder"]),
    ("figures-results-empty", lambda w, t: ["figures", ""], ["RESULTS_DIR", "empty path"]),
    ("figures-dataset-absent", lambda w, t: ["figures", str(w.results), "--dataset", "nosuch",
                                             "--out", str(t / "o")],
     ["no run records of dataset 'nosuch'", "it holds: mnist"]),
    ("figures-out-is-a-file", lambda w, t: ["figures", str(w.results), "--out", str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("report-results-missing", lambda w, t: ["report", str(t / "nope")], ["does not exist"]),
    ("report-results-is-a-file", lambda w, t: ["report", str(w.a_file)],
     ["a_file.txt", "is a file, not a folder"]),
    ("report-results-empty", lambda w, t: ["report", ""], ["RESULTS_DIR", "empty path"]),
    ("report-dataset-absent", lambda w, t: ["report", str(w.results), "--dataset",
                                            "fashion-mnist", "--out", str(t / "o")],
     ["no run records of dataset 'fashion-mnist'", "it holds: mnist"]),
    ("report-out-is-a-file", lambda w, t: ["report", str(w.results), "--out", str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("demo-epochs-negative", lambda w, t: ["demo", "--epochs", "-1", "--out", str(t / "o")],
     ["argument --epochs: -1 is out of range"]),
    ("demo-n-train-zero", lambda w, t: ["demo", "--n-train", "0", "--out", str(t / "o")],
     ["argument --n-train: 0 is out of range"]),
    ("demo-seed-too-large", lambda w, t: ["demo", "--seed", BIG_SEED, "--out", str(t / "o")],
     ["argument --seed", "out of range"]),
    ("demo-workers-negative", lambda w, t: ["demo", "--workers", "-1", "--epochs", "0",
                                            "--out", str(t / "o")], ["--workers must be >= 0"]),
    ("demo-out-empty", lambda w, t: ["demo", "--epochs", "0", "--out", ""],
     ["--out", "empty path"]),
    ("demo-out-is-a-file", lambda w, t: ["demo", "--epochs", "0", "--n-train", "60",
                                         "--out", str(w.a_file)],
     ["a_file.txt", "a file stands where a folder is needed"]),
    # --- paths and devices -----------------------------------------------------------------
    ("train-out-empty", lambda w, t: train_args(w, "--out", ""),
     ["run.out_dir=''", "empty path"]),
    ("train-out-empty-set", lambda w, t: train_args(w, "--set", "run.out_dir="),
     ["run.out_dir=''", "empty path"]),
    ("train-tensorboard-empty", lambda w, t: train_args(w, "--out", str(t / "o"),
                                                        "--tensorboard", ""),
     ["run.tensorboard=''", "empty path"]),
    ("train-out-nul", lambda w, t: ["train", "--config", str(file_in(
        t, "c.toml", '[optim]\nepochs = 0\n[run]\nout_dir = "a\\u0000b"\n'))],
     ["run.out_dir='a\\x00b'", "NUL character"]),
    ("train-out-nul-set", lambda w, t: train_args(w, "--set", 'run.out_dir="a\\u0000b"'),
     ["run.out_dir='a\\x00b'", "NUL character"]),
    ("train-tensorboard-nul", lambda w, t: train_args(
        w, "--out", str(t / "o"), "--set", 'run.tensorboard="tb\\u0000x"'),
     ["run.tensorboard='tb\\x00x'", "NUL character"]),
    ("data-dir-nul", lambda w, t: train_args(w, "--set", f'data.data_dir="{w.data}\\u0000"'),
     ["data.data_dir=", "NUL character"]),
    ("sweep-out-nul", lambda w, t: ["sweep", str(sweep_file(w, t, "")), "--out", "a\x00b"],
     ["--out", "NUL character"]),
    ("train-out-is-a-file", lambda w, t: train_args(w, "--out", str(w.a_file)),
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("train-out-below-a-file", lambda w, t: train_args(w, "--out", str(w.a_file / "runs")),
     ["a_file.txt", "a file stands where a folder is needed"]),
    ("train-wandb-empty", lambda w, t: train_args(w, "--out", str(t / "o"), "--wandb", ""),
     ["run.wandb_project=''", "empty name"]),
    ("train-tensorboard-below-a-file", lambda w, t: train_args(
        w, "--out", str(t / "o"), "--tensorboard", str(w.a_file / "tb")), ["tensorboard"]),
    ("device-unknown", lambda w, t: train_args(w, "--device", "tpu"), ["invalid choice: 'tpu'"]),
    pytest.param("device-cuda-missing", lambda w, t: train_args(
        w, "--device", "cuda", "--out", str(t / "o")), ["no CUDA device"], marks=NO_CUDA),
    pytest.param("audit-device-cuda-missing", lambda w, t: [
        "audit", str(w.run_dir), "--device", "cuda"], ["no CUDA device"], marks=NO_CUDA),
    pytest.param("sweep-device-cuda-missing", lambda w, t: [
        "sweep", str(sweep_file(w, t, "")), "--device", "cuda", "--workers", "0"],
        ["no CUDA device"], marks=NO_CUDA),
    pytest.param("demo-device-cuda-missing", lambda w, t: [
        "demo", "--device", "cuda", "--epochs", "0", "--out", str(t / "o")],
        ["no CUDA device"], marks=NO_CUDA),
]


def _case_id(case) -> str:  # noqa: ANN001 - a tuple or a pytest.param
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize(("name", "build", "fragments"), CASES, ids=list(map(_case_id, CASES)))
def test_bad_input_is_refused_with_one_line(world, tmp_path, capsys, plant, monkeypatch, name,
                                           build, fragments):
    monkeypatch.chdir(tmp_path)  # a write to the current folder is a changed file too
    argv = build(world, tmp_path)
    plant.register(*tmp_path.rglob(RECORD_FILE))  # the damaged records this case planted
    before = snapshot(world.root, tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own exits must not escape main()
        pytest.fail(f"main() raised SystemExit({exit_.code}) instead of returning")
    out, err = capsys.readouterr()
    assert code not in (0, None), f"{name}: exit {code}\n{out}\n{err}"
    assert_one_line_error(out, err, *fragments)
    assert snapshot(world.root, tmp_path) == before, f"{name} changed files"
    assert not (tmp_path / "marker").exists(), "a planted payload ran"


def test_a_flag_and_a_set_that_agree_are_one_value(capsys):
    """``--epochs 1 --set optim.epochs=1`` (or ``--penalty 1`` and ``method.penalty=1.0``)
    give one value: not a conflict."""
    assert main(["train", "--epochs", "1", "--set", "optim.epochs=1", "--penalty", "1",
                 "--set", "method.penalty=1.0", "-q", "--set", "run.progress=false",
                 "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "epochs = 1\n" in out and "penalty = 1.0\n" in out


def test_the_last_set_of_a_key_counts_after_a_table_that_holds_it(monkeypatch, capsys):
    """A key given again after its table was applied before the table (dict order of its
    first --set), so the record held the table's value, not the last one given."""
    argv = ["train", "--set", "diagnostics.a.growth=10", "--set", "diagnostics.a={growth=20}",
            "--set", "diagnostics.a.growth=30", "--print-config"]
    assert main(argv) == 0
    assert "[diagnostics.a]\ngrowth = 30.0\n" in capsys.readouterr().out
    monkeypatch.setenv("CREDITAUDIT_SET", " ".join(argv[2:-1:2]))
    assert main(["train", "--print-config"]) == 0
    assert "[diagnostics.a]\ngrowth = 30.0\n" in capsys.readouterr().out


def test_a_bad_word_in_creditaudit_set_names_the_variable(monkeypatch, capsys):
    """No flag of the command holds the word: the error says where it came from."""
    monkeypatch.setenv("CREDITAUDIT_SET", "optim.epochs=1 foo")
    assert main(["train", "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert_one_line_error(out, err, "CREDITAUDIT_SET='optim.epochs=1 foo': override 'foo' "
                                    "must look like section.key=value")


def test_the_battery_is_large_and_covers_every_subcommand():
    from creditaudit.cli import SUBCOMMANDS

    assert len(CASES) >= 60
    firsts = {case.values[0].split("-")[0] if hasattr(case, "values") else case[0].split("-")[0]
              for case in CASES}
    covered = {"data", "config", "set", "record", "checkpoint", "resume", "sweep", "audit",
               "experiment", "export", "figures", "report", "demo", "train", "device"}
    assert covered <= firsts
    assert set(SUBCOMMANDS) <= firsts | {"train"}


def test_a_record_of_stop_on_walkback_without_the_protocol_is_rerun_amended(world, tmp_path,
                                                                            capsys):
    """An earlier run recorded with --stop-on-walkback and protocol_every=0 (accepted then):
    --config RUN/record.json is refused as the pair, and was refused all the same with the
    amendment the refusal asks for; with it, the run's config is taken."""
    def edit(record: dict) -> dict:
        record["config"]["diagnostics"].update(stop_on_walkback=True, protocol_every=0)
        return record

    record = str(with_record(world, tmp_path, edit) / RECORD_FILE)
    assert main(["train", "--config", record, "--print-config"]) == 2
    assert "protocol_every=0 turns the protocol off" in capsys.readouterr().err
    assert main(["train", "--config", record, "--set", "diagnostics.protocol_every=1",
                 "--print-config"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "protocol_every = 1" in out and "stop_on_walkback = true" in out
