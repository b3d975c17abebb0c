"""The record layer: typed run records, their files, checkpoints and strict JSON.

Everything that reads or writes a run folder goes through this package::

    from creditaudit.records import load_record, RunRecord
    record = load_record("runs/dfa-resmlp-synthetic-s42-…")
    record.final_acc, record.deep_cos, record.series("h_L_norm"), record.recipe_key
"""

from __future__ import annotations

from creditaudit.descriptions import DataIdentity, EpochMeasures
from creditaudit.descriptions.fields import finite_number
from creditaudit.records.checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_torch_save,
    load_checkpoint,
    load_parameters,
    structure_mismatch,
)
from creditaudit.records.compare import comparable
from creditaudit.records.duplicates import Copies
from creditaudit.records.files import (
    CHECKPOINT_FILE,
    CLAIM_FILE,
    CONFIG_FILE,
    CONTENT_KEY,
    INIT_FILE,
    RECORD_FILE,
    RUN_FILES,
    RUN_FOLDER_FILES,
    FoundRecords,
    atomic_write_json,
    check_not_run_file,
    content_digest,
    find_records,
    find_runs,
    load_config_file,
    load_record,
    load_record_cached,
    load_records,
    new_record,
    record_path,
    results_folder,
    save_record,
    scan_records,
)
from creditaudit.records.parts import DERIVED, RECORD_KEYS, EpochEntry
from creditaudit.records.reading import FINISHED, SCHEMA, STATUSES
from creditaudit.records.recipes import NOT_RECORDED, recipe_key
from creditaudit.records.run_parts import (
    EndOfRun,
    FinalResults,
    ProtocolState,
    ReferenceState,
    ResumedPart,
)
from creditaudit.records.schema import RunRecord

__all__ = [
    "RunRecord", "DERIVED", "EpochEntry", "EpochMeasures", "FinalResults", "EndOfRun",
    "ProtocolState", "ReferenceState", "ResumedPart", "DataIdentity", "SCHEMA", "STATUSES",
    "FINISHED",
    "NOT_RECORDED", "RECORD_KEYS",
    "RECORD_FILE",
    "CHECKPOINT_FILE", "CONFIG_FILE", "INIT_FILE", "CLAIM_FILE", "RUN_FILES",
    "RUN_FOLDER_FILES", "check_not_run_file", "CHECKPOINT_FORMAT", "load_record",
    "load_config_file",
    "load_record_cached",
    "load_records", "scan_records", "find_records", "find_runs", "FoundRecords",
    "Copies", "save_record", "new_record", "CONTENT_KEY", "content_digest",
    "record_path", "results_folder", "comparable", "finite_number", "recipe_key",
    "atomic_write_json",
    "atomic_torch_save", "load_checkpoint", "load_parameters", "structure_mismatch",
]
