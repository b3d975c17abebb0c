"""Text read from records (run ids, names, errors, unreadable reasons) reads as itself in
report.md and report.html — no link, image, heading or broken table row — and report.html
embeds only the figures the report was handed, inside its folder, read only if regular."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from creditaudit.cli import main
from creditaudit.figures import Rendered
from creditaudit.formatting import markdown_table, markdown_text
from creditaudit.report.folder import write_report
from creditaudit.report.html import markdown_fragment, read_regular_file
from creditaudit.results import RunIndex

SECRET = b"secret-bytes-4711\n"
# Every line break Python knows: a renderer, editor or terminal may break a line at each.
BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
          "\u2029"]
HOSTILE = ["![k](s.png)", "[l](http://x.example)", "<http://x.example>", "# head",
           "*em* _em_ **b**", "`code`", "a | b", "&amp; &#60;", "~~gone~~", "back\\slash",
           "out_ln", *(f"x{brk}# injected" for brk in BREAKS)]


def _flat(text: str) -> str:
    return " ".join(text.splitlines())


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_text_reads_as_itself(text):
    page = markdown_fragment(f"run {markdown_text(text)} end\n")
    assert page == f"<p>run {_html(_flat(text))} end</p>\n"
    # In a table cell: one row of two cells, the text as it is.
    table = markdown_fragment(markdown_table(["a", "b"], [[markdown_text(text), "z"]]) + "\n")
    assert table.count("<tr>") == 2 and table.count("<td>") == 2
    assert f"<td>{_html(_flat(text))}</td>" in table


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") \
        .replace('"', "&quot;")


def test_markdown_table_keeps_a_row_on_one_line():
    for brk in BREAKS:  # generated cell text too (the table's own markup stays)
        table = markdown_fragment(markdown_table(["a"], [[f"**fired**{brk}# x"]]) + "\n")
        assert "<h1>" not in table and table.count("<tr>") == 2
        assert "<td><strong>fired</strong> # x</td>" in table


def _record(out: Path, name: str, fail: str | None = None) -> None:
    """A small run of the user's own loop, recorded under ``out/name``; ``fail``: it raises
    this error inside the recorder instead of finishing."""
    from creditaudit import Recorder, adapt, rule

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
                        nn.Linear(16, 3))
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    recorder = Recorder(rule("dfa", adapt(net, states=["0", "1"], example=x[:8])), x, y,
                        out=out, name=name, progress=False,
                        config={"diagnostics.end_of_run": False})
    if fail is None:
        recorder.epoch(0)
        recorder.epoch(1, test_acc=0.5)
        recorder.finish()
        return
    with pytest.raises(RuntimeError), recorder:
        recorder.epoch(0)
        raise RuntimeError(fail)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(results, report folder, a secret file outside both): a record whose schema names
    the secret as an image, a failed run whose error does, a finished run whose name
    names a file planted in the report folder; the report written by the CLI."""
    root = tmp_path_factory.mktemp("hostile")
    secret = root / "secret.txt"
    secret.write_bytes(SECRET)
    res, rep = root / "res", root / "rep"
    (res / "r1").mkdir(parents=True)
    (res / "r1" / "record.json").write_text(json.dumps(
        {"schema": f"![k]({secret})\r# injected schema"}))
    _record(res, "n\r# injected name ![k](s.png) [l](x.html)")
    _record(res, "failing", fail=f"loader broke ![k]({secret})\r# injected error")
    rep.mkdir()
    (rep / "s.png").write_bytes(SECRET)  # inside the report's folder, yet not a figure
    assert main(["report", str(res), "--out", str(rep)]) == 0
    return res, rep, secret


def test_record_text_reads_as_itself_in_report_md(hostile):
    _, rep, secret = hostile
    markdown = (rep / "report.md").read_text()
    assert "![k]" not in markdown and "[l](" not in markdown
    for what in ("schema", "name", "error"):
        lines = [line for line in markdown.splitlines() if f"injected {what}" in line]
        assert lines, what
        assert all(not line.startswith("#") or line.startswith("### ") for line in lines)
        assert all(f"# injected {what}" in line for line in lines)  # mid-line: plain text
    assert f"!\\[k\\]({secret})" in markdown  # the schema and the error, as they read
    heading = [line for line in markdown.splitlines() if line.startswith("### n ")]
    assert heading == ["### n # injected name !\\[k\\](s.png) \\[l\\](x.html)"]


def test_report_html_carries_no_file_the_records_name(hostile):
    _, rep, _ = hostile
    page = (rep / "report.html").read_text()
    assert base64.b64encode(SECRET).decode() not in page
    assert SECRET.decode().strip() not in page
    assert not re.search(r"<h[1-6][^>]*>[^<]*injected", page)
    assert page.count("<h1>") == 1
    assert "![k](" in page  # shown as text
    for table in re.findall(r"<table.*?</table>", page, re.S):  # no row broken
        head = len(re.findall(r"<th[ >]", table.split("</thead>")[0]))
        for row in re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1], re.S):
            assert len(re.findall(r"<td", row)) == head


def test_report_html_still_embeds_its_own_figures(hostile):
    _, rep, _ = hostile
    markdown = (rep / "report.md").read_text()
    page = (rep / "report.html").read_text()
    own = re.findall(r"^!\[[^\]]*\]\((figures/[^)]+\.png)\)$", markdown, re.M)
    assert own and all((rep / path).is_file() for path in own)
    assert page.count('src="data:image/png;base64,') == len(own)


class Blocked(Exception):
    """Not an OSError: code that swallows OSError must not swallow this."""


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail, rather than hang, when the body blocks longer (reading a FIFO would)."""
    def fail(*_: object) -> None:
        raise Blocked(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _png(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (200, 10, 10)).save(path)
    return path.read_bytes()


def test_report_embeds_only_regular_figure_files_inside_its_folder(tmp_path):
    out = tmp_path / "rep"
    own = _png(out / "figures" / "own.png")
    fifo = out / "figures" / "pipe.png"
    os.mkfifo(fifo)
    with _deadline(60):
        files = write_report(RunIndex([]), out, rendered=[
            Rendered("mine", "Mine", [out / "figures" / "own.png", fifo])])
    page = files.html.read_text()
    assert page.count('src="data:image/png;base64,') == 1
    assert base64.b64encode(own).decode() in page
    assert "image figures/pipe.png could not be read" in page
    # A figure module listing a file outside the report's folder: referenced, not carried.
    elsewhere = tmp_path / "elsewhere" / "secret.png"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(SECRET)
    files = write_report(RunIndex([]), out, rendered=[Rendered("guest", "Guest", [elsewhere])])
    page = files.html.read_text()
    assert "../elsewhere/secret.png" in files.markdown.read_text()
    assert base64.b64encode(SECRET).decode() not in page and "data:image" not in page


def test_read_regular_file_refuses_a_fifo_without_waiting(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with _deadline(60):
        assert read_regular_file(fifo) is None
    assert read_regular_file(tmp_path) is None
    (tmp_path / "f").write_bytes(b"x")
    assert read_regular_file(tmp_path / "f") == b"x"


def test_report_finishes_when_a_record_names_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "h" / "r1").mkdir(parents=True)
    (tmp_path / "h" / "r1" / "record.json").write_text(json.dumps({"schema": f"![k]({fifo})"}))
    # beside a readable record: a folder of only unreadable ones has nothing to report
    legacy = Path(__file__).parent / "legacy_records" / "run1_dfa.json"
    (tmp_path / "h" / "r0").mkdir()
    (tmp_path / "h" / "r0" / "record.json").write_bytes(legacy.read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "creditaudit", "report", str(tmp_path / "h"),
                           "--out", str(tmp_path / "hr")], env=env, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"!\\[k\\]({fifo})" in (tmp_path / "hr" / "report.md").read_text()
