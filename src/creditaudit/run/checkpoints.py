"""A run's checkpoint: the live training state written after every epoch and read back to
resume.

``checkpoint.pt`` holds the model, the credit rule's own state, the optimiser, the schedule,
both RNG streams (torch's global one and the data order's), the record as of its epoch and
the digest of the run's ``init.pt``.
:func:`restore` checks a checkpoint against the run being rebuilt
(:mod:`creditaudit.run.resume`) before anything of it is loaded, so a foreign or damaged file
ends in one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from creditaudit.caller import FORCE
from creditaudit.descriptions import DataIdentity
from creditaudit.errors import RunRecordError
from creditaudit.methods import CreditRule
from creditaudit.models import ResidualNet
from creditaudit.records import (
    CHECKPOINT_FORMAT,
    RunRecord,
    atomic_torch_save,
    load_checkpoint,
)
from creditaudit.run.init_file import INIT_DIGEST, check_initial
from creditaudit.run.plan import RunPlan
from creditaudit.run.resume import (
    check_checkpoint_fits,
    check_same_data,
    check_same_question,
    check_same_run,
    load_into,
    other_runs_record,
    resume_threads,
    saved_record,
)
from creditaudit.run.rng import rng_states


@dataclass
class TrainingState:
    """The live objects of a run that a checkpoint saves and a resume loads back into."""

    model: ResidualNet
    rule: CreditRule
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler (its state_dict and load_state_dict)
    generator: torch.Generator  # the data order's RNG
    init_digest: str | None = None  # init.pt's (run.init_file), which ties it to the run

    def save(self, path: Path, *, method: str, epoch: int, record: RunRecord) -> None:
        """Write the state after ``epoch`` (0: before training) with ``record`` as of then,
        atomically (a kill mid-write leaves the previous checkpoint)."""
        tie = {INIT_DIGEST: self.init_digest} if self.init_digest is not None else {}
        atomic_torch_save(path, {
            **tie,
            "format": CHECKPOINT_FORMAT,
            "method": method,
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rule": self.rule.state_dict(),
            "rng": rng_states(self.model, self.generator),
            "record": record.to_dict(),
        })


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` read besides the state it loaded."""

    record: RunRecord  # the record as of the checkpoint's epoch
    epoch: int  # the last trained epoch the checkpoint holds
    threads: int | None  # the torch thread count to go on with (None: as configured)
    init_digest: str | None  # init.pt's digest (None: a checkpoint from before digests)


def restore(path: Path, state: TrainingState, plan: RunPlan, *, identity: DataIdentity,
            device: torch.device) -> Restored:
    """Check the checkpoint at ``path`` against ``plan`` (same data ``identity``, same
    question, same run, a thread count it can go on with), then load it into ``state``,
    and check the run's init.pt against the model and the digest the checkpoint keeps.
    One-line RunRecordError naming the file when any check fails."""
    if not path.exists():
        raise RunRecordError(f"cannot resume: no checkpoint at {path}; start the run "
                             f"over with {FORCE}")
    saved = load_checkpoint(path, map_location=device)
    record = saved_record(saved, path)
    if other_runs_record(record, plan.run_id, path) is not None:
        # said as another run's (after the method and shape checks, which say more), not as
        # its data, options or thread count differing from this run's
        check_checkpoint_fits(saved, state.model, state.rule, plan.config, path)
        check_same_run(record, plan.run_id, path)
    check_same_data(record, identity, path)
    check_same_question(record.config, plan.config, path)
    threads = resume_threads(record, plan.config, path)
    load_into(saved, path, plan.config, saved=record, run_id=plan.run_id, model=state.model,
              rule=state.rule, optimizer=state.optimizer, scheduler=state.scheduler,
              generator=state.generator)
    digest = saved.get(INIT_DIGEST)
    if digest is not None and not isinstance(digest, str):
        raise RunRecordError(f"checkpoint {path} is not a creditaudit checkpoint: its "
                             f"{INIT_DIGEST!r} entry is malformed")
    check_initial(path.parent, state.model, digest,
                  needed=plan.config.diagnostics.end_of_run)
    state.rule.to(device)
    return Restored(record=record, epoch=saved["epoch"], threads=threads, init_digest=digest)
