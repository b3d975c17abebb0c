"""CIFAR loading on tiny files written in the official python-batch format; no network."""

from __future__ import annotations

import codecs
import hashlib
import io
import pickle
import re
import tarfile
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from creditaudit.caller import for_command_line
from creditaudit.data import cifar
from creditaudit.data.cifar import load_cifar, safe_extract, verify_md5
from creditaudit.errors import DataError

C10 = cifar.SPECS[10]
C100 = cifar.SPECS[100]


def _batch(n: int, seed: int, n_classes: int = 10) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, n_classes, size=n).tolist()
    return data, labels


def _dump(path: Path, obj: object, protocol: int | None = None) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def _write_cifar10(parent: Path, sizes: tuple[int, ...] = (2, 3, 1, 2, 2, 3),
                   protocol: int | None = None) -> Path:
    """Write data_batch_1..5 and test_batch (sizes in that order) with pickle ``protocol``
    (Python's default when None); return the folder."""
    folder = parent / C10.folder
    folder.mkdir(parents=True)
    for name, n, seed in zip(C10.files, sizes, range(len(sizes))):
        data, labels = _batch(n, seed)
        _dump(folder / name, {b"batch_label": b"x", b"data": data, b"labels": labels},
              protocol)
    return folder


def _expected(sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    batches = [_batch(n, seed) for n, seed in zip(sizes, range(len(sizes)))]
    train = batches[:5]
    tx = np.concatenate([b[0] for b in train]).reshape(-1, 3, 32, 32)
    ty = np.concatenate([b[1] for b in train])
    return tx, ty, batches[5][0].reshape(-1, 3, 32, 32), np.array(batches[5][1])


@pytest.mark.parametrize("point_at_folder", [False, True])
def test_cifar10_round_trip_exact(tmp_path: Path, point_at_folder: bool) -> None:
    folder = _write_cifar10(tmp_path)
    root = folder if point_at_folder else tmp_path
    train_x, train_y, test_x, test_y = load_cifar(root)
    ex, ey, tx, ty = _expected((2, 3, 1, 2, 2, 3))
    assert train_x.dtype == torch.uint8 and train_x.shape == (10, 3, 32, 32)
    assert train_y.dtype == torch.int64 and test_y.dtype == torch.int64
    assert np.array_equal(train_x.numpy(), ex) and np.array_equal(train_y.numpy(), ey)
    assert np.array_equal(test_x.numpy(), tx) and np.array_equal(test_y.numpy(), ty)
    # Row layout is R plane, G plane, B plane: channel 1 starts at byte 1024.
    first = _batch(2, 0)[0][0]
    assert train_x[0, 1, 0, 0].item() == first[1024]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_batch_written_with_any_pickle_protocol_reads_the_same(tmp_path: Path,
                                                                  protocol: int) -> None:
    """Protocols 0–2 from Python 3 write bytes as ``_codecs.encode(str, 'latin1')`` and
    protocol 5 (Python 3.14's default) rebuilds arrays with numpy's ``_frombuffer``."""
    _write_cifar10(tmp_path, protocol=protocol)
    loaded = load_cifar(tmp_path)
    for got, want in zip(loaded, _expected((2, 3, 1, 2, 2, 3)), strict=True):
        assert np.array_equal(got.numpy(), want)


class _Call:
    """Pickles as ``function(*args)``: a hand-made pickle naming an allowed global."""

    def __init__(self, function: object, *args: object) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.function, self.args


@pytest.mark.parametrize("call", [
    _Call(codecs.encode, "payload", "rot13"),
    _Call(codecs.encode, b"payload", "base64"),
    _Call(np._core.numeric._frombuffer, b"\0" * 8, np.dtype(object), (1,), "C"),
    _Call(np._core.numeric._frombuffer, b"\0" * 8, np.dtype("u1"), (8,), "K"),
], ids=["rot13", "base64", "object-dtype", "order"])
def test_the_stand_ins_for_codecs_and_frombuffer_refuse_other_uses(tmp_path: Path,
                                                                   call: _Call) -> None:
    folder = _write_cifar10(tmp_path)
    path = folder / "data_batch_1"
    _dump(path, {b"data": call, b"labels": [0]}, 5)
    with pytest.raises(DataError, match="refusing") as info:
        load_cifar(tmp_path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_labels_written_as_numpy_numbers_read_as_their_values(tmp_path: Path,
                                                             protocol: int) -> None:
    """``list(labels_array)`` pickles numpy numbers (numpy's ``scalar``): a batch written
    so by hand is a CIFAR batch, not a corrupt file."""
    folder = _write_cifar10(tmp_path)
    data, labels = _batch(3, 7)
    _dump(folder / "test_batch", {b"data": data, b"labels": list(np.array(labels))}, protocol)
    _, _, test_x, test_y = load_cifar(tmp_path)
    assert test_y.tolist() == labels and np.array_equal(test_x.reshape(3, -1).numpy(), data)


@pytest.mark.parametrize("call", [
    _Call(np._core.multiarray.scalar, np.dtype(object), [1]),
    _Call(np._core.multiarray.scalar, np.dtype("i8"), b"\0" * 4),
], ids=["object", "short"])
def test_the_stand_in_for_numpy_numbers_refuses_other_uses(tmp_path: Path, call: _Call) -> None:
    folder = _write_cifar10(tmp_path)
    _dump(folder / "data_batch_1", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [call]})
    with pytest.raises(DataError, match="no CIFAR batch: refusing numpy scalar"):
        load_cifar(tmp_path)


def test_a_planted_payload_is_named_as_refused_not_as_a_corrupt_file(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path)
    path = folder / "data_batch_3"
    _dump(path, {b"data": _Call(print, "ran"), b"labels": [0]}, 2)
    with pytest.raises(DataError) as info:
        load_cifar(tmp_path)
    message = str(info.value)
    assert re.search(f"{re.escape(str(path))} is no CIFAR batch: refusing to load "
                     r"\w+\.print:", message)
    assert "truncated" not in message and "nothing it names was run" in message


def test_a_test_batch_copied_from_a_training_batch_is_refused(tmp_path: Path) -> None:
    from creditaudit.config import RunConfig
    from creditaudit.data import load_dataset

    folder = _write_cifar10(tmp_path, sizes=(4, 3, 1, 2, 2, 3))
    (folder / "test_batch").write_bytes((folder / "data_batch_1").read_bytes())
    config = RunConfig().replace(**{"data.name": "cifar10", "data.data_dir": str(tmp_path)})
    with pytest.raises(DataError, match=re.escape(
            f"cifar10 folder {tmp_path}: 4 of the 4 test samples (the test batch) are also "
            "training samples")):
        load_dataset(config.data, seed=0)


def test_cifar100_uses_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / C100.folder
    folder.mkdir()
    data, labels = _batch(4, 0, n_classes=100)
    coarse = [0] * 4
    _dump(folder / "train", {b"data": data, b"fine_labels": labels, b"coarse_labels": coarse})
    tdata, tlabels = _batch(2, 1, n_classes=100)
    _dump(folder / "test", {b"data": tdata, b"fine_labels": tlabels, b"coarse_labels": [0, 0]})
    train_x, train_y, test_x, test_y = load_cifar(tmp_path, n_classes=100)
    assert train_y.tolist() == labels and test_y.tolist() == tlabels
    assert np.array_equal(test_x.reshape(2, -1).numpy(), tdata)


def test_missing_folder_names_path(tmp_path: Path) -> None:
    """The fix is spelled for the caller: RunConfig.replace from Python, --set on the
    command line."""
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=re.escape(str(missing))) as info:
        load_cifar(missing)
    text = str(info.value)
    assert "data_batch_1" in text and "RunConfig.replace(**{'data.download': True})" in text
    assert "\n" not in text
    with for_command_line(), pytest.raises(DataError) as info:
        load_cifar(missing)
    assert "--set data.download=true" in str(info.value)


def test_missing_file_names_it(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match="missing data_batch_3") as info:
        load_cifar(tmp_path)
    assert str(folder) in str(info.value)


def test_truncated_pickle(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path)
    path = folder / "data_batch_2"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="truncated or corrupt") as info:
        load_cifar(tmp_path)
    assert str(path) in str(info.value)


def test_garbage_file(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path)
    path = folder / "test_batch"
    path.write_bytes(b"not a pickle at all")
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_cifar(tmp_path)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}, "shape"),
        ({b"data": np.full((2, 3072), 300, np.int32), b"labels": [0, 1]}, "dtype"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but 1 labels"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "labels in"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, -1]}, "labels in"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "no b'labels'"),
        ([1, 2, 3], "not a batch dict"),
    ],
)
def test_bad_batch_contents(tmp_path: Path, payload: object, match: str) -> None:
    folder = _write_cifar10(tmp_path)
    path = folder / "data_batch_4"
    _dump(path, payload)
    with pytest.raises(DataError, match=match) as info:
        load_cifar(tmp_path)
    assert str(path) in str(info.value)


def test_int_pixels_in_range_are_accepted(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path)
    _dump(folder / "data_batch_1", {b"data": np.full((2, 3072), 255, np.int64), b"labels": [1, 2]})
    train_x, train_y, _, _ = load_cifar(tmp_path)
    assert train_x.dtype == torch.uint8 and int(train_x[:2].min()) == 255
    assert train_y[:2].tolist() == [1, 2]


def test_rejects_unknown_class_count(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="10 or 100"):
        load_cifar(tmp_path, n_classes=20)


# ---------------------------------------------------------------------------------------------
# download helpers (never touch the network)


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def test_verify_md5_accepts_and_rejects(tmp_path: Path) -> None:
    path = tmp_path / "a.tar.gz"
    path.write_bytes(b"hello")
    verify_md5(path, hashlib.md5(b"hello").hexdigest())
    assert path.exists()
    with pytest.raises(DataError, match=re.escape(str(path))):
        verify_md5(path, "0" * 32)
    assert not path.exists()  # partial or tampered archive is removed


def test_safe_extract_writes_members(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    archive.write_bytes(_tar_bytes({"dir/a.bin": b"abc", "dir/b.bin": b"de"}))
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "dir" / "a.bin").read_bytes() == b"abc"
    assert (tmp_path / "out" / "dir" / "b.bin").read_bytes() == b"de"


@pytest.mark.parametrize("bad_name", ["../evil", "/abs/evil", "dir/../../evil"])
def test_safe_extract_rejects_escaping_members(tmp_path: Path, bad_name: str) -> None:
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(_tar_bytes({"fine": b"x", bad_name: b"y"}))
    out = tmp_path / "out"
    with pytest.raises(DataError, match="unsafe member"):
        safe_extract(archive, out)
    assert not (tmp_path / "evil").exists() and not out.exists()


def test_safe_extract_rejects_symlinks(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    archive = tmp_path / "link.tar"
    archive.write_bytes(buf.getvalue())
    with pytest.raises(DataError, match="link"):
        safe_extract(archive, tmp_path / "out")


def test_network_failure_becomes_data_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(DataError, match="could not download") as info:
        load_cifar(tmp_path, download=True)
    msg = str(info.value)
    assert C10.url in msg and "no internet" in msg and str(tmp_path / C10.folder) in msg
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def _fake_cifar10_archive() -> bytes:
    members = {}
    for name, seed in zip(C10.files, range(6)):
        data, labels = _batch(2, seed)
        members[f"{C10.folder}/{name}"] = pickle.dumps({b"data": data, b"labels": labels})
    return _tar_bytes(members)


def test_download_flow_with_fake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = _fake_cifar10_archive()
    monkeypatch.setitem(cifar.SPECS, 10, replace(C10, md5=hashlib.md5(payload).hexdigest()))
    calls: list[str] = []

    def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
        calls.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    train_x, train_y, test_x, _ = load_cifar(tmp_path, download=True)
    assert calls == [C10.url]
    assert train_x.shape == (10, 3, 32, 32) and test_x.shape == (2, 3, 32, 32)
    assert (tmp_path / C10.archive).is_file()
    assert not list(tmp_path.glob("*.part"))
    # A second call finds the extracted files and does not download again.
    load_cifar(tmp_path, download=True)
    assert calls == [C10.url]


def test_download_with_bad_checksum_deletes_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"junk"))
    with pytest.raises(DataError, match="md5"):
        load_cifar(tmp_path, download=True)
    assert list(tmp_path.iterdir()) == []
