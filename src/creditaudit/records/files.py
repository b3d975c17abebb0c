"""Run folders on disk: atomic writes, strict-JSON records, safe loading, folder scans.

Layout of a run folder ``OUT_DIR/RUN_ID/``::

    record.json      the run record (:class:`~creditaudit.records.schema.RunRecord`)
    checkpoint.pt    latest epoch: model, optimiser, scheduler, rule state, RNG states
    init.pt          the model's parameters at initialisation (for feature drift)
    config.toml      the run's config, to read or edit for a new run
    claim.json       while a sweep worker trains the run: who holds it

Every write goes to a temporary file in the same folder and is renamed over the target, so a
reader sees the old file or the new one, never half of one; a failed write (disk full, folder
read-only) leaves no partial file and raises a one-line error naming the path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.caller import FORCE, OUT, RESUME
from creditaudit.config import RunConfig, config_from_dict, load_config
from creditaudit.descriptions import DataIdentity, ModelDescription
from creditaudit.errors import (
    ChangedRecordError,
    ConfigError,
    NewerRecordError,
    OutputError,
    RunRecordError,
)
from creditaudit.files import strict_json
from creditaudit.files.safe_files import (
    atomic_write_json,
    describe_os_error,
    read_text,
)
from creditaudit.formatting import counted
from creditaudit.records.duplicates import Copies, distinct_runs
from creditaudit.records.schema import RunRecord

log = logging.getLogger(__name__)

RECORD_FILE, CHECKPOINT_FILE, INIT_FILE = "record.json", "checkpoint.pt", "init.pt"
CONFIG_FILE = "config.toml"
CLAIM_FILE = "claim.json"  # held by the process that trains the run (creditaudit.records.claims)
# The files a run writes for itself (``--force`` removes them), and every name a run folder
# may hold (the claim and its break lock too): no report may be written over one of these.
RUN_FILES = (RECORD_FILE, CHECKPOINT_FILE, INIT_FILE, CONFIG_FILE)
RUN_FOLDER_FILES = (*RUN_FILES, CLAIM_FILE, f"{CLAIM_FILE}.break")


# --- records -------------------------------------------------------------------------------
def environment(device: str, components: dict[str, Any] | None = None) -> dict[str, Any]:
    """Package versions, the source revision, device and threads: what a reader needs to
    reproduce the run."""
    import numpy
    import torch

    from creditaudit.version import __version__, source_revision

    cuda = torch.cuda.is_available()
    return {
        "creditaudit": __version__, "source": source_revision(),
        "python": platform.python_version(),
        "torch": str(torch.__version__), "numpy": str(numpy.__version__),
        "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None, "device": device,
        "components": components,
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def new_record(config: RunConfig, *, device: str, run_id: str = "",
               data: DataIdentity | None = None, model: ModelDescription | None = None,
               code: dict[str, Any] | None = None) -> RunRecord:
    """A fresh ``running`` record of ``config`` (``run_id``, ``data``, ``model`` and the
    components' ``code`` versions as the run plan and the built model give them)."""
    return RunRecord(run_id=run_id, config=config, status="running", data=data, model=model,
                     environment=environment(device, code), created=now())


def record_path(path: Path | str) -> Path:
    """The record.json of a run folder, or the path itself when it names a file (or a
    folder named record.json, which is then refused as one)."""
    path = Path(path)
    return path / RECORD_FILE if path.is_dir() and path.name != RECORD_FILE else path


def check_not_run_file(path: Path | str) -> None:
    """Refuse (OutputError, one line) an output file that is one of a run folder's own files
    (:data:`RUN_FOLDER_FILES`, in a folder holding any of :data:`RUN_FILES`): writing a report
    there would replace the run's record, checkpoint or claim and break every later read."""
    path = Path(path)
    if path.name in RUN_FOLDER_FILES and any((path.parent / name).exists()
                                               for name in RUN_FILES):
        raise OutputError(f"{path} is one of the run's own files ({', '.join(RUN_FOLDER_FILES)}"
                          f" are); write the report to another file, e.g. "
                          f"{path.parent / 'audit.txt'}")


# The digest of a record's content, written beside it: a record changed after it was written
# (by hand, or by a script) describes a run that did not happen and is refused when read.
CONTENT_KEY = "content_sha256"


def content_digest(stored: dict[str, Any]) -> str:
    """sha256 of a stored record's content (every key but :data:`CONTENT_KEY`), independent
    of key order and indentation: a record reformatted (``jq -S``) keeps its digest, one with
    any value changed does not. Non-finite numbers count by name (strict JSON marks)."""
    clean, marks = strict_json.encode({k: v for k, v in stored.items() if k != CONTENT_KEY})
    # as the file holds it (a guest's int keys are strings there), then in one key order
    as_read = json.loads(json.dumps([clean, marks], allow_nan=False))
    text = json.dumps(as_read, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def save_record(run_dir: Path | str, record: RunRecord) -> Path:
    record.updated = now()
    path = Path(run_dir) / RECORD_FILE
    stored = record.to_dict(stored=True)
    stored[CONTENT_KEY] = content_digest(stored)
    atomic_write_json(path, stored)
    return path


def _changed(raw: Any) -> bool:
    """Whether a record's content no longer has the digest written with it (records written
    before the digest was kept have none: not changed, as far as can be known)."""
    return isinstance(raw, dict) and CONTENT_KEY in raw \
        and raw[CONTENT_KEY] != content_digest(raw)


def load_record(path: Path | str, *, check_content: bool = True) -> RunRecord:
    """Read and validate a run record (a run folder or its record.json).

    Raises RunRecordError with a one-line reason for missing, unreadable, binary,
    truncated, malformed or foreign-schema files, for anything but a regular file (a
    folder, a named pipe, a device), for files over the size limit or nested too deeply
    (:func:`~creditaudit.files.safe_files.read_text`,
    :func:`~creditaudit.files.strict_json.check_depth`), for values outside their domain
    (an accuracy of 5) and, unless ``check_content`` is False, for a record changed after it
    was written (:func:`content_digest`).
    """
    path = record_path(path)
    if not path.exists():
        raise RunRecordError(f"no run record at {path}: "
                             + (path.name == RECORD_FILE and (_runs_below(path.parent)
                                                              or _run_without_record(path.parent))
                                or f"pass a run folder that holds {RECORD_FILE} or the file "
                                   "itself"))
    _check_not_a_sibling(path)
    text = read_text(path, "run record")
    try:
        strict_json.check_depth(text)
    except strict_json.TooDeep as err:
        raise RunRecordError(f"run record {path} {err}; it was not written by creditaudit"
                             ) from None
    try:
        raw = json.loads(text, object_pairs_hook=strict_json.unique_keys)
    except strict_json.DuplicateKey as err:
        raise RunRecordError(f"run record {path} {err}, so JSON readers disagree on its value "
                             "(it was edited by hand, or written by an earlier creditaudit "
                             "from a guest's numbers keyed 1 and '1' alike)",
                             f"keep the one value you trust, or train the run again with "
                             f"{FORCE}") from None
    except ValueError as err:
        raise RunRecordError(f"run record {path} is truncated or not JSON ({err})"
                             ) from None
    try:
        raw = strict_json.decode(raw)
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise RunRecordError(f"run record {path} has a malformed non_finite block ({err}); "
                             "it was not written by creditaudit as it is") from None
    changed = check_content and _changed(raw)  # before reading: that may fill raw in
    record = RunRecord.from_dict(raw, str(path))  # its own errors first: they say more
    if changed:
        raise ChangedRecordError(
            f"run record {path} was changed after creditaudit wrote it (its {CONTENT_KEY} "
            "no longer matches its content), so its numbers may not be its run's",
            _changed_record_advice(path))
    return record


def _changed_record_advice(path: Path) -> str:
    """How to get back a run whose record ``path`` changed after it was written: restore
    it, rebuild it from the run's checkpoint when there is one (a run saved without
    checkpoints — a Recorder's default — has none), or train the run again."""
    rebuild = (f"rebuild it from the run's checkpoint with {RESUME}, "
               if (path.parent / CHECKPOINT_FILE).is_file() else "")
    return f"restore the file, {rebuild}or train the run again with {FORCE}"


def _check_not_a_sibling(path: Path) -> None:
    """RunRecordError (one line) when ``path`` is another of a run folder's own files
    (``audit runs/…/checkpoint.pt``): read as a record it would be refused as a damaged or
    binary file, blaming a file that is fine; the run's folder is what was meant."""
    if path.name in RUN_FOLDER_FILES and path.name != RECORD_FILE \
            and (path.parent / RECORD_FILE).is_file():
        raise RunRecordError(f"{path} is one of the run's own files, not its record: pass "
                             f"the run's folder {path.parent} (or its {RECORD_FILE})")


def _runs_below(folder: Path) -> str:
    """For a results folder named where a run's folder was meant (``audit runs/``): the
    number of run folders in it and one of them, as the end of a refusal; empty for any
    other folder."""
    try:
        runs = sorted(found.parent for found in folder.glob(f"*/{RECORD_FILE}"))
    except OSError:
        return ""
    if not runs:
        return ""
    return (f"{folder} is a results folder of {counted(len(runs), 'run')}, not a run's "
            f"folder: pass a run's folder (e.g. {runs[0]}), or several")


def _run_without_record(folder: Path) -> str:
    """For a run's folder that holds some of a run's files but no record yet (a run starting
    now in another process, or one killed before its first record was written): what it is,
    as the end of a refusal; empty for any other folder. A ``config.toml`` alone is no sign
    of a run: it is also what a researcher names their own config file."""
    try:
        held = [name for name in RUN_FOLDER_FILES if (folder / name).exists()]
    except OSError:
        return ""
    if not set(held) - {CONFIG_FILE}:
        return ""
    return (f"{folder} holds {', '.join(held)} of a run that has not written its record yet "
            "(one starting now in another process, or one killed before it got that far): "
            "wait for it, or start that run again")


def no_runs_in(folder: Path, doing: str = "report", unreadable: int = 0) -> str:
    """The one-line refusal for a results folder below which no record lies (``report``,
    ``figures`` or ``export`` of an empty folder, a mistyped one, one holding only a
    researcher's config.toml, or only a starting run's init.pt), or none that could be read
    (``unreadable``: how many were left out, each already named in a warning); ``doing``:
    what there is nothing to do ("report", "draw", "export")."""
    if unreadable:
        return (f"{folder} holds {counted(unreadable, 'run record')} but none that could be "
                f"read (each named in a warning above), so there is nothing to {doing}: "
                "repair or replace them, or pass the folder your runs were written to")
    why = _run_without_record(folder)
    return (f"{folder} holds no run records ({RECORD_FILE} below it), so there is nothing to "
            f"{doing}" + (f": {why}" if why else ": pass the folder your runs were written to "
                                                 "(the --out of train or sweep)"))


def load_config_file(path: Path | str, *, checked: bool = True) -> RunConfig:
    """The config of ``--config FILE``: a TOML config, or a run's ``record.json`` (its
    config is taken, checked as a config file's; the record is validated like any other, but
    may have been edited: only its config is used, and the run it gives gets the id of that
    config). ``checked``: as :func:`~creditaudit.config.config_from_dict`'s."""
    path = Path(path)
    inside = [path / name for name in (CONFIG_FILE, RECORD_FILE) if (path / name).is_file()]
    if path.is_dir() and inside:  # a run's folder, as audit takes it: name its file
        raise ConfigError(f"config file {path} is a run folder, not a file: pass the run's "
                          f"config in it, {inside[0]}")
    text = read_text(path, "config file", ConfigError)
    if not text.lstrip().startswith("{") and (path.suffix != ".json" or text.strip()) \
            and not (path.suffix == ".json" and _is_json(text)):
        # a TOML config, whatever its name (a .json that is not JSON)
        return load_config(path, checked=checked)
    try:
        load_record(path, check_content=False)
    except NewerRecordError as err:  # a record, of a version that can read it
        raise ConfigError(f"config file {path}: {err}") from None
    except RunRecordError as err:
        raise ConfigError(f"config file {path} is JSON but not a readable creditaudit run "
                          f"record ({err}); pass a TOML config or a run's record.json"
                          ) from None
    # Read as a record, its config drops every key its run did not read; given as a config,
    # its keys are checked as a config file's (an edited key the rule does not read, or a
    # misspelt one, is refused, not dropped without a word).
    try:
        return config_from_dict(strict_json.loads(text)["config"], checked=checked)
    except ConfigError as err:
        raise ConfigError(f"config file {path} (a run record): {err}") from None


def _is_json(text: str) -> bool:
    """Whether ``text`` parses as JSON (a .json file holding ``[1, 2]`` is told it is not a
    run record, not that it is invalid TOML)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


_CACHE: dict[str, tuple[tuple[int, int, int], RunRecord]] = {}


def load_record_cached(path: Path | str) -> RunRecord:
    """:func:`load_record`, reused while the file is unchanged (records are replaced
    atomically, so a new version has a new inode or mtime). Do not modify the result."""
    path = record_path(path)
    try:
        stat = path.stat()
    except OSError:
        return load_record(path)  # raises the one-line error
    key = str(path.resolve())
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == version:
        return hit[1]
    record = load_record(path)
    _CACHE[key] = (version, record)
    return record


def results_folder(root: Path | str) -> Path:
    """``root`` as a results folder to read: ConfigError (one line) when it is empty, which
    would silently mean the current folder, missing, or a file."""
    if not str(root).strip():
        raise ConfigError("the results folder is an empty path, which would mean the current "
                          "folder; give a folder (. for the current one)")
    root = Path(root)
    if not root.is_dir():
        state = "is a file, not a folder" if root.exists() else "does not exist"
        raise ConfigError(f"results folder {root} {state}: pass the folder your runs were "
                          f"written to (the {OUT} of train/sweep/experiment)")
    return root


def find_records(root: Path | str) -> list[Path]:
    """Every record.json below ``root`` (sorted), whatever it is: a folder, pipe or device
    of that name is listed too, so that readers name it as unreadable; unreadable folders
    are skipped."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root, onerror=lambda err: log.warning(
            "skipping %s", describe_os_error(err))):
        if RECORD_FILE in files or RECORD_FILE in dirs:
            found.append(Path(folder) / RECORD_FILE)
        if RECORD_FILE in dirs:
            dirs.remove(RECORD_FILE)  # not a run folder: not searched
    return sorted(found)


def scan_records(root: Path | str) -> Iterator[tuple[Path, RunRecord | RunRecordError]]:
    """(path, record) for every record below ``root``; an unreadable one comes with its
    error instead (callers warn once and skip it)."""
    for path in find_records(root):
        try:
            yield path, load_record(path)
        except RunRecordError as err:
            yield path, err


@dataclass
class FoundRecords:
    """The records below a folder, one per run id (:mod:`creditaudit.records.duplicates`)."""

    records: list[tuple[Path, RunRecord]]  # (path, record), one per run id
    unreadable: list[tuple[Path, str]]  # (path, reason): unreadable, or copies that differ
    copies: list[Copies]  # run ids found more than once, and which copy was read


def find_runs(root: Path | str) -> FoundRecords:
    """Every readable record below ``root``, each run id once. Every unreadable record is
    named in one warning and listed with its reason; copies of one run say in one line
    which was counted (a warning where they differ), and copies that differ with none to
    choose are listed as left out, with that line as the reason."""
    good: list[tuple[Path, RunRecord]] = []
    bad: list[tuple[Path, str]] = []
    for path, item in scan_records(root):
        if isinstance(item, RunRecordError):
            log.warning("warning: skipping an unreadable record: %s", item)
            bad.append((path, str(item)))
        else:
            good.append((path, item))
    distinct, copies = distinct_runs(good)
    for found in copies:
        if found.differ:
            log.warning("warning: %s", found.text())
        else:
            log.info("%s", found.text())
        if found.kept is None:
            bad += [(path, found.text()) for path in found.paths]
    return FoundRecords(distinct, bad, copies)


def load_records(root: Path | str) -> tuple[list[tuple[Path, RunRecord]],
                                            list[tuple[Path, str]]]:
    """(readable records, one per run id; [(path, reason) of the records left out]) below
    ``root``: :func:`find_runs`."""
    found = find_runs(root)
    return found.records, found.unreadable
