"""The shipped experiments, one module each, and how to run them.

::

    from creditaudit.study.experiments import run_experiment, experiment_names
    summary = run_experiment("audit_table", scale="smoke", out_dir="results")

Every experiment builds its runs from :func:`scales.base_config` (so equal settings give
equal run ids, shared between experiments and sweeps), trains what is missing through
:func:`creditaudit.sweep.run_sweep`, and writes ``OUT/experiments/NAME.SCALE.DATASET.json``
and ``.md``.
"""

from __future__ import annotations

from creditaudit.study.experiments import (  # noqa: F401  (importing registers each experiment)
    audit_table,
    capacity_cost,
    decision_utility,
    depth_ladder,
    fresh_null,
    literature,
    penalty_sweep,
    random_init,
    rule_zoo,
    temporal,
    threshold_sensitivity,
)
from creditaudit.study.experiments.aggregate import aggregate
from creditaudit.study.experiments.groups import group_records
from creditaudit.study.experiments.registry import (
    Choices,
    Experiment,
    all_names,
    experiment_names,
    get_experiment,
    register,
)
from creditaudit.study.experiments.runner import run_experiment, run_experiments
from creditaudit.study.experiments.scales import SCALES, base_config

__all__ = [
    "Choices", "Experiment", "all_names", "experiment_names", "get_experiment", "register",
    "run_experiment",
    "run_experiments", "aggregate", "group_records", "SCALES", "base_config",
]
