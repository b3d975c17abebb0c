"""Sweeps: expand a grid of run configs and train them on a process pool or a Ray cluster.

The sweep file (TOML)
---------------------
::

    # [base]: a normal run config, same sections and keys as a config file (creditaudit.config).
    [base.data]
    n_train = 10000
    [base.optim]
    epochs = 20
    [base.run]
    out_dir = "runs/penalty_grid"

    # [grid]: dotted config keys → lists of values; the sweep is their cartesian product
    # (in file order). Quote the keys: "method.name" is one key, method.name a nested table
    # (both are accepted).
    [grid]
    "method.name" = ["bp", "fa", "dfa"]
    "method.penalty" = [0.0, 1e-3, 1e-2]
    "run.seed" = [42, 123, 456]

    # [[include]]: optional extra single runs, dotted overrides of [base].
    [[include]]
    "method.name" = "frozen"
    "run.seed" = 42

Every combination is validated with :func:`~creditaudit.config.apply_overrides`; a bad key
or value raises :class:`~creditaudit.errors.ConfigError` naming the combination. Runs with
the same run id (same semantic config) appear once; a grid axis that cannot add runs (a key
outside the run id such as ``run.out_dir``, a value listed twice), one key spelled twice
(``"method.name"`` beside a ``[grid.method]`` table) and a grid of more than ``max_runs``
runs (counted, not expanded) are errors.

Planning
--------
Before any run starts, every run is planned (:func:`plan_runs`: components, the options each
reads, the rule bound to the model, data identity, run id); a run that cannot train stops
the sweep in one line naming it, and a ``[base]`` value a run's component does not read is
refused while the grid is expanded. The dry run, the summary and the table read those plans,
one per run.

Running
-------
Every run goes through :func:`run_one`, whichever executor calls it
(:class:`LocalExecutor`: spawned worker processes; :class:`RayExecutor`: one Ray task per run;
:class:`InlineExecutor`: this process). Before training, the worker *claims* the run by
creating ``OUT/RUN_ID/claim.json`` with ``O_CREAT | O_EXCL`` (pid, host, time, token), so two
sweeps — or two processes of one — never train the same run. The claim is refreshed (its
mtime) while the run trains and removed at the end. A claim whose process is gone (same host,
pid not alive) or whose mtime is older than ``stale_after`` seconds is broken and retaken.

A completed or diverged run is never rerun; an interrupted run (killed sweep) resumes from
its checkpoint; a failed run is skipped unless ``retry_failed``. A run that raises is
recorded as failed (record status ``failed`` plus ``error``) and the sweep goes on; so
does it when a worker process dies (:mod:`creditaudit.sweep.deaths`).
``OUT/sweep_log.jsonl`` is an append-only log of what each process did (start, end, skip,
busy, break_claim, worker_died), one JSON object per line.
"""


from __future__ import annotations

from creditaudit.config import config_value
from creditaudit.records.claims import (
    CLAIM_FILE,
    DEFAULT_STALE_AFTER,
    Claim,
    claim_is_stale,
    release_claim,
    try_claim,
)
from creditaudit.sweep.distinct import count_runs, dedupe
from creditaudit.sweep.executors import Executor, InlineExecutor, LocalExecutor, RayExecutor
from creditaudit.sweep.grid import (
    DEFAULT_MAX_RUNS,
    Sweep,
    expand_grid,
    flatten_keys,
    load_sweep,
    sweep_from_dict,
)
from creditaudit.sweep.plans import plan_runs, run_labels, unique_plans
from creditaudit.sweep.preflight import (
    check_devices,
    check_loggers,
    prepare_configs,
    results_folder,
    sweep_threads,
)
from creditaudit.sweep.progress import SweepState
from creditaudit.sweep.runner import SweepResult, run_states, run_sweep
from creditaudit.sweep.summary_file import SUMMARY_FILE, sweep_summary
from creditaudit.sweep.worker import (
    AFTER_THE_RECORD,
    SWEEP_LOG_FILE,
    disk_status,
    run_one,
    run_task,
)

__all__ = [
    "Sweep", "load_sweep", "sweep_from_dict", "expand_grid", "flatten_keys", "config_value",
    "dedupe", "count_runs", "DEFAULT_MAX_RUNS", "plan_runs", "unique_plans", "run_labels",
    "run_one", "run_task", "run_sweep", "run_states", "check_devices", "check_loggers",
    "prepare_configs", "results_folder",
    "sweep_summary", "sweep_threads",
    "LocalExecutor", "RayExecutor", "InlineExecutor", "Executor", "try_claim",
    "release_claim", "claim_is_stale", "Claim", "SweepState", "SweepResult", "CLAIM_FILE",
    "SUMMARY_FILE", "SWEEP_LOG_FILE", "DEFAULT_STALE_AFTER", "disk_status", "AFTER_THE_RECORD",
]
