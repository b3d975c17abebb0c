"""TensorBoard: every epoch's scalars (epoch 0 included), the protocol, the end-of-run
metrics and the config as hparams, in ``DIR/RUN_ID/``.

Tags are grouped (``train/``, ``norms/``, ``credit/``, ``protocol/``;
:mod:`creditaudit.loggers.scalars`); the step is the epoch. Text: ``run/config`` (the
config as TOML), ``protocol/verdict`` at every evaluated epoch, ``run/status`` at the end.
The config is also written as hparams (flat ``section.key``) with the headline metrics, so
TensorBoard's HPARAMS tab compares runs.

A finished run replayed from its record is written only into a folder that does not hold
the whole run yet (its finished status): TensorBoard would show a second copy of every
point beside the first. A folder that holds only part of it (a part killed or interrupted
there, then resumed without ``--tensorboard``) gets the whole record, behind a restart mark
at epoch 0 that drops the partial points. A run
started over (``--force``, or a run killed before its first trained epoch) and a resumed
part write into the folder that holds the earlier part: each part's event file starts with
a restart mark at the first epoch it logs (``SummaryWriter``'s ``purge_step``), so
TensorBoard drops every earlier point from that epoch on — one point per tag and step. A
resumed part starts at the epoch it resumes after and logs it again: the part before saved
that epoch before logging it, and may have been killed in between. Into a folder that lacks
the record's earlier epochs (``--tensorboard`` first asked for on the resume) it logs them
too, its restart mark at epoch 0.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from creditaudit.config import config_to_toml
from creditaudit.errors import ConfigError, OutputError
from creditaudit.files.safe_files import check_output_folder, ensure_folder
from creditaudit.loggers.base import RunLogger, RunStart
from creditaudit.loggers.scalars import (
    end_of_run_scalars,
    epoch_scalars,
    hparams,
    status_text,
    verdict_text,
)
from creditaudit.records import FINISHED, EpochEntry, RunRecord

log = logging.getLogger(__name__)
# The metrics the HPARAMS tab shows beside the config: scalars every epoch logs.
HPARAM_METRICS = ("train/test_acc", "train/test_loss", "norms/h_L", "norms/g_L",
                  "credit/deep_cos", "protocol/walk_back")


class TensorBoardLogger(RunLogger):
    """Writes ``folder/run_id/events.out.tfevents.*``."""

    def __init__(self, folder: str | Path, run_id: str) -> None:
        try:
            import torch.utils.tensorboard  # noqa: F401 — here, so a missing package stops the run
        except ImportError:
            raise ConfigError("--tensorboard needs the tensorboard package: pip install "
                              "'creditaudit[tensorboard]'") from None
        self.log_dir = Path(folder) / run_id
        # An unusable folder is one line before the run starts; the folder itself is made by
        # start(), so a run refused before its loggers start leaves none behind.
        with _named_folder():
            check_output_folder(self.log_dir)
        self.writer: Any = None  # opened by start(), unless a replay would duplicate
        self.reference: dict[str, Any] | None = None
        self.first_step = 0

    def start(self, run: RunStart) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        with _named_folder():
            ensure_folder(self.log_dir)
        if run.replayed and _holds_finished_run(self.log_dir):
            log.info("TensorBoard folder %s already holds run %s: not replayed into it",
                     self.log_dir, run.run_id)
            return
        self.reference = run.reference
        # The first epoch this part logs: 0 for a new run (epoch 0 included); for a resumed
        # part the epoch it resumes after, logged again below (the part before saved it, but
        # may have been stopped before it logged it). An earlier part's points from there on
        # (a run started over, a part killed after it logged) are dropped by the restart mark.
        self.first_step = _first_step(run)
        earlier = [entry for entry in run.logged_before if entry.epoch < self.first_step]
        if earlier and not _holds_steps(self.log_dir, {entry.epoch for entry in earlier}):
            # Resumed with --tensorboard first asked for now (or a folder that lost them):
            # the record's earlier epochs go in too, behind a restart mark at their first.
            self.first_step = earlier[0].epoch
        else:
            earlier = []
        _wait_for_a_later_second(self.log_dir)
        self.writer = SummaryWriter(str(self.log_dir), purge_step=self.first_step)
        config = run.config
        experiment, session_start, _ = hparams_summaries(
            hparams(config.to_dict(), run.run_id), dict.fromkeys(HPARAM_METRICS, 0.0))
        self.writer.file_writer.add_summary(experiment, self.first_step)
        self.writer.file_writer.add_summary(session_start, self.first_step)
        self.writer.add_text("run/config", "```toml\n" + config_to_toml(config) + "```",
                             self.first_step)
        for entry in earlier:
            self.log_epoch(entry)
        if run.resumed_after is not None:
            self.log_epoch(run.resumed_after)

    def log_epoch(self, entry: EpochEntry) -> None:
        if self.writer is None:
            return
        for tag, value in epoch_scalars(entry).items():
            self.writer.add_scalar(tag, value, entry.epoch)
        verdict = verdict_text(entry, self.reference)
        if verdict is not None:
            self.writer.add_text("protocol/verdict", verdict, entry.epoch)
        self.writer.flush()

    def finish(self, record: RunRecord) -> None:
        if self.writer is None:
            return
        step = _status_step(record, self.first_step)
        for tag, value in end_of_run_scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.add_text("run/status", status_text(record), step)
        self.writer.file_writer.add_summary(_session_end(record.is_finished), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@contextlib.contextmanager
def _named_folder() -> Iterator[None]:
    """An OutputError in the block names the option that gave the folder."""
    try:
        yield
    except OutputError as err:
        raise OutputError(f"TensorBoard folder (--tensorboard, run.tensorboard): {err}"
                          ) from None


def _first_step(run: RunStart) -> int:
    """The step of a part's restart mark: 0 for a new run; for a resumed part the epoch
    it resumes after (its ``first_epoch`` when it is not told which: a logger started by
    hand)."""
    if run.resumed_after is not None:
        return run.resumed_after.epoch
    return run.first_epoch if run.resumed else 0


def _status_step(record: RunRecord, first_step: int) -> int:
    """The step of ``run/status``: a finished run's last epoch (beside its end-of-run
    metrics); for a run that stopped unfinished, the epoch it stopped in (after its last
    recorded one), which the part that resumes it drops with its restart mark — a run
    resumed twice from one epoch keeps one status there, not one per killed part."""
    last = record.log[-1].epoch if record.log else -1
    return max(last, 0) if record.is_finished else max(last + 1, first_step)


def _wait_for_a_later_second(log_dir: Path) -> None:
    """Sleep (under a second) until the clock's second is later than that of every event
    file in ``log_dir``. TensorBoard reads a folder's files in the order of their names,
    ``events.out.tfevents.SECOND.HOST.PID.N``: a part written in the same second by the same
    process as the part before it (a killed run resumed at once from Python) sorts by its
    ``N`` as text, so the 10th file would come before the 9th, and the earlier part's restart
    mark would drop the later part's points. (A file from a clock ahead costs 1 s at most.)"""
    seconds = [int(name.split(".")[3]) for name in
               (path.name for path in log_dir.glob("events.out.tfevents.*"))
               if len(name.split(".")) > 3 and name.split(".")[3].isdigit()]
    if seconds:
        time.sleep(min(1.0, max(0.0, max(seconds) + 1 - time.time())))


def _kept_points(log_dir: Path, tag: str) -> dict[int, Any]:
    """step → the last point of ``tag`` that the event files in ``log_dir`` keep, read as
    TensorBoard reads them (in order, a restart mark dropping the points from its step on);
    a damaged file adds none."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    points: dict[int, Any] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        try:
            for event in EventFileLoader(str(path)).Load():
                if (event.HasField("session_log")
                        and event.session_log.status == SessionLog.START):
                    points = {step: value for step, value in points.items()
                              if step < event.step}
                for value in event.summary.value:
                    if value.tag == tag:
                        points[event.step] = value
        except Exception:  # noqa: BLE001 — a damaged file holds no point we can trust
            log.debug("cannot read TensorBoard file %s", path, exc_info=True)
    return points


def _holds_finished_run(log_dir: Path) -> bool:
    """Whether the event files in ``log_dir`` keep a ``run/status`` of a finished run
    (completed or diverged): the run was logged there to its end."""
    statuses = [value.tensor.string_val[0].decode() for value in
                _kept_points(log_dir, "run/status/text_summary").values()
                if value.tensor.string_val]
    # status_text: the status first, then ", stopped early …" or ": ERROR"
    return any(text.split(":")[0].split(",")[0] in FINISHED for text in statuses)


def _holds_steps(log_dir: Path, steps: set[int]) -> bool:
    """Whether the event files in ``log_dir`` keep an epoch's point (``train/test_loss``,
    which every evaluated epoch logs) at each of ``steps``."""
    return steps <= set(_kept_points(log_dir, "train/test_loss"))


def _session_end(finished: bool) -> Any:
    """The hparams plugin's end-of-session summary: success for a finished run (completed or
    diverged: ``RunRecord.is_finished``, as the W&B run's exit code 0 says), failure for a
    failed or interrupted one."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.metadata import (
        PLUGIN_DATA_VERSION,
        PLUGIN_NAME,
        SESSION_END_INFO_TAG,
    )
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    code = Status.STATUS_SUCCESS if finished else Status.STATUS_FAILURE
    data = HParamsPluginData(session_end_info=SessionEndInfo(status=code),
                             version=PLUGIN_DATA_VERSION)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=meta)])
