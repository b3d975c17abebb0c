"""Regenerate the field tables of docs/records.md from the typed record classes."""

from pathlib import Path

from creditaudit.records.docs import MARKER, render_record_docs

doc = Path("docs/records.md")
head = doc.read_text().split(MARKER)[0]
doc.write_text(head + render_record_docs())
