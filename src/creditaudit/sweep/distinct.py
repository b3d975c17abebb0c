"""Which distinct runs a sweep grid gives: the runs counted before anything is expanded
(and capped), one run per run key, and the grid axes whose values give fewer runs than
they list (:class:`AxisCollapse`, with the reason a message states)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from creditaudit.config import RunConfig, apply_where_read, config_value, semantic_dict
from creditaudit.config.keys import data_path_options, signless_zeros
from creditaudit.errors import ConfigError
from creditaudit.formatting import counted


def count_runs(grid: dict[str, list[Any]], include: Sequence[Any] = ()) -> int:
    """The runs a grid expands to before duplicates are dropped: the product of the axis
    lengths plus the ``include`` runs. Counted, never expanded."""
    return math.prod(len(values) for values in grid.values()) + len(include)


def check_run_count(grid: dict[str, list[Any]], include: Sequence[Any],
                    max_runs: int | None) -> None:
    """Raise ConfigError when the grid has more than ``max_runs`` runs (None: no cap)."""
    if max_runs is None:
        return
    n_runs = count_runs(grid, include)
    if n_runs > max_runs:
        sizes = " × ".join(str(len(values)) for values in grid.values()) or "1"
        raise ConfigError(f"the sweep has {n_runs:,} runs ({sizes} grid combinations + "
                          f"{len(include)} [[include]] runs), more than --max-runs "
                          f"{max_runs:,}: split the grid into several sweep files, or raise "
                          "--max-runs")


def combination_at(grid: dict[str, list[Any]], index: int) -> dict[str, Any]:
    """The ``index``-th combination of ``grid`` in product order (last key fastest)."""
    combo = {}
    for key, values in reversed(grid.items()):
        index, position = divmod(index, len(values))
        combo[key] = values[position]
    return dict(reversed(combo.items()))


def left_out_keys(dropped: list[str], overrides: dict[str, Any]) -> list[str]:
    """The keys of ``overrides`` a run leaves out: each key in ``dropped`` (the options of a
    component the run does not select) or an entry of a table in it (``model.args.d`` where
    ``model.args`` is not read)."""
    return [key for key in overrides
            if key in dropped or key.rpartition(".")[0] in dropped]


@dataclass(frozen=True)
class AxisCollapse:
    """A grid axis whose ``n_values`` values give only ``n_runs`` different runs.

    ``reason``: ``"not in run id"`` (the key does not change what a run computes, e.g.
    ``run.out_dir``), ``"same value"`` (two values are one value once validated, e.g. 0 and
    0.0), ``"overridden"`` (the command line sets the key for every run) or
    ``"overrides"`` (it sets other keys that make the axis's values one run, e.g.
    ``method.name=bp`` under a feedback-seed axis).
    """

    key: str
    n_values: int
    n_runs: int
    reason: str
    detail: str  # the repeated values, or the overriding value(s)
    n_repeated: int = 2  # how many of the values are the repeated one ("same value")

    @property
    def message(self) -> str:
        gives = f"its {self.n_values} values give {counted(self.n_runs, 'run')}"
        if self.reason == "overridden":
            return (f"grid axis {self.key} is set for every run by the command line "
                    f"({self.key}={self.detail}): {gives}")
        if self.reason == "overrides":
            return (f"grid axis {self.key} gives fewer runs under the command line's "
                    f"{self.detail}: {gives}")
        if self.reason == "same value":
            times = "twice" if self.n_repeated == 2 else f"{self.n_repeated} times"
            return (f"grid axis {self.key} lists one value {times} ({self.detail}): {gives}; "
                    "list each value once")
        return (f"grid axis {self.key} does not change what a run computes (it is not part "
                f"of the run id): {gives}; give it one value in [base]")


def collapsed_axes(grid: dict[str, list[Any]], configs: Sequence[RunConfig],
                   overrides: dict[str, Any] | None = None) -> list[AxisCollapse]:
    """The axes of a (flat) ``grid`` whose values give fewer runs than they list.

    ``configs`` holds the grid's combinations in product order (as ``grid._every_run`` builds
    them, before ``overrides``). Each axis is varied with the other axes at their first
    values: a key that is not part of the run id, a repeated value or an override makes
    an axis collapse in every combination alike, so one line of the grid shows it.
    """
    lengths = [len(values) for values in grid.values()]
    out = []
    for axis, (key, values) in enumerate(grid.items()):
        if len(values) < 2:
            continue
        stride = math.prod(lengths[axis + 1:])
        given = line = [configs[index * stride] for index in range(len(values))]
        if overrides:
            line = [apply_where_read(config, overrides) for config in line]
        groups: dict[str, list[tuple[Any, RunConfig]]] = {}
        for value, config in zip(values, line):
            groups.setdefault(run_key(config), []).append((value, config))
        if len(groups) == len(values):
            continue
        repeated = next(group for group in groups.values() if len(group) > 1)
        if overrides and key in overrides:
            reason, detail = "overridden", repr(overrides[key])
        elif overrides and len({run_key(config) for config in given}) == len(values):
            # another key the command line sets collapses it (method.name=bp: no feedback seed)
            near = {k: v for k, v in overrides.items() if k.partition(".")[0]
                    == key.partition(".")[0]} or overrides
            reason, detail = "overrides", ", ".join(f"{k}={v!r}" for k, v in near.items())
        elif len({repr(signless_zeros(config_value(config, key)))  # 0.0 is -0.0
                  for _, config in repeated}) == 1 or _one_folder(key, repeated):
            reason, detail = "same value", " and ".join(repr(value) for value, _ in repeated)
        else:
            reason, detail = "not in run id", ""
        out.append(AxisCollapse(key, len(values), len(groups), reason, detail, len(repeated)))
    return out


def _one_folder(key: str, repeated: list[tuple[Any, RunConfig]]) -> bool:
    """Whether ``key`` is a data path option whose ``repeated`` values name one folder."""
    section, _, name = key.partition(".")
    folders = {data_folders(config).get(name) for _, config in repeated}
    return section == "data" and len(folders) == 1 and None not in folders


def run_key(config: RunConfig) -> str:
    """Equal for configs that compute the same thing on the same data folder (the run id
    without the data fingerprint, which would need the data read). A folder is compared by
    its absolute, normalised path: ``x``, ``./x/`` and ``/cwd/x`` are one folder."""
    return json.dumps([semantic_dict(config), data_folders(config)], sort_keys=True)


def data_folders(config: RunConfig) -> dict[str, str]:
    """Each path option of ``config``'s data (``data_dir``, a plugin dataset's own) that is
    set, as an absolute, normalised path (against the current folder, ``~`` expanded)."""
    return {name: os.path.normpath(os.path.abspath(os.path.expanduser(value)))
            for name, value in data_path_options(config).items()}


def dedupe(configs: Iterable[RunConfig]) -> list[RunConfig]:
    """The first of each set of configs that compute the same thing on the same data folder,
    in order. (Without reading the data: the same data in two folders is deduplicated later,
    when both resolve to one run id and the second finds the first's run.)"""
    seen: set[str] = set()
    out = []
    for config in configs:
        key = run_key(config)
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out
