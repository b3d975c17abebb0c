"""Dotted-key overrides (``method.penalty=0.01``): parsing them and merging them into raw sections.

The one way overrides are applied — ``--set``, ``RunConfig.replace``, sweep grids — is
:func:`merge_overrides` on a config's nested dicts, validated afterwards by
:func:`creditaudit.config.config_from_dict`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from creditaudit.config.composed import BASES, SELECTORS, protocol_names
from creditaudit.config.sections import SECTION_TYPES, DiagnosticsConfig, legacy_default
from creditaudit.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_value(text: str) -> Any:
    """Parse an override value with TOML syntax (``3``, ``1e-3``, ``true``), else a string.

    ConfigError for a value TOML would read only the start of (``1e-3 # fast``: the rest is
    a comment; a second line): the rest would be dropped without a word."""
    if text.lower() in ("none", "null"):
        return None
    try:
        value = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if len(value) > 1 or _ends_in_comment(text):
        raise ConfigError(f"the value {text!r} is read as {value['v']!r} and the rest dropped "
                          "(a # comment or a second line); leave the rest out, or write the "
                          "whole value as a quoted TOML string to mean the text")
    return value["v"]


def _ends_in_comment(text: str) -> bool:
    """Whether TOML reads the end of ``text`` as a comment: only then does a character
    appended to a valid value leave it valid (``3x`` is not TOML, ``3 # fast x`` is)."""
    try:
        tomllib.loads(f"v = {text}x")
    except tomllib.TOMLDecodeError:
        return False
    return True


def parse_override(item: str, *, given_as: str | None = None) -> tuple[str, Any]:
    """``"method.penalty=1e-2"`` → ``("method.penalty", 0.01)``. ``given_as``: how a refusal
    names the item (``"--set"``: ``--set ITEM``; None: ``override 'ITEM'``)."""
    named = f"{given_as} {item.strip()}" if given_as else f"override {item!r}"
    if "=" not in item:
        raise ConfigError(f"{named} must look like section.key=value, e.g. "
                          "method.penalty=0.01")
    key, text = item.split("=", 1)
    key = key.strip()
    if "" in key.split("."):  # model.args..d, model.args.: a key named '' in a table
        raise ConfigError(f"{named}: the key {key!r} has an empty part (two dots in a row, or "
                          "a dot at an end); write section.key=value, e.g. model.args.d=3")
    return key, parse_value(text.strip())


def device_overrides(device: str | None = None, precision: str | None = None
                     ) -> dict[str, str]:
    """Dotted overrides ``run.device`` / ``run.precision`` for the values that are given."""
    return {key: value for key, value in (("run.device", device), ("run.precision", precision))
            if value is not None}


def split_key(key: str) -> tuple[str, str]:
    """``"method.penalty"`` → ``("method", "penalty")``; ConfigError for anything else."""
    section, _, name = key.partition(".")
    if section in SECTION_TYPES and name and "" in name.split("."):
        raise ConfigError(f"override key {key!r} has an empty part (two dots in a row, or a "
                          "dot at an end): write section.key, e.g. model.args.d")
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
            if dropped is not None:  # a legacy default counts once it holds another value
                dropped += [f"{section}.{k}" for k, v in old.items()
                            if k not in keep and f"{section}.{k}" not in overrides
                            and not legacy_default(section, k, v)]
    _keep_protocol_tables(merged, overrides, dropped)
    for key, value in overrides.items():
        section, name = split_key(key)
        table, _, leaf = name.partition(".")
        if leaf:  # a key of a nested table: diagnostics.a.growth, model.args.t.u
            inner = merged.setdefault(section, {}).get(table)
            merged[section][table] = _with_path(inner, leaf.split("."), value)
        else:
            merged.setdefault(section, {})[name] = value
    return merged


def _with_path(table: Any, path: list[str], value: Any) -> dict[str, Any]:
    """``table`` (a dict, else a new one) with ``value`` at the dotted ``path`` of nested
    tables, as TOML reads ``t.u = 3`` in a table: ``model.args.t.u=3`` sets {t = {u = 3}}."""
    out = dict(table) if isinstance(table, dict) else {}
    head, *rest = path
    out[head] = _with_path(out.get(head), rest, value) if rest else value
    return out


def _keep_protocol_tables(merged: dict[str, Any], overrides: dict[str, Any],
                          dropped: list[str] | None) -> None:
    """Selecting another protocol (``diagnostics.protocol``) keeps only the option tables of
    the diagnostics it lists (``[diagnostics.a]`` does not apply to a protocol without (a);
    listed in ``dropped`` when given), as selecting another component keeps its options."""
    names = overrides.get("diagnostics.protocol")
    old = merged.get("diagnostics", {})
    if "diagnostics.protocol" not in overrides or names == old.get("protocol"):
        return
    if names is not None and not (isinstance(names, list | tuple)
                                  and all(isinstance(n, str) for n in names)):
        return  # not a list of names: validation says so
    keep = {f.name for f in dataclasses.fields(DiagnosticsConfig)} | set(protocol_names(names))
    merged["diagnostics"] = {k: v for k, v in old.items() if k in keep}
    if dropped is not None:
        dropped += [f"diagnostics.{k}" for k in old if k not in keep]


__all__ = ["parse_value", "parse_override", "device_overrides", "split_key", "merge_overrides"]
