"""The registry of credit rules: the built-in ones and those other packages install.

A rule is one :class:`~creditaudit.methods.base.CreditRule` subclass that describes itself
(``name``, ``label``, ``credit_formula``, ``feedback_kind``, …). Built-in rules register with
the :func:`register` decorator; a rule in another package registers through the entry-point
group ``creditaudit.rules`` of its distribution, e.g. in its ``pyproject.toml``::

    [project.entry-points."creditaudit.rules"]
    noisy-bp = "my_package.noisy_bp:NoisyBP"

Once installed, ``creditaudit train --method noisy-bp``, ``sweep``, ``experiment``,
``audit`` and ``figures`` accept it unchanged. Entry points are loaded on first use; a plugin
that fails to import is reported in one line when its name is asked for (and a warning when
all rules are listed), never as a traceback.
"""

from __future__ import annotations

import logging
import re
from importlib import metadata
from typing import Any

from creditaudit.config import MethodConfig
from creditaudit.errors import ConfigError
from creditaudit.methods.base import FEEDBACK_KINDS, CreditRule

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "creditaudit.rules"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_BUILTIN: dict[str, type[CreditRule]] = {}
_PLUGINS: dict[str, type[CreditRule]] = {}
_BROKEN: dict[str, str] = {}
_LOADED = False


def validate_rule_class(cls: Any, source: str) -> type[CreditRule]:
    """The class itself when it is a valid, self-describing rule; ConfigError otherwise."""
    if not (isinstance(cls, type) and issubclass(cls, CreditRule)):
        raise ConfigError(f"{source} is not a creditaudit.methods.CreditRule subclass")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or name == "base":
        raise ConfigError(f"{source} needs a lower-case `name` (letters, digits, - and _), "
                          f"got {name!r}")
    for attribute in ("label", "credit_formula"):
        if not isinstance(getattr(cls, attribute, None), str) or not getattr(cls, attribute):
            raise ConfigError(f"{source} ({name}) needs a non-empty `{attribute}` string")
    if cls.feedback_kind not in FEEDBACK_KINDS:
        raise ConfigError(f"{source} ({name}) has feedback_kind {cls.feedback_kind!r}; use "
                          f"one of {', '.join(FEEDBACK_KINDS)}")
    return cls


def register(cls: type[CreditRule]) -> type[CreditRule]:
    """Class decorator of the built-in rules."""
    validate_rule_class(cls, cls.__qualname__)
    _BUILTIN[cls.name] = cls
    return cls


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load_plugins() -> None:
    """Import every installed plugin rule once (failures are kept to be reported)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for entry in _entry_points():
        source = f"rule plugin {entry.value!r} (entry point {entry.name!r} of group " \
                 f"{ENTRY_POINT_GROUP})"
        try:
            cls = validate_rule_class(entry.load(), source)
        except Exception as err:  # noqa: BLE001 - a broken plugin must not break the tool
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            _BROKEN[entry.name] = f"{source} cannot be used: {reason}"
            continue
        if cls.name != entry.name:
            _BROKEN[entry.name] = (f"{source} names its class {cls.name!r}; the entry point "
                                   "and the rule's `name` must be equal")
        elif cls.name in _BUILTIN:
            _BROKEN[entry.name] = f"{source} would replace the built-in rule {cls.name!r}"
        else:
            _PLUGINS[cls.name] = cls


def reload_plugins() -> None:
    """Forget and reload the installed plugins (after installing one in this process)."""
    global _LOADED
    _PLUGINS.clear()
    _BROKEN.clear()
    _LOADED = False
    _load_plugins()


def _ordered(rules: dict[str, type[CreditRule]]) -> list[str]:
    return sorted(rules, key=lambda name: (rules[name].rank, name))


def rule_names() -> list[str]:
    """Every usable rule, in listing order (each rule's ``rank``, then its name)."""
    _load_plugins()
    for message in _BROKEN.values():
        log.warning("warning: %s", message)
    return _ordered({**_BUILTIN, **_PLUGINS})


def rule_class(name: str) -> type[CreditRule]:
    """The rule called ``name``; ConfigError naming the choices when there is none."""
    if name in _BUILTIN:
        return _BUILTIN[name]
    _load_plugins()
    if name in _PLUGINS:
        return _PLUGINS[name]
    if name in _BROKEN:
        raise ConfigError(_BROKEN[name])
    raise ConfigError(f"method.name={name!r} is not a known credit rule; choose one of "
                      f"{', '.join(_ordered({**_BUILTIN, **_PLUGINS}))} (rules of other packages "
                      f"register through the entry-point group {ENTRY_POINT_GROUP})")


def find_rule(name: str) -> type[CreditRule] | None:
    """The rule called ``name``, or None (e.g. a record of a plugin not installed here)."""
    try:
        return rule_class(name)
    except ConfigError:
        return None


def check_method(config: MethodConfig) -> None:
    """ConfigError when ``config.name`` names no installed rule."""
    rule_class(config.name)


def rule_label(name: str) -> str:
    """The display label of rule ``name`` (the name itself for unknown rules)."""
    rule = find_rule(name)
    return rule.label if rule is not None else name


def credit_formula(name: str) -> str | None:
    rule = find_rule(name)
    return rule.credit_formula if rule is not None else None
