"""The registry of credit rules: the built-in ones and those other packages install.

A rule is one :class:`~creditaudit.methods.base.CreditRule` subclass that describes itself
(``name``, ``label``, ``Options``, ``id_version``, ``credit_formula``, ``feedback_kind``, …).
Built-in rules register with the :func:`register` decorator; a rule in another package
registers through the entry-point group ``creditaudit.rules`` of its distribution, e.g. in
its ``pyproject.toml``::

    [project.entry-points."creditaudit.rules"]
    noisy-bp = "my_package.noisy_bp:NoisyBP"

Once installed, ``creditaudit train --method noisy-bp``, ``sweep``, ``experiment``,
``audit`` and ``figures`` accept it unchanged. This is the rules' instance of the one
mechanism every axis uses (:mod:`creditaudit.registry`).
"""

from __future__ import annotations

from typing import Any

from creditaudit.config import MethodConfig
from creditaudit.errors import ConfigError
from creditaudit.methods.base import (
    FEEDBACK_KINDS,
    STACKED_STEPS,
    CreditRule,
)
from creditaudit.registry import RULES

ENTRY_POINT_GROUP = RULES.group


def _validate(cls: type[CreditRule], source: str) -> None:
    """What a rule declares beyond every component's name, label, options and version."""
    name = cls.name
    formula = getattr(cls, "credit_formula", None)
    if not isinstance(formula, str) or not formula:
        raise ConfigError(f"{source} ({name}) needs a non-empty `credit_formula` string")
    if cls.feedback_kind not in FEEDBACK_KINDS:
        raise ConfigError(f"{source} ({name}) has feedback_kind "
                          f"{cls.feedback_kind!r}; use one of "
                          f"{', '.join(FEEDBACK_KINDS)}")
    stacked = cls.__dict__.get("stacked_step")
    if stacked is not None and stacked not in STACKED_STEPS:
        raise ConfigError(f"{source} ({name}) has stacked_step {stacked!r}; use one of "
                          f"{', '.join(STACKED_STEPS)} or None")
    needs = STACKED_STEPS[stacked] if stacked is not None else ()
    missing = [m for m in needs if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(f"{source} ({name}) declares stacked_step {stacked!r} but has no "
                          f"{', '.join(missing)} method; define it or leave stacked_step None")
    failures = getattr(cls, "expected_failures", {})
    if not isinstance(failures, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in failures.items()):
        raise ConfigError(f"{source} ({name}): expected_failures must map check names to "
                          "the reason each fails")


RULES.configure(CreditRule, _validate)


def validate_rule_class(cls: Any, source: str) -> type[CreditRule]:
    """The class itself when it is a valid, self-describing rule; ConfigError otherwise."""
    return RULES.validate(cls, source)


def register(cls: type[CreditRule]) -> type[CreditRule]:
    """Class decorator of the built-in rules."""
    return RULES.register(cls)


def reload_plugins() -> None:
    """Forget the installed plugins, to find them again (after installing one in this
    process)."""
    RULES.reload()


def rule_names() -> list[str]:
    """Every usable rule, in listing order (each rule's ``rank``, then its name)."""
    return RULES.names()


def rule_class(name: str) -> type[CreditRule]:
    """The rule called ``name``; ConfigError naming the choices when there is none."""
    return RULES.get(name)


def find_rule(name: str) -> type[CreditRule] | None:
    """The rule called ``name``, or None (e.g. a record of a plugin not installed here)."""
    return RULES.find(name)


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
