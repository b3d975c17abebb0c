"""One epoch's entry of a run record (:class:`EpochEntry`), and how a record's parts are
checked when read (:func:`check_domains`); the run-level parts (final results, end-of-run
block, protocol state) are in :mod:`creditaudit.records.run_parts`.

Each part is a dataclass whose fields carry their documentation and, for numbers, their
domain (:func:`creditaudit.descriptions.fields.doc`), from which ``docs/records.md`` is generated;
:mod:`creditaudit.records.schema` assembles them into a
:class:`~creditaudit.records.schema.RunRecord`. An entry's diagnostics are the one typed
:class:`~creditaudit.descriptions.EpochMeasures` the training loop measured, written as
keys of the entry.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from creditaudit.descriptions import COSINE_INVALID, MEASURES_DERIVED, EpochMeasures
from creditaudit.descriptions.fields import (
    ACCURACY,
    DOMAIN_TOLERANCE,
    NONNEGATIVE,
    Domain,
    FieldDomain,
    Flag,
    KeyDomain,
    ListOf,
    as_number,
    doc,
)
from creditaudit.errors import RunRecordError


def check_domains(part: Any, where: str, prefix: str = "") -> None:
    """Raise RunRecordError when a number of a field of dataclass ``part`` lies outside the
    field's ``domain`` (or is not a number at all). ``where`` starts the message (``run
    record PATH``), ``prefix`` names the part (``final.``, ``log[3].``)."""
    for name, domain, shape in _field_domains(type(part)):
        _check_domain(getattr(part, name), domain, where, prefix + name, shape)
    for name, shape in _field_shapes(type(part)):  # no domain: read as their type says
        _check_shape(getattr(part, name), shape, where, prefix + name)
    for name in _inline_fields(type(part)):  # written as keys of ``part``: named so too
        inner = getattr(part, name)
        if inner is not None:
            check_domains(inner, where, prefix)


# What a field's type says its JSON value is: ("list", items), ("dict", values) or
# ("number", None); None: anything (the domain alone is checked).
Shape = tuple[str, "Shape | None"]
_KINDS = {"list": (list, "a list"), "dict": (Mapping, "an object"),
          "number": ((int, float), "a number")}


def _shape(hint: Any) -> Shape | None:
    """The :data:`Shape` of a type hint (``list[float] | None`` → ("list", ("number", None)))."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _shape(kinds[0]) if len(kinds) == 1 else None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args:
        return ("list", _shape(args[0]))
    if origin is dict and len(args) == 2:
        return ("dict", _shape(args[1]))
    return ("number", None) if hint in (int, float) else None


@functools.cache
def _field_domains(cls: type) -> tuple[tuple[str, FieldDomain, Shape | None], ...]:
    """(name, domain, shape) of the fields of dataclass ``cls`` that declare a domain."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, f.metadata["domain"], _shape(hints[f.name]))
                 for f in dataclasses.fields(cls) if f.metadata.get("domain") is not None)


@functools.cache
def _field_shapes(cls: type) -> tuple[tuple[str, Shape], ...]:
    """(name, shape) of the fields of dataclass ``cls`` without a domain whose type has a
    :data:`Shape` (lists, objects, numbers)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, shape) for f in dataclasses.fields(cls)
                 if f.metadata.get("domain") is None and not f.metadata.get("inline")
                 and (shape := _shape(hints[f.name])) is not None)


def _check_shape(value: Any, shape: Shape | None, where: str, name: str) -> None:
    """Raise RunRecordError when ``value`` (None aside) is not of ``shape``."""
    if value is None or shape is None:
        return
    kind, text = _KINDS[shape[0]]
    if not isinstance(value, kind) or (shape[0] == "number" and isinstance(value, bool)):
        raise RunRecordError(f"{where}: {name} must be {text}, got {reprlib.repr(value)}; the "
                             "record was not written by creditaudit as it is")
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_shape(item, shape[1], where, f"{name}[{index}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_shape(item, shape[1], where, f"{name}.{key}")


@functools.cache
def _inline_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` whose own fields are keys of its object."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("inline"))


def _check_domain(value: Any, domain: FieldDomain, where: str, name: str,
                  shape: Shape | None = None) -> None:
    """Raise RunRecordError when ``value`` is not of ``shape`` (a list where an object
    should be, a list of lists, …: readers index it as its field's type says) or a number
    in it lies outside ``domain``."""
    if value is None:
        return
    if shape is not None:
        _check_shape(value, (shape[0], None), where, name)
    items = None if shape is None else shape[1]
    if type(value) is float and isinstance(domain, Domain) and domain.admits(value):
        return
    if isinstance(value, list):
        suspects: Iterable[int] = range(len(value))
        if isinstance(domain, Domain):  # the common case, a list of floats, in one pass
            low, high = domain.low - DOMAIN_TOLERANCE, domain.high + DOMAIN_TOLERANCE
            suspects = [index for index, item in enumerate(value)
                        if not (type(item) is float and (low <= item <= high or item != item))]
        if items is not None and items[0] != "number":
            suspects = range(len(value))
        for index in suspects:
            _check_domain(value[index], domain, where, f"{name}[{index}]", items)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(domain, Domain):
                _check_domain(item, domain, where, f"{name}.{key}", items)
            else:
                _check_key(item, domain.get(key), where, f"{name}.{key}")
        return
    try:
        number = as_number(value)
    except OverflowError:  # an integer past float's range (10**400): no number we write
        raise RunRecordError(f"{where}: {name} = {reprlib.repr(value)} is too large to be a "
                             "number creditaudit wrote; the record was not written by "
                             "creditaudit as it is") from None
    if not isinstance(domain, Domain):
        problem = f"{name} must be an object, got {reprlib.repr(value)}"
    elif number is None:
        problem = f"{name} must be a number, got {reprlib.repr(value)}"
    elif not domain.admits(number):
        problem = (f"{name} = {reprlib.repr(value)} is outside {domain.text}, the range of "
                   f"{domain.what}")
    else:
        return
    raise RunRecordError(f"{where}: {problem}; the record was not written by creditaudit as "
                         "it is")


def _check_key(value: Any, kind: KeyDomain | None, where: str, name: str) -> None:
    """Raise RunRecordError when ``value``, held by a key of an object whose domain names
    each key's kind (a cosine-table row), is not of that kind (a list where one number
    should be: readers format or compare it) or a number in it lies outside its domain.
    A key the domain does not name, and null, are not checked."""
    if kind is None or value is None:
        return
    if isinstance(kind, Flag):
        if not isinstance(value, bool):
            raise RunRecordError(f"{where}: {name} must be {kind.text}, got "
                                 f"{reprlib.repr(value)}; the record was not written by "
                                 "creditaudit as it is")
    elif isinstance(kind, ListOf):
        _check_domain(value, kind.domain, where, name, ("list", ("number", None)))
    else:
        _check_domain(value, kind, where, name, ("number", None))


# --- one epoch ----------------------------------------------------------------------------
@dataclass
class EpochEntry:
    """One evaluated epoch (epoch 0 = at initialisation): its test and training numbers,
    the diagnostics measured on the evaluation set (``measures``, None on an epoch they did
    not run), the protocol's statuses where it ran, and the rule's own values."""

    epoch: int = doc("epoch number (0 = initialisation, before any training)", 0,
                     domain=NONNEGATIVE)
    test_loss: float | None = doc("mean cross-entropy on the whole test split (nats)",
                                  domain=NONNEGATIVE)
    acc_eval: float | None = doc("test accuracy on the whole test split (fraction); also "
                                 "written as `test_acc`", domain=ACCURACY)
    train_loss: float | None = doc("mean training cross-entropy over the epoch (nats)")
    train_acc: float | None = doc("training accuracy over the epoch (fraction)",
                                  domain=ACCURACY)
    lr: float | None = doc("learning rate at the end of the epoch", domain=NONNEGATIVE)
    seconds: float | None = doc("wall-clock seconds of the epoch (training + evaluation)",
                                domain=NONNEGATIVE)
    measures: EpochMeasures | None = doc(
        "the diagnostics of the epoch on the evaluation set, written as keys of the entry",
        inline=True)
    protocol: dict[str, str] | None = doc(
        "status of each diagnostic at this epoch: fired, passed or not evaluated")
    verdict: str | None = doc("protocol verdict at this epoch")
    extras: dict[str, float] = doc(
        "rule-specific per-epoch values written beside the others, e.g. `state_pred_error`, "
        "`bridge_consistency_error`, `ep_relax_grad_ratio`", factory=dict)

    @property
    def test_acc(self) -> float | None:
        """The test accuracy (the original study's second name of ``acc_eval``)."""
        return self.acc_eval

    @property
    def has_diagnostics(self) -> bool:
        return self.measures is not None

    def __getattr__(self, name: str) -> Any:
        # The spelling before the measures had a type of their own (entry.hidden_norms,
        # entry.h_L_norm, …) reads the epoch's measures: None on an epoch without them.
        if name in _MEASURE_KEYS:
            measures = self.__dict__.get("measures")
            return None if measures is None else getattr(measures, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def value(self, key: str) -> Any:
        """A stored field (the entry's or its measures'), a derived value (:data:`DERIVED`)
        or a rule extra by its record key (None when absent): the one way a series is
        read."""
        if key in _OWN_FIELDS or key == "test_acc" or key in _MEASURE_KEYS:
            return getattr(self, key)  # a measure through __getattr__
        return self.extras.get(key)

    def to_dict(self, *, token_states: bool = False, copies: bool = True) -> dict[str, Any]:
        """The entry as JSON: the stored fields (the measures' as keys of the entry), the
        rule extras, and the original study's key names of values derived from them
        (``test_acc``, ``h_L_norm``, ``g_2_norm``, and ``hidden_norms_cls`` for
        ``token_states``), which scripts reading the files directly expect; reading ignores
        those (they are derived again). Without ``copies`` (record.json) ‖g_L‖ is written
        twice at most, in the gradient norms and as the statistic of (b): ``g_2_norm`` is
        left out where state 2 is the deepest (it is ‖g_L‖), and ``g_L_nonzero_median``
        where no g_L is zero (it is then the median ‖g_L‖ itself;
        :func:`nonzero_median_restored` puts it back on read)."""
        out: dict[str, Any] = {"epoch": self.epoch}
        measures = self.measures
        for name in _ENTRY_FIELDS:
            if name == "measures":
                if measures is not None:
                    out.update(_measure_items(measures, copies))
            elif name not in ("epoch", "extras") and (value := getattr(self, name)) is not None:
                out[name] = value
        h_L = g_2 = None
        if measures is not None:
            deepest = len(measures.bp_grad_norms_per_sample_med) <= 3  # g_2 is g_L
            h_L, g_2 = measures.h_L_norm, None if deepest and not copies else measures.g_2_norm
        for name, value in (("test_acc", self.acc_eval), ("h_L_norm", h_L), ("g_2_norm", g_2)):
            if value is not None:
                out[name] = value
        if token_states and measures is not None:
            out["hidden_norms_cls"] = measures.hidden_norms
        out.update(self.extras)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "log entry",
                  index: int | None = None) -> EpochEntry:
        """The entry ``raw`` of a record's log; ``where`` (``run record PATH``) and
        ``index`` (its place in the log) name it in messages."""
        record, prefix = where, "" if index is None else f"log[{index}]."
        if index is not None:
            where = f"{record}: log entry {index}"
        if not isinstance(raw, Mapping):
            raise RunRecordError(f"{where} is not an object")
        epoch = raw.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise RunRecordError(f"{where} has no integer 'epoch'")
        known = {k: raw[k] for k in _OWN_FIELDS if k in raw and k != "extras"}
        # Derived values (and the copies earlier schemas stored) are read again from the
        # stored ones, never taken from the file.
        extras = {k: v for k, v in raw.items() if k not in _OWN_FIELDS
                  and k not in _MEASURE_FIELDS and k not in DERIVED
                  and k not in WRITTEN_ALIASES}
        for key, value in extras.items():
            if value is not None and as_number(value) is None:
                raise RunRecordError(f"{where}: {key!r} must be a number, got "
                                     f"{type(value).__name__}")
        return cls(**known, measures=_measures(raw, where, record, prefix), extras=extras)


def _measure_items(measures: EpochMeasures, copies: bool) -> dict[str, Any]:
    """The measures' stored fields as keys of their entry (None left out)."""
    items = {name: value for name in _MEASURE_FIELDS
             if (value := getattr(measures, name)) is not None}
    if (not copies and measures.g_L_zero_fraction == 0.0
            and items.get("g_L_nonzero_median") == measures.g_L_norm):
        del items["g_L_nonzero_median"]
    return items


def _measures(raw: Mapping[str, Any], where: str, record: str, prefix: str
              ) -> EpochMeasures | None:
    """The diagnostics an entry holds (None: none); one missing some of the fields every
    measurement writes was not written by creditaudit (a value it holds outside its domain,
    which may be why one was not restored, is named first, as ``record`` ``prefix`` name
    it when the record's domains are checked)."""
    measured = {k: raw[k] for k in _MEASURE_FIELDS if raw.get(k) is not None}
    if not measured:
        return None
    for name in _LIST_MEASURES:  # a number where a list belongs reads as no list
        if name in measured and not isinstance(measured[name], list):
            raise RunRecordError(f"{where}: {name} must be a list (one value per state), got "
                                 f"{reprlib.repr(measured[name])}; the record was not written "
                                 "by creditaudit as it is")
    missing = [name for name in _REQUIRED_MEASURES if name not in measured]
    if missing:
        for name, domain, shape in _field_domains(EpochMeasures):
            if name in measured:
                _check_domain(measured[name], domain, record, prefix + name, shape)
        raise RunRecordError(f"{where} holds diagnostics without {', '.join(missing)}; the "
                             "record was not written by creditaudit as it is")
    _check_invalid(measured.get("cos_invalid"), measured.get("cos_valid"), where)
    return EpochMeasures(**measured)


def _check_invalid(reasons: Any, valid: Any, where: str) -> None:
    """``cos_invalid``: null or one of :data:`COSINE_INVALID` per state, null exactly where
    ``cos_valid`` says valid (None: a record from before the field)."""
    if reasons is None:
        return
    fine = isinstance(reasons, list) and all(r is None or r in COSINE_INVALID for r in reasons)
    if fine and isinstance(valid, list):
        fine = len(valid) == len(reasons) and all(
            (r is None) == (v is True) for r, v in zip(reasons, valid))
    if not fine:
        raise RunRecordError(
            f"{where}: cos_invalid = {reprlib.repr(reasons)} is not a list of null or "
            f"{', '.join(COSINE_INVALID)} agreeing with cos_valid; the record was not "
            "written by creditaudit as it is")


def nonzero_median_restored(raw: Any) -> Any:
    """A stored entry (schema 4 on) with ``g_L_nonzero_median`` put back where
    :meth:`EpochEntry.to_dict` left it out: no g_L is zero, so the median over the non-zero
    ones is the median ‖g_L‖. Anything else is returned as it is (checked when read)."""
    if (not isinstance(raw, Mapping) or "g_L_nonzero_median" in raw
            or raw.get("g_L_zero_fraction") != 0.0):
        return raw
    grads = raw.get("bp_grad_norms_per_sample_med")
    if not isinstance(grads, list) or not grads:
        return raw
    return {**raw, "g_L_nonzero_median": grads[-1]}


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EpochEntry))
_OWN_FIELDS = tuple(name for name in _ENTRY_FIELDS if name != "measures")
_MEASURE_FIELDS = tuple(f.name for f in dataclasses.fields(EpochMeasures))
_REQUIRED_MEASURES = tuple(f.name for f in dataclasses.fields(EpochMeasures)
                           if f.default is dataclasses.MISSING)
_MEASURE_KEYS = (*_MEASURE_FIELDS, *MEASURES_DERIVED)
# The measures that hold one value per state or layer (their type is a list).
_LIST_MEASURES = tuple(name for name, tp in typing.get_type_hints(EpochMeasures).items()
                       if name in _MEASURE_FIELDS and list in (
                           typing.get_origin(tp), *map(typing.get_origin, typing.get_args(tp))))
# Values an entry derives from its stored fields (properties), and the keys earlier schemas
# stored for them: read again, never from the file.
DERIVED = ("test_acc", *MEASURES_DERIVED)
WRITTEN_ALIASES = ("hidden_norms_cls",)
# The keys an entry's own values are written under or read from (its fields, its measures,
# what is derived from them): an extra named like one would replace that value in
# record.json (extras are written last), or be dropped when the record is read.
RECORD_KEYS = frozenset((*_OWN_FIELDS, *_MEASURE_FIELDS, *DERIVED, *WRITTEN_ALIASES))
