"""One config section validated from raw values: types, allowed values, ranges, unknown keys.

:func:`section_from_dict` builds a section (the dataclass of the component it selects,
:mod:`creditaudit.config.composed`) from the keys a TOML file, a record or an override
gives; :func:`coerce` checks one value against its field's type and
:func:`~creditaudit.config.sections.opt` metadata. Every refusal is a one-line
:class:`~creditaudit.errors.ConfigError` naming the key, what was given and what is allowed.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import reprlib
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from creditaudit.caller import set_key
from creditaudit.config.composed import (
    BASES,
    SELECTORS,
    composed_class,
    diagnostics_class,
    protocol_names,
    unresolved_class,
)
from creditaudit.config.sections import (
    COMPONENT_NAME,
    MAX_SEED,
    RETIRED_KEYS,
    SECTION_TYPES,
    legacy_default,
)
from creditaudit.errors import ConfigError
from creditaudit.registry import DIAGNOSTICS

log = logging.getLogger(__name__)


# What a value of each type is called in a refusal (as the type checks below call it).
_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
          "list": "a list", "tuple": "a list"}


def _type_name(tp: Any) -> str:
    """``tp`` (a field's type, not optional) as a refusal names it: "an integer", …"""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # [diagnostics.a]'s options
        return "a table of options"
    name = getattr(typing.get_origin(tp) or tp, "__name__", str(tp))
    return _KINDS.get(name, f"a {name}")


# The largest integer a config holds: TOML's integers are 64-bit, and so are torch's sizes
# and seeds.
INT64 = MAX_SEED

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
    _refuse_dates(key, value)
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    if base is Any:
        return value
    if value is None or (optional and isinstance(value, str) and value.lower() == "none"):
        if optional:
            return None
        raise ConfigError(f"{key} must be {_type_name(tp)}, got none")
    if f.metadata.get("path") and isinstance(value, os.PathLike):
        value = os.fspath(value)  # a pathlib.Path from Python: the path it names
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
    elif base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    elif base is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}{_toml_number(value)}")
        try:
            value = float(value)
        except OverflowError:  # an integer past float's range (TOML reads any length)
            value = math.inf if value > 0 else -math.inf
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite value")
    elif base is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}{_quote_hint(key, value)}")
    elif typing.get_origin(base) in (list, tuple) and not isinstance(value, list | tuple):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    elif isinstance(base, type) and dataclasses.is_dataclass(base):
        return options_table(key, base, value)
    meta = f.metadata
    if meta.get("path") and isinstance(value, str) and not value.strip():
        raise ConfigError(f"{key}={value!r} is an empty path, which would mean the current "
                          f"folder; give a folder ({key}=. for the current one)")
    if meta.get("path") and isinstance(value, str) and "\0" in value:
        raise ConfigError(f"{key}={value!r} holds a NUL character (\\x00), which no file "
                          "path can hold; give the path without it")
    if meta.get("path") and isinstance(value, str):  # "~/runs" is the home's, not ./~/runs
        value = os.path.expanduser(value)
    if meta.get("name") and isinstance(value, str) and not value.strip():
        raise ConfigError(f"{key}={value!r} is an empty name; give a name, or leave {key} out")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of "
                          f"{', '.join(map(str, meta['choices']))}")
    shown = reprlib.repr(value)  # an integer of 400 digits (TOML reads any length) shortened
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}={shown} is out of range; it must be >= {meta['min']}")
    if meta.get("above") is not None and value <= meta["above"]:
        raise ConfigError(f"{key}={shown} is out of range; it must be > {meta['above']}")
    if meta.get("max") is not None and value > meta["max"] and not reading_a_record():
        # (a record keeps what its run used: an earlier version may have had no bound)
        raise ConfigError(f"{key}={shown} is out of range; it must be <= {meta['max']}")
    if base is int and not -INT64 - 1 <= value <= INT64:  # after the key's own bounds, which
        # say its range better (run.seed: 0 … 2**63−1); TOML's reader takes any length
        bound = f"<= {INT64}" if value > 0 else f">= {-INT64 - 1}"
        raise ConfigError(f"{key}={shown} is out of range; it must be {bound} (a 64-bit "
                          "integer)")
    return value


def nested_values(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(key, value)`` and then every value inside it (a table's or a list's, depth first),
    each with its dotted path: ``model.args.t``, ``model.args.when[0]``."""
    yield key, value
    inner = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    for name, item in inner:
        yield from nested_values(f"{key}.{name}" if isinstance(value, dict)
                                 else f"{key}[{name}]", item)


def _refuse_dates(key: str, value: Any) -> None:
    """ConfigError for a TOML date or time (``1979-05-27``, ``07:32:00``), also inside a
    table or list (``model.args``): no key takes one, and a run record (JSON) cannot hold
    it (it was an internal TypeError when the run id was computed)."""
    for where, item in nested_values(key, value):
        if isinstance(item, datetime.date | datetime.time):
            text = item.isoformat()
            raise ConfigError(f"{where}={text} is a TOML date or time, which no config key "
                              f"takes; quote it to mean the text: \"{text}\"")


def _toml_number(value: Any) -> str:
    """For a text Python reads as a number and TOML does not (``.001``, ``1.``: no digit
    on one side of the point), how to write it: it came as a text, so it was refused as
    one."""
    try:
        number = float(value) if isinstance(value, str) and "." in value else math.nan
    except ValueError:
        return ""
    return (f" (TOML needs a digit each side of the point: {number!r})"
            if math.isfinite(number) else "")


def _quote_hint(key: str, value: Any) -> str:
    """For a number or true/false given to a string key (``--set run.out_dir=2024`` reads
    2024 as TOML, a number): how to write it as a string, in a file and in ``--set``."""
    if not isinstance(value, bool | int | float):
        return ""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    table, _, name = key.rpartition(".")
    flag = set_key(f"--set '{key}=\"{text}\"'", key, text)
    return (f"; quote it to mean the text: {flag} (in a config file, "
            f"{name} = \"{text}\" under [{table}])")


# While a record is read its values are kept as its run wrote them where a range this
# version checks in an options class is narrower than an earlier one's (a threshold).
_AS_RECORDED: ContextVar[bool] = ContextVar("as_recorded", default=False)


@contextmanager
def as_recorded() -> Iterator[None]:
    """Within it, options classes keep values out of the ranges they check
    (:func:`reading_a_record`): a record stays readable."""
    token = _AS_RECORDED.set(True)
    try:
        yield
    finally:
        _AS_RECORDED.reset(token)


def reading_a_record() -> bool:
    """Whether values are being read as a record holds them (:func:`as_recorded`)."""
    return _AS_RECORDED.get()


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
        if strict and names is not None and not names:  # records before this check keep []
            default = protocol_names(None)
            example = ", ".join(f'"{name}"' for name in default[:2])
            raise ConfigError(f"diagnostics.protocol=[] names no diagnostic: name at least one, "
                              f"e.g. [{example}]; leave the key out for the default "
                              f"{len(default)} ({' '.join(default)})")
        return diagnostics_class(protocol_names(names), strict)
    if section not in SELECTORS:
        return SECTION_TYPES[section]
    key, registry = SELECTORS[section]
    base = BASES[section]
    name = given.get(key, next(f.default for f in dataclasses.fields(base) if f.name == key))
    if not isinstance(name, str) or not COMPONENT_NAME.match(name):
        raise ConfigError(f"{section}.{key}={name!r} cannot name any {registry.noun}: names "
                          "are lower-case letters, digits, - and _")
    if strict:
        return composed_class(section, registry.get(name))
    component = registry.find(name)
    if component is None:
        return unresolved_class(section, name, tuple(given))
    return composed_class(section, component)


def _owners(section: str, key: str) -> list[str]:
    """Names of the registered components of ``section``'s axis that have option ``key``
    and that a config may choose (not ``own-loop``, which builds nothing: its options are
    no run's to read, and an error naming an option's readers offers them as choices)."""
    _, registry = SELECTORS[section]
    return [cls.name for cls in registry.offered_classes() if key in cls.option_names()]


def _unknown_key(section: str, cls: type, key: str, value: Any, strict: bool,
                 dropped: list[str] | None, *, legacy: bool = True) -> None:
    """Decide about a key the section's class lacks: drop it silently when it is a default an
    earlier version wrote for every component (``legacy``: the key comes from a file, not an
    override given now), or when not ``strict`` (records: the run never read it); drop it
    into ``dropped`` when that list is given and the key is an option of another component
    (a sweep's base over several rules); raise a one-line ConfigError otherwise."""
    if not strict:
        return
    if legacy and legacy_default(section, key, value):
        return
    if (section, key) in RETIRED_KEYS:  # an old config still loads
        log.warning("warning: %s.%s is no longer read and is ignored: %s", section, key,
                    RETIRED_KEYS[(section, key)])
        return
    if dropped is not None and section in SELECTORS and _owners(section, key):
        dropped.append(f"{section}.{key}")
        return
    allowed = ", ".join(f.name for f in dataclasses.fields(cls))
    if section == "diagnostics" and DIAGNOSTICS.find(key) is not None:
        raise ConfigError(f"diagnostics.{key} holds the options of diagnostic ({key}), which "
                          f"diagnostics.protocol does not list: add \"{key}\" to "
                          f"diagnostics.protocol or drop [diagnostics.{key}]")
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
        raise ConfigError(f"unknown key {section}.{key} for {what}{_elsewhere(section, key)}"
                          f"allowed keys in [{section}]: {allowed}")
    raise ConfigError(f"unknown key {section}.{key}{_elsewhere(section, key)}allowed keys in "
                      f"[{section}]: {allowed}")


def _elsewhere(section: str, key: str) -> str:
    """The words between an unknown key and its section's allowed keys: ``; did you mean
    optim.epochs? `` for a key of another section (``model.epochs``: a key every config has
    there, or an option of a component of its axis), else ``; ``."""
    found = [f"{other}.{key}" for other, cls in SECTION_TYPES.items() if other != section and (
        key in {f.name for f in dataclasses.fields(cls)}
        or (other in SELECTORS and _owners(other, key)))]
    return f"; did you mean {' or '.join(found)}? " if found else "; "


def check_overrides_read(config: Any, overrides: dict[str, Any]) -> None:
    """One-line ConfigError for an override (``--set``, ``RunConfig.replace``) of a key the
    component of its section in ``config`` does not read, even one holding a value an
    earlier version wrote by default: a file of that version drops such a key, a value given
    now is meant to be read. None is no value (unset, as a key left out of a file), so an
    override to None of a key the component does not read changes nothing and passes."""
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        values = getattr(config, section, None)
        if value is None or values is None or "." in key or (section, key) in RETIRED_KEYS \
                or key in {f.name for f in dataclasses.fields(values)}:
            continue
        _unknown_key(section, type(values), key, value, True, None, legacy=False)


def component_of_class(cls: type) -> type | None:
    return getattr(cls, "component", None)


def section_from_dict(section: str, given: dict[str, Any], strict: bool,
                      dropped: list[str] | None = None) -> Any:
    """Section ``section`` validated from its raw keys ``given``, as the dataclass of the
    component it selects (``strict``, ``dropped``: :func:`creditaudit.config.config_from_dict`)."""
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


__all__ = ["coerce", "options_table", "section_from_dict", "check_overrides_read",
           "component_of_class"]
