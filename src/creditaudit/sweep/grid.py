"""The sweep file: a base run config, a grid of dotted keys and extra runs, expanded into
validated run configs (see :mod:`creditaudit.sweep` for the file format). How many distinct
runs a grid gives, and why fewer than it lists, is :mod:`creditaudit.sweep.distinct`."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config import (
    SELECTORS,
    RunConfig,
    apply_where_read,
    config_from_dict,
    merge_overrides,
    semantic_dict,
)
from creditaudit.errors import ConfigError
from creditaudit.formatting import counted
from creditaudit.guests.blame import blame
from creditaudit.methods import no_effect_options
from creditaudit.registry import RULES
from creditaudit.sweep.distinct import (
    check_run_count,
    collapsed_axes,
    combination_at,
    config_value,
    dedupe,
    left_out_keys,
    run_key,
)
from creditaudit.sweep.keys import flatten_keys, known_keys

log = logging.getLogger(__name__)

SWEEP_TABLES = ("base", "grid", "include")
# Runs a sweep may expand to unless told otherwise (--max-runs): the product of the axes is
# counted before anything is expanded, so a grid that would not fit in memory is one line.
DEFAULT_MAX_RUNS = 10_000



# --- the sweep file ---------------------------------------------------------------------
def _describe(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def _given_keys(base: RunConfig | dict[str, Any]) -> set[str]:
    """The dotted keys a sweep's ``[base]`` sets: every key of a table, or the fields of a
    RunConfig that differ from their defaults (the rest were never chosen)."""
    sections = semantic_dict(base) if isinstance(base, RunConfig) else base
    return {f"{section}.{key}" for section, values in sections.items() for key in values}


def _refuse_unread_base(raw: dict[str, Any], given: set[str], config: RunConfig,
                        overrides: dict[str, Any], unread: list[str], where: str) -> None:
    """ConfigError when a value ``[base]`` sets is not read by the component a run selects
    (``[base] model.d = 16`` beside ``model.arch = "plain-mlp"``): that run would train
    with the component's own default instead, without a word."""
    for key in unread:
        if key not in given:
            continue
        section, _, name = key.partition(".")
        if section not in SELECTORS:  # a diagnostic's table the run's protocol leaves out
            raise ConfigError(f"[base] {key}={raw[section][name]!r} holds the options of a "
                              f"diagnostic that the protocol of {where} does not list: set "
                              "it only for the runs that list it, or drop it from [base]")
        selector = SELECTORS[section][0]
        component = getattr(getattr(config, section), selector)
        registry = SELECTORS[section][1]
        owners = [cls.name for cls in registry.offered_classes() if name in cls.option_names()]
        chooser = where if f"{section}.{selector}" in overrides else "[base]"
        said = (f"[base] {key}={raw[section][name]!r} is not read by {component} "
                f"({section}.{selector}), which {chooser} selects")
        if not owners:  # an option of a component that builds nothing (own-loop)
            raise ConfigError(f"{said}, nor by any {registry.noun} a run can select: drop it "
                              "from [base]")
        raise ConfigError(f"{said} (it is an option of {', '.join(owners)}): set it only for "
                          "the runs that read it (a grid axis or [[include]] runs), or drop it "
                          "from [base]")


def _with_overrides(raw: dict[str, Any], overrides: dict[str, Any],
                    dropped: list[str]) -> RunConfig:
    """A validated config from nested ``raw`` sections plus dotted ``overrides``; the
    options of another component than the one a run selects go into ``dropped``."""
    return config_from_dict(merge_overrides(raw, overrides, dropped), dropped=dropped)


def expand_grid(base: RunConfig | dict[str, Any], grid: dict[str, list[Any]],
                include: Iterable[dict[str, Any]] = (), *,
                max_runs: int | None = DEFAULT_MAX_RUNS) -> list[RunConfig]:
    """Every combination of ``grid`` applied to ``base``, then the ``include`` runs.

    ``base`` is a RunConfig or the nested sections of one (a ``[base]`` table may be
    incomplete on its own, e.g. ``data.name = "mnist"`` with the grid giving
    ``data.data_dir``). ``grid`` maps dotted keys (``"method.penalty"``) to non-empty
    lists; the product runs in key order, the last key fastest. Runs with an equal run id
    keep their first place. Raises ConfigError naming the key or the combination that is not
    a valid config, an axis whose values give fewer runs than it lists (a key that is not
    part of the run id, such as ``run.out_dir``, or one value listed twice), or a grid of
    more than ``max_runs`` runs (counted before anything is expanded; None: no cap).
    """
    return dedupe(_every_run(base, grid, include, max_runs=max_runs))


def _without_no_effect(config: RunConfig, overrides: dict[str, Any]
                       ) -> tuple[RunConfig, dict[str, str]]:
    """``config`` with each ``method.*`` value its grid combination or ``[[include]]`` run
    sets (``overrides``) that changes nothing with its rule put back to its default (the
    penalty of the frozen baseline: it is then that baseline's run), and those keys with why
    (:func:`~creditaudit.methods.no_effect_options`). A value ``[base]`` sets is left for
    the run's plan to refuse: the file asks it of every run."""
    cls = RULES.get(config.method.name)
    defaults = {f.name: f.default for f in dataclasses.fields(type(config.method))}
    left_out: dict[str, str] = {}
    while True:  # putting one back may make another matter again (trainable_blocks=0)
        with blame(RULES.guest(cls.name)):
            found = no_effect_options(cls, config.method)
        key = next((k for k in found if f"method.{k}" in overrides
                    and f"method.{k}" not in left_out
                    and defaults.get(k, dataclasses.MISSING) is not dataclasses.MISSING), None)
        if key is None:
            return config, left_out
        left_out[f"method.{key}"] = found[key]
        config = dataclasses.replace(
            config, method=dataclasses.replace(config.method, **{key: defaults[key]}))


def _every_run(base: RunConfig | dict[str, Any], grid: dict[str, list[Any]],
               include: Iterable[dict[str, Any]], *, max_runs: int | None
               ) -> list[RunConfig]:
    """The configs of every grid combination (product order) then of every include, before
    duplicates are dropped (see :func:`expand_grid`)."""
    raw = base.to_dict() if isinstance(base, RunConfig) else base
    given = _given_keys(base)
    grid = flatten_keys(grid)
    include = [flatten_keys(extra) for extra in include]
    fields = known_keys()
    for key in [*grid, *(k for extra in include for k in extra)]:
        section, _, name = key.partition(".")
        # a key of a table field, as --set takes it: model.args.d, diagnostics.a.growth
        table = name.partition(".")[0]
        if section not in fields or (name not in fields[section] and table not in fields[section]):
            allowed = (", ".join(f"{section}.{f}" for f in fields[section])
                       if section in fields else ", ".join(f"{s}.…" for s in fields))
            raise ConfigError(f"sweep key {key!r} is not a config field; allowed: {allowed}")
    for key, values in grid.items():
        if values == []:
            raise ConfigError(f"grid key {key!r} lists no value: give it at least one, or "
                              "drop it to keep the value of [base]")
        if not isinstance(values, list):
            raise ConfigError(f"grid key {key!r} must map to a non-empty list of values, got "
                              f"{values!r}; e.g. \"{key}\" = [{values!r}]")
    check_run_count(grid, include, max_runs)
    try:
        config_from_dict(raw)
        base_error = None
    except ConfigError as err:
        base_error = str(err)
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    n_grid = len(combos)
    combos += include
    configs: list[RunConfig] = []
    not_read: dict[str, set[str]] = {}  # option → the components that do not read it
    no_effect: dict[str, list[str]] = {}  # option → why, per run it changes nothing in
    dropped_in: dict[str, int] = {}  # option → in how many runs it was left out
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
        config, left_out = _without_no_effect(config, overrides)
        for key, why in left_out.items():
            no_effect.setdefault(key, []).append(why)
            not_read.setdefault(key, set())
            if index < n_grid:
                dropped_in[key] = dropped_in.get(key, 0) + 1
        configs.append(config)
        where = "grid combination" if index < n_grid else "[[include]] run"
        _refuse_unread_base(raw, given, config, overrides,
                            [k for k in dropped if k not in overrides],
                            f"{where} {{{_describe(overrides)}}}")
        for key in left_out_keys(dropped, overrides):
            section = key.partition(".")[0]
            selected = getattr(getattr(config, section), SELECTORS[section][0])
            not_read.setdefault(key, set()).add(selected)
            if index < n_grid:
                dropped_in[key] = dropped_in.get(key, 0) + 1
    for key in grid:
        if dropped_in.get(key, 0) >= n_grid and len(grid[key]) > 1:
            raise ConfigError(f"grid axis {key} is not read by "
                              f"{', '.join(sorted(not_read[key]))}: its {len(grid[key])} "
                              "values give 1 run; drop the axis or select a component that "
                              "reads it")
    for key, whys in sorted(no_effect.items()):
        if len(grid.get(key, [])) > 1 and len({repr(config_value(c, key))
                                               for c in configs[:n_grid]}) == 1:
            raise ConfigError(f"grid axis {key} changes nothing in any run ({whys[0]}): its "
                              f"{len(grid[key])} values give 1 run; drop the axis")
        more = f" (and {counted(len(whys) - 1, 'more run')})" if len(whys) > 1 else ""
        log.warning("warning: %s changes nothing in some runs: left out of those runs (and "
                    "of their run ids): %s%s", key, whys[0], more)
    for key, names in sorted(not_read.items()):
        if not names:  # only where it changes nothing (said above)
            continue
        log.warning("warning: %s is not read by %s: left out of those runs (and of their run "
                    "ids)", key, ", ".join(sorted(names)))
    # An axis that cannot add runs is a mistake in the file: its later values would be
    # dropped without a word (see collapsed_axes). An option some runs' components do not
    # read collapses there by design (the warning above names it).
    collapsed = [c for c in collapsed_axes(grid, configs) if c.key not in not_read]
    if collapsed:
        raise ConfigError(collapsed[0].message)
    return configs


@dataclass
class Expansion:
    """What a sweep expands to: its runs, and why they are fewer than the grid combinations
    plus the ``[[include]]`` runs (``warnings``: axes the command line overrides; ``notes``:
    runs that repeat an earlier one)."""

    configs: list[RunConfig]
    n_combinations: int
    n_include: int
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Sweep:
    """A parsed sweep file: the base config, the grid and the extra runs."""

    base: dict[str, Any] = field(default_factory=dict)  # nested sections of a run config
    grid: dict[str, list[Any]] = field(default_factory=dict)
    include: list[dict[str, Any]] = field(default_factory=list)
    source: str | None = None

    def configs(self, overrides: dict[str, Any] | None = None, *,
                max_runs: int | None = DEFAULT_MAX_RUNS) -> list[RunConfig]:
        """The runs, with ``overrides`` (e.g. from the command line) applied to each."""
        return self.expand(overrides, max_runs=max_runs).configs

    def expand(self, overrides: dict[str, Any] | None = None, *,
               max_runs: int | None = DEFAULT_MAX_RUNS) -> Expansion:
        """The runs (as :meth:`configs`) and why some combinations give no run of their own."""
        grid = flatten_keys(self.grid)
        include = [flatten_keys(extra) for extra in self.include]
        try:
            every = _every_run(self.base, grid, include, max_runs=max_runs)
        except ConfigError as err:
            if self.source is None:
                raise
            raise ConfigError(f"sweep file {self.source}: {err}") from None
        n_grid = len(every) - len(include)
        # Command-line and CREDITAUDIT_SET overrides apply where a run's components read
        # them (data.n_train shrinks generated data and leaves a file dataset alone).
        runs = [apply_where_read(c, overrides) for c in every] if overrides else every
        # Only what the overrides collapse: an axis that collapses without them is one that
        # some runs do not read (_every_run refuses any other), named in a warning there.
        by_file = ({axis.key for axis in collapsed_axes(grid, every[:n_grid])} - set(overrides)
                   if overrides else set())
        warnings = [axis.message for axis in collapsed_axes(grid, every[:n_grid], overrides)
                    if axis.key not in by_file] if overrides else []
        notes = []
        first: dict[str, int] = {}  # run key → the index of its first config
        kept: list[RunConfig] = []  # as dedupe(runs), each key computed once (the slow part)
        repeats = 0
        for index, config in enumerate(runs):
            key = run_key(config)
            if key not in first:
                first[key] = index
                kept.append(config)
            elif index >= n_grid:
                earlier = first[key]
                same = (f"the run of [[include]] run {earlier - n_grid + 1}"
                        if earlier >= n_grid else "the [base] run" if not grid else
                        f"the run of grid combination "
                        f"{{{_describe(combination_at(grid, earlier))}}}")
                notes.append(f"[[include]] run {index - n_grid + 1} "
                             f"{{{_describe(include[index - n_grid])}}} is {same}: "
                             "it runs once")
            else:
                repeats += 1
        if repeats and not warnings:
            notes.append(f"{repeats} grid combination{'s give' if repeats != 1 else ' gives'}"
                         " the run of an earlier combination: each run runs once")
        return Expansion(kept, n_grid, len(include), warnings, notes)

    @property
    def grid_keys(self) -> list[str]:
        keys = list(self.grid)
        for extra in self.include:
            keys += [k for k in extra if k not in keys]
        return keys



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
    tables = [("[grid]", grid)] + [(f"[[include]] {n}", t) for n, t in enumerate(include, 1)]
    flat = []
    for name, table in tables:
        try:
            flat.append(flatten_keys(table))
        except ConfigError as err:
            raise ConfigError(f"{where}: {name}: {err}") from None
    return Sweep(base=base, grid=flat[0], include=flat[1:], source=source)


def load_sweep(path: str | Path, *, max_runs: int | None = DEFAULT_MAX_RUNS,
               validate: bool = True) -> Sweep:
    """Read and validate a sweep TOML file: its tables, and with ``validate`` every run (if
    it has at most ``max_runs``). ``validate=False`` suits a caller that expands the sweep
    next (:meth:`Sweep.expand` validates the same, and its warnings are then said once)."""
    from creditaudit.caller import on_command_line
    from creditaudit.config import sets_nothing, tomllib
    from creditaudit.files.safe_files import read_text

    path = Path(path)
    try:
        raw = tomllib.loads(read_text(path, "sweep file", ConfigError))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep file {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"sweep file {path} nests arrays or tables too deeply to be a "
                          "sweep file") from None
    # An empty file, or the wrong one, is no request for the defaults; an unknown table
    # ([grids] left empty) is said as such by sweep_from_dict.
    if sets_nothing(raw) and set(raw) <= set(SWEEP_TABLES):
        train = "creditaudit train" if on_command_line() else "creditaudit.train(RunConfig())"
        raise ConfigError(f"sweep file {path} sets nothing (it is empty, or holds only "
                          "comments or empty tables): give its [base] and [grid], or train "
                          f"the defaults' one run with {train}")
    sweep = sweep_from_dict(raw, source=str(path))
    if validate:  # every combination, before anything runs
        sweep.configs(max_runs=max_runs)
    return sweep
