"""Where a run reports as it trains: the console, TensorBoard and Weights & Biases.

Every backend implements one small interface, :class:`RunLogger` (``start``,
``log_step``, ``log_epoch``, ``finish``, ``close``); :func:`build_loggers` opens the ones a
run's config asks for:

- ``run.progress`` (default on; ``-q`` turns it off): :class:`ConsoleLogger` — a run-level
  bar in a terminal, one line per epoch when stdout (or stderr) goes to a file;
- ``run.tensorboard = DIR``: :class:`TensorBoardLogger` (``pip install
  'creditaudit[tensorboard]'``);
- ``run.wandb_project = NAME``: :class:`WandbLogger` (``pip install 'creditaudit[wandb]'``).

Loggers only read what training computed: training with and without them gives
bit-identical weights. A run that had finished before is not trained again: asked for
loggers, it replays its record into them (:func:`replay`).
"""

from __future__ import annotations

from creditaudit.config import RunConfig
from creditaudit.loggers.base import LoggerGroup, RunLogger, RunStart, current_run_id, replay
from creditaudit.loggers.console import ConsoleLogger
from creditaudit.loggers.scalars import end_of_run_scalars, epoch_scalars


def build_loggers(config: RunConfig, run_id: str, *, console: bool = True,
                  stacked: bool = False) -> LoggerGroup:
    """The loggers ``config`` asks for (the console only with ``console``: a replayed run
    has no progress to show; ``stacked``: one of several runs trained at once, whose console
    lines interleave and so are led by its run id, not its method name). Raises ConfigError
    (before anything is written) when a backend's package is missing or its folder
    unusable."""
    from creditaudit.loggers.tensorboard import TensorBoardLogger
    from creditaudit.loggers.wandb_logger import WandbLogger

    group = LoggerGroup([])
    try:
        if console and config.run.progress:
            group.loggers.append(ConsoleLogger(label=run_id if stacked else None))
        if config.run.tensorboard is not None:
            group.loggers.append(TensorBoardLogger(config.run.tensorboard, run_id))
        if config.run.wandb_project is not None:
            group.loggers.append(WandbLogger(config.run.wandb_project))
    except BaseException:
        group.close()  # the ones already open
        raise
    return group


__all__ = ["RunLogger", "RunStart", "LoggerGroup", "ConsoleLogger", "build_loggers",
           "replay", "epoch_scalars", "end_of_run_scalars", "current_run_id"]
