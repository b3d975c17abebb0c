"""Regenerate the key tables of docs/configuration.md from the config and the registries:
each section's common keys, then every option the installed rules, architectures, datasets
and diagnostics declare (with the components that read it)."""
from collections import Counter
from pathlib import Path

from creditaudit.config import component_help, config_help

doc = Path("docs/configuration.md")
head = doc.read_text().split("<!-- keys -->")[0] if doc.exists() else ""
rows, section = [], None
for key, default, help_text in config_help():
    name = key.split(".")[0]
    if name != section:
        section = name
        rows += ["", f"### [{name}]", "", "| key | default | meaning |", "|---|---|---|"]
    rows.append(f"| `{key}` | `{default}` | {help_text.replace('|', '/')} |")

# section → key → (help, {reader: its default})
options: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}
for section, name, _label, option_rows in component_help():
    for key, default, help_text in option_rows:
        options.setdefault(section, {}).setdefault(key, (help_text, {}))[1][name] = default
titles = {"data": "the datasets' own options", "model": "the architectures' own options",
          "method": "the credit rules' own options",
          "diagnostics": "the protocol diagnostics' options (their thresholds)"}
for section, keys in options.items():
    rows += ["", f"### [{section}]: {titles[section]}", "",
             "| key | default | read by | meaning |", "|---|---|---|---|"]
    for key, (help_text, defaults) in keys.items():
        # the default most readers share; a reader with another one says its own
        usual = Counter(defaults.values()).most_common(1)[0][0]
        readers = ", ".join(name if default == usual else f"{name} (default `{default}`)"
                            for name, default in defaults.items())
        rows.append(f"| `{key}` | `{usual}` | {readers} | {help_text.replace('|', '/')} |")
doc.write_text(head + "<!-- keys -->\n" + "\n".join(rows).lstrip("\n") + "\n")
