"""Records edited after they were written: their run id no longer matches what they say.

A run id is derived from the run's config, its data's fingerprint and its components' code
(:mod:`creditaudit.records.run_ids`), all of which the record keeps. A record whose config
was edited by hand (``optim.lr`` 0.001 → 0.5) still sits in the folder of the run it was,
so it would be served for that run's config, audited and reported with numbers the edited
config never produced. Recomputing the id from the record finds this. Runs whose id may be
a name their user gave (a ``Recorder``'s ``name=``) and records too old to keep the
fingerprint or the components are not checked: there is nothing to recompute from.
"""

from __future__ import annotations

from pathlib import Path

from creditaudit.errors import RunRecordError
from creditaudit.records.run_ids import derived_run_id
from creditaudit.records.schema import RunRecord
from creditaudit.registry import ARCHITECTURES


def named_by_user(record: RunRecord) -> bool:
    """Whether the record's id may be a name its user gave, not an id computed from what
    ran: a run of an architecture creditaudit only describes (``unbuildable``: a network
    trained in its user's own loop and recorded by a ``Recorder``)."""
    arch = ARCHITECTURES.find(record.config.model.arch)
    return arch is not None and bool(arch.unbuildable)


def check_not_edited(record: RunRecord, path: Path | str) -> None:
    """One-line RunRecordError when the run id derived from ``record`` (read from ``path``)
    is not the id it holds: the record was edited since it was written."""
    if not record.run_id or named_by_user(record):
        return
    fingerprint = record.data.fingerprint if record.data is not None else None
    derived = derived_run_id(record.config, fingerprint,
                             record.environment.get("components"))
    if derived is not None and derived != record.run_id:
        raise RunRecordError(f"run record {path} was edited since it was written: its config, "
                             f"data and code give run id {derived}, not {record.run_id}; "
                             "train it again with --force")


__all__ = ["check_not_edited", "named_by_user"]
