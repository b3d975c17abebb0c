"""Reading README.md and docs/*.md as code: fenced blocks, the commands in them, placeholders.

Used by tests/test_docs_run.py (every block runs as written) and tests/test_docs_outputs.py
(every example output equals what the command prints). A *block* is one fenced code block;
a *command* is one logical line of a ```bash block (backslash continuations joined, comments
dropped), split like a shell would.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("bash", "python", "toml", "json", "text")
# A fence may be indented (a block inside a list item): its closing fence has the same indent.
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", flags=re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: ``doc`` relative to the repository, the line of its opening fence."""

    doc: str
    line: int
    lang: str
    text: str

    @property
    def key(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.lstrip("\n").splitlines()[0].strip() if self.text.strip() else ""


def doc_blocks(docs: list[Path] = DOCS) -> list[Block]:
    """Every fenced block of ``docs``, in order."""
    blocks = []
    for path in docs:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text[:match.start()].count("\n") + 1
            indent, lang, body = match.groups()
            body = re.sub(rf"^{indent}", "", body, flags=re.M)  # as if not indented
            blocks.append(Block(str(path.relative_to(ROOT)), line, lang, body))
    return blocks


def text_after(block: Block) -> str:
    """The paragraph right after ``block`` in its document (up to the next blank line)."""
    lines = (ROOT / block.doc).read_text().splitlines()
    end = block.line + block.text.count("\n") + 1  # the closing fence's line (1-based)
    paragraph = []
    for line in lines[end:]:
        if not line.strip():
            if paragraph:
                break
            continue
        paragraph.append(line)
    return " ".join(paragraph)


def printed_fragments(block: Block) -> list[str]:
    """What the docs say a python block prints: the `…` fragments of the sentence after the
    block when it starts with "prints " (``prints `3 12.8` (…)`` → ``["3 12.8"]``)."""
    after = text_after(block)
    if not after.startswith("prints "):
        return []
    sentence = re.split(r"(?<=[`)])\.\s", after, maxsplit=1)[0]
    # Asides in parentheses are not output; parentheses inside `…` are: each code span is
    # set aside as a placeholder while the asides (with the spans in them) are dropped.
    spans = re.findall(r"`[^`]+`", sentence)
    for i, span in enumerate(spans):
        sentence = sentence.replace(span, f"\0{i}\0", 1)
    sentence = re.sub(r"\([^()]*\)", "", sentence)
    kept = [int(i) for i in re.findall(r"\0(\d+)\0", sentence)]
    return [spans[i][1:-1] for i in kept]


@dataclass(frozen=True)
class Command:
    """One command of a bash block: ``raw`` as written (comment dropped), ``argv`` after the
    environment assignments and a leading ``time``, ``env`` those assignments, ``stdout`` the
    file of a ``> FILE`` redirection."""

    raw: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdout: str | None = None

    @property
    def is_creditaudit(self) -> bool:
        return bool(self.argv) and Path(self.argv[0]).name == "creditaudit"


def commands(block: Block) -> list[Command]:
    """The logical command lines of a bash block."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        raw = " ".join(shlex.quote(w) if w != ">" else w for w in words)
        env = []
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env.append((name, value))
        if words and words[0] == "time":
            words.pop(0)
        stdout = None
        if ">" in words:
            at = words.index(">")
            stdout = words[at + 1]
            words = words[:at]
        out.append(Command(raw, tuple(words), tuple(env), stdout))
    return out


def usage_form(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A synopsis (``figures RESULTS_DIR [--out DIR] [--dataset NAME]``) with every optional
    part given: the brackets dropped. A value's own brackets (``model.states=["a", "b"]``,
    balanced, not opening the word) stay."""
    def unbracketed(word: str) -> str:
        if word.startswith("[") or word.count("]") > word.count("["):
            return word.strip("[]")
        return word
    return tuple(unbracketed(w) for w in argv if unbracketed(w))
