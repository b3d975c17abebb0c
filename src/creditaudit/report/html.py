"""A self-contained HTML page from the reports' Markdown (markdown-it-py, CommonMark with
tables); images are embedded as base64 data URIs so the page opens anywhere on its own —
only the files the caller hands over by name, never a path the Markdown's text names.

Two things Markdown cannot say are added while rendering: a CSS class on table cells and
bold text that ``classify`` names (the report colours verdicts by meaning with it: it is
told each cell's column, so only a verdict column's cells are coloured), and the
class ``interactive`` on the tables of a fragment rendered with ``interactive=True``: the
page's one inline script (:data:`SCRIPT`) gives those a filter box and sortable columns.
Without JavaScript the tables read as plain tables.
"""

from __future__ import annotations

import base64
import html
import io
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

from creditaudit.formatting import TEXT_ON, VERDICT_COLORS, WALK_BACK_COLOR

# One rule per verdict kind: bold, its colour behind, readable text on it.
VERDICT_CSS = "\n".join(
    f"td.{kind}, tr:nth-child(even) td.{kind}, strong.{kind} {{ background: {color}; "
    f"color: {TEXT_ON[kind]}; font-weight: bold; }}\nstrong.{kind} {{ padding: .1em .4em; }}"
    for kind, color in VERDICT_COLORS.items())

# Verdicts by meaning (the words are always there too): white on blue, white on red, black
# on yellow, black on grey — each at least 4.5:1, WCAG AA for text.
CSS = f"""
body {{ font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }}
h1, h2, h3 {{ border-bottom: 1px solid #ddd; padding-bottom: .2em; }}
h3 {{ font-size: 1.05em; }}
table {{ border-collapse: collapse; margin: .8em 0; font-size: .85em; display: block;
        overflow-x: auto; }}
th, td {{ border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; }}
tr:nth-child(even) td {{ background: #fafafa; }}
pre {{ background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }}
code {{ background: #f6f8fa; padding: 0 .2em; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
{VERDICT_CSS}
strong.fired {{ color: {WALK_BACK_COLOR}; }}
details {{ margin: .3em 0; }}
summary {{ cursor: pointer; }}
.table-tools {{ margin: .8em 0 -.4em; font-size: .85em; }}
.table-tools input {{ width: 22em; padding: .2em .4em; }}
.table-tools span {{ margin-left: .8em; color: #555; }}
th button {{ font: inherit; font-weight: bold; border: 0; background: none; padding: 0;
            cursor: pointer; text-align: left; }}
th[aria-sort=ascending] button::after {{ content: " \\25B2"; }}
th[aria-sort=descending] button::after {{ content: " \\25BC"; }}
"""
# Sorting and filtering of table.interactive. A cell's sort key is the text before its
# first number, then that number (so "0.9" < "10", "passed 2" < "passed 10"); a sign right
# after a letter, digit or dot is a hyphen, not a minus ("rec-bp-2" < "rec-bp-10"); empty and
# "—" cells stay last in both directions; ties keep the page's order.
SCRIPT = r"""
(function () {
  "use strict";
  var NUMBER = /[+\-\u2212]?(?:\d+\.?\d*|\.\d+)(?:e[+\-]?\d+)?/i;
  function key(cell) {
    var text = cell ? cell.textContent.trim() : "";
    var found = text.match(NUMBER), at = found ? found.index : 0;
    var number = found ? found[0] : "";
    if (found && /^[+\-\u2212]/.test(number) && at > 0 && /[\w.]/.test(text.charAt(at - 1))) {
      at += 1;  // a hyphen in a name: the number is unsigned
      number = number.slice(1);
    }
    return {empty: text === "" || text === "\u2014", text: text,
            prefix: found ? text.slice(0, at) : text,
            number: found ? parseFloat(number.replace("\u2212", "-")) : null};
  }
  function compare(a, b) {
    var byPrefix = a.prefix.localeCompare(b.prefix, undefined, {numeric: true});
    if (byPrefix !== 0) return byPrefix;
    if (a.number !== null && b.number !== null && a.number !== b.number) {
      return a.number < b.number ? -1 : 1;
    }
    if ((a.number === null) !== (b.number === null)) return a.number === null ? -1 : 1;
    return a.text.localeCompare(b.text, undefined, {numeric: true});
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.interactive"), function (table) {
    var body = table.tBodies[0], head = table.tHead;
    if (!body || !head) return;
    var rows = Array.prototype.slice.call(body.rows);
    var tools = document.createElement("div"), input = document.createElement("input");
    var count = document.createElement("span");
    tools.className = "table-tools";
    input.type = "search";
    input.placeholder = "filter: rows holding every word";
    input.setAttribute("aria-label", "filter the rows of the next table");
    tools.appendChild(input);
    tools.appendChild(count);
    table.parentNode.insertBefore(tools, table);
    function filter() {
      var words = input.value.toLowerCase().split(/\s+/).filter(Boolean), shown = 0;
      rows.forEach(function (row) {
        var text = row.textContent.toLowerCase();
        row.hidden = !words.every(function (word) { return text.indexOf(word) >= 0; });
        shown += row.hidden ? 0 : 1;
      });
      count.textContent = shown + " of " + rows.length + " rows";
    }
    input.addEventListener("input", filter);
    filter();
    var headers = Array.prototype.slice.call(head.rows[0].cells);
    headers.forEach(function (th, column) {
      var button = document.createElement("button");
      button.type = "button";
      button.title = "sort by this column";
      while (th.firstChild) button.appendChild(th.firstChild);
      th.appendChild(button);
      th.setAttribute("aria-sort", "none");
      button.addEventListener("click", function () {
        var descending = th.getAttribute("aria-sort") === "ascending";
        headers.forEach(function (other) { other.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        rows.map(function (row, i) { return {row: row, key: key(row.cells[column]), i: i}; })
          .sort(function (a, b) {
            if (a.key.empty || b.key.empty) {
              return a.key.empty === b.key.empty ? a.i - b.i : (a.key.empty ? 1 : -1);
            }
            var order = compare(a.key, b.key);
            return (descending ? -order : order) || a.i - b.i;
          })
          .forEach(function (item) { body.appendChild(item.row); });
      });
    });
  });
})();
"""
# classify(tag, text, column): a CSS class or None; see markdown_fragment.
Classify = Callable[[str, str, str], "str | None"]


def compact_png(data: bytes) -> bytes:
    """``data`` (a PNG) with its colours reduced to at most 256 (median cut, no dithering:
    the dominant colours — backgrounds, lines, markers — stay exact), when that is smaller
    and the image is opaque; else ``data`` unchanged. A figure's 200-dpi PNG shrinks about
    threefold; anti-aliased edges move by a few levels at most."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (OSError, ValueError):
        return data
    if image.mode not in ("RGB", "RGBA") or (
            image.mode == "RGBA" and image.getchannel("A").getextrema() != (255, 255)):
        return data
    paletted = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                             dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    paletted.save(buffer, format="PNG")
    return buffer.getvalue() if buffer.tell() < len(data) else data


def read_regular_file(path: Path) -> bytes | None:
    """The bytes of ``path`` when it is a regular file (after links), else None: opened
    without blocking, so a FIFO or a device named there can neither hang nor feed the
    page."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _data_uri(path: Path, compact: bool) -> str | None:
    data = read_regular_file(path)
    if data is None:
        return None
    if compact:
        data = compact_png(data)
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _embed_images(renderer: MarkdownIt, tokens: list[Token], images: Mapping[str, Path],
                  compact: bool) -> None:
    """Give each image of ``tokens`` whose destination ``images`` names its file as a
    data URI; any other image — one the Markdown names but the caller did not hand over,
    or a file that cannot be read — becomes a line of text saying so."""
    files = {renderer.normalizeLink(src): (src, path) for src, path in images.items()}
    for token in tokens:
        children = token.children or []
        for i, child in enumerate(children):
            if child.type != "image":
                continue
            src = str(child.attrGet("src") or "")
            name, path = files.get(src, (src, None))
            uri = None if path is None else _data_uri(path, compact)
            if uri is not None:
                child.attrSet("src", uri)
                continue
            note = Token("text", "", 0)
            note.content = (f"image {name} could not be read" if path is not None else
                            f"image {name} is not one of this page's figures")
            children[i] = note


def _inline_text(token: Token) -> str:
    """The text of an inline token as read, code spans in their backticks, images left
    out, stripped."""
    return "".join(c.markup + c.content + c.markup if c.type == "code_inline" else c.content
                   for c in token.children or [] if c.type != "image").strip()


def _classify_tokens(tokens: list[Token], classify: Classify) -> None:
    """Set the class ``classify`` names on each table cell (told its column's header) and
    bold span (column ``""``) of ``tokens``."""
    headers: list[str] = []
    column = 0
    for i, token in enumerate(tokens):
        if token.type == "thead_open":
            headers = []
        elif token.type == "tr_open":
            column = 0
        elif token.type in ("th_open", "td_open") and tokens[i + 1].type == "inline":
            text = _inline_text(tokens[i + 1])
            if token.type == "th_open":
                headers.append(text)
            else:
                header = headers[column] if column < len(headers) else ""
                css = classify("td", text, header)
                if css:
                    token.attrSet("class", css)
            column += 1
        if token.type != "inline":
            continue
        children = token.children or []
        for j, child in enumerate(children[:-1]):
            if child.type == "strong_open" and children[j + 1].type == "text":
                css = classify("strong", children[j + 1].content.strip(), "")
                if css:
                    child.attrSet("class", css)


def markdown_fragment(text: str, *, images: Mapping[str, Path] | None = None,
                      classify: Classify | None = None, interactive: bool = False,
                      compact_images: bool = False) -> str:
    """The HTML of Markdown ``text`` (no page around it; raw HTML in ``text`` is escaped).

    ``images``: the image files the page may embed, by their destination in ``text``
    (``figures/fig1.png`` → its path); they are embedded as data URIs
    (``compact_images``: through :func:`compact_png`), and no other file is read, whatever
    ``text`` names. ``classify(tag, text, column)`` is asked for a CSS class of every table
    cell (``tag`` ``"td"``, ``text`` the cell's text as read, code spans in their
    backticks, ``column`` its column's header read the same way) and bold span
    (``"strong"``, its text, ``""``); ``interactive`` marks the tables for the page's
    sort-and-filter script.
    """
    renderer = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = renderer.parse(text)
    _embed_images(renderer, tokens, images or {}, compact_images)
    if interactive:
        for token in tokens:
            if token.type == "table_open":
                token.attrSet("class", "interactive")
    if classify is not None:
        _classify_tokens(tokens, classify)
    return renderer.renderer.render(tokens, renderer.options, {})


def html_page(body: str, *, title: str = "creditaudit report", script: bool = False) -> str:
    """A whole page around ``body`` (HTML) with the CSS inline; ``script``: with the inline
    sort-and-filter script of tables marked ``interactive``. Nothing is loaded from
    elsewhere."""
    tail = f"<script>{SCRIPT}</script>\n" if script else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + body + tail + "</body>\n</html>\n")


def markdown_to_html(text: str, *, images: Mapping[str, Path] | None = None,
                     title: str = "creditaudit report") -> str:
    """A self-contained HTML page of Markdown ``text``; ``images`` (destination → file)
    are embedded, and only they (:func:`markdown_fragment`)."""
    return html_page(markdown_fragment(text, images=images), title=title)
