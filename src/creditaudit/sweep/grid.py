"""The sweep file: a base run config, a grid of dotted keys and extra runs, expanded into
validated run configs (see :mod:`creditaudit.sweep` for the file format)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config import (
    SECTION_TYPES,
    SELECTORS,
    RunConfig,
    apply_overrides,
    config_from_dict,
    merge_overrides,
    semantic_dict,
)
from creditaudit.errors import ConfigError
from creditaudit.registry import DIAGNOSTICS

log = logging.getLogger(__name__)

SWEEP_TABLES = ("base", "grid", "include")

Outcome = dict[str, Any]


# --- the sweep file ---------------------------------------------------------------------
def flatten_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"method": {"name": "fa"}, "run.seed": 1}`` → ``{"method.name": "fa", "run.seed": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def known_keys() -> dict[str, list[str]]:
    """Every key a sweep may set, per section: the section's common keys, every installed
    component's own options, and each diagnostic's options (``a.growth``)."""
    known = {name: [f.name for f in dataclasses.fields(cls)]
             for name, cls in SECTION_TYPES.items()}
    for section, (_, registry) in SELECTORS.items():
        for component in registry.classes():
            known[section] += [k for k in component.option_names() if k not in known[section]]
    for diagnostic in DIAGNOSTICS.classes():
        known["diagnostics"] += [f"{diagnostic.name}.{k}" for k in diagnostic.option_names()]
    return known


def _with_overrides(raw: dict[str, Any], overrides: dict[str, Any],
                    dropped: list[str]) -> RunConfig:
    """A validated config from nested ``raw`` sections plus dotted ``overrides``; the
    options of another component than the one a run selects go into ``dropped``."""
    return config_from_dict(merge_overrides(raw, overrides, dropped), dropped=dropped)


def expand_grid(base: RunConfig | dict[str, Any], grid: dict[str, list[Any]],
                include: Iterable[dict[str, Any]] = ()) -> list[RunConfig]:
    """Every combination of ``grid`` applied to ``base``, then the ``include`` runs.

    ``base`` is a RunConfig or the nested sections of one (a ``[base]`` table may be
    incomplete on its own, e.g. ``data.name = "mnist"`` with the grid giving
    ``data.data_dir``). ``grid`` maps dotted keys (``"method.penalty"``) to non-empty
    lists; the product runs in key order, the last key fastest. Runs with an equal run id
    keep their first place. Raises ConfigError naming the key or the combination that is not
    a valid config.
    """
    raw = base.to_dict() if isinstance(base, RunConfig) else base
    grid = flatten_keys(grid)
    include = [flatten_keys(extra) for extra in include]
    fields = known_keys()
    for key in [*grid, *(k for extra in include for k in extra)]:
        section, _, name = key.partition(".")
        if section not in fields or name not in fields[section]:
            allowed = (", ".join(f"{section}.{f}" for f in fields[section])
                       if section in fields else ", ".join(f"{s}.…" for s in fields))
            raise ConfigError(f"sweep key {key!r} is not a config field; allowed: {allowed}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid key {key!r} must map to a non-empty list of values, got "
                              f"{values!r}; e.g. \"{key}\" = [{values!r}]")
    try:
        config_from_dict(raw)
        base_error = None
    except ConfigError as err:
        base_error = str(err)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    n_grid = len(combos)
    combos += include
    configs: list[RunConfig] = []
    not_read: dict[str, set[str]] = {}
    for index, overrides in enumerate(combos):
        dropped: list[str] = []
        try:
            config = _with_overrides(raw, overrides, dropped)
        except ConfigError as err:
            if str(err) == base_error:  # the grid did not cause it
                raise ConfigError(f"[base]: {err}") from None
            where = "grid combination" if index < n_grid else "[[include]] run"
            raise ConfigError(f"{where} {{{_describe(overrides)}}} is not a valid run: "
                              f"{err}") from None
        configs.append(config)
        for key in dropped:
            section = key.partition(".")[0]
            selector = SELECTORS[section][0]
            not_read.setdefault(key, set()).add(getattr(getattr(config, section), selector))
    for key, names in sorted(not_read.items()):
        log.warning("warning: %s is not read by %s: left out of those runs (and of their run "
                    "ids)", key, ", ".join(sorted(names)))
    return dedupe(configs)


@dataclass
class Sweep:
    """A parsed sweep file: the base config, the grid and the extra runs."""

    base: dict[str, Any] = field(default_factory=dict)  # nested sections of a run config
    grid: dict[str, list[Any]] = field(default_factory=dict)
    include: list[dict[str, Any]] = field(default_factory=list)
    source: str | None = None

    def configs(self, overrides: dict[str, Any] | None = None) -> list[RunConfig]:
        """The runs, with ``overrides`` (e.g. from the command line) applied to each."""
        configs = expand_grid(self.base, self.grid, self.include)
        if overrides:
            configs = dedupe([apply_overrides(c, overrides) for c in configs])
        return configs

    @property
    def grid_keys(self) -> list[str]:
        keys = list(self.grid)
        for extra in self.include:
            keys += [k for k in extra if k not in keys]
        return keys


def dedupe(configs: Iterable[RunConfig]) -> list[RunConfig]:
    """The first of each set of configs that compute the same thing on the same data folder,
    in order. (Without reading the data: the same data in two folders is deduplicated later,
    when both resolve to one run id and the second finds the first's run.)"""
    seen: set[str] = set()
    out = []
    for config in configs:
        key = json.dumps([semantic_dict(config), config.to_dict()["data"].get("data_dir")],
                         sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


def sweep_from_dict(raw: dict[str, Any], source: str | None = None) -> Sweep:
    """Validate the tables of a sweep file (see the module docstring)."""
    where = f"sweep file {source}" if source else "sweep"
    unknown = set(raw) - set(SWEEP_TABLES)
    if unknown:
        raise ConfigError(f"{where}: unknown table {sorted(unknown)[0]!r}; a sweep file holds "
                          "[base] (a run config), [grid] (dotted key = list of values) and "
                          "optional [[include]] tables")
    base = raw.get("base", {})
    if not isinstance(base, dict) or not all(isinstance(v, dict) for v in base.values()):
        raise ConfigError(f"{where}: [base] must hold run-config sections such as "
                          "[base.method] and [base.optim]")
    grid = raw.get("grid", {})
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: [grid] must be a table of dotted key = list of values")
    include = raw.get("include", [])
    if not isinstance(include, list) or not all(isinstance(t, dict) for t in include):
        raise ConfigError(f"{where}: include must be [[include]] tables of dotted overrides")
    return Sweep(base=base, grid=flatten_keys(grid),
                 include=[flatten_keys(t) for t in include], source=source)


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep TOML file."""
    from creditaudit.config import tomllib
    from creditaudit.safe_files import read_text

    path = Path(path)
    try:
        raw = tomllib.loads(read_text(path, "sweep file", ConfigError))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep file {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"sweep file {path} nests arrays or tables too deeply to be a "
                          "sweep file") from None
    sweep = sweep_from_dict(raw, source=str(path))
    try:
        sweep.configs()  # validate every combination now, before anything runs
    except ConfigError as err:
        raise ConfigError(f"sweep file {path}: {err}") from None
    return sweep


def config_value(config: RunConfig | dict[str, Any], key: str) -> Any:
    """The value of a dotted key in a config (or its dict)."""
    raw = config.to_dict() if isinstance(config, RunConfig) else config
    section, _, name = key.partition(".")
    return raw.get(section, {}).get(name)


