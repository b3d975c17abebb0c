"""A rule's style in figures: its colour and marker (:func:`method_color`,
:func:`method_marker`), its own where its class declares one, else a fallback chosen from its
name that no installed rule has. Figure modules import them from
:mod:`creditaudit.figures.common` with the rest of what every figure shares.
"""

from __future__ import annotations

import hashlib

from creditaudit.methods import find_rule
from creditaudit.registry import RULES

# The built-in rules each declare their own `color` and `marker`: 12 of Paul Tol's discrete
# rainbow of 14 colours (SRON technical note "Colour schemes", fig. 22; the two lightest,
# #CAE0AB and #F7F056, are hard to see as lines on white) and grey for the frozen baseline,
# every pair apart (CIELAB ΔE ≥ 10) in normal vision and in simulated protanopia,
# deuteranopia and tritanopia. A rule without a style of its own — a plugin, a subclass of a
# built-in (the style is never inherited: `CreditRule.style`), a record of a rule not
# installed here — takes a colour from FALLBACK_COLORS and a marker from FALLBACK_MARKERS,
# chosen from its name so it keeps its style across figures and runs. No fallback is a
# built-in's: each colour is ΔE ≥ 10 from every built-in colour and every other fallback in
# all four visions (Tol's muted and dark schemes first, then CSS colours; none lighter than
# L* 80), and the markers are those no built-in uses. Two fallback rules may share a colour
# or a marker; the legend's label then tells them apart.
FALLBACK_COLORS = ("#332288", "#117733", "#EE99AA", "#663333", "#004488", "#8A2BE2",
                   "#00BFFF", "#CD853F", "#FF1493", "#7B68EE")
FALLBACK_MARKERS = ("H", "8", "x", "+", "1", "2", "3", "4")


def _stable_index(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16)


def own_style(method: str, attribute: str) -> str | None:
    """The ``color`` or ``marker`` the rule declares on its own class (None for a rule
    that declares none, and for one not installed here)."""
    rule = find_rule(method)
    return rule.style(attribute) if rule is not None else None


def _fallback(attribute: str, palette: tuple[str, ...], index: int) -> str:
    """``palette[index]`` among the entries no installed rule declares as its own (a plugin
    may have picked one): a rule without a style must not look like one that has it."""
    taken = {rule.style(attribute) for rule in RULES.classes()}
    free = [value for value in palette if value not in taken] or list(palette)
    return free[index % len(free)]


def method_color(method: str) -> str:
    """The rule's own colour, else a fallback colour no built-in rule has."""
    own = own_style(method, "color")
    return own or _fallback("color", FALLBACK_COLORS, _stable_index(method))


def method_marker(method: str) -> str:
    """The rule's own marker, else a fallback marker no built-in rule has (chosen apart from
    the colour, so two fallback rules rarely share both)."""
    own = own_style(method, "marker")
    index = _stable_index(method) // len(FALLBACK_COLORS)
    return own or _fallback("marker", FALLBACK_MARKERS, index)
