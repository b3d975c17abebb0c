"""The README's two commands are the ones users and CI run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [block.strip() for block in blocks[:2]]


def test_readme_opens_with_setup_demo_and_setup_tests():
    demo, tests = readme_commands()
    for command in (demo, tests):
        assert "\n" not in command
        assert command.index("pip install torch==2.13.0") < command.index("pip install -e")
    assert demo.endswith("creditaudit demo")
    assert "pytest" in tests


def test_readme_activates_the_environment_before_bare_commands():
    """The set-up commands install into .venv without activating it; every later bare
    `creditaudit` would be "command not found" unless the README activates it first."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert blocks[2].strip() == "source .venv/bin/activate"
    assert all(".venv/bin/" not in block for block in blocks[3:])  # one way, not two


def test_ci_runs_the_readme_test_command():
    _, tests = readme_commands()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines


def test_every_config_key_is_documented():
    from creditaudit.config import config_help

    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key, _, _ in config_help() if f"`{key}`" not in text]
    assert not missing, f"document these keys in docs/configuration.md: {missing}"
    # the key table is generated: each key's row says what the code's help text says
    stale = [key for key, default, help_text in config_help()
             if f"| `{key}` | `{default}` | {help_text.replace('|', '/')} |" not in text]
    assert not stale, ("docs/configuration.md's rows for these keys differ from the code's "
                       f"help: {stale}; run python scripts/gen_config_doc.py")
    # every option an installed rule, architecture, dataset or diagnostic declares
    from creditaudit.config import component_help

    options = {key for *_, rows in component_help() for key, _, _ in rows}
    missing = sorted(key for key in options if f"| `{key}` |" not in text)
    assert not missing, (f"document these options in docs/configuration.md: {missing}; run "
                         "python scripts/gen_config_doc.py")


def test_relative_links_in_the_docs_point_at_files():
    """Every relative link and image in README.md and docs/*.md names a file in the repo."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # not code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)} → {target}")
    assert not broken, "broken links: " + ", ".join(broken)


def test_records_doc_is_generated_from_the_typed_classes():
    from creditaudit.records.docs import MARKER, render_record_docs

    text = (ROOT / "docs" / "records.md").read_text()
    assert MARKER in text, "docs/records.md lost its <!-- generated --> marker"
    assert text.split(MARKER)[1] == render_record_docs().split(MARKER)[1], \
        "docs/records.md is stale: run python scripts/gen_records_doc.py"


def test_the_commands_the_readme_says_take_q_are_those_that_do():
    """README's "`-q` silences progress on every command …" names the commands: a command
    the docs send a user to with `-q` that refuses it (once: figures, report, export) fails."""
    import argparse

    from creditaudit.cli import build_parser

    sentence = re.search(r"`-q` silences progress on every\s+command that shows it \(([^)]*)\);"
                         r"([^.]*)\.", (ROOT / "README.md").read_text())
    assert sentence, "README.md lost its sentence on -q"
    named, without = (set(re.findall(r"`(\w+)`", part)) for part in sentence.groups())
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    taking_q = {name for name, parser in commands.items()
                if any("-q" in a.option_strings for a in parser._actions)}
    assert named == taking_q and without == set(commands) - taking_q, (named, without, taking_q)


# Lab notes: what only the people who built the tool can read (an issue, a work session, a
# revision "this" one replaced, a fix's date, a helper's name, the spec beside the repo).
LAB_NOTES = [  # a space in a pattern is any white space: a phrase may break over lines
    (r"(?<![\w./(-])#\d+\b", "an issue number"),
    (r"\b(?:the|per the|an?) issue\b", "an internal issue"),
    (r"\bthis (?:session|revision)\b|\bolder revision\b", "a revision of the work"),
    (r"\(fixed \d{4}-\d\d-\d\d\)|\bused to allow\b", "a fix's history"),
    (r"\b(?:before|until) \d{4}-\d\d-\d\d\b", "the date of a change (say: earlier versions)"),
    (r"\b[pm]\d{2}\b", "a helper's name"),
    (r"(?-i:\bSPEC(?:\.md)?\b)|/work/shared", "a file a user does not have"),
]


def test_the_docs_speak_to_users_not_in_lab_notes():
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for pattern, what in LAB_NOTES:
            for match in re.finditer(pattern.replace(" ", r"\s+"), text, flags=re.I):
                line = text[:match.start()].count("\n") + 1
                found.append(f"{doc.relative_to(ROOT)}:{line}: {what}: {match.group(0)!r}")
    assert not found, "say what the tool does now, for its users:\n" + "\n".join(found)


def test_the_readme_describes_the_demo_it_runs():
    from creditaudit.cli.demo import DEMO_TASKS

    task = DEMO_TASKS["mnist1d"]
    said = " ".join((ROOT / "README.md").read_text().split())
    assert f"{task.epochs} epochs of {task.n_train:,} samples per method".replace(",", " ") \
        in said, "README's first paragraph after the commands says other demo sizes"


def github_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings (lower case, punctuation dropped, spaces
    to hyphens, ``-1``, ``-2`` … on repeats), and any ``<a id=…>``/``<a name=…>``."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    anchors: set[str] = set(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_links_to_a_section_name_one_that_exists():
    """`[…](page.md#section)` and `[…](#section)`: a renamed heading leaves the link landing
    at the top of the page (GitHub says nothing); the file check above cannot see it."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            name, anchor = target.split("#", 1)
            page = (doc.parent / name).resolve() if name else doc
            if page.suffix == ".md" and page.exists() and anchor not in github_anchors(page):
                broken.append(f"{doc.relative_to(ROOT)} → {target}")
    assert not broken, "links to no section: " + ", ".join(broken)


def test_section_anchors_are_github_s():
    page = ROOT / "docs" / "science.md"
    assert "7-reference-results-of-the-published-study" in github_anchors(page)
    assert "2-notation-scale-convention-and-the-model-contract" in github_anchors(page)


def test_the_readme_layout_names_the_packages_there_are():
    """README's Layout block names every package of src/creditaudit (``name/``) and no
    package that is not there (it once listed diagnostics/, experiments/ and a zoo)."""
    block = re.search(r"## Layout\n\n```text\n(.*?)```", (ROOT / "README.md").read_text(),
                      flags=re.S).group(1)
    src_part = block.split("\ntests/")[0]
    named = set(re.findall(r"(?<![\w/])(\w+)/(?!\w)", src_part.split(None, 1)[1]))
    packages = {p.parent.name for p in (ROOT / "src" / "creditaudit").glob("*/__init__.py")}
    assert named == packages, (f"named, not packages: {sorted(named - packages)}; "
                               f"packages not named: {sorted(packages - named)}")


def test_every_flag_of_train_is_in_the_configuration_table_with_its_key():
    """docs/configuration.md's flag table against the parser: `--blocks` was documented in
    `--help` alone."""
    import argparse

    from creditaudit.cli import build_parser

    text = (ROOT / "docs" / "configuration.md").read_text()
    train = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["train"]
    missing = []
    for action in train._actions:
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag is None or flag in ("--help", "--verbose", "--quiet"):
            continue
        if "." in action.dest:  # a config key: its row names it
            row = re.search(rf"^\| `{re.escape(flag)}[ `].*$", text, flags=re.M)
            if not row or f"`{action.dest}" not in row.group(0):
                missing.append(f"{flag} → {action.dest}")
        elif f"`{flag}" not in text:
            missing.append(flag)
    assert not missing, f"docs/configuration.md's flag table lacks: {missing}"


def test_the_cpu_build_hint_installs_the_torch_the_setup_pins():
    """PyPI's Linux torch is a CUDA build (the README once said pinning it first avoided
    that): the README gives the CPU index for the set-up's own torch release."""
    pinned = {re.search(r"pip install (torch==[\d.]+) ", c).group(1) for c in readme_commands()}
    assert len(pinned) == 1, pinned
    said = " ".join((ROOT / "README.md").read_text().split())
    assert f"pip install {pinned.pop()} --index-url https://download.pytorch.org/whl/cpu" \
        in said
    assert "never pulls a CUDA build" not in said
