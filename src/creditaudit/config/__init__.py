"""Dataclass configs, TOML loading, command-line overrides and validation.

A run is described by one :class:`RunConfig` with six sections (data, model, method, optim,
diagnostics, run), declared field by field in :mod:`creditaudit.config.sections`. The data,
model and method sections also hold the own options of the dataset, architecture and credit
rule they select (:mod:`creditaudit.config.composed`). Every field carries its help text,
allowed values, range and role in its metadata; :func:`config_from_dict` validates against
them and raises a one-line :class:`~creditaudit.errors.ConfigError` naming the bad key, what
was given and what is allowed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from creditaudit.config.composed import (
    BASES,
    SELECTORS,
    bind,
    component_of,
    composed_class,
    diagnostics_class,
    protocol_names,
    unresolved_class,
)
from creditaudit.config.sections import (
    COMPONENT_NAME,
    DEVICES,
    LEGACY_DEFAULTS,
    MAX_SEED,
    METHOD_NAME,
    PRECISIONS,
    RETIRED_KEYS,
    SCHEDULES,
    DataConfig,
    DiagnosticsConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunSettings,
    opt,
)
from creditaudit.errors import ConfigError
from creditaudit.registry import DIAGNOSTICS
from creditaudit.safe_files import read_text

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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


SECTION_TYPES: dict[str, type] = {
    "data": DataConfig, "model": ModelConfig, "method": MethodConfig, "optim": OptimConfig,
    "diagnostics": DiagnosticsConfig, "run": RunSettings,
}
SECTIONS = SECTION_TYPES


def fields_of(section: Any) -> tuple[dataclasses.Field, ...]:
    """The fields of a section instance or class (common keys, then the options)."""
    return dataclasses.fields(section)


def role(section_obj_or_cls: Any, name: str) -> str:
    """The role of key ``name`` of a section (see :mod:`creditaudit.config.sections`)."""
    for f in dataclasses.fields(section_obj_or_cls):
        if f.name == name:
            return f.metadata.get("role", "compute")
    return "compute"


def keys_with_role(config: RunConfig, *roles: str) -> set[tuple[str, str]]:
    """(section, key) of every field of ``config`` whose role is one of ``roles``."""
    return {(section, f.name) for section in SECTION_TYPES
            for f in dataclasses.fields(getattr(config, section))
            if f.metadata.get("role", "compute") in roles}


def _type_name(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    name = getattr(base, "__name__", str(base))
    return f"{name} or none" if type(None) in typing.get_args(tp) else name


_HINTS: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a section class's fields (resolving them is slow; do it once)."""
    if cls not in _HINTS:
        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            if dataclasses.is_dataclass(klass):
                try:
                    hints.update(typing.get_type_hints(klass))
                except (NameError, TypeError):
                    hints.update(getattr(klass, "__annotations__", {}))
        _HINTS[cls] = hints
    return _HINTS[cls]


def coerce(key: str, f: dataclasses.Field, tp: Any, value: Any) -> Any:
    """``value`` checked against the field's type and its :func:`opt` metadata; one-line
    ConfigError naming ``key`` otherwise."""
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    if base is Any:
        return value
    if value is None or (optional and isinstance(value, str) and value.lower() == "none"):
        if optional:
            return None
        raise ConfigError(f"{key} must be a {_type_name(tp)}, got none")
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
    elif base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value")
    elif base is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    elif typing.get_origin(base) in (list, tuple) and not isinstance(value, list | tuple):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    elif isinstance(base, type) and dataclasses.is_dataclass(base):
        return options_table(key, base, value)
    meta = f.metadata
    if meta.get("path") and isinstance(value, str) and not value.strip():
        raise ConfigError(f"{key}={value!r} is an empty path, which would mean the current "
                          f"folder; give a folder ({key}=. for the current one)")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of "
                          f"{', '.join(map(str, meta['choices']))}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}={value!r} is out of range; it must be >= {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"{key}={value!r} is out of range; it must be <= {meta['max']}")
    return value


def options_table(key: str, options: type, value: Any) -> Any:
    """A table of options (e.g. ``[diagnostics.a]``) validated against its dataclass."""
    if isinstance(value, options):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table of options, got {value!r}")
    fields = {f.name: f for f in dataclasses.fields(options)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {key}.{unknown[0]}; allowed keys in [{key}]: "
                          f"{', '.join(fields) or 'none'}")
    types = typing.get_type_hints(options)
    return options(**{k: coerce(f"{key}.{k}", fields[k], types[k], v) for k, v in value.items()})


def _section_class(section: str, given: dict[str, Any], strict: bool) -> type:
    """The dataclass of ``section`` for the component(s) ``given`` selects."""
    if section == "diagnostics":
        names = given.get("protocol")
        if names is not None and (not isinstance(names, list | tuple) or not all(
                isinstance(n, str) for n in names)):
            raise ConfigError(f"diagnostics.protocol must be a list of diagnostic names, got "
                              f"{names!r}")
        return diagnostics_class(protocol_names(names), strict)
    if section not in SELECTORS:
        return SECTION_TYPES[section]
    key, registry = SELECTORS[section]
    base = BASES[section]
    name = given.get(key, next(f.default for f in dataclasses.fields(base) if f.name == key))
    if not isinstance(name, str) or not COMPONENT_NAME.match(name):
        raise ConfigError(f"{section}.{key}={name!r} is not a {registry.noun} name (lower-case "
                          "letters, digits, - and _)")
    if strict:
        return composed_class(section, registry.get(name))
    component = registry.find(name)
    if component is None:
        return unresolved_class(section, name, tuple(given))
    return composed_class(section, component)


def _owners(section: str, key: str) -> list[str]:
    """Names of the registered components of ``section``'s axis that have option ``key``."""
    _, registry = SELECTORS[section]
    return [cls.name for cls in registry.classes() if key in cls.option_names()]


def _unknown_key(section: str, cls: type, key: str, value: Any, strict: bool,
                 dropped: list[str] | None) -> None:
    """Decide about a key the section's class lacks: drop it silently when it is a default an
    earlier version wrote for every component, or when not ``strict`` (records: the run
    never read it); drop it into ``dropped`` when that list is given and the key is an option
    of another component (a sweep's base over several rules); raise a one-line ConfigError
    otherwise."""
    if not strict:
        return
    if (section, key) in LEGACY_DEFAULTS and LEGACY_DEFAULTS[(section, key)] == value:
        return
    if (section, key) in RETIRED_KEYS:  # an old config still loads
        log.warning("warning: %s.%s is no longer read and is ignored: %s", section, key,
                    RETIRED_KEYS[(section, key)])
        return
    if dropped is not None and section in SELECTORS and _owners(section, key):
        dropped.append(f"{section}.{key}")
        return
    allowed = ", ".join(f.name for f in dataclasses.fields(cls))
    component = component_of_class(cls)
    if section in SELECTORS and component is not None:
        owners = _owners(section, key)
        what = f"{component.name} ({section}.{SELECTORS[section][0]})"
        hint = component.hints.get(key)
        if hint:
            raise ConfigError(f"{section}.{key} is not read by {what}: {hint}")
        if owners:
            raise ConfigError(f"{section}.{key} is not read by {what}: it is an option of "
                              f"{', '.join(owners)}; drop it (allowed keys in [{section}]: "
                              f"{allowed})")
        raise ConfigError(f"unknown key {section}.{key} for {what}; allowed keys in "
                          f"[{section}]: {allowed}")
    raise ConfigError(f"unknown key {section}.{key}; allowed keys in [{section}]: {allowed}")


def component_of_class(cls: type) -> type | None:
    return getattr(cls, "component", None)


def _section(section: str, given: dict[str, Any], strict: bool,
             dropped: list[str] | None = None) -> Any:
    if not isinstance(given, dict):
        raise ConfigError(f"config section {section!r} must be a table, got {given!r}")
    cls = _section_class(section, given, strict)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = _field_types(cls)
    values = {}
    for key, value in given.items():
        if key not in fields:
            _unknown_key(section, cls, key, value, strict, dropped)
            continue
        values[key] = coerce(f"{section}.{key}", fields[key], types.get(key, Any), value)
    return cls(**values)


def config_from_dict(raw: dict[str, Any], *, strict: bool = True,
                     dropped: list[str] | None = None) -> RunConfig:
    """Build and validate a RunConfig from nested dicts (missing keys take defaults).

    ``strict`` (configs a user gives): every component must be installed and every key read
    by the component it is given to. ``strict=False`` (records): a section of a component
    not installed here keeps its keys as written, and keys the component does not read are
    dropped (records of earlier versions list every key of every component). ``dropped``
    (sweeps): a list that collects, instead of refusing them, the keys that are options of
    another component than the one selected (a sweep's [base] may hold EP's options while
    its grid varies the rule).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"a config must be a table of sections, got {type(raw).__name__}")
    unknown = set(raw) - set(SECTION_TYPES)
    if unknown:
        raise ConfigError(f"unknown config section {sorted(unknown)[0]!r}; allowed sections: "
                          f"{', '.join(SECTION_TYPES)}")
    sections = {name: _section(name, raw.get(name, {}), strict, dropped)
                for name in SECTION_TYPES}
    config = RunConfig(**sections)
    _check_consistency(config)
    return config


def _check_consistency(config: RunConfig) -> None:
    """Cross-field rules that single-field validation cannot see (a component's own rules
    are checked where the component is resolved: :func:`creditaudit.plan.plan_run`)."""
    tb = config.method.trainable_blocks
    n_blocks = getattr(config.model, "n_blocks", None)
    if tb is not None and isinstance(n_blocks, int) and tb > n_blocks:
        raise ConfigError(f"method.trainable_blocks={tb} exceeds model.n_blocks={n_blocks}; "
                          f"use 0…{n_blocks}")


def config_to_toml(config: RunConfig) -> str:
    """The config as a TOML file that :func:`load_config` reads back to an equal config.

    Fields set to None are left out (TOML has no null; every optional field defaults to
    None, so leaving it out restores it).
    """
    import tomli_w

    raw = {section: {k: v for k, v in values.items() if v is not None}
           for section, values in config.to_dict().items()}
    return tomli_w.dumps(raw)


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file (sections [data], [model], [method], …; e.g. a run folder's
    ``config.toml``). A run's ``record.json`` is read by
    :func:`creditaudit.records.load_config_file`."""
    path = Path(path)
    text = read_text(path, "config file", ConfigError)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to be a "
                          "config") from None
    return config_from_dict(raw)


def parse_value(text: str) -> Any:
    """Parse an override value with TOML syntax (``3``, ``1e-3``, ``true``), else a string."""
    if text.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_override(item: str) -> tuple[str, Any]:
    """``"method.penalty=1e-2"`` → ``("method.penalty", 0.01)``."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. "
                          "method.penalty=0.01")
    key, text = item.split("=", 1)
    return key.strip(), parse_value(text.strip())


def device_overrides(device: str | None = None, precision: str | None = None
                     ) -> dict[str, str]:
    """Dotted overrides ``run.device`` / ``run.precision`` for the values that are given."""
    return {key: value for key, value in (("run.device", device), ("run.precision", precision))
            if value is not None}


def split_key(key: str) -> tuple[str, str]:
    """``"method.penalty"`` → ``("method", "penalty")``; ConfigError for anything else."""
    section, _, name = key.partition(".")
    if section not in SECTION_TYPES or not name:
        raise ConfigError(f"override key {key!r} must be section.key with section one of "
                          f"{', '.join(SECTION_TYPES)}")
    return section, name


def merge_overrides(raw: dict[str, Any], overrides: dict[str, Any],
                    dropped: list[str] | None = None) -> dict[str, Any]:
    """Nested sections ``raw`` with dotted ``overrides`` applied (not yet validated): the one
    way overrides are applied (``--set``, ``RunConfig.replace``, sweep grids).

    Selecting another component (``method.name``, ``model.arch``, ``data.name``) keeps only
    the keys the new component reads (plus those the overrides set): the options of the old
    one do not apply to it (listed in ``dropped`` when given).
    """
    merged = {section: dict(values) for section, values in raw.items()}
    for key in overrides:
        split_key(key)
    for section, (selector, registry) in SELECTORS.items():
        key = f"{section}.{selector}"
        old = merged.get(section, {})
        if key in overrides and overrides[key] != old.get(selector):
            component = registry.find(overrides[key]) if isinstance(overrides[key], str) else None
            keep = {f.name for f in dataclasses.fields(BASES[section])}
            if component is not None:
                keep |= set(component.option_names())
            merged[section] = {k: v for k, v in old.items() if k in keep}
            if dropped is not None:
                dropped += [f"{section}.{k}" for k in old
                            if k not in keep and f"{section}.{k}" not in overrides
                            and (section, k) not in LEGACY_DEFAULTS]
    for key, value in overrides.items():
        section, name = split_key(key)
        table, _, leaf = name.partition(".")
        if leaf:  # a key of a nested table: diagnostics.a.growth
            inner = merged.setdefault(section, {}).get(table)
            merged[section][table] = {**(inner if isinstance(inner, dict) else {}), leaf: value}
        else:
            merged.setdefault(section, {})[name] = value
    return merged


def apply_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A validated copy of ``config`` with dotted-key overrides applied. Options of a
    component the overrides replace (``--arch student`` on a config with ``model.d``) do
    not apply to the new one: each that differs from its default is named in a warning."""
    defaults = semantic_dict(config)
    dropped: list[str] = []
    new = config_from_dict(merge_overrides(config.to_dict(), overrides, dropped))
    for key in dropped:
        section, name = split_key(key)
        if name in defaults.get(section, {}):
            log.warning("warning: %s=%r is an option of the %s replaced; left out", key,
                        defaults[section][name], section)
    return new


def apply_where_read(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``config`` with the ``overrides`` its components read; an option of another
    component is skipped (``CREDITAUDIT_SET="data.n_train=600"`` shrinks the generated
    datasets of a sweep and leaves its file datasets alone). Unknown keys are still an
    error."""
    return config_from_dict(merge_overrides(config.to_dict(), overrides), dropped=[])


def semantic_dict(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The fields that change what a run computes and differ from their defaults.

    Only non-default values are kept, so adding an option whose default keeps the old
    behaviour does not change existing run ids (see :mod:`creditaudit.run_ids`). A
    component's options are compared with the component's own defaults.
    """
    out: dict[str, dict[str, Any]] = {}
    for section in SECTION_TYPES:
        values = getattr(config, section)
        kept = {}
        for f in dataclasses.fields(values):
            if f.metadata.get("role", "compute") != "compute":
                continue
            value = getattr(values, f.name)
            default = (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                       else f.default)
            if value != default:
                kept[f.name] = (dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                                else value)
        out[section] = kept
    return out


def iter_fields(cls: type, section: str) -> Iterator[tuple[str, str, str]]:
    """(dotted key, default, help) of a section class's fields."""
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        extra = f" [{'|'.join(map(str, choices))}]" if choices else ""
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default  # type: ignore[misc]
        yield f"{section}.{f.name}", repr(default), f.metadata.get("help", "") + extra


def config_help() -> list[tuple[str, str, str]]:
    """(dotted key, default, help) of every common field, for ``--help`` texts and docs;
    :func:`component_help` lists each component's own options."""
    rows = []
    for section, cls in SECTION_TYPES.items():
        if section == "diagnostics":
            cls = DiagnosticsConfig  # the options tables are listed per diagnostic
        rows.extend(iter_fields(cls, section))
    return rows


def component_help() -> list[tuple[str, str, str, list[tuple[str, str, str]]]]:
    """(section, component name, label, its option rows) for every installed component of
    the data, model and method sections."""
    out = []
    for section, (_, registry) in SELECTORS.items():
        for component in registry.classes():
            rows = [row for row in iter_fields(component.Options, section)]
            out.append((section, component.name, component.label, rows))
    for diagnostic in DIAGNOSTICS.classes():
        rows = list(iter_fields(diagnostic.Options, f"diagnostics.{diagnostic.name}"))
        out.append(("diagnostics", diagnostic.name, diagnostic.label, rows))
    return out


def non_semantic(config: RunConfig) -> set[tuple[str, str]]:
    """(section, key) of the fields that are not part of the run id (role record or place)."""
    return keys_with_role(config, "record", "place")


__all__ = [
    "DEVICES", "MAX_SEED", "METHOD_NAME", "COMPONENT_NAME", "PRECISIONS", "SCHEDULES",
    "LEGACY_DEFAULTS", "DataConfig", "DiagnosticsConfig", "MethodConfig", "ModelConfig",
    "OptimConfig", "RunSettings", "opt", "RunConfig", "config_from_dict", "config_to_toml",
    "load_config", "parse_value", "parse_override", "device_overrides", "apply_overrides",
    "merge_overrides", "apply_where_read", "split_key", "semantic_dict", "config_help",
    "component_help", "SECTIONS", "SECTION_TYPES", "role", "keys_with_role", "non_semantic",
    "coerce", "component_of", "bind", "composed_class", "SELECTORS", "tomllib",
]
