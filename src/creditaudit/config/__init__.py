"""Run configs: :class:`RunConfig`, built from nested dicts, TOML files and overrides.

A run is described by one :class:`RunConfig` with six sections (data, model, method, optim,
diagnostics, run), declared field by field in :mod:`creditaudit.config.sections`. The data,
model and method sections also hold the own options of the dataset, architecture and credit
rule they select (:mod:`creditaudit.config.composed`). Every field carries its help text,
allowed values, range and role in its metadata; :func:`config_from_dict` validates against
them (:mod:`creditaudit.config.validation`) and raises a one-line
:class:`~creditaudit.errors.ConfigError` naming the bad key, what was given and what is
allowed. Overrides are parsed and merged in :mod:`creditaudit.config.overrides`; the roles
and help rows of the keys are read in :mod:`creditaudit.config.keys`.
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.caller import on_command_line
from creditaudit.config.composed import (
    SELECTORS,
    bind,
    component_of,
    composed_class,
)
from creditaudit.config.keys import (
    component_help,
    config_help,
    keys_with_role,
    non_semantic,
    role,
    semantic_dict,
    with_absolute_data_paths,
)
from creditaudit.config.overrides import (
    device_overrides,
    merge_overrides,
    parse_override,
    parse_value,
    split_key,
    tomllib,  # the TOML reader of this Python (tomli before 3.11)
)
from creditaudit.config.sections import (
    COMPONENT_NAME,
    DEVICES,
    LEGACY_DEFAULTS,
    MAX_SEED,
    METHOD_NAME,
    PRECISIONS,
    SCHEDULES,
    SECTION_TYPES,
    DataConfig,
    DiagnosticsConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunSettings,
    opt,
)
from creditaudit.config.validation import (
    as_recorded,
    check_overrides_read,
    coerce,
    nested_values,
    section_from_dict,
)
from creditaudit.errors import ConfigError
from creditaudit.files.safe_files import read_text

log = logging.getLogger(__name__)


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    run: RunSettings = field(default_factory=RunSettings)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain dicts: each section's common keys and its component's options."""
        return dataclasses.asdict(self)

    def replace(self, **overrides: Any) -> RunConfig:
        """A copy with dotted-key overrides, e.g. ``replace(**{"method.name": "dfa"})``."""
        return apply_overrides(self, overrides)


SECTIONS = SECTION_TYPES


def config_from_dict(raw: dict[str, Any], *, strict: bool = True,
                     dropped: list[str] | None = None, checked: bool = True) -> RunConfig:
    """Build and validate a RunConfig from nested dicts (missing keys take defaults).

    ``strict`` (configs a user gives): every component must be installed and every key read
    by the component it is given to. ``strict=False`` (records): a section of a component
    not installed here keeps its keys as written, and keys the component does not read are
    dropped (records of earlier versions list every key of every component). ``dropped``
    (sweeps): a list that collects, instead of refusing them, the keys that are options of
    another component than the one selected; the sweep decides (a grid value that some
    runs' rule does not read is left out of those runs, a ``[base]`` value is refused).
    ``checked=False``: the rules between keys are left to :func:`apply_overrides`, which the
    caller applies next (a config file that ``--set`` amends: the amended config is checked).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a table of sections, got {type(raw).__name__}")
    unknown = set(raw) - set(SECTION_TYPES)
    if unknown:
        raise ConfigError(f"unknown config section {sorted(unknown)[0]!r}; allowed sections: "
                          f"{', '.join(SECTION_TYPES)}")
    with as_recorded() if not strict else nullcontext():  # a record: values as written
        sections = {name: section_from_dict(name, raw.get(name, {}), strict, dropped)
                    for name in SECTION_TYPES}
    config = RunConfig(**sections)
    if checked:
        _check_consistency(config, strict)
    return config


def _check_consistency(config: RunConfig, strict: bool = True) -> None:
    """Cross-field rules that single-field validation cannot see (a component's own rules
    are checked where the component is resolved: :func:`creditaudit.run.plan.plan_run`).
    ``strict`` (a config given now, not a record): also refuse a value the run would accept
    and never act on."""
    tb = config.method.trainable_blocks
    n_blocks = getattr(config.model, "n_blocks", None)
    if tb is not None and isinstance(n_blocks, int) and tb > n_blocks:
        raise ConfigError(f"method.trainable_blocks={tb} exceeds model.n_blocks={n_blocks}; "
                          f"use 0…{n_blocks}")
    diagnostics = config.diagnostics
    if strict and diagnostics.stop_on_walkback and diagnostics.protocol_every == 0:
        raise ConfigError("diagnostics.stop_on_walkback=true stops on the protocol's verdict, "
                          "but diagnostics.protocol_every=0 turns the protocol off, so the "
                          "run would never stop early: set diagnostics.protocol_every to 1 "
                          "or more, or drop stop_on_walkback")


def config_to_toml(config: RunConfig) -> str:
    """The config as a TOML file that :func:`load_config` reads back to an equal config.

    Fields set to None are left out (TOML has no null; every optional field defaults to
    None, so leaving it out restores it). A None inside a field's table or list (``--set
    model.args.w=none``) has no TOML spelling: a one-line ConfigError names it.
    """
    import tomli_w

    raw = {section: {k: v for k, v in values.items() if v is not None}
           for section, values in config.to_dict().items()}
    for section, values in raw.items():
        for name, value in values.items():
            _refuse_inner_none(f"{section}.{name}", value)
    return tomli_w.dumps(raw)


def _refuse_inner_none(key: str, value: Any) -> None:
    """ConfigError naming the first None inside ``value`` (a field's table or list)."""
    for where, item in nested_values(key, value):
        if item is None and where != key:
            raise ConfigError(f"{where} is None, which a TOML config cannot hold (TOML has "
                              "no null): leave it out, or for an argument of model.factory "
                              "list it in model.none_args")


def load_config(path: str | Path, *, checked: bool = True) -> RunConfig:
    """Read a TOML config file (sections [data], [model], [method], …; e.g. a run folder's
    ``config.toml``). A run's ``record.json`` is read by
    :func:`creditaudit.records.load_config_file`. ``checked``: as :func:`config_from_dict`'s."""
    path = Path(path)
    text = read_text(path, "config file", ConfigError)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to be a "
                          "config") from None
    if {"base", "grid"} & set(raw) and not set(raw) & set(SECTION_TYPES):
        run_it = (f"creditaudit sweep {path}" if on_command_line()
                  else f"creditaudit.sweep.load_sweep({str(path)!r})")
        raise ConfigError(f"config file {path} is a sweep file ([base], [grid]), not a run "
                          f"config: run it with {run_it}, or give a run config ([data], "
                          "[model], … sections; a run folder's config.toml)")
    if sets_nothing(raw):  # an empty file, or the wrong one: not a request for the defaults
        config_from_dict(raw)  # an unknown section ([methd]) is said as such first
        defaults = ("omit --config" if on_command_line()
                    else "use RunConfig() instead of load_config")
        raise ConfigError(f"config file {path} sets nothing (it is empty, or holds only "
                          f"comments or empty tables): to train the defaults {defaults}; "
                          "else give the config that sets the run's keys")
    return config_from_dict(raw, checked=checked)


def sets_nothing(raw: dict[str, Any]) -> bool:
    """Whether a parsed TOML file holds no key outside empty tables (an empty file, one of
    comments only, ``[data]`` with nothing under it)."""
    return all(isinstance(value, dict) and sets_nothing(value) for value in raw.values())


def apply_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A validated copy of ``config`` with dotted-key overrides applied. Options of a
    component the overrides replace (``--arch student`` on a config with ``model.d``) do
    not apply to the new one: each that differs from its default is named in a warning."""
    defaults = semantic_dict(config)
    dropped: list[str] = []
    new = config_from_dict(merge_overrides(config.to_dict(), overrides, dropped))
    check_overrides_read(new, overrides)
    for key in dropped:
        section, name = split_key(key)
        if name not in defaults.get(section, {}):
            continue
        if section == "diagnostics":  # a diagnostic's table (merge_overrides)
            log.warning("warning: %s=%r holds the options of a diagnostic diagnostics.protocol "
                        "no longer lists; left out", key, defaults[section][name])
        else:
            log.warning("warning: %s=%r is an option of the %s replaced; left out", key,
                        defaults[section][name], section)
    return new


def apply_where_read(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``config`` with the ``overrides`` its components read; an option of another
    component is skipped (``CREDITAUDIT_SET="data.n_train=600"`` shrinks the generated
    datasets of a sweep and leaves its file datasets alone). Unknown keys are still an
    error."""
    return config_from_dict(merge_overrides(config.to_dict(), overrides), dropped=[])


def config_value(config: RunConfig | dict[str, Any], key: str) -> Any:
    """The value of a dotted key in a config (or its dict); a key of a table field
    (``model.args.d``) reads that table's entry."""
    raw = config.to_dict() if isinstance(config, RunConfig) else config
    section, _, name = key.partition(".")
    values = raw.get(section, {})
    if name not in values and "." in name:
        table, _, leaf = name.partition(".")
        inner = values.get(table)
        return inner.get(leaf) if isinstance(inner, dict) else None
    return values.get(name)


__all__ = [
    "config_value", "DEVICES", "MAX_SEED", "METHOD_NAME", "COMPONENT_NAME", "PRECISIONS",
    "SCHEDULES",
    "LEGACY_DEFAULTS", "DataConfig", "DiagnosticsConfig", "MethodConfig", "ModelConfig",
    "OptimConfig", "RunSettings", "opt", "RunConfig", "config_from_dict", "config_to_toml",
    "load_config", "sets_nothing", "parse_value", "parse_override", "device_overrides",
    "apply_overrides",
    "merge_overrides", "apply_where_read", "with_absolute_data_paths", "split_key",
    "semantic_dict", "config_help",
    "component_help", "SECTIONS", "SECTION_TYPES", "role", "keys_with_role", "non_semantic",
    "coerce", "component_of", "bind", "composed_class", "SELECTORS", "tomllib",
]
