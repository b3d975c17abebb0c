"""What ``creditaudit sweep`` prints: its progress line and its tables.

:class:`SweepProgress` is the one status line while runs train (``creditaudit experiment``
draws it too); :func:`format_sweep_table` the summary of the runs' records led by their grid
values; :func:`describe_plan` and :func:`describe_stacks` what a sweep file expands to and
how ``--stack`` groups its runs — only those still to train (:func:`plans_to_train`,
:func:`task_sizes`), as the sweep does — before anything runs. Every table reads the runs'
plans (:func:`creditaudit.sweep.plan_runs`): nothing here plans a run again.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from creditaudit.errors import CreditAuditError
from creditaudit.formatting import counted, duration, plain_line


# --- progress ------------------------------------------------------------------------------
class SweepProgress:
    """One status line: a tqdm line on a terminal, plain lines otherwise, nothing when
    ``quiet``."""

    def __init__(self, total: int, stream: TextIO | None = None, *, quiet: bool = False
                 ) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.bar = None
        if not quiet and self.stream.isatty():
            from creditaudit.loggers.console import terminal_bar

            self.bar = terminal_bar(total, self.stream, desc="sweep",
                                    bar_format="{desc} {bar:20} {n_fmt}/{total_fmt}{postfix}")

    @staticmethod
    def status(state: Any) -> str:
        return (f"done {state.done}, running {state.running}, failed {state.failed}, "
                + (f"interrupted {state.interrupted}, " if state.interrupted else "")
                + (f"newer {state.newer}, " if state.newer else "")
                + (f"refused {state.refused}, " if state.refused else "")
                + f"left {state.left}" + (f" (busy elsewhere {state.busy})" if state.busy else "")
                + f", ETA {duration(state.eta_seconds)}")

    def __call__(self, state: Any, outcome: dict[str, Any] | None) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.n = state.ended
            self.bar.set_postfix_str(self.status(state), refresh=True)
            if outcome is not None and outcome["status"] != "busy" and (
                    outcome["status"] != "completed" or outcome.get("error")):
                self.bar.write(self.describe(outcome), file=self.stream)
            return
        line = f"sweep: {state.ended}/{state.total} | {self.status(state)}"
        if outcome is not None:
            line += f" | {self.describe(outcome)}"
        print(line, file=self.stream, flush=True)

    @staticmethod
    def describe(outcome: dict[str, Any]) -> str:
        text = f"{outcome['run_id']} {outcome['status']} ({outcome['action']}"
        if outcome.get("seconds"):
            text += f", {outcome['seconds']:.1f} s"
        text += ")"
        if outcome.get("error"):  # a guest's message may hold line breaks, escape sequences
            text += f": {plain_line(outcome['error'])}"
        return text

    def say(self, line: str) -> None:
        """A line between the progress updates (a RunWatch line): above the bar on a
        terminal, on its own otherwise; nothing when quiet."""
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- tables ------------------------------------------------------------------------------
def format_sweep_table(plans: list[Any], grid_keys: list[str],
                       statuses: Mapping[str, str] | None = None) -> str:
    """format_run_summary of the runs (their plans) that have a record of their own, each row
    led by its grid values (which name it in the lines under the table too); a folder
    holding another run's record has no row (the sweep lists it as refused). ``statuses``: run id →
    the status the sweep reports (sweep_summary.json's): shown for a record left
    ``running`` by a run that ended (:func:`as_reported`)."""
    from creditaudit.records import RECORD_FILE, load_record
    from creditaudit.report import format_run_summary
    from creditaudit.run.resume import other_runs_record
    from creditaudit.sweep import run_labels

    records, labels = [], []
    for plan, label in zip(plans, run_labels(plans, grid_keys)):
        path = plan.run_dir / RECORD_FILE
        if path.exists():
            try:
                record = load_record(path)
            except CreditAuditError:  # an unreadable record is listed below, not fatal
                continue
            if other_runs_record(record, plan.run_id, path) is not None:
                continue  # another run's numbers, not this row's: listed below as refused
            records.append(as_reported(record, (statuses or {}).get(plan.run_id)))
            labels.append(plain_line(label))  # grid values: one table line, no escapes
    if not records:
        return "no run has a record yet"
    width = max(len("run"), *(len(label) for label in labels))
    lines = format_run_summary(records, names=labels).splitlines()
    out = [f"{'run':<{width}}  {lines[0]}", "-" * (width + 2 + len(lines[1]))]
    out += [f"{label:<{width}}  {line}" for label, line in zip(labels, lines[2:])]
    out += lines[2 + len(labels):]  # footnotes
    return "\n".join(out)


def as_reported(record: Any, reported: str | None) -> Any:
    """``record`` (a RunRecord) as a sweep's table shows it: with the status the sweep
    reports (``reported``, sweep_summary.json's;
    :func:`creditaudit.sweep.summary_file.reported_status`) where its record was left
    ``running`` by a run that ended, or where the sweep refused the run its record
    describes (an interrupted run whose checkpoint is gone: why is said below the table);
    the file is not changed."""
    import dataclasses

    from creditaudit.sweep.outcome import FOREIGN

    if reported == FOREIGN and record.status != FOREIGN:
        return dataclasses.replace(record, status=reported)
    if record.status != "running" or reported in (None, "running", "busy"):
        return record
    return dataclasses.replace(record, status=reported)


def describe_plan(sweep: Any, expansion: Any, out_dir: Path, n_runs: int | None = None
                  ) -> str:
    """``sweep s.toml: 2 × 3 grid combinations (method.name × run.seed) + 1 [[include]] run
    → 7 runs in OUT``: what the sweep file expands to, before anything runs. ``n_runs``: the
    distinct run ids of its plans, when known; fewer than its configs (the same data in two
    folders is one run) is said as ``→ 7 configs, 6 runs in OUT``."""
    from creditaudit.sweep import flatten_keys

    grid = flatten_keys(sweep.grid)
    text = f"sweep {sweep.source}: "
    if grid:
        text += (" × ".join(str(len(values)) for values in grid.values())
                 + f" grid combination{'s' if expansion.n_combinations != 1 else ''} ("
                 + " × ".join(grid) + ")")
    else:
        text += "the [base] run"
    if expansion.n_include:
        text += f" + {counted(expansion.n_include, '[[include]] run')}"
    n_configs = len(expansion.configs)
    n_runs = n_configs if n_runs is None else n_runs
    configs = f"{counted(n_configs, 'config')}, " if n_runs < n_configs else ""
    return text + f" → {configs}{counted(n_runs, 'run')} in {out_dir}"


def describe_stacks(plans: list[Any], size: int) -> str:
    """``6 runs in 2 stacks of up to 4, 1 run alone``: how --stack groups the runs (their
    plans, one per run id: those to train, as the sweep groups only those);
    ``nothing to stack: 1 run alone`` where no two runs stack."""
    from creditaudit.run.stacked import stack_groups

    if not plans:
        return "no run to train"
    groups = stack_groups(plans, size)
    stacks = [g for g in groups if len(g) > 1]
    alone = len(groups) - len(stacks)
    if not stacks:  # not "0 runs in 0 stacks of up to K"
        return f"nothing to stack: {counted(alone, 'run')} alone"
    text = f"{sum(map(len, stacks))} runs in {counted(len(stacks), 'stack')} of up to {size}"
    return text + (f", {counted(alone, 'run')} alone" if alone else "")


def at_once(tasks: list[int], slots: int) -> str:
    """``' (8 runs at once)'`` where the first ``slots`` tasks hold more runs than one
    each (--stack groups), else ``''``."""
    runs = sum(tasks[:slots])
    return f" ({runs} runs at once)" if runs > min(slots, len(tasks)) else ""


def task_sizes(plans: list[Any], stack: int) -> list[int]:
    """How many runs each task of ``plans`` (those to train, one per run id) trains at once,
    in the order the sweep hands them out: 1 each, or the --stack groups' sizes."""
    from creditaudit.run.stacked import stack_groups

    return [len(group) for group in stack_groups(plans, stack)]


def plans_to_train(plans: list[Any], rows: list[dict[str, Any]]) -> list[Any]:
    """The plans of ``rows`` (:func:`~creditaudit.sweep.run_states` of ``plans``) still to
    train, one per run id: what the sweep hands to its workers."""
    from creditaudit.sweep import unique_plans

    return unique_plans([plan for plan, row in zip(plans, rows, strict=True) if row["todo"]])
