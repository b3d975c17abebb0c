"""From diagnostic results to a verdict, and the words tables print for it.

The verdict is *needs walk-back* (naming the diagnostics that fired) when any fires,
*trustworthy* only when every diagnostic of the protocol was evaluated and none fired, and
*incomplete* otherwise — printed as "no walk-back in (a)–(c); (d) not evaluated". A
diagnostic that cannot be evaluated is never counted as passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditaudit.blame import blame
from creditaudit.protocol.checks import (
    FIRED,
    INCOMPLETE,
    NOT_EVALUATED,
    TRUSTWORTHY,
    WALK_BACK,
    DiagnosticResult,
    Thresholds,
)
from creditaudit.protocol.diagnostics import (
    Evidence,
    ProtocolDiagnostic,
    default_names,
    protocol,
)
from creditaudit.registry import DIAGNOSTICS


def order() -> list[str]:
    """Every installed diagnostic's id, in listing order (what "consecutive" means)."""
    return [cls.name for cls in DIAGNOSTICS.classes()]


def in_order(ids: Iterable[str]) -> list[str]:
    """The distinct ``ids`` in listing order (ids of diagnostics not installed here last,
    as first seen): the columns, panels and rows of whatever diagnostics records hold."""
    distinct = list(dict.fromkeys(ids))
    known = {name: i for i, name in enumerate(order())}
    return sorted(distinct, key=lambda i: (known.get(i, len(known)), distinct.index(i)))


def labels(ids: Sequence[str]) -> str:
    """Diagnostic ids as their labels, ``(a)(b)``; three or more consecutive ids as a range,
    ``(a)–(c)``."""
    ids = list(ids)
    known = order()
    if len(ids) >= 3 and all(i in known for i in ids):
        positions = [known.index(i) for i in ids]
        if positions == list(range(positions[0], positions[0] + len(ids))):
            return f"({ids[0]})–({ids[-1]})"
    return "".join(f"({i})" for i in ids)


def verdict_from(fired: Sequence[str], not_evaluated: Sequence[str]) -> str:
    return WALK_BACK if fired else (INCOMPLETE if not_evaluated else TRUSTWORTHY)


def verdict_of(results: Sequence[DiagnosticResult]) -> tuple[str, list[str], list[str]]:
    """(verdict, fired ids, not-evaluated ids) of a protocol's results."""
    fired = [r.id for r in results if r.status == FIRED]
    skipped = [r.id for r in results if r.status == NOT_EVALUATED]
    return verdict_from(fired, skipped), fired, skipped


def verdict_phrase(statuses: Mapping[str, str]) -> str:
    """What a table prints for a protocol's statuses (id → status, in protocol order):
    ``trustworthy`` only when all were evaluated and none fired; ``needs walk-back (a)(b)``
    (plus what was not evaluated); otherwise ``no walk-back in (a)–(c); (d) not
    evaluated``."""
    fired = [i for i, s in statuses.items() if s == FIRED]
    skipped = [i for i, s in statuses.items() if s == NOT_EVALUATED]
    if fired:
        text = f"{WALK_BACK} {labels(fired)}"
        return text + (f"; {labels(skipped)} not evaluated" if skipped else "")
    if skipped:
        evaluated = [i for i in statuses if i not in skipped]
        head = f"no walk-back in {labels(evaluated)}; " if evaluated else ""
        return f"{head}{labels(skipped)} not evaluated"
    return TRUSTWORTHY


def statuses_of(results: Sequence[DiagnosticResult]) -> dict[str, str]:
    return {r.id: r.status for r in results}


@dataclass
class Protocol:
    """The diagnostics a run is judged by and the options (thresholds) of each.

    ``options[name]`` is the diagnostic's ``Options`` instance (or any object with its
    fields — a :class:`Thresholds` serves the four built-ins).
    """

    diagnostics: tuple[type[ProtocolDiagnostic], ...]
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def default(cls, thresholds: Thresholds | None = None) -> Protocol:
        """The four built-ins with ``thresholds`` (default: the calibrated ones)."""
        thresholds = thresholds or Thresholds()
        diagnostics = protocol()
        return cls(diagnostics, {d.name: d.options_from(thresholds) for d in diagnostics})

    @classmethod
    def of(cls, names: Sequence[str], options: Mapping[str, Any] | None = None,
           thresholds: Thresholds | None = None) -> Protocol:
        """The diagnostics ``names`` with ``options`` (name → Options; the built-ins fall
        back to ``thresholds``, everything else to its own defaults)."""
        diagnostics = protocol(names)
        given = dict(options or {})
        thresholds = thresholds or Thresholds()
        resolved = {d.name: given[d.name] if d.name in given else d.options_from(thresholds)
                    for d in diagnostics}
        return cls(diagnostics, resolved)

    @classmethod
    def from_config(cls, diagnostics: Any) -> Protocol:
        """The protocol a config's ``[diagnostics]`` section selects (``protocol``, default
        the built-in four) with each diagnostic's options table (its thresholds)."""
        names = diagnostics.protocol or default_names()
        chosen = protocol(names)
        return cls(chosen, {d.name: getattr(diagnostics, d.name, None) or d.Options()
                            for d in chosen})

    def thresholds(self) -> Thresholds:
        """The built-ins' thresholds of this protocol (defaults where one is not in it)."""
        values: dict[str, Any] = {}
        for d in self.diagnostics:
            for name in d.option_names():
                if name in Thresholds.__dataclass_fields__:
                    values[name] = getattr(self.options[d.name], name)
        return Thresholds(**values)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.diagnostics]

    def evaluate(self, evidence: Evidence) -> list[DiagnosticResult]:
        """Every diagnostic's result on ``evidence``, in protocol order (what a plugin's
        ``evaluate`` raises is one line naming it: :func:`creditaudit.blame.blame`)."""
        results = []
        for d in self.diagnostics:
            with blame(DIAGNOSTICS.guest(d.name)):
                results.append(d.evaluate(evidence, self.options[d.name]))
        return results

    def diagnostic(self, name: str) -> type[ProtocolDiagnostic]:
        return next(d for d in self.diagnostics if d.name == name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """name → its options as a plain dict (what reports record)."""
        import dataclasses

        return {d.name: {f: getattr(self.options[d.name], f) for f in d.option_names()}
                for d in self.diagnostics if dataclasses.is_dataclass(d.Options)}


__all__ = ["labels", "in_order", "verdict_from", "verdict_of", "verdict_phrase", "statuses_of",
           "order", "Protocol"]
