"""A file's cached digest is keyed by how it is read — the decoder's name — so a decoder
cached by name must return the same bytes for a file whatever dataset calls it.

A closure made in ``files()`` or a bound method reads its dataset's options under one name:
its digests were cached, so the second of two datasets holding other options got the first's
fingerprint (a run id that depended on what this machine hashed first), and the door refused
a plugin doing what docs/extending.md asks (identity_follows_every_option, "put the option in
what identity() hashes"). A raw file (no decoder) is hashed a block at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from creditaudit.config import bind, opt
from creditaudit.data import FileDataset, identity
from creditaudit.data.registry import FileOptions
from creditaudit.testing import check_dataset

READS: list[Path] = []


def counted_read(path: Path) -> bytes:
    """A module's function: what it returns is what its name says (cached)."""
    READS.append(path)
    return path.read_bytes()


class Scaled:
    """A decoder object reading its instance: the file's bytes with its scale before."""

    def __init__(self, scale: int) -> None:
        self.scale = scale

    def decode(self, path: Path) -> bytes:
        return bytes([self.scale]) + path.read_bytes()

    __call__ = decode


def scaled_closure(scale: int):
    def decode(path: Path) -> bytes:
        return bytes([scale]) + path.read_bytes()
    return decode


def scaled_with_default(path: Path, scale: int = 1) -> bytes:
    return bytes([scale]) + path.read_bytes()


@pytest.fixture
def fingerprints(tmp_path, monkeypatch) -> Path:
    """A fresh fingerprint cache, caching even files written a moment ago, and an empty
    in-memory cache (as in a new process)."""
    monkeypatch.setenv("CREDITAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(identity, "RACY_SECONDS", -1.0)
    monkeypatch.setattr(identity, "_MEMORY", {})
    return tmp_path / "cache" / identity.FINGERPRINT_CACHE


@pytest.mark.parametrize("make", [scaled_closure, lambda s: Scaled(s).decode, Scaled,
                                  lambda s: functools.partial(scaled_with_default, scale=s)],
                         ids=["closure", "bound-method", "callable-object", "partial"])
def test_a_decoder_reading_more_than_the_file_is_hashed_for_each_dataset(
        fingerprints, tmp_path, monkeypatch, make):
    path = tmp_path / "rows.bin"
    path.write_bytes(b"\x01\x02\x03")
    one, two = identity.file_digest(path, make(1)), identity.file_digest(path, make(2))
    assert one != two
    monkeypatch.setattr(identity, "_MEMORY", {})  # a new process: the file cache only
    assert identity.file_digest(path, make(2)) == two
    assert identity.file_digest(path, make(1)) == one


def test_a_modules_function_is_still_hashed_once(fingerprints, tmp_path, monkeypatch):
    path = tmp_path / "rows.bin"
    path.write_bytes(b"\x01\x02\x03")
    READS.clear()
    digest = identity.file_digest(path, counted_read)
    monkeypatch.setattr(identity, "_MEMORY", {})
    assert identity.file_digest(path, counted_read) == digest
    assert len(READS) == 1 and fingerprints.is_file()


@dataclass
class RowsOptions(FileOptions):
    scale: int = opt(1, "multiply every feature by this", min=1, max=4)


class ScaledRows(FileDataset[RowsOptions]):
    """Features of rows.bin times data.scale; its decoder, a closure, hashes the scale too."""

    name, label = "scaled-rows", "scaled rows"
    Options = RowsOptions

    def input_shape(self) -> tuple[int, ...]:
        return (4,)

    def n_classes(self) -> int:
        return 2

    def files(self):
        scale = self.options.scale

        def decode(path: Path) -> bytes:  # the content, scaled: what arrays() makes of it
            return bytes([scale]) + path.read_bytes()

        return [("rows.bin", self.folder() / "rows.bin", decode)]

    def arrays(self):
        raw = torch.tensor(list((self.folder() / "rows.bin").read_bytes()), dtype=torch.float32)
        x = raw.reshape(-1, 4) * self.options.scale
        y = torch.arange(x.shape[0]) % 2
        return x[:6], y[:6], x[6:], y[6:]


def test_a_file_dataset_hashing_its_option_in_a_closure_passes_its_checks(
        fingerprints, tmp_path):
    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "rows.bin").write_bytes(bytes(range(40)))
    check_dataset(ScaledRows, {"data_dir": str(folder)})
    # and the fingerprint of either option does not depend on which was hashed first
    first = {s: ScaledRows(bind(ScaledRows, "data", data_dir=str(folder), scale=s))
             .identity(0).fingerprint for s in (2, 1)}
    assert first[1] != first[2]


def test_a_raw_file_is_hashed_a_block_at_a_time(tmp_path, monkeypatch):
    """A raw data file's digest (its sha256, as before) is taken without holding the file
    in memory: a dataset may map a file larger than the memory free and read it in part."""
    import hashlib
    import tracemalloc

    monkeypatch.setenv("CREDITAUDIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "big.bin"
    content = bytes(range(256)) * (32 << 12)  # 32 MiB
    path.write_bytes(content)
    expected = hashlib.sha256(content).hexdigest()
    del content
    tracemalloc.start()
    try:
        digest = identity.file_digest(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest == expected
    assert peak < 8 << 20, f"hashing a 32 MiB file held {peak >> 20} MiB"
