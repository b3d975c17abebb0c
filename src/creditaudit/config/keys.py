"""What a config's keys say about themselves: their roles, the part that makes a run id, help.

Each field's role (``compute``, ``record`` or ``place``: :mod:`creditaudit.config.sections`)
decides whether it is part of the run id (:func:`semantic_dict`, :func:`non_semantic`); its
help text and default make the rows of ``--help`` and docs/configuration.md
(:func:`config_help`, :func:`component_help`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from creditaudit.config.composed import SELECTORS
from creditaudit.config.sections import SECTION_TYPES, DiagnosticsConfig
from creditaudit.registry import DIAGNOSTICS

if TYPE_CHECKING:
    from creditaudit.config import RunConfig


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


def data_path_options(config: RunConfig) -> dict[str, str]:
    """Each path option of ``config``'s data (``data_dir``, a plugin dataset's own) that is
    set, by name, as the config spells it."""
    return {f.name: value for f in dataclasses.fields(config.data)
            if f.metadata.get("path") and isinstance(value := getattr(config.data, f.name), str)
            and value.strip()}


def with_absolute_data_paths(config: RunConfig) -> RunConfig:
    """``config`` with every path option of its data (:func:`data_path_options`) made
    absolute against the current folder (``~`` expanded), so that its record still finds the
    data from any folder. Path options are of role ``place``, never in the run id: the id
    does not move."""
    changes = {f"data.{name}": os.path.abspath(os.path.expanduser(value))
               for name, value in data_path_options(config).items()
               if not os.path.isabs(os.path.expanduser(value))}
    return config.replace(**changes) if changes else config


def semantic_dict(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The fields that change what a run computes and differ from their defaults.

    Only non-default values are kept, so adding an option whose default keeps the old
    behaviour does not change existing run ids (see :mod:`creditaudit.records.run_ids`). A
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
            default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else f.default)
            if value != default:
                kept[f.name] = signless_zeros(dataclasses.asdict(value)
                                              if dataclasses.is_dataclass(value) else value)
        out[section] = kept
    return out


def signless_zeros(value: Any) -> Any:
    """``value`` with every float −0.0 (also inside lists and tables) made 0.0: the two
    compare equal and compute the same, but JSON spells them apart, which would give one
    computation two run ids."""
    if isinstance(value, float):
        return 0.0 if value == 0.0 else value
    if isinstance(value, dict):
        return {key: signless_zeros(item) for key, item in value.items()}
    if isinstance(value, list):
        return [signless_zeros(item) for item in value]
    if isinstance(value, tuple):
        return tuple(signless_zeros(item) for item in value)
    return value


def iter_fields(cls: type, section: str) -> Iterator[tuple[str, str, str]]:
    """(dotted key, default, help) of a section class's fields."""
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        extra = f" [{'|'.join(map(str, choices))}]" if choices else ""
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
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


__all__ = ["fields_of", "role", "keys_with_role", "semantic_dict", "non_semantic",
           "iter_fields", "config_help", "component_help"]
