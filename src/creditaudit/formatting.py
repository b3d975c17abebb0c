"""Number and table formatting shared by every rendering."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

# Verdict colours of every rendering (report.html, the figures): Paul Tol's high-contrast
# scheme, distinct in every common colour-vision deficiency and in greyscale, and Tol's grey
# for a run whose reference gradient failed its check (its cosines measure nothing).
PASS_COLOR, WALK_BACK_COLOR, INCOMPLETE_COLOR = "#004488", "#BB5566", "#DDAA33"
UNVERIFIED_COLOR = "#BBBBBB"
# The figures' points of a frozen-blocks run, the baseline of (d) (the tables print its
# verdict cell uncoloured).
BASELINE_KIND, BASELINE_COLOR = "baseline", "#000000"
# A verdict's kind (creditaudit.protocol.KINDS) → its colour, and the text colour on it.
VERDICT_COLORS = {"pass": PASS_COLOR, "walk-back": WALK_BACK_COLOR,
                  "incomplete": INCOMPLETE_COLOR, "unverified": UNVERIFIED_COLOR}
TEXT_ON = {"pass": "#ffffff", "walk-back": "#ffffff", "incomplete": "#000000",
           "unverified": "#000000"}


def fmt(value: Any, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec)


# A format spec with a precision: ``+.2f``, ``.3g``, ``.0%``.
_PRECISION = re.compile(r"^(?P<head>[^.]*)\.(?P<digits>\d+)(?P<kind>[efgEFG%])$")
MORE_DIGITS = 6  # telling_number adds at most this many digits


def telling_number(value: float, spec: str, operator: str, threshold: float) -> str:
    """``value`` formatted with ``spec``, with as many more digits (at most
    :data:`MORE_DIGITS`) as it takes for the number shown to lie on the same side of
    ``threshold`` (``operator`` ``>`` or ``<`` says which side fires) as ``value`` does: a
    margin of 1.997 below 2 reads ``+1.997``, not ``+2.00``; a growth of 50.04 above 50
    reads ``50.04``, not ``50``. Every other value reads as ``spec`` formats it, and so does
    any value where ``spec`` has no precision or either number is not finite."""
    text = f"{value:{spec}}"
    match = _PRECISION.match(spec)
    if match is None or not (math.isfinite(value) and math.isfinite(threshold)):
        return text
    fires = value > threshold if operator == ">" else value < threshold
    kind = match["kind"]
    for extra in range(MORE_DIGITS + 1):
        digits = int(match["digits"]) + extra
        # The number shown, read back without the spec's sign, grouping or fill (a plugin's
        # ``,.0f`` writes 1,234, which float() does not read).
        shown = float(f"{value:.{digits}{kind}}".rstrip("%")) / (100 if kind == "%" else 1)
        if (shown > threshold if operator == ">" else shown < threshold) == fires:
            return f"{value:{match['head']}.{digits}{kind}}"
    return text


def exact_exponent(value: float) -> str:
    """``value`` in exponent notation with the fewest digits that give it back exactly:
    ``1e-07`` for 1e-7, ``1.5e-07`` for 1.5e-7 (which ``.0e`` writes ``1e-07``)."""
    if not math.isfinite(value):
        return f"{value:e}"
    for digits in range(17):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            return text
    return f"{value:.16e}"


def duration(seconds: float | None) -> str:
    """``83.2`` → ``1m23s``, ``7325`` → ``2h02m``; None → ``?`` (e.g. no ETA yet)."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def counted(n: int, noun: str) -> str:
    """``1, "run record"`` → ``1 run record``, ``2, "run record"`` → ``2 run records``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_lambda(value: float) -> str:
    """``1e-2`` style for penalties (``0`` for none, ``2.5e-3`` keeps its mantissa)."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def one_line(text: Any) -> str:
    """``text`` on one line: every line break Python knows (``\\n``, ``\\r``, ``\\x0b``,
    ``\\x0c``, ``\\x1c``–``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029``) becomes a
    space, as a Markdown renderer, a terminal or an editor may break a line at any of them."""
    return " ".join(str(text).splitlines())


def error_text(err: BaseException, limit: int = 300) -> str:
    """``err``'s message on one line (whitespace runs joined, at most ``limit``
    characters), or its type's name when it has none: how a guest's own error (a
    network's, a factory's, another library's) is named inside one of our lines."""
    text = " ".join(str(err).split())
    return text[:limit] if text else type(err).__name__


# Unicode's bidirectional embeddings, overrides and isolates (U+202A–U+202E,
# U+2066–U+2069): a run id holding U+202E shows its end reversed, other text after it too.
# Zero-width joiners and other format characters stay (emoji need them).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def plain_line(text: Any) -> str:
    """``text`` (a guest's: a plugin's label, an exception's message, a record's string) on
    one line (:func:`one_line`) and with every other control character (``\\x1b``,
    ``\\t``, ``\\x00``, …) and every bidirectional override (``\\u202e``, …) as a space:
    no terminal runs its escape sequences, no text reads reversed, no font needs a glyph for
    it, and LaTeX and HTML accept it."""
    return "".join(" " if c in _BIDI or unicodedata.category(c) == "Cc" else c
                   for c in one_line(text))


# What could make text read as Markdown markup rather than as itself: backslash escapes,
# code spans, emphasis, links and images (``[``; ``![`` needs it), table cells, GFM
# strikethrough; ``<`` only where it could open an autolink or raw HTML (before a letter,
# ``/``, ``!`` or ``?``: ``< 1 nats`` stays readable); ``&`` only where it would start an
# entity; ``_`` inside a word (``out_ln``) opens no emphasis, so it stays readable; ``#``
# and ``>`` only at the start, where they would begin a heading or a quote.
_MARKUP = re.compile(r"[\\`*\[\]|~]|<(?=[A-Za-z/!?])|&(?=#?[0-9A-Za-z]+;)|_(?![^\W_])"
                     r"|(?<![^\W_])_|^\s*[#>]")

_PIPE = re.compile(r"(?<!\\)\|")


def markdown_text(text: Any) -> str:
    """``text`` (a run id, a name, an error, a path: anything read from a record or a file
    name) as Markdown that reads as exactly that text, on one line (:func:`plain_line`): it
    can form no link, image, heading or emphasis, nor end a table cell."""
    return _MARKUP.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], plain_line(text))


def cell(text: Any) -> str:
    """A Markdown table cell of ``text`` (Markdown: text from records is
    :func:`markdown_text` already): on one line, its pipes escaped (those that are not)."""
    return _PIPE.sub("\\\\|", one_line(text))


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (cells escaped) of ``rows`` under ``header``."""
    lines = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
