"""Taking one run of a sweep, before it trains: plan it, read what its folder holds
(:func:`disk_status`), skip it (finished, failed, refused) or claim it for training
(:class:`ClaimedRun`, trained by :mod:`creditaudit.sweep.worker`), each step a line in
OUT/sweep_log.jsonl (:func:`append_event`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from creditaudit.config import config_from_dict
from creditaudit.errors import (
    ConfigError,
    CreditAuditError,
    DataError,
    DiskFullError,
    NewerRecordError,
    OutputError,
    RunRecordError,
    error_line,
)
from creditaudit.files.safe_files import describe_os_error
from creditaudit.records import FINISHED
from creditaudit.records.claims import Claim, release_claim, try_claim
from creditaudit.run.plan import RunPlan, plan_run
from creditaudit.run.unresumable import checkpointed_epoch
from creditaudit.sweep.outcome import FOREIGN, NEWER, Outcome, left_alone, new_outcome

log = logging.getLogger(__name__)

SWEEP_LOG_FILE = "sweep_log.jsonl"


def append_event(out_dir: Path, event: str, run_id: str, **fields: Any) -> None:
    """One line in OUT/sweep_log.jsonl (O_APPEND: concurrent writers do not interleave)."""
    line = json.dumps({"event": event, "run_id": run_id, "pid": os.getpid(),
                       "host": socket.gethostname(), "time": time.time(), **fields},
                      default=str) + "\n"
    path = out_dir / SWEEP_LOG_FILE
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as err:
        raise OutputError(f"cannot write {describe_os_error(err, path)}") from None


def disk_status(run_dir: Path) -> tuple[str | None, str | None]:
    """(status, error) of the run record in ``run_dir``; (None, None) without one.

    An unreadable record reads as ("corrupt", reason); for a record changed after it was
    written, the reason without load_record's advice (restore it, or --force): a sweep
    starts such a run over itself. A record written by a newer creditaudit reads as
    ("newer", reason): a sweep leaves it alone (refused), for the newer version to read. A
    record of another run than the folder's (a folder copied or renamed by hand) reads as
    (:data:`FOREIGN`, reason): neither this run's result nor to be trained over (refused).
    So does an interrupted (or running) run whose record logs a trained epoch but whose
    checkpoint is gone (a folder copied without its ``.pt`` files): it can be neither
    resumed nor started over without losing the epochs its record holds.
    """
    from creditaudit.records import CHECKPOINT_FILE, RECORD_FILE, load_record
    from creditaudit.run.resume import other_runs_record

    path = run_dir / RECORD_FILE
    if not path.exists():
        return None, None
    try:
        record = load_record(path)
    except NewerRecordError as err:
        return NEWER, str(err)
    except RunRecordError as err:  # without load_record's advice: the sweep acts itself
        return "corrupt", err.fact
    foreign = other_runs_record(record, run_dir.name, path)
    if foreign is not None:
        return FOREIGN, f"{foreign}: move it away, then run again"
    trained = max((entry.epoch for entry in record.log), default=0)
    if record.status in ("running", "interrupted") and trained > 0 \
            and not (run_dir / CHECKPOINT_FILE).exists():
        return FOREIGN, (f"{run_dir / CHECKPOINT_FILE} is missing, but the run's record logs "
                         f"training up to epoch {trained}: restore the checkpoint to resume "
                         "the run, or move the folder away to train it again")
    return record.status, record.error



def on_threads(plan: RunPlan, threads: int | None, epoch: int | None) -> RunPlan:
    """``plan`` resumed from its checkpoint of ``epoch``, on the torch thread count a sweep
    gives it. The sweep's ``threads`` are for the runs it starts: a run resumed from a
    trained epoch goes on with the count its epochs ran on (``run.threads`` unset; another
    count would change the last bits of its numbers); one whose checkpoint holds only its
    initial weights (``epoch`` 0) starts over (``restartable``), on the sweep's count,
    which its record says as its uninterrupted twin's does."""
    kept = threads if epoch == 0 else None
    return dataclasses.replace(plan, config=plan.config.replace(**{"run.threads": kept}))


@dataclass
class ClaimedRun:
    """A run claimed for training: its plan, claim, the train() flags, its event log."""

    plan: RunPlan
    run_dir: Path
    claim: Claim
    kwargs: dict[str, bool]
    event: Callable[..., None]
    outcome: Outcome


def begin_run(config_dict: dict[str, Any], run_id: str | None, *, retry_failed: bool,
              stale_after: float, fingerprint: str | None = None
              ) -> tuple[Outcome, ClaimedRun | None]:
    """Plan (once, in this process), skip or claim one run: its outcome so far and, when it
    is to train, the claim (released by the caller). ``fingerprint``: of the data the sweep
    planned the run on, which names the data in the refusal when the data changed since."""
    from creditaudit.records import CHECKPOINT_FILE

    outcome = new_outcome(run_id)
    try:
        plan = plan_run(config_from_dict(config_dict))
        own_id = plan.run_id
        now = plan.identity.fingerprint
        if run_id is not None and own_id != run_id and fingerprint not in (None, now):
            raise DataError(f"the {plan.dataset.name} data changed since the sweep planned "
                            f"this run (fingerprint {str(fingerprint)[:12]}… then, {now[:12]}… "
                            f"now), so it is no longer the data of run {run_id}: run the sweep "
                            "again once the data stops changing")
        if run_id is not None and own_id != run_id:
            raise ConfigError(f"this worker computes run id {own_id} for the run the sweep "
                              f"calls {run_id}: the sweep and its workers run different "
                              "creditaudit versions or see different data")
    except CreditAuditError as err:
        if run_id is None:
            raise
        outcome.update(status="failed", action="refused", error=error_line(err))
        return outcome, None
    outcome["run_id"] = own_id
    out_dir = Path(plan.config.run.out_dir)
    run_dir = plan.run_dir

    def event(name: str, **fields: Any) -> None:
        append_event(out_dir, name, own_id, **fields)

    def skip_reason() -> bool:
        status, error = disk_status(run_dir)
        # a newer version's run, or another run's record, is never replaced (refused), a
        # finished one skipped
        if status in (NEWER, FOREIGN) or status in FINISHED or (
                status == "failed" and not retry_failed):
            outcome.update(status=status, error=error, action=left_alone(status))
            return True
        return False

    if skip_reason():
        return outcome, None
    try:
        claim, holder = try_claim(run_dir, stale_after=stale_after, events=event)
    except DiskFullError:
        raise  # no run can be written: the sweep stops, and the next one goes on from here
    except OutputError as err:  # this run's folder cannot be claimed; the others go on
        outcome.update(status="failed", action="refused", error=error_line(err))
        event("end", status="failed", error=outcome["error"])
        return outcome, None
    if claim is None:
        event("busy", holder=holder)
        outcome.update(status="busy", action="busy", holder=holder)
        return outcome, None
    try:
        if skip_reason():  # finished by another process between our check and our claim
            event("skip", status=outcome["status"])
            release_claim(claim)
            return outcome, None
        status, reason = disk_status(run_dir)
        has_checkpoint = (run_dir / CHECKPOINT_FILE).exists()
        epoch = checkpointed_epoch(run_dir) if has_checkpoint else None  # read once
        # No readable record.json (gone, cut short, edited) but a checkpoint of a trained
        # epoch, which holds the record as of it: resumed, never trained over
        trained = status in (None, "corrupt") and (epoch or 0) > 0
        if status is None and not trained:
            action, kwargs = "trained", {"force": has_checkpoint}
        elif trained or (status in ("running", "interrupted", "failed") and has_checkpoint):
            action, kwargs = "resumed", {"resume": True}
            plan = on_threads(plan, plan.config.run.threads, epoch)
        else:  # corrupt record and nothing trained kept, or died before its first
            # checkpoint: start over
            action, kwargs = "restarted", {"force": True}
            if status == "corrupt":
                log.warning("warning: starting %s over, replacing its record: %s", own_id,
                            reason)
        if status == "corrupt" and action == "resumed":
            log.warning("warning: resuming %s from its checkpoint of epoch %s, replacing its "
                        "record: %s", own_id, epoch, reason)
        outcome["action"] = action
        event("start", action=action)
    except BaseException:  # an interrupt (a broken pool's SIGTERM): the run is not held
        release_claim(claim)
        raise
    return outcome, ClaimedRun(plan, run_dir, claim, kwargs, event, outcome)
