"""A self-contained HTML page from the reports' Markdown (markdown-it-py, CommonMark with
tables); images are embedded as base64 data URIs so the page opens anywhere on its own."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }
h1, h2, h3 { border-bottom: 1px solid #ddd; padding-bottom: .2em; }
h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .85em; display: block;
        overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }
code { background: #f6f8fa; padding: 0 .2em; }
img { max-width: 100%; border: 1px solid #eee; }
strong { color: #b2182b; }
"""
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def _data_uri(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _embed_images(text: str, base: Path) -> str:
    """Replace ``![alt](file.png)`` by a data-URI image, or a note when unreadable."""

    def embed(match: re.Match[str]) -> str:
        alt, src = match.groups()
        if src.startswith("data:"):
            return match.group(0)
        uri = _data_uri(base / src)
        return f"![{alt}]({uri})" if uri else f"*image {src} could not be read*"

    return _IMAGE.sub(embed, text)


def markdown_to_html(text: str, *, base_dir: str | Path = ".", title: str = "creditaudit report"
                     ) -> str:
    """A self-contained HTML page of Markdown ``text``; images are read relative to
    ``base_dir`` and embedded."""
    renderer = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = renderer.render(_embed_images(text, Path(base_dir)))
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + body + "</body>\n</html>\n")
