"""Records of the right types with impossible values, and torch files no torch.save wrote.

Each record here is valid JSON of the right shape, edited one way (as a script, a merge
tool or a hand could leave a record written before records carried their digest): epochs
repeated or out of order, past the run's length, a ``final`` of another epoch, a number too
large for a float, a key named twice, an optional block of the wrong kind. Each is refused
in one line naming the file, and a folder read skips it and keeps the good runs, instead of
showing another epoch's numbers as the run's or ending in an internal error.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from creditaudit.errors import RunRecordError
from creditaudit.records import RECORD_FILE, load_record
from creditaudit.records.checkpoint import safe_load
from creditaudit.records.files import find_runs

# A schema-4 record without a content digest (as every record before 2026-11-29): epochs
# 0, 1, 2 of optim.epochs = 2, completed, final's numbers from epoch 2.
GOOD = Path(__file__).parent / "legacy_records" / "run4_fa_linear.json"


def _log(edit: Callable[[list], list]) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        record["log"] = edit(record["log"])
    return change


def _set(key: str, value: object, part: str = "") -> Callable[[dict], None]:
    """An edit setting ``key`` of the object at the dotted ``part`` (the record itself)."""
    def change(record: dict) -> None:
        node = record
        for name in filter(None, part.split(".")):
            node = node[int(name)] if isinstance(node, list) else node[name]
        node[key] = value
    return change


EDITS = {
    "an epoch logged twice": (_log(lambda log: [log[0], log[1], log[1], log[2]]),
                              "log[2] is epoch 1, after epoch 1"),
    "epochs out of order": (_log(lambda log: [log[0], log[2], log[1]]),
                            "log[2] is epoch 1, after epoch 2"),
    "an epoch past optim.epochs": (_set("epochs", 1, "config.optim"),
                                   "past the run's optim.epochs = 1"),
    "final of another length": (_set("epochs_completed", 5, "final"),
                                "final.epochs_completed = 5, but the last logged epoch is 2"),
    "a completed run's numbers from epoch 0": (_set("numbers_from", 0, "final"),
                                               "final's numbers are from epoch 0"),
    "an integer past float's range": (_set("epochs_completed", 10**400, "final"),
                                      "final.epochs_completed = 1000"),
    "a number past float's range": (_set("seconds", 10**400, "log.1"),
                                    "log[1].seconds = 1000"),
    "stopped_early a list": (_set("stopped_early", [1]), "'stopped_early' has the wrong type"),
    "divergence a text": (_set("divergence", "overflow"), "'divergence' has the wrong type"),
    "error an object": (_set("error", {"a": 1}), "'error' has the wrong type"),
    "created a number": (_set("created", 5), "'created' has the wrong type"),
}


def _edited(edit: Callable[[dict], None]) -> dict:
    record = json.loads(GOOD.read_text())
    edit(record)
    return record


def _plant(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / RECORD_FILE).write_text(text)
    return folder / RECORD_FILE


@pytest.mark.parametrize("kind", list(EDITS))
def test_an_impossible_record_is_one_line_and_a_folder_read_skips_it(tmp_path, kind):
    edit, said = EDITS[kind]
    good = _plant(tmp_path / "good", GOOD.read_text())
    bad = _plant(tmp_path / "bad", json.dumps(_edited(edit)))
    with pytest.raises(RunRecordError) as refused:
        load_record(bad)
    message = str(refused.value)
    assert str(bad) in message and said in message and "\n" not in message
    assert len(message) < 600  # a huge number is shortened, not printed whole
    found = find_runs(tmp_path)  # report, figures, export: the good run stays
    assert [path for path, _ in found.records] == [good]
    assert [path for path, _ in found.unreadable] == [bad]


@pytest.mark.parametrize("key", ["status", "acc_eval"])
def test_a_key_named_twice_is_refused_not_read_as_its_last_value(tmp_path, key):
    text = GOOD.read_text()
    duplicated = (text.replace('"status": "completed"',
                               '"status": "completed", "status": "diverged"', 1)
                  if key == "status" else
                  text.replace('"acc_eval": ', '"acc_eval": 0.99, "acc_eval": ', 1))
    bad = _plant(tmp_path / "bad", duplicated)
    with pytest.raises(RunRecordError, match=f"names the key '{key}' twice"):
        load_record(bad)


def test_a_diverged_runs_earlier_numbers_still_read(tmp_path):
    record = json.loads(GOOD.read_text())
    record["status"] = "diverged"
    record["final"]["numbers_from"] = 1
    loaded = load_record(_plant(tmp_path / "run", json.dumps(record)))
    assert loaded.final.from_epoch == 1 and loaded.final.epochs_completed == 2
    record["final"]["numbers_from"] = 2  # its last: read as the last's
    assert load_record(_plant(tmp_path / "last", json.dumps(record))).final.from_epoch is None


def test_a_compressed_torch_file_is_refused_before_torch_inflates_it(tmp_path, monkeypatch):
    """torch.save stores its entries as they are; a deflated one (a zip bomb: 600 KB of a
    checkpoint inflated to 512 MiB in torch's reader before it found the size wrong) is
    refused from the archive's directory, without torch reading it."""
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buffer)
    path = tmp_path / "checkpoint.pt"
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source, \
            zipfile.ZipFile(path, "w") as bomb:
        for info in source.infolist():
            data = source.read(info.filename)
            if "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                bomb.writestr(info.filename, b"\0" * (8 << 20),
                              compress_type=zipfile.ZIP_DEFLATED)
            else:
                bomb.writestr(info, data)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load read a compressed file")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(RunRecordError, match="holds compressed entries") as refused:
        safe_load(path, "checkpoint")
    assert str(path) in str(refused.value) and "start the run again" in str(refused.value)
