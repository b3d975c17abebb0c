"""TensorBoard: every epoch's scalars (epoch 0 included), the protocol, the end-of-run
metrics and the config as hparams, in ``DIR/RUN_ID/``.

Tags are grouped (``train/``, ``norms/``, ``credit/``, ``protocol/``;
:mod:`creditaudit.loggers.scalars`); the step is the epoch. Text: ``run/config`` (the
config as TOML), ``protocol/verdict`` at every evaluated epoch, ``run/status`` at the end.
The config is also written as hparams (flat ``section.key``) with the headline metrics, so
TensorBoard's HPARAMS tab compares runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from creditaudit.config import config_to_toml
from creditaudit.errors import ConfigError, OutputError
from creditaudit.loggers.base import RunLogger, RunStart
from creditaudit.loggers.scalars import (
    end_of_run_scalars,
    epoch_scalars,
    hparams,
    verdict_text,
)
from creditaudit.records import EpochEntry, RunRecord
from creditaudit.safe_files import ensure_folder

# The metrics the HPARAMS tab shows beside the config: scalars every epoch logs.
HPARAM_METRICS = ("train/test_acc", "train/test_loss", "norms/h_L", "norms/g_L",
                  "credit/deep_cos", "protocol/walk_back")


class TensorBoardLogger(RunLogger):
    """Writes ``folder/run_id/events.out.tfevents.*``."""

    def __init__(self, folder: str | Path, run_id: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("--tensorboard needs the tensorboard package: pip install "
                              "'creditaudit[tensorboard]'") from None
        self.log_dir = Path(folder) / run_id
        try:  # an unusable folder is one line before the run starts
            ensure_folder(self.log_dir)
        except OutputError as err:
            raise OutputError(f"TensorBoard folder (--tensorboard, run.tensorboard): {err}"
                              ) from None
        self.writer: Any = SummaryWriter(str(self.log_dir))
        self.step = 0

    def start(self, run: RunStart) -> None:
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        config = run.config
        experiment, session_start, _ = hparams_summaries(
            hparams(config.to_dict(), run.run_id), dict.fromkeys(HPARAM_METRICS, 0.0))
        self.writer.file_writer.add_summary(experiment)
        self.writer.file_writer.add_summary(session_start)
        self.writer.add_text("run/config", "```toml\n" + config_to_toml(config) + "```",
                             run.first_epoch - 1)

    def log_epoch(self, entry: EpochEntry) -> None:
        self.step = entry.epoch
        for tag, value in epoch_scalars(entry).items():
            self.writer.add_scalar(tag, value, entry.epoch)
        verdict = verdict_text(entry)
        if verdict is not None:
            self.writer.add_text("protocol/verdict", verdict, entry.epoch)
        self.writer.flush()

    def finish(self, record: RunRecord) -> None:
        step = record.log[-1].epoch if record.log else self.step
        for tag, value in end_of_run_scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        status = record.status + (f": {record.error}" if record.error else "")
        self.writer.add_text("run/status", status, step)
        self.writer.file_writer.add_summary(_session_end(record.status), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _session_end(status: str) -> Any:
    """The hparams plugin's end-of-session summary: success for completed runs, aborted for
    interrupted ones, failure for diverged and failed ones."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import (
        PLUGIN_DATA_VERSION,
        PLUGIN_NAME,
        SESSION_END_INFO_TAG,
    )
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    code = {"completed": "STATUS_SUCCESS", "interrupted": "STATUS_ABORTED"}.get(
        status, "STATUS_FAILURE")
    data = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(code)),
                             version=PLUGIN_DATA_VERSION)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=meta)])
