"""The dotted keys of a sweep file: its nested tables flattened to ``section.key`` (two
spellings of one key refused), and every key a sweep may set."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from creditaudit.config import SECTION_TYPES, SELECTORS
from creditaudit.errors import ConfigError
from creditaudit.registry import DIAGNOSTICS


def _leaves(table: dict[str, Any], path: tuple[str, ...] = ()
            ) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every non-table value, e.g. ``(("method", "name"), "fa")``."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def _spelling(path: tuple[str, ...]) -> str:
    """How a key path is written in TOML: ``("method.name",)`` → ``"method.name"``,
    ``("method", "name")`` → ``method.name``."""
    return ".".join(f'"{key}"' if "." in key else key for key in path)


def flatten_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"method": {"name": "fa"}, "run.seed": 1}`` → ``{"method.name": "fa", "run.seed": 1}``.

    Raises ConfigError when two spellings name one key (``"method.name"`` beside a
    ``method`` table holding ``name``): TOML keeps both, and one value would be lost.
    """
    flat: dict[str, Any] = {}
    spelled: dict[str, tuple[str, ...]] = {}
    for path, value in _leaves(table):
        dotted = prefix + ".".join(path)
        if dotted in flat:
            raise ConfigError(f"key {dotted} is given twice, as {_spelling(spelled[dotted])} "
                              f"and as {_spelling(path)}; keep one of them")
        flat[dotted], spelled[dotted] = value, path
    return flat


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


__all__ = ["flatten_keys", "known_keys"]
