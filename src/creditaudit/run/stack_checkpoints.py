"""The checkpoints of a stack's epoch as one commit: a kill between two runs' writes resumes
every run of the stack from the same epoch.

A stack writes its runs' checkpoints of an epoch one after the other. Before the first, each
run's checkpoint of the epoch before is kept as a second name of the same file
(:data:`PREVIOUS_FILE`, a hard link: no byte is copied); once every run has written, the
second names go. A run killed in between leaves some runs one epoch ahead of the others,
each ahead one with its previous checkpoint beside it: :func:`resume_together` puts those
back, so the stack resumes as one, bit for bit the stack left alone — resumed from
different epochs, the runs would train in stacks of their own, whose steps differ in the
last bits. Nothing is lost: after a kill (-9) the epoch put back is in no record yet
(records are written once every checkpoint is); after a Ctrl-C or a full disk between the
writes it is in the run's ``interrupted`` record, and the resume trains it again, to the
same numbers (its checkpoint of the epoch before holds its record as of then).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from creditaudit.errors import CreditAuditError
from creditaudit.records import CHECKPOINT_FILE
from creditaudit.records.checkpoint import load_checkpoint

log = logging.getLogger(__name__)
PREVIOUS_FILE = "checkpoint.previous.pt"


def keep_previous(run_dirs: Sequence[Path]) -> None:
    """Before a stack writes its checkpoints of an epoch: each run's current checkpoint
    under :data:`PREVIOUS_FILE` too (a hard link; on a file system without them the run
    keeps none, and a kill between the writes resumes it as before)."""
    for run_dir in run_dirs:
        previous = run_dir / PREVIOUS_FILE
        drop_previous([run_dir])
        with contextlib.suppress(OSError):  # no checkpoint yet, or no hard links here
            os.link(run_dir / CHECKPOINT_FILE, previous)


def drop_previous(run_dirs: Sequence[Path]) -> None:
    """Once every run of the stack has written its checkpoint (or a run starts): the
    previous checkpoints' second names go."""
    for run_dir in run_dirs:
        with contextlib.suppress(FileNotFoundError):
            (run_dir / PREVIOUS_FILE).unlink()


def resume_together(run_dirs: Sequence[Path]) -> dict[Path, int]:
    """Before the runs of ``run_dirs`` (a stack to resume) start: when a kill came between
    their checkpoint writes of an epoch (some runs hold a checkpoint of epoch e with their
    checkpoint of e − 1 kept beside it, the others still that of e − 1, kept too, not yet
    replaced), the runs ahead go back to e − 1, so every run resumes from the same epoch.
    Any other state is left as it is (the kept names go when each run starts). Returns the
    runs put back, each with the epoch it now resumes from (none when called again)."""
    ahead, behind = [], []
    for run_dir in run_dirs:
        checkpoint, previous = run_dir / CHECKPOINT_FILE, run_dir / PREVIOUS_FILE
        try:
            same = os.path.samefile(checkpoint, previous)
        except OSError:  # none kept: not a run of that stack's commit
            continue
        (behind if same else ahead).append(run_dir)
    if not ahead or not behind:
        return {}
    epochs = {_epoch(run_dir / CHECKPOINT_FILE) for run_dir in behind}
    if len(epochs) != 1 or None in epochs:
        return {}
    (epoch,) = epochs
    put_back = {}
    for run_dir in ahead:
        if _epoch(run_dir / PREVIOUS_FILE) == epoch:
            os.replace(run_dir / PREVIOUS_FILE, run_dir / CHECKPOINT_FILE)
            put_back[run_dir] = epoch
            log.info("run %s resumes from epoch %d with the rest of its stack (it was "
                     "stopped while the stack wrote its checkpoints)", run_dir.name, epoch)
    return put_back


def _epoch(path: Path) -> int | None:
    """The epoch the checkpoint at ``path`` holds; None when it cannot be read."""
    try:
        return int(load_checkpoint(path)["epoch"])
    except (CreditAuditError, OSError):  # a damaged file: its run's start says so
        return None


__all__ = ["PREVIOUS_FILE", "drop_previous", "keep_previous", "resume_together"]
