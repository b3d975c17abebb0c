"""How the JSON object of a run record becomes its typed parts: checked, and migrated from
earlier schemas.

:func:`record_parts` validates the object (schema, required keys and their types, status,
config, each number within its field's domain) and returns the parts
:class:`~creditaudit.records.schema.RunRecord` is built from. Schema 4 stores each number
once (:mod:`creditaudit.records.copies` puts the copies back); records of schemas 1–3
stored the copies and are read as they are.
"""

from __future__ import annotations

import reprlib
from typing import Any

from creditaudit.config import config_from_dict
from creditaudit.descriptions import COSINE_INVALID, DataIdentity, ModelDescription
from creditaudit.errors import CreditAuditError, NewerRecordError, RunRecordError
from creditaudit.records.copies import read_final, read_protocol
from creditaudit.records.parts import EpochEntry, check_domains, nonzero_median_restored
from creditaudit.records.run_parts import (
    EndOfRun,
    FinalResults,
    ProtocolState,
    ReferenceState,
    ResumedPart,
    own_architecture,
)

SCHEMA = "creditaudit.run/4"  # 4: each number once (records.copies)
LEGACY_SCHEMAS = ("creditaudit.run/1", "creditaudit.run/2", "creditaudit.run/3")
STATUSES = ("running", "completed", "diverged", "interrupted", "failed")
FINISHED = ("completed", "diverged")  # the trajectory is final (a diverged run keeps its epochs)

_REQUIRED: dict[str, Any] = {
    "schema": str, "run_id": str, "config": dict, "status": str, "log": list,
    "final": (dict, type(None)), "diagnostics": dict, "protocol": dict,
}


def record_parts(raw: Any, where: str) -> dict[str, Any]:
    """The fields of a :class:`~creditaudit.records.schema.RunRecord` read from its JSON
    object ``raw`` (``where``: the file or checkpoint, for messages), in the current schema;
    a record that is not one raises a one-line :class:`RunRecordError`."""
    if not isinstance(raw, dict):
        raise RunRecordError(f"run record {where} must be a JSON object")
    schema = raw.get("schema")
    if _newer(schema):
        raise NewerRecordError(f"run record {where} was written by a newer version of "
                               f"creditaudit (schema {schema!r}; this version reads up to "
                               f"{SCHEMA!r}): upgrade creditaudit to read it")
    if schema not in (SCHEMA, *LEGACY_SCHEMAS):
        raise RunRecordError(f"run record {where} has schema {schema!r}; this version of "
                             f"creditaudit reads {SCHEMA!r} (and migrates "
                             f"{', '.join(map(repr, LEGACY_SCHEMAS))})")
    for key, kind in _REQUIRED.items():
        if key not in raw:
            raise RunRecordError(f"run record {where} lacks the key {key!r}")
        if not isinstance(raw[key], kind):
            raise RunRecordError(f"run record {where}: {key!r} has the wrong type "
                                 f"({type(raw[key]).__name__})")
    if raw["status"] not in STATUSES:
        raise RunRecordError(f"run record {where}: status {raw['status']!r} is not one of "
                             f"{', '.join(STATUSES)}")
    try:
        config = config_from_dict(raw["config"], strict=False)
    except CreditAuditError as err:
        raise RunRecordError(f"run record {where} holds an invalid config: {err}") from None
    if not isinstance(raw.get("environment") or {}, dict):
        raise RunRecordError(f"run record {where}: 'environment' must be an object, got "
                             f"{type(raw['environment']).__name__}")
    current = schema == SCHEMA  # earlier schemas stored the copies: read as they are
    log = [EpochEntry.from_dict(nonzero_median_restored(e) if current else e,
                                f"run record {where}", i)
           for i, e in enumerate(raw["log"])]
    try:
        final = (None if raw["final"] is None
                 else read_final(raw["final"], log, f"run record {where}") if current
                 else FinalResults(**raw["final"]))
        data = raw.get("data")
        data = None if data is None else _typed(DataIdentity(**data), DATA_KINDS,
                                                f"run record {where}: data")
        model = raw.get("model")
        model = None if model is None else _typed(ModelDescription(**model), MODEL_KINDS,
                                                  f"run record {where}: model")
        protocol = (read_protocol(raw["protocol"], log, f"run record {where}") if current
                    else ProtocolState(**raw["protocol"]))
        reference = ReferenceState.from_dict(raw.get("reference"), f"run record {where}",
                                             own_model=own_architecture(
                                                 config.model.arch,
                                                 getattr(config.model, "factory", None)))
    except TypeError as err:
        raise RunRecordError(f"run record {where} has an unexpected field ({err})") from None
    _check_epochs(log, final, raw["status"], config.optim.epochs, where)
    for key, kind in _OPTIONAL.items():
        if not isinstance(raw.get(key), kind):
            raise RunRecordError(f"run record {where}: {key!r} has the wrong type "
                                 f"({type(raw[key]).__name__}); the record was not written "
                                 "by creditaudit as it is")
    diagnostics = EndOfRun.from_dict(raw["diagnostics"])
    _check_table_reasons(diagnostics.cosine_table, where)
    parts = [*((entry, f"log[{i}].") for i, entry in enumerate(log)), (final, "final."),
             (diagnostics, "diagnostics.")]
    for part, prefix in parts:
        if part is not None:
            check_domains(part, f"run record {where}", prefix)
    return dict(
        run_id=raw["run_id"], config=config, status=raw["status"], log=log, final=final,
        diagnostics=diagnostics, protocol=protocol, reference=reference, data=data,
        model=model,
        environment=dict(raw.get("environment") or {}),
        resumed=_resumed(raw.get("resumed", []), where), created=raw.get("created"),
        updated=raw.get("updated"), error=raw.get("error"),
        divergence=raw.get("divergence"),
        stopped_early=_stopped_early(raw.get("stopped_early"), config.optim.epochs),
        credit_not_finite=_credit_not_finite(raw.get("credit_not_finite"), where),
        not_recorded=_keys(raw.get("not_recorded", []), where), schema=SCHEMA)


def _stopped_early(stopped: dict[str, Any] | None, epochs: int) -> dict[str, Any] | None:
    """``stopped_early`` as read: None for one at the run's last epoch (``epochs``), which
    creditaudit before 2026-11-30 wrote for a walk-back verdict first reached there — the
    run trained every epoch of its recipe, and readers would leave it out of end-of-run
    means and (d)'s frozen baselines as a run stopped early."""
    if stopped is not None and isinstance(stopped.get("epoch"), int) \
            and stopped["epoch"] >= epochs:
        return None
    return stopped


_OPTIONAL_INT, _OPTIONAL_STR = (int, type(None)), (str, type(None))
# Keys a record may lack (absent reads as null), each of its kind: readers join the texts
# and ask the objects for their keys (a list as ``stopped_early`` was an internal error).
_OPTIONAL: dict[str, Any] = {
    "created": _OPTIONAL_STR, "updated": _OPTIONAL_STR, "error": _OPTIONAL_STR,
    "divergence": (dict, type(None)), "stopped_early": (dict, type(None)),
}
# What each field of the record's ``model`` and ``data`` holds: reports, figures and exports
# join their texts and index their lists (a label of 5 was an internal error there).
MODEL_KINDS: dict[str, Any] = {
    "arch": str, "label": str, "terminal_ln": (bool, type(None)), "d": _OPTIONAL_INT,
    "n_blocks": _OPTIONAL_INT, "residual": (bool, type(None)), "input_shape": (list, type(None)),
    "layout": _OPTIONAL_STR, "parameters": _OPTIONAL_INT, "dtype": _OPTIONAL_STR,
    "frozen_parameters": (dict, type(None)),
}
DATA_KINDS: dict[str, Any] = {
    "name": str, "fingerprint": str, "source": str, "n_train": _OPTIONAL_INT,
    "n_test": _OPTIONAL_INT, "n_classes": _OPTIONAL_INT, "input_shape": (list, type(None)),
    "provenance": dict, "arrays_sha256": _OPTIONAL_STR, "eval_samples": _OPTIONAL_INT,
}


def _typed(part: Any, kinds: dict[str, Any], where: str) -> Any:
    """``part`` (the record's model description or data identity), each field of the kind
    ``kinds`` names; a one-line RunRecordError naming ``where`` and the field otherwise."""
    for name, kind in kinds.items():
        value = getattr(part, name)
        if not isinstance(value, kind):
            raise RunRecordError(f"{where}.{name} has the wrong type ({type(value).__name__}): "
                                 "the record was not written by creditaudit as it is")
    return part


def _check_epochs(log: list[EpochEntry], final: FinalResults | None, status: str,
                  epochs: int, where: str) -> None:
    """The log's epochs each once, in increasing order, none past the run's ``epochs``
    (``optim.epochs``); ``final`` of the last of them, its numbers from that epoch, or, for
    a diverged run, from an earlier logged one: a record that says otherwise would show
    another epoch's numbers as the run's."""
    problem = None
    numbers = [entry.epoch for entry in log]
    later = next((i for i in range(1, len(numbers)) if numbers[i] <= numbers[i - 1]), None)
    if later is not None:
        problem = (f"log[{later}] is epoch {reprlib.repr(numbers[later])}, after epoch "
                   f"{reprlib.repr(numbers[later - 1])}: each epoch is logged once, in order")
    elif numbers and numbers[-1] > epochs:
        problem = (f"log holds epoch {reprlib.repr(numbers[-1])}, past the run's "
                   f"optim.epochs = {epochs}")
    elif final is not None and numbers and final.epochs_completed != numbers[-1]:
        problem = (f"final.epochs_completed = {reprlib.repr(final.epochs_completed)}, but the "
                   f"last logged epoch is {numbers[-1]}")
    elif final is not None and final.from_epoch is not None and status != "diverged":
        problem = (f"final's numbers are from epoch {reprlib.repr(final.from_epoch)}, not the "
                   f"last, though the run is {status} (only a diverged run's numbers come from "
                   "an earlier epoch)")
    elif final is not None and final.from_epoch is not None \
            and final.from_epoch not in numbers[:-1]:
        problem = (f"final's numbers are from epoch {reprlib.repr(final.from_epoch)}, which is "
                   "not a logged epoch before the last")
    if problem is not None:
        raise RunRecordError(f"run record {where}: {problem}; the record was not written by "
                             "creditaudit as it is")


def _newer(schema: Any) -> bool:
    """Whether ``schema`` is a run-record schema after :data:`SCHEMA` (``creditaudit.run/N``,
    N larger than this version's)."""
    prefix, _, version = SCHEMA.rpartition("/")
    if not isinstance(schema, str) or not schema.startswith(prefix + "/"):
        return False
    number = schema[len(prefix) + 1:]
    return number.isascii() and number.isdigit() and int(number) > int(version)


def _resumed(value: Any, where: str) -> list[ResumedPart]:
    """``resumed``: one object per resumed part (absent: never resumed, or written before
    the parts were kept)."""
    if not isinstance(value, list):
        raise RunRecordError(f"run record {where}: 'resumed' must be a list of the run's "
                             "resumed parts")
    return [ResumedPart.from_dict(part, f"run record {where}: resumed[{i}]")
            for i, part in enumerate(value)]


def _keys(value: Any, where: str) -> list[str]:
    """``not_recorded``: a list of dotted config keys (absent: every key recorded)."""
    if isinstance(value, list) and all(isinstance(k, str) for k in value):
        return list(value)
    raise RunRecordError(f"run record {where}: 'not_recorded' must be a list of config keys")


def _check_table_reasons(table: Any, where: str) -> None:
    """The end-of-run cosine table's rows: each with its ``cos`` (readers index it), and
    ``cos_invalid`` absent (records from before it), null or one of
    :data:`COSINE_INVALID`."""
    for index, row in enumerate(table if isinstance(table, list) else []):
        if isinstance(row, dict) and "cos" not in row:
            raise RunRecordError(f"run record {where}: diagnostics.cosine_table[{index}] has no "
                                 "'cos'; the record was not written by creditaudit as it is")
        reason = row.get("cos_invalid") if isinstance(row, dict) else None
        if reason is not None and reason not in COSINE_INVALID:
            raise RunRecordError(
                f"run record {where}: diagnostics.cosine_table[{index}].cos_invalid = "
                f"{reason!r} is not null or one of {', '.join(COSINE_INVALID)}; the record "
                "was not written by creditaudit as it is")


def _credit_not_finite(value: Any, where: str) -> dict[str, Any] | None:
    """``credit_not_finite`` (absent: none): the first epoch, the states (integers), the
    rule's name (text) and whether it is a guest's code."""
    if value is None:
        return None
    fine = (isinstance(value, dict) and isinstance(value.get("rule"), str)
            and isinstance(value.get("guest", False), bool)
            and isinstance(value.get("part", ""), str)
            and _integers([value.get("epoch")]) and isinstance(value.get("states"), list)
            and _integers(value["states"]))
    if not fine:
        raise RunRecordError(f"run record {where}: 'credit_not_finite' must be an object with "
                             "an integer 'epoch', a list of integer 'states', the 'rule' as "
                             "text, 'guest' true or false and any 'part' as text; the record "
                             "was not written "
                             "by creditaudit as it is")
    return dict(value)


def _integers(values: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
