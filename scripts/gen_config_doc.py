"""Regenerate the key tables of docs/configuration.md from the config and the registries:
each section's common keys, then every option the installed rules, architectures, datasets
and diagnostics declare (with the components that read it)."""
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

# section → key → (defaults seen, help, readers)
options: dict[str, dict[str, tuple[set[str], str, list[str]]]] = {}
for section, name, _label, option_rows in component_help():
    for key, default, help_text in option_rows:
        seen = options.setdefault(section, {}).setdefault(key, (set(), help_text, []))
        seen[0].add(default)
        seen[2].append(name)
titles = {"data": "the datasets' own options", "model": "the architectures' own options",
          "method": "the credit rules' own options",
          "diagnostics": "the protocol diagnostics' options (their thresholds)"}
for section, keys in options.items():
    rows += ["", f"### [{section}]: {titles[section]}", "",
             "| key | default | read by | meaning |", "|---|---|---|---|"]
    for key, (defaults, help_text, readers) in keys.items():
        default = next(iter(defaults)) if len(defaults) == 1 else " / ".join(sorted(defaults))
        rows.append(f"| `{key}` | `{default}` | {', '.join(readers)} | "
                    f"{help_text.replace('|', '/')} |")
doc.write_text(head + "<!-- keys -->\n" + "\n".join(rows).lstrip("\n") + "\n")
