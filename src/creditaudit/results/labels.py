"""How a credit rule is named and ordered wherever runs are listed (tables and figures)."""

from __future__ import annotations

from collections.abc import Iterable

from creditaudit.methods import find_rule, rule_label
from creditaudit.registry import own_rank


def method_label(method: str, penalty: float = 0.0) -> str:
    """The rule's own label (the name for rules not installed here), λ appended."""
    label = rule_label(method)
    return f"{label} λ={penalty:g}" if penalty else label


def method_rank(method: str) -> tuple[int, str]:
    """Listing order of a rule: its own ``rank`` (a subclass that sets none is listed as a
    rule of its own, not beside its parent), then its name (unknown rules: rank 100)."""
    rule = find_rule(method)
    return (own_rank(rule) if rule is not None else 100, method)


def sort_methods(methods: Iterable[str]) -> list[str]:
    """The distinct ``methods`` in listing order."""
    return sorted(set(methods), key=method_rank)


__all__ = ["method_label", "method_rank", "sort_methods"]
