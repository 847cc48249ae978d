"""The HTML report in a real browser: headless Chromium renders the matrix, runs the page's own
script, runs no injected one, and takes a screenshot.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skipped without it.
Set ``ACCEL_REPORT_SCREENSHOT=/some/file.png`` to keep the screenshot for a person to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from accel_harness.known_issues import KnownIssues
from accel_reports.analyse.analysis import build_report
from accel_reports.load.loaders import load_results
from accel_reports.render.report import write_report

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


# ---------------------------------------------------------------------------- the verdict at the top
def _png_rows(data: bytes) -> tuple[int, int, list[bytes], int]:
    """Decode a PNG screenshot (8-bit RGB or RGBA, not interlaced): width, height, the unfiltered rows
    and the bytes per pixel."""
    import struct
    import zlib

    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(b"".join(chunks)), width * bpp, [], bytes(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - bpp] if x >= bpp else 0
            up, corner = previous[x], previous[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = rows[-1]
    return width, height, rows, bpp


#: the green verdict's background (``.verdict.ok`` in the report's CSS)
VERDICT_GREEN = bytes((0xDA, 0xFB, 0xE1))


@pytest.fixture(scope="module")
def clean_reports(tmp_path_factory) -> dict[str, Path]:
    """The report of a clean cpu run the harness wrote (with its command line) and of a clean emu run."""
    import sys

    from accel_harness.fingerprint import COMMAND_LINE_ENV
    from _synthetic_results import bench_entry, write_benchmarks

    tmp_path = tmp_path_factory.mktemp("chromium-clean")
    (tmp_path / "test_tiny.py").write_text("def test_one():\n    assert True\n\ndef test_two():\n    assert True\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1", COMMAND_LINE_ENV: "accel qualify --backend cpu"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py",
                           "--accel-backend", "cpu", "--accel-results-dir", "cpu"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    quiet = [0.100, 0.101, 0.099, 0.100, 0.100, 0.101, 0.099, 0.100]
    write_benchmarks(tmp_path / "cpu" / "bench.json", [bench_entry("test_step", "cpu", quiet, work_size=64.0, dtype="float32")])
    run_file(tmp_path / "emu", "emu-run", "emu", [rec("emu-run", f"test_ok_{i}", "emu", "passed") for i in range(6)]
             + [rec("emu-run", "test_four", "emu", "skipped", "Skipped: [needs-devices] needs 4 emu devices, found 2")])
    out = {}
    for name in ("cpu", "emu"):
        report = build_report(load_results([tmp_path / name]), title="accel qualify")
        out[name] = write_report(report, tmp_path / f"out-{name}", ["html"])["html"]
    return out


@pytest.mark.parametrize("backend", ["cpu", "emu"])
def test_a_clean_run_shows_a_green_qualified_verdict_at_the_top(clean_reports, tmp_path, backend):
    page = clean_reports[backend].as_uri()
    result = _chromium(tmp_path, "--dump-dom", page)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom(result.stdout)
    assert dom.all("body")[0].get("data-report-ready") == "1"
    order = [(tag, attrs.get("id")) for tag, attrs in dom.elements if tag in ("h1", "p", "table", "section")]
    assert order[:2] == [("h1", None), ("p", "verdict")]  # the verdict is the first thing under the title
    assert dom.by_id("verdict")[1]["class"] == "verdict ok"
    verdict = re.search(r'id="verdict">([^<]*)<', result.stdout).group(1)
    assert verdict.startswith(f"qualified on {backend} — ") and "⚠" not in result.stdout
    facts = result.stdout[result.stdout.index('id="run-facts"'):result.stdout.index("</header>")]
    assert ('<code class="cmd">accel qualify --backend cpu</code>' if backend == "cpu" else "<i>not recorded</i>") in facts
    shot = tmp_path / f"{backend}.png"
    result = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,800", page)
    assert result.returncode == 0, result.stderr[-2000:]
    width, height, rows, bpp = _png_rows(shot.read_bytes())
    assert (width, height) == (1200, 800)
    green = [y for y, row in enumerate(rows)
             if sum(row[x:x + 3] == VERDICT_GREEN for x in range(0, len(row), bpp)) > width // 3]
    assert green and max(green) < 250, "the green verdict is not across the top of the screenshot"
    keep = os.environ.get("ACCEL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, Path(keep).with_name(Path(keep).stem + f"-clean-{backend}.png"))
