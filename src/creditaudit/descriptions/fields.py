"""How a stored field is declared: its documentation and the domain of its numbers.

Every part of a run record (and the typed measures an epoch stores,
:class:`creditaudit.descriptions.EpochMeasures`) is a dataclass whose fields are made by
:func:`doc`: the text ``docs/records.md`` is generated from and, for numbers, the
:class:`Domain` a record's values are checked against when it is read
(:func:`creditaudit.records.parts.check_domains`). It sits at the base so that the measures
(which compute an epoch's numbers) and the records (which store them) declare them once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

# Rounding slack of a domain's bounds: a cosine of 1.0000000002 (float32 arithmetic) is 1.
DOMAIN_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Domain:
    """The interval every number of a record field lies in, ``low ≤ x ≤ high`` (give or take
    :data:`DOMAIN_TOLERANCE`), for a number or each number of a list or mapping of them.

    NaN is always allowed: it is how an undefined value is written (the cosine of a zero
    vector, the norms of a diverged run). ±inf is allowed only on an unbounded side (the
    growth of a stream whose norm is 0); an infinite cosine or accuracy is refused.
    """

    low: float
    high: float
    what: str  # "a cosine": what a number of this domain is, for messages

    @property
    def text(self) -> str:
        """``[0, 1]``, ``[−1, 1]``, ``≥ 0``, ``any number``: the interval as docs/records.md
        states it."""
        if math.isinf(self.high):
            return "any number" if math.isinf(self.low) else f"≥ {self.low:g}"
        return f"[{self.low:g}, {self.high:g}]".replace("-", "−")

    def admits(self, number: float) -> bool:
        return math.isnan(number) or (self.low - DOMAIN_TOLERANCE <= number
                                      <= self.high + DOMAIN_TOLERANCE)


FRACTION = Domain(0.0, 1.0, "a fraction")
ACCURACY = Domain(0.0, 1.0, "an accuracy (a fraction, not a percentage)")
COSINE = Domain(-1.0, 1.0, "a cosine")
CORRELATION = Domain(-1.0, 1.0, "a correlation")
NONNEGATIVE = Domain(0.0, math.inf, "a norm, ratio, count or duration")
DEGREES = Domain(0.0, 180.0, "an angle in degrees")

REAL = Domain(-math.inf, math.inf, "a real number (a z-score)")


@dataclass(frozen=True)
class ListOf:
    """A key of an object (in a per-key domain) whose value is a list of numbers, each in
    ``domain`` (``fresh_b_null.values``); a bare :class:`Domain` there is one number."""

    domain: Domain

    @property
    def text(self) -> str:
        return f"a list, each {self.domain.text}"


@dataclass(frozen=True)
class Flag:
    """A key of an object (in a per-key domain) whose value is true or false
    (``valid_reference`` of a cosine-table row)."""

    @property
    def text(self) -> str:
        return "true or false"


FLAG = Flag()
# What one key of an object holds: a number in a Domain, a list of them, or a flag.
KeyDomain = Domain | ListOf | Flag
# A field's domain: one Domain for every number in its value, or, for objects holding
# values of several kinds (rows of the cosine table), what each key holds (keys not named:
# unchecked), so a value of the wrong kind under a key is refused.
FieldDomain = Domain | Mapping[str, KeyDomain]


def doc(text: str, default: Any = None, *, factory: Any = None,
        domain: FieldDomain | None = None, required: bool = False,
        inline: bool = False) -> Any:
    """A dataclass field documented by ``text`` (rendered into docs/records.md); ``domain``:
    where its numbers lie, checked when a record is read. ``required``: no default (the
    field must be given). ``inline``: the field holds a dataclass whose fields are written
    as keys of the object holding it (as an epoch entry holds its measures), so they are
    documented and checked in its place."""
    metadata = {"doc": text, "domain": domain, "inline": inline}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=MISSING if required else default, metadata=metadata)


def domain_text(domain: FieldDomain | None) -> str:
    """The domain as docs/records.md states it (``""`` for none)."""
    if domain is None:
        return ""
    if isinstance(domain, Domain):
        return domain.text
    return ", ".join(f"`{key}` {d.text}" for key, d in domain.items())


def as_number(value: Any) -> float | None:
    """A float for int/float values (NaN and inf kept), None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def finite_number(value: Any) -> float | None:
    number = as_number(value)
    return number if number is not None and math.isfinite(number) else None
