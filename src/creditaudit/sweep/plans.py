"""A sweep's runs planned before any of them trains: one :class:`~creditaudit.run.plan.RunPlan`
per run, each refusal naming the run.

:func:`plan_runs` resolves every config of a sweep (its components and the options each
reads, the rule bound to the model built on the meta device, the data identity, the run
id) before the first run starts, so a run that cannot train stops the sweep — and its dry
run — in one line, not after the other runs trained. The summary, the dry run, the table
and the workers' tasks read these plans; nothing plans a run twice in the sweep's process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from creditaudit.config import RunConfig, config_value
from creditaudit.errors import CreditAuditError
from creditaudit.formatting import plain_line
from creditaudit.run.defaults import why_default
from creditaudit.run.plan import RunPlan, plan_run


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Dotted keys → last segment where unambiguous (``method.penalty`` → ``penalty``)."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (short if last.count(short) == 1 else key) for key, short in zip(keys, last)}


def value_labels(configs: Sequence[RunConfig | dict[str, Any]], keys: Sequence[str]
                 ) -> list[str]:
    """Each config's (or config dict's) values of the ``keys`` that vary between the configs
    (``name=bp seed=42``); empty where none varies."""
    varying = [key for key in keys
               if len({repr(config_value(config, key)) for config in configs}) > 1]
    short = _short_keys(varying)
    return [" ".join(f"{short[key]}={config_value(config, key)}" for key in varying)
            for config in configs]


def run_labels(plans: Sequence[RunPlan], keys: Sequence[str]) -> list[str]:
    """Each run's values of the sweep keys that vary between runs, as the user gave them
    (``trainable_blocks=2`` of 2 blocks, though its plan holds the default;
    :meth:`RunPlan.as_given`) on one line without control characters (a folder's name may
    hold any), or its run id."""
    labels = value_labels([plan.as_given() for plan in plans], keys)
    return [plain_line(label) or plan.run_id for label, plan in zip(labels, plans)]


def same_run_reasons(plan: RunPlan, first: RunPlan) -> list[str]:
    """Why ``plan`` is the run of the earlier ``first`` (one run id, two configs as given):
    an explicit value of either that is its default's run (``trainable_blocks=2 trains every
    block: the default run``), and data in another folder that is the same data."""
    reasons = [why_default(key, value)
               for key, value in {**first.explicit_defaults, **plan.explicit_defaults}.items()
               if config_value(first.as_given(), key) != config_value(plan.as_given(), key)]
    if config_value(plan.config, "data.data_dir") != config_value(first.config,
                                                                   "data.data_dir"):
        reasons.append("the same data in another folder")
    return reasons or ["the same run"]


def plan_runs(configs: Sequence[RunConfig | RunPlan], keys: Sequence[str] = ()
              ) -> list[RunPlan]:
    """One plan per config, in order (a plan given is kept as it is).

    ``keys``: the sweep's grid keys, whose values name a run that cannot be planned. The
    error is the plan's own (ConfigError, DataError, …), on one line, led by
    ``run name=fa arch=module:`` (or ``run 3:`` when no key varies).
    """
    given = [run.config if isinstance(run, RunPlan) else run for run in configs]
    labels = value_labels(given, keys)
    plans = []
    for index, (run, label) in enumerate(zip(configs, labels)):
        if isinstance(run, RunPlan):
            plans.append(run)
            continue
        try:
            plans.append(plan_run(run))
        except CreditAuditError as err:
            raise type(err)(f"run {label or index + 1}: {err}") from None
    return plans


def unique_plans(plans: Sequence[RunPlan]) -> list[RunPlan]:
    """The first plan of each run id, in order: two data folders holding the same data
    give one run (the grid's dedupe compares folders, not data, as it reads no files)."""
    out: dict[str, RunPlan] = {}
    for plan in plans:
        out.setdefault(plan.run_id, plan)
    return list(out.values())


__all__ = ["plan_runs", "unique_plans", "run_labels", "value_labels", "same_run_reasons"]
