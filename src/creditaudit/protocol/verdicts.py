"""From diagnostic results to a verdict, and the words and colour every output shows.

:func:`judge` is the one place a verdict is decided: *needs walk-back* (naming the
diagnostics that fired) when any fires; *unverified* when the reference gradient failed its
check and the run was allowed to go on (every cosine, Γ and (b) is then the model's own
credit, not a measure); *incomplete* when a diagnostic — or the reference check — was not
evaluated, printed as "no walk-back in (a)–(c); (d) not evaluated"; *trustworthy* only when
all were evaluated, none fired and the reference was not found wanting. A diagnostic that
cannot be evaluated is never counted as passed. Reports (:attr:`DiagnosticReport.judgement
<creditaudit.protocol.evaluate.DiagnosticReport.judgement>`) and records
(:func:`creditaudit.protocol.records.record_verdict`) both ask it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from creditaudit.errors import ConfigError
from creditaudit.guests.blame import blame
from creditaudit.guests.settings import settings_kept
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
    DirectionStability,
    Evidence,
    ProtocolDiagnostic,
    ReferenceValidity,
    ResidualStreamScale,
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


UNVERIFIED = "unverified"
# What each verdict is, for every rendering that colours or counts verdicts: the CSS class of
# report.html and the colour of the figures (creditaudit.formatting.VERDICT_COLORS).
KINDS = {TRUSTWORTHY: "pass", WALK_BACK: "walk-back", INCOMPLETE: "incomplete",
         UNVERIFIED: "unverified"}
UNVERIFIED_MARK = "(unverified)"  # after every number measured against such a reference


@dataclass(frozen=True)
class Judgement:
    """A protocol's outcome as every output shows it (:func:`judge`).

    ``verdict``: *needs walk-back* when a diagnostic fired; else *unverified* when the
    reference gradient failed its check (the run was allowed to go on); else *incomplete*
    when a diagnostic, or the reference check, was not evaluated; else *trustworthy*.
    ``text``: what tables print; ``kind``: its colour class (:data:`KINDS`);
    ``reference_verified``: None when the caller said nothing of the reference (a report
    of :func:`~creditaudit.protocol.evaluate_protocol` on gradients it was given);
    ``reference_note``: why the reference is not verified (empty when it is).
    """

    verdict: str
    text: str
    fired: tuple[str, ...]
    not_evaluated: tuple[str, ...]
    reference_verified: bool | None = None
    reference_note: str = ""
    reference_failed: bool = False

    @property
    def kind(self) -> str:
        return KINDS[self.verdict]

    @property
    def walked_back(self) -> bool:
        return self.verdict == WALK_BACK

    def mark(self, text: str) -> str:
        """``text`` — a cosine, Γ or (b)'s value, all measured against the reference
        gradient — with :data:`UNVERIFIED_MARK` when the reference is not verified; a
        missing value (``—``) stays as it is."""
        if self.reference_verified is False and text.strip() not in ("", "—", "n/e"):
            return f"{text} {UNVERIFIED_MARK}"
        return text


def reads_reference(id_: str) -> bool:
    """Whether diagnostic ``id_``'s statistic is computed from the reference gradient ((b)
    its norm, (c) its batch means): marked with the cosines when the reference is not
    verified."""
    return id_ in (ReferenceValidity.name, DirectionStability.name)


def reference_note(reference: Mapping[str, Any] | None) -> tuple[bool | None, bool, str]:
    """(verified — None when not stated —, whether the check failed, why it is not
    verified) of a reference block (a record's ``reference``, a report's
    ``metadata["reference_check"]``)."""
    if reference is None:
        return None, False, ""
    if reference.get("verified"):
        return True, False, ""
    how, where = reference.get("how"), reference.get("where")
    if how == "failed":
        return False, True, "reference gradient failed its check" + (
            f" at `{where}`" if where else "")
    if how == "not checked":
        return False, False, str(reference.get("detail") or "reference not checked")
    if how == "built-in":  # recorded before the check, on one of creditaudit's own models
        return None, False, ""
    return False, False, "reference gradient not verified"


def judge(statuses: Mapping[str, str], reference: Mapping[str, Any] | None = None
          ) -> Judgement:
    """The verdict of a protocol's ``statuses`` (id → fired / passed / not evaluated, in
    protocol order) on a run whose reference gradient is ``reference`` (a check's block;
    None: not stated) — the one function every verdict, its words and its colour come from.

    Texts: ``trustworthy``; ``needs walk-back (a)(b)`` (plus what was not evaluated);
    ``unverified: reference gradient failed its check at `out_head`; no walk-back in
    (a)–(d)``; ``no walk-back in (a)–(c); (d) not evaluated``. A reference that is not
    verified is named after them, unless the verdict already says so.
    """
    fired = [i for i, s in statuses.items() if s == FIRED]
    skipped = [i for i, s in statuses.items() if s == NOT_EVALUATED]
    evaluated = [i for i in statuses if i not in skipped]
    verified, failed, note = reference_note(reference)
    parts = []
    if fired:
        verdict = WALK_BACK
        parts.append(f"{WALK_BACK} {labels(fired)}")
    elif failed:
        verdict = UNVERIFIED
        parts.append(f"{UNVERIFIED}: {note}")
        note = ""
    elif skipped or verified is False:
        verdict = INCOMPLETE
    else:
        verdict = TRUSTWORTHY
    if not fired and verdict != TRUSTWORTHY and evaluated:
        parts.append(f"no walk-back in {labels(evaluated)}")
    if skipped:
        parts.append(f"{labels(skipped)} not evaluated")
    if note:
        parts.append(note)
    return Judgement(verdict, "; ".join(parts) or TRUSTWORTHY, tuple(fired), tuple(skipped),
                     verified, reference_note(reference)[2], failed)


def verdict_of(results: Sequence[DiagnosticResult],
               reference: Mapping[str, Any] | None = None) -> tuple[str, list[str], list[str]]:
    """(verdict, fired ids, not-evaluated ids) of a protocol's results (:func:`judge`)."""
    judged = judge(statuses_of(results), reference)
    return judged.verdict, list(judged.fired), list(judged.not_evaluated)


def verdict_phrase(statuses: Mapping[str, str],
                   reference: Mapping[str, Any] | None = None) -> str:
    """What a table prints for a protocol's statuses: :attr:`Judgement.text`."""
    return judge(statuses, reference).text


def statuses_of(results: Sequence[DiagnosticResult]) -> dict[str, str]:
    return {r.id: r.status for r in results}


@dataclass
class Protocol:
    """The diagnostics a run is judged by, each an instance holding its options (its
    thresholds: an ``Options`` instance, or any object with its fields — a
    :class:`Thresholds` serves the four built-ins)."""

    diagnostics: tuple[ProtocolDiagnostic[Any], ...]

    def __post_init__(self) -> None:
        """A one-line ConfigError for a protocol of no diagnostic (``Protocol.of([])``):
        its verdict would be *trustworthy* with nothing evaluated, as a config's
        ``diagnostics.protocol = []`` is refused for."""
        if not self.diagnostics:
            example = ", ".join(f'"{name}"' for name in default_names()[:2])
            raise ConfigError(f"a protocol of no diagnostic judges nothing (its verdict would "
                              f"be trustworthy): name at least one, e.g. Protocol.of([{example}"
                              "]), or take Protocol.default()")

    @classmethod
    def default(cls, thresholds: Thresholds | None = None) -> Protocol:
        """The four built-ins with ``thresholds`` (default: the calibrated ones)."""
        thresholds = thresholds or Thresholds()
        return cls(tuple(type(d)(d.options_from(thresholds)) for d in protocol()))

    @classmethod
    def of(cls, names: Sequence[str], options: Mapping[str, Any] | None = None,
           thresholds: Thresholds | None = None) -> Protocol:
        """The diagnostics ``names`` with ``options`` (name → Options; the built-ins fall
        back to ``thresholds``, everything else to its own defaults)."""
        given = dict(options or {})
        thresholds = thresholds or Thresholds()
        return cls(tuple(d if d.name in given else type(d)(d.options_from(thresholds))
                         for d in protocol(names, given)))

    @classmethod
    def from_config(cls, diagnostics: Any) -> Protocol:
        """The protocol a config's ``[diagnostics]`` section selects (``protocol``, default
        the built-in four) with each diagnostic's options table (its thresholds)."""
        return cls(protocol(diagnostics.protocol or default_names(), diagnostics))

    @property
    def options(self) -> dict[str, Any]:
        """name → the options that diagnostic holds."""
        return {d.name: d.options for d in self.diagnostics}

    def thresholds(self) -> Thresholds:
        """The built-ins' thresholds of this protocol (defaults where one is not in it)."""
        values = {name: value for name, (value, _) in self._held().items()}
        return Thresholds.as_recorded(values)  # its options were checked when built

    def _held(self) -> dict[str, tuple[Any, str]]:
        """The :class:`Thresholds` fields its diagnostics' options hold: their values and
        the diagnostic holding each."""
        return {name: (getattr(d.options, name), d.name) for d in self.diagnostics
                for name in d.option_names() if name in Thresholds.__dataclass_fields__}

    def agreeing(self, thresholds: Thresholds | None) -> Thresholds:
        """The thresholds this protocol judges by (:meth:`thresholds`), with ``thresholds``'
        fields that none of its diagnostics holds (the floor of a cosine table whose
        protocol has no (b)): what a report of it records. ConfigError (one line) when
        ``thresholds`` sets a field one of its diagnostics holds otherwise — given both, the
        protocol judges by its own, and the report would record the other."""
        if thresholds is None:
            return self.thresholds()
        held = self._held()
        clash = [f"{name}={getattr(thresholds, name)!r} (its ({holder}) holds {mine!r})"
                 for name, (mine, holder) in held.items() if getattr(thresholds, name) != mine]
        if clash:
            raise ConfigError(f"thresholds= and protocol= disagree: {', '.join(clash)}; give "
                              "the thresholds in the protocol's options (Protocol.default("
                              "thresholds)) and leave thresholds= out")
        return Thresholds.as_recorded({**thresholds.to_dict(),
                                       **{name: value for name, (value, _) in held.items()}})

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.diagnostics]

    def evaluate(self, evidence: Evidence) -> list[DiagnosticResult]:
        """Every diagnostic's result on ``evidence``, in protocol order; a result that
        claims what its statistic cannot show is not evaluated
        (:meth:`ProtocolDiagnostic.checked`), and what a plugin's ``evaluate`` raises is one
        line naming it (:func:`creditaudit.guests.blame.blame`); a torch setting one changes
        (a plugin's, or a diagnostic of the caller's own) is put back and it is refused in
        one line naming it (:func:`creditaudit.guests.settings.settings_kept`). On an
        untrained network (``evidence.trained`` False) a diagnostic that means nothing
        before training is not evaluated (:meth:`ProtocolDiagnostic.assess`). (b) calls the
        stream grown by this protocol's (a) threshold (``evidence.growth_limit``, unless the
        evidence sets it), so the two never disagree. The built-ins read ``evidence`` as it
        is; every other diagnostic (a plugin) reads it on the CPU (:meth:`Evidence.on_cpu`),
        as the conformance suite checked it: in a CUDA run its tensors are moved once, for
        them — each gets a copy of its own, so one that changes its evidence (which the
        suite checks only on its tiny cases) changes neither the record's numbers nor
        another's."""
        if evidence.growth_limit is None:
            evidence = dataclasses.replace(evidence, growth_limit=self.growth_limit())
        builtins = DIAGNOSTICS.builtin_classes()
        on_cpu: Evidence | None = None
        results = []
        for d in self.diagnostics:
            if type(d) in builtins:
                given = evidence
            else:  # its own copy: what it changes reaches no other diagnostic, nor the record
                on_cpu = evidence.on_cpu() if on_cpu is None else on_cpu
                given = copy.deepcopy(on_cpu)
            guest = DIAGNOSTICS.guest(d.name)
            # a caller's own diagnostic (no plugin) leaves torch's settings as a plugin must
            kept = (contextlib.nullcontext() if guest is not None or type(d) in builtins else
                    settings_kept(f"diagnostic {d.name!r} "
                                  f"({type(d).__module__}:{type(d).__qualname__})"))
            with blame(guest), kept:
                results.append(d.assess(given))
        return results

    def growth_limit(self) -> float:
        """The growth factor above which this protocol's (a) fires (its default when the
        protocol has no (a))."""
        a = next((d for d in self.diagnostics if isinstance(d, ResidualStreamScale)),
                 ResidualStreamScale())
        return a.limit()

    def diagnostic(self, name: str) -> ProtocolDiagnostic[Any]:
        return next(d for d in self.diagnostics if d.name == name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """name → its options as a plain dict (what reports record)."""
        return {d.name: {f: getattr(d.options, f) for f in d.option_names()}
                for d in self.diagnostics if dataclasses.is_dataclass(d.Options)}


__all__ = ["labels", "in_order", "judge", "Judgement", "reference_note", "reads_reference",
           "verdict_of",
           "verdict_phrase", "statuses_of", "order", "Protocol", "UNVERIFIED", "KINDS",
           "UNVERIFIED_MARK"]
