"""What a sweep worker reports for one run: :class:`Outcome`, defined once.

An outcome crosses process boundaries (multiprocessing and Ray pickle it) and is what the
sweep's progress line, summary and log read, so it stays a plain ``dict`` on the wire; the
:class:`~typing.TypedDict` gives every reader and writer the same keys and types.
"""

import os
import socket
from typing import NotRequired, TypedDict


class Outcome(TypedDict):
    """One run's outcome in a sweep.

    ``status`` is the run's status afterwards (completed, diverged, failed, interrupted,
    busy, newer — its record was written by a newer creditaudit: :data:`NEWER`; refused —
    its folder holds another run's record: :data:`FOREIGN`; None before the worker knows
    it); ``action`` what the call did (trained, resumed, restarted, skipped, refused — a
    newer version's run, or another run's record, is always refused: :func:`left_alone` —,
    busy, interrupted, :data:`TAKEN_OVER`); ``seconds`` the wall time of the call;
    ``pid`` and ``host`` the worker process that made it (None when the worker died);
    ``holder`` (busy runs only) the claim of the process that holds the run.
    """

    run_id: str | None
    status: str | None
    action: str
    error: str | None
    seconds: float
    pid: int | None
    host: str | None
    holder: NotRequired[str | None]


# The status of a run whose record a newer creditaudit wrote: never replaced, never read.
NEWER = "newer"
# The status of a run whose folder holds the record of another run (a folder copied or
# renamed by hand): its numbers are not this run's, and the record is another run's work —
# neither counted as this run nor trained over. So is an interrupted run whose record logs
# trained epochs but whose checkpoint is gone: starting it over would lose them.
FOREIGN = "refused"


# The action of a call that trained a run until another process broke its claim (this one
# was stopped past that one's --stale-after) and took the run over: the run is the other
# process's since, which writes its summary entry (summary_file.merged_summary).
TAKEN_OVER = "taken over"


def left_alone(status: str | None) -> str:
    """The action of a sweep that does not train a run whose record says ``status``:
    ``refused`` for a newer version's run (the sweep cannot read it and must not replace
    it) and for a folder holding another run's record (:data:`FOREIGN`), ``skipped`` for a
    run that is done (or failed, without --retry-failed)."""
    return "refused" if status in (NEWER, FOREIGN) else "skipped"


def new_outcome(run_id: str | None, *, status: str | None = None,
                action: str = "skipped") -> Outcome:
    """An outcome of this process for ``run_id``, no time spent and no error yet."""
    return {"run_id": run_id, "status": status, "action": action, "error": None,
            "seconds": 0.0, "pid": os.getpid(), "host": socket.gethostname()}


__all__ = ["FOREIGN", "NEWER", "TAKEN_OVER", "Outcome", "left_alone", "new_outcome"]
