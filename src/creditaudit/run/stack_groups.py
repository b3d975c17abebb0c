"""Which runs can train as one stack: :func:`stack_key` (what they must share),
:func:`check_stackable` and :func:`stack_groups` (``creditaudit sweep --stack K``). The
stack itself is trained by :func:`creditaudit.run.stacked.train_stacked`."""

from __future__ import annotations

import json
from collections.abc import Sequence

from creditaudit.config import RunConfig
from creditaudit.errors import ConfigError
from creditaudit.methods import CreditRule, rule_class
from creditaudit.methods.stacked import stacked_rule_names
from creditaudit.run.plan import RunPlan

# Config keys in which the runs of one stack may differ: each run keeps its own value.
VARYING = frozenset({("run", "seed"), ("optim", "lr"), ("optim", "weight_decay"),
                     ("method", "penalty"), ("method", "feedback_seed"),
                     ("method", "feedback_scale")})
# Sections whose every key may differ (each run measures and records on its own).
VARYING_SECTIONS = frozenset({"diagnostics"})


Run = RunConfig | RunPlan  # a run's config, or its plan (whose resolved rule is used)


def config_and_rule(run: Run) -> tuple[RunConfig, type[CreditRule]]:
    """The run's config and rule class (a plan's resolved rule)."""
    if isinstance(run, RunPlan):
        return run.config, run.rule
    return run, rule_class(run.method.name)


def stack_key(run: Run) -> str | None:
    """What runs must share to train in one stack (JSON text), or None when the run's rule
    never steps stacked. Keys that do not change a run's computation (folders, threads,
    progress, loggers) are left out, as are the :data:`VARYING` ones."""
    config, rule = config_and_rule(run)
    if rule.stacks_as() is None:
        return None
    raw = config.to_dict()
    shared = {section: {key: value for key, value in values.items()
                        if (section, key) not in VARYING}
              for section, values in raw.items() if section not in VARYING_SECTIONS}
    for key in ("out_dir", "threads", "progress", "tensorboard", "wandb_project"):
        shared["run"].pop(key, None)
    return json.dumps(shared, sort_keys=True, default=str)


def check_stackable(configs: Sequence[Run]) -> None:
    """ConfigError, naming the first key that differs, unless every run (config or plan)
    can train in one stack with the first."""
    if not configs:
        raise ConfigError("train_stacked needs at least one run config")
    names = ", ".join(stacked_rule_names())
    if stack_key(configs[0]) is None:
        first, _ = config_and_rule(configs[0])
        raise ConfigError(f"method.name={first.method.name!r} does not train stacked; "
                          "stacked runs use a rule that declares a stacked_step (built-in: "
                          f"{names})")
    first = json.loads(stack_key(configs[0]) or "{}")
    for index, config in enumerate(configs[1:], start=2):
        key = stack_key(config)
        if key is None or json.loads(key) != first:
            other = json.loads(key) if key is not None else {}
            differs = next((f"{section}.{name}" for section, values in first.items()
                            for name, value in values.items()
                            if other.get(section, {}).get(name) != value), "method.name")
            raise ConfigError(f"run {index} differs from run 1 in {differs}: stacked runs may "
                              "differ only in run.seed, optim.lr, optim.weight_decay, "
                              "method.penalty, method.feedback_seed, method.feedback_scale "
                              "and [diagnostics]")


def stack_groups(configs: Sequence[Run], size: int) -> list[list[int]]:
    """Indices of ``configs`` (configs or plans) in groups of at most ``size`` that can
    train stacked (same :func:`stack_key`), in order of first appearance; a config that
    cannot stack is a group of its own."""
    if size < 1:
        raise ConfigError(f"--stack must be >= 1, got {size}")
    groups: list[list[int]] = []
    open_groups: dict[str, list[int]] = {}
    for index, config in enumerate(configs):
        key = stack_key(config) if size > 1 else None
        group = open_groups.get(key) if key is not None else None
        if group is None or len(group) >= size:
            group = [index]
            groups.append(group)
            if key is not None:
                open_groups[key] = group
        else:
            group.append(index)
    return groups
