"""Strict JSON for run records and reports: no ``NaN`` or ``Infinity`` tokens.

Python's ``json`` writes NaN and ±inf as the bare tokens ``NaN`` and ``Infinity``, which no
strict parser (``jq``, JavaScript's ``JSON.parse``, Go, Rust's serde) accepts. The tool's
numbers can legitimately be non-finite — an undefined cosine of a zero vector is NaN, the
growth of a stream whose norm is 0 is infinite — so instead of dropping them, :func:`dumps`
writes ``null`` in their place and lists every such place in one top-level object::

    {"deep_cos": null, ..., "non_finite": {"/deep_cos": "NaN", "/log/3/max_block_growth":
     "Infinity"}}

The keys are JSON Pointers (RFC 6901) into the document, the values ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``. :func:`loads` puts the values back, so a round trip is
lossless, while a strict reader sees ``null`` plus the reason. Files written before this
scheme (with bare ``NaN`` tokens) still load.

:func:`loads` also refuses a document nested deeper than :data:`MAX_DEPTH` arrays and
objects (a record nests seven deep) before parsing it: the standard parser recurses once
per level, so 200 000 ``[`` would end in a RecursionError instead of a clear refusal.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

NON_FINITE_KEY = "non_finite"
MAX_DEPTH = 64
# A JSON string, escapes included, or an unterminated one up to the end of the text: every
# quote outside a string starts a match, so the scan never restarts inside a string and
# stays linear.
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_CHUNK = 2**20
_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def encode(obj: Any) -> tuple[Any, dict[str, str]]:
    """(a copy of ``obj`` with non-finite floats replaced by None, {pointer: name})."""
    marks: dict[str, str] = {}

    def walk(value: Any, pointer: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            marks[pointer] = _name(value)
            return None
        if isinstance(value, dict):
            return {key: walk(item, f"{pointer}/{_escape(str(key))}")
                    for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [walk(item, f"{pointer}/{index}") for index, item in enumerate(value)]
        return value

    return walk(obj, ""), marks


def dumps(obj: Any, *, indent: int | None = 1) -> str:
    """Strict JSON text of ``obj``; non-finite floats become null (see the module doc).

    ``obj`` must be a dict when it holds non-finite values (the marks live at its top level).
    """
    clean, marks = encode(obj)
    if marks:
        if not isinstance(clean, dict):
            raise ValueError("non-finite values can only be marked inside a JSON object")
        clean[NON_FINITE_KEY] = marks
    return json.dumps(clean, indent=indent, allow_nan=False, ensure_ascii=False)


def decode(obj: Any) -> Any:
    """Put the marked non-finite values of a parsed document back (removes the marks)."""
    if not isinstance(obj, dict) or not isinstance(obj.get(NON_FINITE_KEY), dict):
        return obj
    marks = obj.pop(NON_FINITE_KEY)
    for pointer, name in marks.items():
        if name not in _NAMES or not isinstance(pointer, str) or not pointer.startswith("/"):
            raise ValueError(f"bad non-finite mark {pointer!r}: {name!r}")
        tokens = [_unescape(t) for t in pointer[1:].split("/")]
        parent: Any = obj
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if isinstance(parent, list):
            parent[int(last)] = _NAMES[name]
        else:
            parent[last] = _NAMES[name]
    return obj


class TooDeep(ValueError):
    """A JSON document nested deeper than the parser is allowed to go."""


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (parsers disagree on which value counts)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for :func:`json.loads`: the object, or :class:`DuplicateKey`
    when it names a key twice (Python keeps the last value, other readers the first)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"names the key {key!r} twice in one object")
        out[key] = value
    return out


def keys_spelled_alike(value: Any) -> tuple[tuple[Any, Any], str] | None:
    """The first two keys of one object in ``value`` (nested dicts, lists and tuples searched)
    that ``json.dumps`` writes as one string (``1`` and ``"1"``: a JSON object would name the
    key twice, one value lost), with that string; None when there are none."""
    if isinstance(value, dict):
        seen: dict[str, Any] = {}
        for key in value:
            spelled = key if isinstance(key, str) else _json_key(key)
            if spelled is None:
                continue
            if spelled in seen:
                return (seen[spelled], key), spelled
            seen[spelled] = key
        inner: Any = value.values()
    elif isinstance(value, list | tuple):
        inner = value
    else:
        return None
    return next((clash for item in inner if (clash := keys_spelled_alike(item))), None)


def _json_key(key: Any) -> str | None:
    """How ``json.dumps`` spells a key that is no string (None: it cannot be a key)."""
    try:
        return next(iter(json.loads(json.dumps({key: None}))))
    except (TypeError, ValueError):
        return None


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON ``text`` (0 for a bare value): the largest
    number of brackets open at once, brackets inside strings left out. Malformed text is
    measured all the same (200 000 unclosed ``[`` nest 200 000 deep).

    Linear and without recursion: strings are cut out by one regular expression, then the
    running count of open brackets is a cumulative sum (numpy, 2**20 brackets at a time).
    """
    import numpy as np

    outside = _STRING.sub("", text).encode("utf-8", "surrogatepass")
    brackets = np.frombuffer(outside.translate(_SQUARE, _NOT_BRACKET), dtype=np.uint8)
    level, deepest = 0, 0
    for start in range(0, brackets.size, _CHUNK):
        levels = np.cumsum(np.where(brackets[start:start + _CHUNK] == ord("["), 1, -1)) + level
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`TooDeep` when ``text`` nests deeper than ``limit`` (see
    :func:`nesting_depth`)."""
    depth = nesting_depth(text)
    if depth > limit:
        raise TooDeep(f"nests arrays and objects {depth} levels deep, more than the {limit} "
                      "creditaudit reads (its records nest fewer than 10)")


def loads(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON (strict, or with the bare NaN tokens older files have) and restore marks;
    :class:`TooDeep` (a ValueError) when nested deeper than ``max_depth``."""
    check_depth(text, max_depth)
    return decode(json.loads(text))


def check_strict(text: str) -> Any:
    """Parse ``text`` as a strict parser would (bare NaN/Infinity raise ValueError)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)
