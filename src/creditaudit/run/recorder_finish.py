"""The end of a run trained in a user's own loop, as :meth:`Recorder.finish
<creditaudit.run.recorder.Recorder.finish>` closes its record: the status (``completed``,
``diverged``, or stopped early before the ``optim.epochs`` its config gives), the final
results and, unless ``diagnostics.end_of_run`` is off, the end-of-run block, measured with
the training loop's own functions (:mod:`creditaudit.run.results`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from torch import Tensor

from creditaudit.config import RunConfig
from creditaudit.formatting import duration
from creditaudit.methods import CreditRule
from creditaudit.records import RunRecord
from creditaudit.run.results import (
    end_of_run_metrics,
    final_results,
    finite_entry,
    note_end_of_run_credits,
)


def finish_record(record: RunRecord, rule: CreditRule, eval_x: Tensor, eval_y: Tensor, *,
                  config: RunConfig, initial: dict[str, Tensor], say: Callable[[str], None],
                  started: float) -> None:
    """Close ``record`` (at least one epoch logged) in place: its status — ``completed``, or
    ``diverged`` when the last epoch's numbers or state norms are NaN/Inf; a completed run
    whose last epoch is before ``config.optim.epochs`` is recorded as stopped early there —
    its final results, and, unless ``config.diagnostics.end_of_run`` is off, the end-of-run
    block on the evaluation set ``eval_x`` ``(N, …)``, ``eval_y`` ``(N,)``, with drift from
    the ``initial`` parameters. ``say``: a progress line per stage; ``started``: the
    ``time.perf_counter()`` the finish began at, for the block's closing line. The status
    and results are set once the block is measured: a block that raises (out of memory,
    Ctrl-C) leaves the record as it was."""
    if config.diagnostics.end_of_run:
        say(f"end of run: credit-quality block on {len(eval_y)} samples (cosines "
            "and Γ, then ρ, nudging, the fresh-feedback null; diagnostics.end_of_run="
            "False skips it) …")
        record.diagnostics.update(end_of_run_metrics(
            rule, eval_x, eval_y, initial=initial, settings=config.diagnostics,
            seed=config.run.seed, progress=lambda text: say(f"end of run: {text}")))
        note_end_of_run_credits(record, rule)
        say(f"end of run: done in {duration(time.perf_counter() - started)}")
    last = record.log[-1]
    record.status = "completed" if finite_entry(last) else "diverged"
    if record.status == "diverged":
        record.divergence = {"epoch": last.epoch, "reason": "non-finite loss or state norms"}
    epochs = config.optim.epochs
    if record.status == "completed" and last.epoch < epochs:  # its loop stopped
        record.stopped_early = {
            "epoch": last.epoch,
            "reason": f"finish() after epoch {last.epoch} of optim.epochs={epochs}"}
    record.final = final_results(record.log)
