"""Regenerate the key table of docs/configuration.md from config.config_help()."""
from pathlib import Path

from creditaudit.config import config_help

doc = Path("docs/configuration.md")
head = doc.read_text().split("<!-- keys -->")[0] if doc.exists() else ""
rows, section = [], None
for key, default, help_text in config_help():
    name = key.split(".")[0]
    if name != section:
        section = name
        rows += ["", f"### [{name}]", "", "| key | default | meaning |", "|---|---|---|"]
    rows.append(f"| `{key}` | `{default}` | {help_text.replace('|', '/')} |")
doc.write_text(head + "<!-- keys -->\n" + "\n".join(rows).lstrip("\n") + "\n")
