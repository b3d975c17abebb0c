"""What one ``creditaudit experiment`` invocation did with an experiment's runs, counted
apart: trained now (and completed), diverged, failed, interrupted, busy (another process
holds it), skipped (finished before, or failed before without ``--retry-failed``) and
refused (a newer version's record, or another run's record in its folder)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from creditaudit.sweep.outcome import TAKEN_OVER

# What a sweep did to a run it trained (from its start, on from a checkpoint, over again).
TRAINING_ACTIONS = ("trained", "resumed", "restarted")
# The counts of a summary's ``meta.execution``, in the order the closing line names them.
COUNTS = ("trained", "diverged", "failed", "interrupted", "busy", "skipped", "refused")
# The end status of a run this invocation trained → its count (any other: failed).
_TRAINED_TO = {"completed": "trained", "diverged": "diverged", "interrupted": "interrupted",
               "busy": "busy"}


def count_of(outcome: Mapping[str, Any]) -> str | None:
    """The count (one of :data:`COUNTS`) a run's sweep ``outcome`` falls in; None for a run
    this invocation did not reach (``not started``)."""
    action, status = outcome.get("action"), outcome.get("status")
    if action in TRAINING_ACTIONS:
        return _TRAINED_TO.get(status, "failed")
    if action == TAKEN_OVER:  # trained here until another process took it over
        return "busy"
    return action if action in COUNTS else None


def execution_counts(outcomes: Mapping[str, Mapping[str, Any]], run_ids: Sequence[str]
                     ) -> dict[str, Any]:
    """``{count: runs}`` for every count of :data:`COUNTS` (0 where none) of the runs
    ``run_ids`` (one experiment's) in ``outcomes`` (this invocation's sweep, by run id),
    and ``actions``: ``{action: runs}`` as the sweep reported them."""
    counts = dict.fromkeys(COUNTS, 0)
    actions: dict[str, int] = {}
    for run_id in dict.fromkeys(run_ids):
        outcome = outcomes.get(run_id)
        if outcome is None:
            continue
        action = outcome.get("action") or "not started"
        actions[action] = actions.get(action, 0) + 1
        count = count_of(outcome)
        if count is not None:
            counts[count] += 1
    return {**counts, "actions": actions}


def execution_text(execution: Mapping[str, Any]) -> str:
    """``"3 trained now, 1 failed, 4 skipped"``: the counts of a summary's
    ``meta.execution`` (older summaries: ``trained`` only), those at 0 left out but the
    first."""
    parts = [f"{execution.get('trained', 0)} trained now"]
    parts += [f"{execution[key]} {key}" for key in COUNTS[1:] if execution.get(key)]
    return ", ".join(parts)


__all__ = ["COUNTS", "TRAINING_ACTIONS", "count_of", "execution_counts", "execution_text"]
