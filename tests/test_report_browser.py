"""report.html in a real browser: every figure decodes, the page logs no console error, the
tables sort and filter, and verdicts wear their colours.

Headless Chromium (Debian's ``chromium``; .ci/run installs it) loads a copy of the report with
a probe script injected first in <head>: it records console.error calls and every error event
(a script error, an image or other resource that fails to load) and, once the page has
loaded, writes the state of every <img> into the DOM, which ``--dump-dom`` prints. Chromium's
own log (``--enable-logging=stderr``) must hold no console message either: the report's one
script logs nothing, so any console line is an error. A second probe clicks column headers
and types into a filter box, the way a reader would, and writes what the table then shows.
Skipped, saying so, where Chromium is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from creditaudit.figures import RunIndex, render_all
from creditaudit.report.folder import write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# Flags that work as root in a sandboxed container; a fresh profile per run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000")
PROBE = """<script>
window.__errors = [];
const __error = console.error;
console.error = function (...args) { window.__errors.push(args.join(" ")); __error(...args); };
window.addEventListener("error", (event) => window.__errors.push("error event: " +
  (event.message || (event.target && (event.target.src || event.target.href)) || "?")), true);
window.addEventListener("load", () => {
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    images: [...document.images].map((img) => ({alt: img.alt, complete: img.complete,
                                              width: img.naturalWidth, height: img.naturalHeight})),
    errors: window.__errors});
  document.body.appendChild(probe);
});
</script>"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def report_dir(figure_results, tmp_path_factory):
    out = tmp_path_factory.mktemp("browser_report")
    index = RunIndex.from_dir(figure_results, frozen_from_runs=True)
    rendered, missing = render_all(index, out / "figures")
    write_report(index, out, rendered=rendered, missing=missing)
    return out


def load(html_path, profile) -> tuple[dict, list[str]]:
    """(probe result, console lines of Chromium's log) of the page at ``html_path``."""
    proc = subprocess.run([browser(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                           html_path.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, flags=re.S)
    assert found, f"the page did not finish loading: {proc.stderr[-2000:]}"
    probe = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<")
                       .replace("&gt;", ">").replace("&quot;", '"'))
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return probe, console


@pytest.mark.skipif(browser() is None, reason="Chromium is not installed (apt-get install "
                    "chromium; .ci/run installs it): report.html not checked in a browser")
def test_report_html_renders_every_figure_without_console_errors(report_dir, tmp_path):
    page = (report_dir / "report.html").read_text()
    figures = sorted((report_dir / "figures").glob("*.png"))
    assert figures, "the report should embed the figures of the tiny runs"
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    assert PROBE in probed.read_text(), "report.html has no <head> to put the probe in"
    probe, console = load(probed, tmp_path / "profile")
    assert probe["errors"] == [] and console == [], (probe["errors"], console)
    images = probe["images"]
    assert len(images) == len(figures), (len(images), [p.name for p in figures])
    broken = [img for img in images if not (img["complete"] and img["width"] > 0)]
    assert not broken, f"images that did not decode: {broken}"


@pytest.mark.skipif(browser() is None, reason="Chromium is not installed")
def test_the_probe_sees_a_broken_image_and_a_console_error(tmp_path):
    """The check above would catch what it is for."""
    page = tmp_path / "bad.html"
    page.write_text(f"<html><head>{PROBE}</head><body><img alt='x' src='data:image/png;"
                    "base64,AAAA'><script>console.error('boom')</script></body></html>")
    probe, console = load(page, tmp_path / "profile")
    assert probe["images"][0]["width"] == 0
    assert "boom" in probe["errors"] and any("boom" in line for line in console)


def test_ci_installs_chromium_before_running_the_tests():
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text().splitlines()
    install = next(i for i, line in enumerate(lines) if "apt-get install" in line
                   and "chromium" in line)
    assert install < next(i for i, line in enumerate(lines) if "pytest" in line)



# Clicks the audit table's headers and types in its filter box; writes what the table shows.
INTERACT = """<script>
window.addEventListener("load", () => {
  const table = document.querySelector("table.interactive");
  const head = table.tHead.rows[0];
  const headers = [...head.cells].map((th) => th.textContent.trim());
  const shown = () => [...table.tBodies[0].rows].filter((row) => !row.hidden);
  const cells = (name) => shown().map((row) => row.cells[headers.indexOf(name)].textContent
                                                .trim());
  const click = (name) => head.cells[headers.indexOf(name)].querySelector("button").click();
  const out = {headers: headers, page: cells("seed")};
  click("seed"); out.seed_up = cells("seed");
  click("seed"); out.seed_down = cells("seed");
  click("acc"); out.acc_up = cells("acc");
  const tools = table.previousElementSibling;
  const input = tools.querySelector("input");
  input.value = "DFA"; input.dispatchEvent(new Event("input"));
  out.filtered = shown().map((row) => row.textContent);
  out.count = tools.querySelector("span").textContent;
  input.value = ""; input.dispatchEvent(new Event("input"));
  out.unfiltered = shown().length;
  out.colors = {};
  for (const css of ["pass", "walk-back", "incomplete"]) {
    const cell = document.querySelector("td." + css);
    if (cell) out.colors[css] = getComputedStyle(cell).backgroundColor;
  }
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify(out);
  document.body.appendChild(probe);
});
</script>"""


def rgb(color: str) -> str:
    return "rgb({}, {}, {})".format(*(int(color[i:i + 2], 16) for i in (1, 3, 5)))


@pytest.mark.skipif(browser() is None, reason="Chromium is not installed")
def test_tables_sort_numbers_as_numbers_and_filter_rows(report_dir, tmp_path):
    from creditaudit.formatting import INCOMPLETE_COLOR, PASS_COLOR, WALK_BACK_COLOR

    page = (report_dir / "report.html").read_text()
    probed = tmp_path / "interact.html"
    probed.write_text(page.replace("<head>", "<head>" + INTERACT, 1))
    probe, console = load(probed, tmp_path / "profile")
    assert console == [], console
    seeds = [int(s) for s in probe["page"]]
    assert {42, 123} <= set(seeds)
    # 42 before 123: as numbers (as text "123" < "42").
    assert [int(s) for s in probe["seed_up"]] == sorted(seeds)
    assert [int(s) for s in probe["seed_down"]] == sorted(seeds, reverse=True)
    accuracies = [float(a) for a in probe["acc_up"] if a != "—"]
    assert accuracies == sorted(accuracies) and len(accuracies) > 2
    assert all(a == "—" for a in probe["acc_up"][len(accuracies):])  # blanks last
    markdown = (report_dir / "report.md").read_text()
    section = markdown.split("## Audit table", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    with_dfa = [line for line in rows if "dfa" in line.lower()]
    assert 0 < len(probe["filtered"]) == len(with_dfa) < len(rows)
    assert all("dfa" in text.lower() for text in probe["filtered"])
    assert probe["count"] == f"{len(with_dfa)} of {len(rows)} rows"
    assert probe["unfiltered"] == len(rows)
    expected = {"pass": PASS_COLOR, "walk-back": WALK_BACK_COLOR,
                "incomplete": INCOMPLETE_COLOR}
    assert probe["colors"], "no verdict cell carries a verdict colour"
    for css, color in probe["colors"].items():
        assert color == rgb(expected[css]), css


def test_report_html_is_smaller_than_its_figures(report_dir):
    """The figures dominate the page: they are embedded compacted, never twice."""
    page = (report_dir / "report.html").read_text()
    pngs = sorted((report_dir / "figures").glob("*.png"))
    assert page.count("data:image/png;base64,") == len(pngs)
    assert len(page) < 0.7 * sum(p.stat().st_size for p in pngs)
    # Without JavaScript the tables are plain tables: every row there, no dead controls.
    assert "<input" not in page and " hidden" not in page


# Clicks the first column's header of the page's one table; writes that column's cells.
SORT_FIRST = """<script>
window.addEventListener("load", () => {
  const table = document.querySelector("table.interactive");
  table.tHead.rows[0].cells[0].querySelector("button").click();
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify([...table.tBodies[0].rows].map(
    (row) => row.cells[0].textContent.trim()));
  document.body.appendChild(probe);
});
</script>"""


@pytest.mark.skipif(browser() is None, reason="Chromium is not installed")
def test_a_hyphen_in_a_name_is_no_minus_sign(tmp_path):
    """Runs a Recorder names ``rec-bp-1`` … sort 1, 2, 10 (not 10, 2, 1 as −10 < −2 < −1);
    a number's own sign still counts."""
    from creditaudit.report.html import html_page, markdown_fragment

    cells = ["rec-bp-10", "rec-bp-2", "rec-bp-1", "cifar-100", "cifar-10", "-0.5", "+0.25",
             "-2"]
    table = "| name |\n|---|\n" + "".join(f"| {cell} |\n" for cell in cells)
    page = html_page(markdown_fragment(table, interactive=True), script=True)
    probed = tmp_path / "sort.html"
    probed.write_text(page.replace("<head>", "<head>" + SORT_FIRST, 1))
    order, console = load(probed, tmp_path / "profile")
    assert console == [], console
    assert order == ["-2", "-0.5", "+0.25", "cifar-10", "cifar-100", "rec-bp-1", "rec-bp-2",
                     "rec-bp-10"]
