"""report.html in a real browser: every figure decodes and the page logs no console error.

Headless Chromium (Debian's ``chromium``; .ci/run installs it) loads a copy of the report with
a probe script injected first in <head>: it records console.error calls and every error event
(a script error, an image or other resource that fails to load) and, once the page has
loaded, writes the state of every <img> into the DOM, which ``--dump-dom`` prints. Chromium's
own log (``--enable-logging=stderr``) must hold no console message either: the report has no
scripts, so any console line is an error. Skipped, saying so, where Chromium is absent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from creditaudit.figures import RunIndex
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
    write_report(RunIndex.from_dir(figure_results, frozen_from_runs=True), out)
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
