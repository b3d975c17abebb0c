"""Weights & Biases: one W&B run per training run (or resumed part of one), named by the
run id, with the config, every epoch's scalars (step = epoch, the grouped tags of
:mod:`creditaudit.loggers.scalars`), the end-of-run metrics and the status in its summary.

A resumed part's W&B run starts at the first epoch it trains: W&B cannot drop a point, so
the epoch it resumes after (``RunStart.resumed_after``, logged by the part before unless
that part was killed outright between saving and logging it) is not logged twice.

W&B's own settings apply: ``WANDB_MODE=offline`` writes the run to disk for a later
``wandb sync`` (no account needed), ``WANDB_DIR`` says where (default: ``./wandb``),
``WANDB_ENTITY`` the team. W&B's console capture is off so the epoch lines stay plain.
"""

from __future__ import annotations

from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.formatting import error_text
from creditaudit.loggers.base import RunLogger, RunStart
from creditaudit.loggers.scalars import (
    end_of_run_scalars,
    epoch_scalars,
    final_scalars,
    verdict_text,
)
from creditaudit.records import EpochEntry, RunRecord
from creditaudit.report.runs import stopped_early_text


class WandbLogger(RunLogger):
    """Logs to W&B project ``project``."""

    def __init__(self, project: str) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("run.wandb_project needs the wandb package: pip install "
                              "'creditaudit[wandb]'") from None
        try:  # W&B's own rules for a project name, asked before any run starts
            wandb.Settings(project=project)
        except Exception as err:  # noqa: BLE001 — only the project is set: it is the name
            reason = error_text(err)
            raise ConfigError(f"run.wandb_project={project!r} is not a project name Weights & "
                              f"Biases accepts ({reason}); choose another name (--wandb NAME)"
                              ) from None
        self.wandb = wandb
        self.project = project
        self.run: Any = None
        self.reference: dict[str, Any] | None = None
        self.step = 0

    def start(self, run: RunStart) -> None:
        wandb = self.wandb
        self.reference = run.reference
        config = {**run.config.to_dict(), "run_id": run.run_id,
                  "first_epoch": run.first_epoch}
        try:
            self.run = wandb.init(project=self.project, name=run.run_id, config=config,
                                  job_type="train", reinit="create_new",
                                  settings=wandb.Settings(console="off"))
        except Exception as err:  # noqa: BLE001 — W&B raises many kinds; all mean "cannot log"
            reason = error_text(err)
            raise ConfigError(f"Weights & Biases could not start a run in project "
                              f"{self.project!r} ({reason}): log in with `wandb login`, or "
                              "set WANDB_MODE=offline to write the run to disk") from None

    def log_epoch(self, entry: EpochEntry) -> None:
        if self.run is None:
            return
        self.step = entry.epoch
        values: dict[str, Any] = dict(epoch_scalars(entry))
        verdict = verdict_text(entry, self.reference)
        if verdict is not None:
            values["protocol/verdict"] = verdict
        self.run.log(values, step=entry.epoch)

    def finish(self, record: RunRecord) -> None:
        if self.run is None:
            return
        step = record.log[-1].epoch if record.log else self.step
        end = end_of_run_scalars(record)
        if end:
            self.run.log(end, step=step)
        self.run.summary.update({**final_scalars(record), **end, "status": record.status,
                                 "verdict": record.protocol.verdict or "not evaluated",
                                 "reference": record.reference.how,
                                 "error": record.error or "",
                                 "stopped_early": stopped_early_text(record) or ""})
        self.run.finish(exit_code=0 if record.is_finished else 1)
        self.run = None

    def close(self) -> None:
        if self.run is not None:  # an error before finish(): end the W&B run as failed
            self.run.finish(exit_code=1)
            self.run = None
