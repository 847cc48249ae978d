"""The HTML report in a real browser: headless Chromium renders the matrix, runs the page's own
script, runs no injected one, and takes a screenshot.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skipped without it.
Set ``ACCEL_REPORT_SCREENSHOT=/some/file.png`` to keep the screenshot for a person to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from accel_harness.known_issues import KnownIssues
from accel_reports.analysis import build_report
from accel_reports.loaders import load_results
from accel_reports.render import write_report

from _report_data import KNOWN_YAML, XSS_IMG, XSS_MARKER, XSS_SCRIPT, bench_file, clustered, rec, run_file
from _waits import SAFETY_NET_S

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium is not installed at /usr/bin/chromium (Debian: apt-get install -y chromium)",
)


class Dom(HTMLParser):
    def __init__(self, html: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: (v or "") for k, v in attrs}))

    def all(self, tag: str) -> list[dict]:
        return [a for t, a in self.elements if t == tag]

    def by_id(self, element_id: str) -> tuple[str, dict] | None:
        return next(((t, a) for t, a in self.elements if a.get("id") == element_id), None)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", *args,
    ]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(command, capture_output=True, text=True, timeout=SAFETY_NET_S, env=env, check=False)


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("chromium-report")
    folder = tmp_path / "results"
    clustered(folder)
    run_file(folder, "cuda-run", "cuda", [
        rec("cuda-run", f"test_{XSS_SCRIPT}", "cuda", "failed", f"AssertionError: {XSS_MARKER}"),
        rec("cuda-run", f"test_name{XSS_IMG}", "cuda", "failed", f"RuntimeError: {XSS_IMG} {XSS_SCRIPT}"),
        *[rec("cuda-run", f"test_ok_{i}", "cuda", "passed") for i in range(10)],
    ], torch="2.8.0")
    bench_file(folder, "b1", "xpu", {"test_step": [0.5 + 0.002 * i for i in range(12)], f"test_{XSS_SCRIPT}": [0.2] * 6},
               when="2025-06-01T00:00:00")
    bench_file(folder, "b2", "xpu", {"test_step": [0.62 + 0.002 * i for i in range(12)], f"test_{XSS_SCRIPT}": [0.2] * 6},
               when="2025-06-02T00:00:00")
    known = KnownIssues.from_data(yaml.safe_load(KNOWN_YAML), "known.yaml")
    report = build_report(load_results([folder]), known=known, title=f"Qualification {XSS_SCRIPT}")
    return write_report(report, tmp_path / "out", ["html"])["html"]


def test_matrix_rendered_own_script_ran_injected_code_did_not(report_html, tmp_path):
    result = _chromium(tmp_path, "--dump-dom", report_html.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom(result.stdout)
    matrix = dom.by_id("matrix-table")
    assert matrix is not None and matrix[0] == "table"
    assert "<td>xpu</td><td>2.7.1</td><td>0.2.0</td>" in result.stdout  # a matrix row, as the browser built it
    body = dom.all("body")[0]
    assert body.get("data-report-ready") == "1"  # the page's own script ran under its CSP
    assert "data-pwned" not in body  # the injected handler did not
    assert dom.all("img") == []
    assert len(dom.all("script")) == 1
    assert not [name for _, attrs in dom.elements for name in attrs if name.startswith("on")]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in result.stdout  # shown as text
    # the grid's failure links drill down: opening #f0 opens that failure's details
    opened = _chromium(tmp_path, "--dump-dom", report_html.as_uri() + "#f0")
    details = Dom(opened.stdout).by_id("f0")
    assert details is not None and details[0] == "details" and "open" in details[1]


def test_screenshot(report_html, tmp_path):
    shot = tmp_path / "report.png"
    result = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", report_html.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 1000)
    assert len(data) > 20_000, "the screenshot looks blank (an empty white page compresses to about 6 KB)"
    keep = os.environ.get("ACCEL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


@pytest.fixture(scope="module")
def nightly_html(tmp_path_factory) -> Path:
    """A vendor's report: three backends, two torch versions, four nights each, a regression, a quick run."""
    from accel_harness.known_issues import load_known_issues
    from _synthetic_results import generate

    tmp_path = tmp_path_factory.mktemp("chromium-nightly")
    cells = [("cuda", "2.8.0", "0.2.0"), ("xpu", "2.9.0", "0.2.0"), ("hpu", "2.9.0", "0.2.0")]
    generated = generate(tmp_path / "results", runs=12, tests=80, history=4, cells=cells, quick_cells=[("hpu", "2.9.0")])
    report = build_report(load_results([tmp_path / "results"]), known=load_known_issues(generated.known_issues))
    return write_report(report, tmp_path / "out", ["html"])["html"]


def test_vendor_report_renders_tables_and_charts(nightly_html, tmp_path):
    result = _chromium(tmp_path, "--dump-dom", nightly_html.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom(result.stdout)
    assert dom.all("body")[0].get("data-report-ready") == "1"
    for element_id in ("pass-rates", "rates-1", "pass-fail-chart", "env-table", "bench-charts", "quick-run"):
        assert dom.by_id(element_id) is not None, element_id
    svgs = dom.all("svg")
    # pass/fail chart + 5 comparison charts + a bar and a trend for each of 15 benchmark rows
    # + a pass-rate trend in each of the 3 cells of the pass-rate table
    assert len(svgs) == 1 + 5 + 15 * 2 + 3
    assert len(dom.all("polyline")) == 15 + 3  # the trend lines, as the browser parsed them
    shot = tmp_path / "nightly.png"
    result = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,2400", nightly_html.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(shot.read_bytes()) > 60_000, "the vendor report's screenshot looks blank"
    keep = os.environ.get("ACCEL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, Path(keep).with_name(Path(keep).stem + "-nightly.png"))
