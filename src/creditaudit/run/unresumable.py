"""A run folder that holds no run to resume: what its unfinished run allows, and what
``--resume`` says instead.

An unfinished run that trained nothing (killed before its first trained epoch was saved:
:func:`restartable`, :func:`started_without_record`) can start over — that loses nothing
and gives the same run. A ``--resume`` that finds no run in its folder ends in one
:class:`~creditaudit.errors.RunRecordError` (:func:`no_run_to_resume`) naming the run of the
same config on other data, other guest code or another torch default dtype, the run of
this config an earlier version named by another run id, or else the nearest run of another
config, with the values that differ. What a checkpoint found there
must pass before it is loaded is :mod:`creditaudit.run.resume`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from creditaudit.caller import RESUME, on_command_line, train_again
from creditaudit.config import RunConfig, config_value, semantic_dict
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import RunRecordError
from creditaudit.measures.user_models import dtype_name
from creditaudit.records import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    RECORD_FILE,
    RUN_FILES,
    RunRecord,
    load_checkpoint,
    load_record,
)
from creditaudit.records.run_ids import RunCode, compute_run_id
from creditaudit.run.resume import (
    check_same_run,
    code_digests,
    data_change,
    recorded_code_digests,
    saved_record,
)


def restartable(record: RunRecord, run_dir: Path, *, resume: bool) -> bool:
    """Whether an unfinished run stopped before its first trained epoch was saved (killed
    between its epoch-0 record and checkpoint, during epoch 1, or the disk filled there):
    neither its record nor a readable checkpoint holds a trained epoch — a checkpoint holds
    at most the initial weights — so starting it over loses nothing and gives the same run.
    A checkpoint of a trained epoch whose record.json was not rewritten after it (killed
    between the two writes, a full disk) is resumed instead: it holds the record as of its
    epoch. Without ``resume``, a failed run is left for the user to retry (its error may
    recur)."""
    if record.is_finished:
        return False
    if record.is_failed and not resume:
        return False
    if any(entry.epoch > 0 for entry in record.log):
        return False
    return (checkpointed_epoch(run_dir) or 0) <= 0


def started_without_record(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's first files but no record.json: it was killed
    while it wrote its config and initial weights or measured its epoch 0, before its
    first record (a checkpoint of a trained epoch, which only follows a record, is not
    there). It trained nothing: starting it over loses nothing and gives the same run."""
    if (run_dir / RECORD_FILE).exists():
        return False
    if not any((run_dir / name).exists() for name in RUN_FILES):
        return False
    return (checkpointed_epoch(run_dir) or 0) <= 0


def checkpointed_epoch(run_dir: Path) -> int | None:
    """The epoch of the checkpoint in ``run_dir`` (0: the initial weights); None without
    one, or for one that cannot be read as a checkpoint (resuming from it would refuse it
    too)."""
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        return int(load_checkpoint(path)["epoch"])
    except RunRecordError:
        return None


def trained_epoch(run_dir: Path, run_id: str) -> int:
    """The trained epoch of the checkpoint in ``run_dir`` — 0 without one, for one of the
    initial weights, or for one that cannot be read — read once. One-line RunRecordError
    when a checkpoint of a trained epoch holds the record of another run than ``run_id``:
    a file copied from another run's folder, which ``--resume`` would refuse too."""
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        return 0
    try:
        state = load_checkpoint(path)
    except RunRecordError:
        return 0
    epoch = int(state["epoch"])
    if epoch > 0:
        check_same_run(saved_record(state, path), run_id, path)
    return epoch


def no_run_to_resume(config: RunConfig, run_dir: Path, identity: DataIdentity,
                     code: RunCode | None = None) -> RunRecordError:
    """The error for ``--resume`` when ``run_dir`` (the config's run id on the data found
    now, the ``code`` now — a run plan's — and torch's default dtype now) holds no run: it
    names the run of the same config on other data, if there is one — the data changed
    since that run started —, or trained with other code of a guest (a factory edited
    since), or planned under another torch default dtype (a float64 run resumed from a
    float32 process, such as any command), else the run of the same method, architecture,
    dataset and seed whose config differs least (e.g. ``--epochs`` raised to extend it: the
    schedule spans every epoch, so that is another run), with the values that differ."""
    label = run_dir.name.rsplit("-", 1)[0]  # method-arch-dataset-sSEED
    wanted = semantic_dict(config)
    nearest: tuple[int, Path, RunRecord, list[str]] | None = None  # of another config
    for path in sorted(run_dir.parent.glob(f"{label}-*/{RECORD_FILE}")):
        try:
            record = load_record(path)
        except RunRecordError:
            continue
        if semantic_dict(record.config) == wanted and record.data is not None \
                and record.data.fingerprint != identity.fingerprint:
            why, fix = data_change(record.data, identity)
            return RunRecordError(
                f"cannot resume: {path.parent} has this config but trained on "
                f"{record.data.name} data with fingerprint {record.data.fingerprint[:12]}…, "
                f"and the data found now ({identity.fingerprint[:12]}…) is not that data any "
                f"more ({why}; no run at {run_dir.name}); {fix}, or train without {RESUME}")
        changed = _changed_code(record, None if code is None else code.to_dict())
        if semantic_dict(record.config) == wanted and changed:
            return RunRecordError(
                f"cannot resume: {path.parent} has this config but was trained with other "
                f"code of its {changed} (the run id covers a guest's code, so the code as it "
                f"is now is another run: no run at {run_dir.name}); restore the code the run "
                "was trained with to resume it, or train the code as it is now without "
                f"{RESUME}")
        dtype = _planned_dtype(record, config, identity, code)
        if semantic_dict(record.config) == wanted and dtype is not None:
            return RunRecordError(
                f"cannot resume: {path.parent} has this config but was trained with torch's "
                f"default dtype {dtype}, and this process has {_default_dtype()} (the dtype "
                f"is part of the run id: no run at {run_dir.name}); {_dtype_fix(dtype)}, or "
                f"train it in {_default_dtype()} without {RESUME}")
        differ = _differing_keys(semantic_dict(record.config), wanted)
        if differ and (nearest is None or len(differ) < nearest[0]):
            nearest = (len(differ), path.parent, record, differ)
    if nearest is None:
        return RunRecordError(f"cannot resume: no run at {run_dir}")
    # e.g. --epochs raised to extend a run: another schedule, so another run id
    _, other, record, differ = nearest
    if not record.is_finished and _same_run_now(record, run_dir.name):
        return RunRecordError(
            f"cannot resume: {other} is {record.status}, and it is the run of this config: "
            f"its {', '.join(differ)} computes what the default does, so this version of "
            f"creditaudit names it {run_dir.name}, and the version that started it named it "
            f"{other.name}; resume it with that version, or train this config without "
            f"{RESUME}")
    values = ", ".join(f"{key}={config_value(record.config, key)!r} "
                       f"(not {config_value(config, key)!r})" for key in differ)
    data = record.data
    data_changed = data is not None and data.fingerprint != identity.fingerprint
    if data is not None and data_changed:  # a second reason: each is named
        values += (f", and trained on {data.name} data with fingerprint "
                   f"{data.fingerprint[:12]}… (the data found now is "
                   f"{identity.fingerprint[:12]}…)")
    on_its_data = " with data.data_dir at that run's data" if data_changed else ""
    advice = (f"resume that run with its own config "
              f"({train_again(str(other / CONFIG_FILE))}){on_its_data}, or "
              if not record.is_finished else "")
    covers = " and the data" if data_changed else ""
    return RunRecordError(
        f"cannot resume: no run at {run_dir}; {other} is {record.status} with {values}, "
        f"another run (the run id covers every option that changes what is computed"
        f"{covers}): {advice}train this config without {RESUME}")


def _same_run_now(record: RunRecord, run_id: str) -> bool:
    """Whether ``record``'s config, planned now, is the run ``run_id``: a run an earlier
    version named otherwise (e.g. ``data.train_subset`` equal to the whole training split,
    a run of its own before the IDX headers gave the split's size)."""
    from creditaudit.run.plan import plan_run

    try:
        return plan_run(record.config).run_id == run_id
    except Exception:  # noqa: BLE001 - a config that cannot be planned now is another run
        return False


def _default_dtype() -> str:
    """torch's default dtype now, as run ids and records name it (``float32``)."""
    return dtype_name(torch.get_default_dtype())


def _planned_dtype(record: RunRecord, config: RunConfig, identity: DataIdentity,
                   code: RunCode | None) -> str | None:
    """The torch default dtype other than this process's under which ``record``'s run was
    planned, when its run id is the one ``config`` on the data ``identity`` and the
    ``code`` now get under that dtype (the id says it, whatever the parameters' dtype the
    record's model block holds); None otherwise."""
    if code is None:
        return None
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        if dtype != _default_dtype() and record.run_id == compute_run_id(
                config, identity.fingerprint, code, dtype=dtype):
            return dtype
    return None


def _dtype_fix(dtype: str) -> str:
    """How to resume a run planned under torch's default dtype ``dtype``: a command's torch
    is float32, so from Python."""
    call = f"torch.set_default_dtype(torch.{dtype})"
    return (f"resume it from Python after {call}" if on_command_line()
            else f"call {call} first to resume it")


def _changed_code(record: RunRecord, code: Mapping[str, Any] | None) -> str | None:
    """The components (``model``, ``diagnostic a``, …) whose guest code digest in
    ``record`` differs from ``code``'s (a run plan's ``code.to_dict()``), said in words;
    None when none does or ``code`` is not given."""
    if code is None:
        return None
    then, now = recorded_code_digests(record), code_digests(code)
    changed = [key.replace(":", " ") for key in sorted(then.keys() | now.keys())
               if then.get(key) != now.get(key)]
    return " and ".join(changed) or None


def _differing_keys(recorded: dict[str, dict[str, Any]], wanted: dict[str, dict[str, Any]]
                    ) -> list[str]:
    """The dotted keys whose non-default values (:func:`semantic_dict`) differ, sorted."""
    return sorted(f"{section}.{key}" for section in recorded.keys() | wanted.keys()
                  for key in recorded.get(section, {}).keys() | wanted.get(section, {}).keys()
                  if recorded.get(section, {}).get(key) != wanted.get(section, {}).get(key))
