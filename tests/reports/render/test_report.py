"""accel_reports.render.report: everything escaped (HTML and Markdown), self-contained HTML, Markdown tables intact."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from accel_harness.known_issues import KnownIssues
from accel_reports.analyse.analysis import build_report
from accel_reports.load.loaders import load_results
from accel_reports.render.report import md_escape, render_html, render_markdown, safe_url, write_report

from _report_data import KNOWN_YAML, XSS_IMG, XSS_MARKER, XSS_SCRIPT, bench_file, clustered, rec, run_file

EVIL_ISSUES = f"""\
issues:
  - id: evil-1
    url: "javascript:alert(1)"
    title: '{XSS_SCRIPT}'
    error: "EvilError"
"""


class Tags(HTMLParser):
    """Start tags and their attributes, as a browser's tokenizer sees them."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def named(self, name: str) -> list[dict]:
        return [a for t, a in self.tags if t == name]


def _evil_report(tmp_path: Path):
    folder = tmp_path / "results"
    records = [
        rec("evil", f"test_{XSS_SCRIPT}", "cuda", "failed", f"EvilError: {XSS_IMG}"),
        rec("evil", f"test_x[{XSS_IMG}]", "cuda", "failed", f"AssertionError: {XSS_SCRIPT} {XSS_MARKER}"),
        rec("evil", "test_skip", "cuda", "skipped", f"Skipped: [needs-package] {XSS_IMG}"),
        rec("evil", "test_ok", "cuda", "passed"),
    ]
    run_file(folder, "evil", "cuda", records)
    bench_file(folder, "bench", "cuda", {f"test_{XSS_SCRIPT}": [0.1] * 5})
    (folder / f"{XSS_IMG.replace('/', '_')}.jsonl").write_text("")  # a problem whose file name is an attack
    known = KnownIssues.from_data(yaml.safe_load(EVIL_ISSUES), "evil.yaml")
    return build_report(load_results([folder]), known=known, title=f"report {XSS_SCRIPT}")


def test_html_escapes_names_messages_titles_and_paths(tmp_path):
    report = _evil_report(tmp_path)
    assert report.failures == 2 and len(report.problems) == 1
    html = render_html(report)
    assert XSS_SCRIPT not in html and "<img" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html  # the failure message, escaped
    tags = Tags(html)
    assert len(tags.named("script")) == 1  # only the page's own
    assert tags.named("img") == []
    assert not [a for _, attrs in tags.tags for a in attrs if a.startswith("on")]
    # the known issue's javascript: URL is shown, never linked
    assert not [a for a in tags.named("a") if (a.get("href") or "").lower().startswith("javascript")]
    assert "evil-1" in html


def test_html_csp_allows_only_the_pages_own_script(tmp_path):
    html = render_html(_evil_report(tmp_path))
    script = re.search(r"<script>(.*)</script>", html, re.DOTALL).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = Tags(html).named("meta")
    policy = next(m["content"] for m in csp if m.get("http-equiv") == "Content-Security-Policy")
    assert f"script-src 'sha256-{digest}'" in policy and "default-src 'none'" in policy


def test_html_is_self_contained(tmp_path):
    html = render_html(build_report(load_results(clustered(tmp_path))))
    tags = Tags(html)
    assert not [a for a in tags.named("script") if a.get("src")]
    assert tags.named("link") == [] and tags.named("iframe") == []
    assert "@import" not in html and "url(" not in html
    # every href is an in-page anchor or an issue link
    hrefs = [a["href"] for a in tags.named("a")]
    assert all(h.startswith("#") or h.startswith("https://github.com/") for h in hrefs)
    assert 'id="matrix-table"' in html and 'id="pass-fail-chart"' in html
    assert 'id="benchmarks"' not in html and 'id="bench-charts"' not in html  # no benchmarks in this set
    assert "xlink:href" not in html and "<image" not in html  # the SVG charts reference nothing outside


def test_markdown_neutralises_the_attacks(tmp_path):
    md = render_markdown(_evil_report(tmp_path))
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "](javascript" not in md.lower() and "(<javascript" not in md.lower()
    # every table row keeps its column count: injected pipes are escaped
    for block in re.findall(r"(?:^\|.*\|\n)+", md, re.MULTILINE):
        rows = block.strip().splitlines()
        widths = {len(re.findall(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, rows


@pytest.mark.parametrize("text, expected", [
    ("a|b", r"a\|b"),
    ("`code` *b* _i_", r"\`code\` \*b\* \_i\_"),
    ("[x](javascript:alert(1))", r"\[x\](javascript:alert(1))"),
    ("<b>&", "&lt;b&gt;&amp;"),
    ("line1\nline2", "line1 line2"),
    ("back\\slash", r"back\\slash"),
    (None, ""),
])
def test_md_escape(text, expected):
    assert md_escape(text) == expected


@pytest.mark.parametrize("url, ok", [
    ("https://github.com/pytorch/pytorch/issues/1", True),
    ("http://x.org/a?b=c", True),
    ("javascript:alert(1)", False),
    ("data:text/html,<script>", False),
    ('https://x.org/" onmouseover="alert(1)', False),
    (None, False),
])
def test_safe_url(url, ok):
    assert (safe_url(url) is not None) is ok


def test_markdown_summary_content(tmp_path):
    known = KnownIssues.from_data(yaml.safe_load(KNOWN_YAML), "known.yaml")  # defines the ids the results carry
    md = render_markdown(build_report(load_results(clustered(tmp_path)), known=known))
    assert "> 16 of the 19 failures are known issue pytorch-135550" in md
    assert "| xpu | 2.7.1 | 0.2.0 | 1 | 10 | 10 | 0 | 4 | 1 | 0 | 50.0% |" in md
    assert "| needs-package | a library that is not installed | 4 | 2 |" in md
    assert ":x: **3 failures not covered by a known issue**" in md


def test_write_report_writes_both_files(tmp_path):
    report = build_report(load_results(clustered(tmp_path / "in")))
    written = write_report(report, tmp_path / "out")
    assert sorted(written) == ["html", "md"]
    assert written["html"].read_text().startswith("<!DOCTYPE html>")
    assert written["md"].read_text().startswith("# accel qualification report")
    with pytest.raises(ValueError):
        write_report(report, tmp_path / "out", ["pdf"])


def test_runs_cut_short_are_flagged(tmp_path):
    run_file(tmp_path, "killed", "cpu", [rec("killed", "test_a", "cpu", "passed")], interrupted=True)
    report = build_report(load_results([tmp_path]))
    assert ":warning: **1 run cut short**" in render_markdown(report)
    assert "run cut short" in render_html(report)


def test_host_drift_is_listed_apart_from_regressions(tmp_path):
    import random

    rng = random.Random(5)
    times = lambda median: [median * rng.lognormvariate(0, 0.02) for _ in range(15)]  # noqa: E731
    bench_file(tmp_path / "base", "base", "cpu", {"test_copy": times(0.5), "test_step": times(0.5)}, host=("memory", 40.0))
    bench_file(tmp_path / "cur", "cur", "cpu", {"test_copy": times(0.667), "test_step": times(0.5)}, host=("memory", 30.0),
               when="2025-06-02T00:00:00")
    report = build_report(load_results([tmp_path / "cur"]), baseline=load_results([tmp_path / "base"]))
    md = render_markdown(report)
    drift = md[md.index("### Host drift"):]
    assert "test\\_copy" in drift.split("Regression rule")[0] and "-25.0%" in drift
    assert "### Regressions" not in md
    html = render_html(report)
    assert ">host</th>" in html and ">vs host</th>" in html and 'st-host-drift">host drift<' in html


# ---------------------------------------------------------------------------- the report a vendor sends
def _nightly(tmp_path: Path, **kw):
    """Three cells (two backends, two torch versions) × 4 nights, the xpu 2.9.0 train step 25 %
    slower in its newest night, the hpu cell a quick run."""
    from _synthetic_results import generate

    cells = [("cuda", "2.8.0", "0.2.0"), ("xpu", "2.9.0", "0.2.0"), ("hpu", "2.9.0", "0.2.0")]
    generated = generate(tmp_path / "results", runs=12, tests=60, history=4, cells=cells,
                         quick_cells=[("hpu", "2.9.0")], **kw)
    from accel_harness.known_issues import load_known_issues

    return build_report(load_results([tmp_path / "results"]), known=load_known_issues(generated.known_issues))


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    report = _nightly(tmp_path_factory.mktemp("nightly"))
    return report, render_html(report), render_markdown(report)


def test_pass_rate_table_is_backend_by_torch_version_and_comes_first(nightly):
    report, html, md = nightly
    assert html.index('id="pass-rates"') < html.index('id="environment"') < html.index('id="matrix"')
    table = html[html.index('id="rates-1"'):]
    table = table[:table.index("</table>")]
    assert [h for h in re.findall(r"<th[^>]*>([^<]*)</th>", table)] == ["accel 0.2.0", "torch 2.8.0", "torch 2.9.0", "cuda", "hpu", "xpu"]
    assert table.count("not run") == 3  # cuda 2.9.0, hpu 2.8.0, xpu 2.8.0 are not in the matrix
    # the latest result of each test per cell: the figures the grid shows
    from accel_reports.render.tests_view import _cell_counts

    counts = {(c["backend"], c["torch_version"]): c for c in _cell_counts(report)}
    cuda = counts[("cuda", "2.8.0")]
    assert cuda["tests"] == 60 and cuda["passed"] + cuda["failed"] + cuda["error"] == cuda["executed"]
    assert f"{cuda['pass_rate']:.1%}" in table
    md_table = md[md.index("## Pass rate by backend and torch version"):md.index("## Environment")]
    assert "| accel 0.2.0 | torch 2.8.0 | torch 2.9.0 |" in md_table and "| **hpu** | not run |" in md_table
    assert md.index("## Pass rate by backend") < md.index("## Summary matrix")


def test_each_cell_of_the_pass_rate_table_shows_its_trend_over_runs(nightly):
    report, html, _ = nightly
    table = html[html.index('id="rates-1"'):]
    table = table[:table.index("</table>")]
    assert table.count("<polyline") == 3  # one pass-rate line per cell, each over its 4 nights
    from accel_reports.render.tests_view import _pass_rate_series

    series = _pass_rate_series(report.tests)
    assert {len(points) for points in series.values()} == {4}
    cuda = series[("cuda", "2.8.0", "0.2.0")]
    assert [p[0] for p in cuda] == sorted(p[0] for p in cuda) and all(0 <= rate <= 1 for _, rate in cuda)


def test_pass_fail_chart_stacks_outcomes_per_cell(nightly):
    report, html, _ = nightly
    chart = html[html.index('id="pass-fail-chart"'):]
    chart = chart[:chart.index("</figure>")]
    assert chart.count('class="ok"') == 3  # a passed segment for each of the three cells
    assert "cuda · torch 2.8.0 · accel 0.2.0" in chart and "skipped" in chart


def test_environment_block_has_os_kernel_driver_runtime_and_commit(nightly):
    _, html, md = nightly
    env = html[html.index('id="env-table"'):]
    env = env[:env.index("</table>")]
    import hashlib

    commit = hashlib.sha1(b"accel 0.2.0").hexdigest()
    for text in ("Linux-6.8.0-45-generic", "6.8.0-45-generic", "550.54.15", "CUDA 12.6", "SYCL 2025.1", "3.11.9",
                 "8 × NVIDIA H100 80GB HBM3", commit[:12], "2025-06-01 00:00"):
        assert text in env, text
    assert env.count("<tr>") == 1 + 3  # one environment per cell, each with its four nights
    assert "| cuda-lab-01 | Linux-6.8.0-45-generic-x86\\_64-with-glibc2.39 | 6.8.0-45-generic |" in md


def test_benchmark_rows_show_size_dtype_spread_baseline_and_trend(nightly):
    report, html, md = nightly
    section = html[html.index('id="benchmarks"'):html.index('id="grid"')]
    assert "batch=256, hidden=4096, layers=8" in section and "bytes=64 MiB" in section
    assert "<th>dtype</th>" in section and ">bf16<" in section and '<th class="num">spread</th>' in section
    # one value-vs-reference bar and one trend line per benchmark row (every cell has 4 nights)
    rows = len(report.bench_table)
    assert section.count('aria-label="now beside the reference"') == rows
    assert section.count('aria-label="trend over 4 runs"') == rows
    assert section.count('class="ref"') >= rows  # the reference drawn beside each current value
    # the regressed benchmark: its trend ends in a flagged point, its bar is coloured
    bad = report.bench_table[(report.bench_table["backend"] == "xpu") & (report.bench_table["name"].str.startswith("test_train_step"))]
    assert float(bad["change"].iloc[0]) < -0.15
    assert bad["status"].iloc[0] in ("regression", "suspect", "unconfirmed", "within noise")
    # backends compared: grouped bars per benchmark across the three backends
    charts_html = section[section.index('id="bench-charts"'):section.index("<h3>Throughput</h3>")]
    assert charts_html.count("<svg") == report.bench_table["bench_id"].nunique()
    # Markdown keeps the throughput table with size, dtype, median and spread
    table = md[md.index("### Throughput"):md.index("Median of the samples")]
    assert "| benchmark | backend | torch | size | dtype | ranks | median | spread | reference | change | status |" in table
    assert table.count("\n| test\\_") == rows
    assert "samples/s" in table and "batch=256, hidden=4096, layers=8" in table


def test_quick_run_is_labelled_in_html_and_markdown(nightly):
    report, html, md = nightly
    assert 'id="quick-run"' in html
    quick_rows = int(report.bench_table["quick"].sum()) if "quick" in report.bench_table else 5
    assert quick_rows == 5
    section = html[html.index('id="benchmarks"'):html.index('id="grid"')]
    # each row, its table's title and its line of the summary
    assert section.count('<span class="quick">quick run</span>') == quick_rows + 2
    assert ":warning: **quick run**" in md and md.count("(quick run) | hpu |") == quick_rows


def test_noisy_benchmark_is_flagged(tmp_path):
    import random

    rng = random.Random(3)
    bench_file(tmp_path, "b1", "cpu", {"test_calm": [0.5 * rng.lognormvariate(0, 0.01) for _ in range(15)],
                                       "test_noisy": [0.5 * rng.lognormvariate(0, 0.6) for _ in range(15)]})
    report = build_report(load_results([tmp_path]))
    html, md = render_html(report), render_markdown(report)
    assert html.count('title="too noisy to judge"') == 1
    noisy_line = next(line for line in md.splitlines() if line.startswith("| test\\_noisy"))
    calm_line = next(line for line in md.splitlines() if line.startswith("| test\\_calm"))
    assert ":warning: too noisy" in noisy_line and "too noisy" not in calm_line


def test_charts_escape_benchmark_and_cell_names(tmp_path):
    """A benchmark name that is an attack, compared across two backends, stays text in the SVG."""
    bench_file(tmp_path, "a", "cuda", {f"test_{XSS_SCRIPT}": [0.2] * 6})
    bench_file(tmp_path, "b", "xpu", {f"test_{XSS_SCRIPT}": [0.3] * 6})
    html = render_html(build_report(load_results([tmp_path])))
    assert 'id="bench-charts"' in html
    assert XSS_SCRIPT not in html and "<img" not in html.lower()
    tags = Tags(html)
    assert len(tags.named("script")) == 1 and not tags.named("foreignobject")
    assert not [a for _, attrs in tags.tags for a in attrs if a.startswith("on")]


def test_chart_builders():
    from markupsafe import Markup

    from accel_reports.render import charts

    bars = charts.stacked_bars([("a<b", [3, 1, 0, 0])], [("passed", "ok"), ("failed", "bad"), ("skipped", "skip"), ("x", "xf")])
    assert isinstance(bars, Markup) and "a&lt;b" in bars and bars.count("<rect") == 2  # no empty segment
    widths = [float(w) for w in re.findall(r'<rect class="\w+" x="[\d.]+" y="0" width="([\d.]+)"', bars)]
    assert widths == [390.0, 130.0]  # 3:1 of the 520-pixel bar
    assert charts.trend([("t0", 1.0)]) == ""  # one point is no trend
    line = charts.trend([("t0", 1.0), ("t1", 2.0), ("t2", float("nan")), ("t3", 1.5)], band=(0.9, 2.1), ref=1.2, status="regression")
    assert line.count("<circle") == 4 and 'class="bad"' in line and 'class="band"' in line
    bar = charts.value_bar(80.0, 100.0, 110.0, status="regression", band=(90.0, 110.0))
    assert 'class="bad"' in bar and 'class="ref"' in bar and 'class="band"' in bar


def test_write_report_is_atomic(tmp_path, monkeypatch):
    from accel_reports.render import report as render

    report = build_report(load_results(clustered(tmp_path / "in")))
    out = tmp_path / "out"
    first = write_report(report, out)
    before = first["html"].read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(render, "render_markdown", broken)
    with pytest.raises(RuntimeError):
        write_report(report, out)
    assert first["html"].read_bytes().startswith(b"<!DOCTYPE html>") and first["md"].stat().st_size > 0
    assert len(first["html"].read_bytes()) == len(before)  # same report (only its generated time may differ)
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]  # no temporary file left

    real_replace = os.replace

    def crash_on_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(render, "render_markdown", lambda *a, **k: "# md\n")
    monkeypatch.setattr(os, "replace", crash_on_replace)
    with pytest.raises(OSError):
        write_report(report, out, ["md"])
    monkeypatch.setattr(os, "replace", real_replace)
    assert first["md"].read_text().startswith("# accel qualification report")
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]


def test_synthetic_history_layout(tmp_path):
    from _synthetic_results import generate

    generated = generate(tmp_path, runs=6, tests=20, history=3, cells=[("xpu", "2.9.0", "0.2.0"), ("cuda", "2.8.0", "0.2.0")])
    assert generated.cells == [("xpu", "2.9.0", "0.2.0")] * 3 + [("cuda", "2.8.0", "0.2.0")] * 3
    loaded = load_results([tmp_path])
    xpu = loaded.benchmarks[(loaded.benchmarks["backend"] == "xpu") & loaded.benchmarks["name"].str.startswith("test_train_step")]
    values = xpu.sort_values("datetime")["value"].tolist()
    assert len(values) == 3 and values[-1] < 0.85 * min(values[:-1])  # the newest night regressed
    assert sorted(loaded.runs["start_time"].str[:10].unique()) == ["2025-06-01", "2025-06-02", "2025-06-03"]
    with pytest.raises(ValueError, match="history"):
        generate(tmp_path / "x", runs=1, tests=1, history=0)


def test_suspect_benchmarks_are_counted_apart(tmp_path):
    report = _nightly(tmp_path)
    table = report.bench_table.copy()
    table.loc[table.index[0], "status"] = "suspect"  # outside the history's band, unconfirmed (accel_reports.analyse.benchmarks)
    report.bench_table = table
    html, md = render_html(report), render_markdown(report)
    assert 'id="gate-suspect"' in html and "<b>1</b>suspect benchmark</div>" in html
    assert ":warning: **1 suspect benchmark**" in md
    assert html.count('st-suspect">suspect<') == 1


def test_benchmarks_only_report_takes_its_environment_from_the_benchmark_files(tmp_path):
    bench_file(tmp_path, "b1", "cpu", {"test_step": [0.5] * 6})
    report = build_report(load_results([tmp_path]))
    assert report.loaded.runs.empty
    html = render_html(report)
    env = html[html.index('id="env-table"'):]
    env = env[:env.index("</table>")]
    assert "lab-01" in env and "3.11.9" in env and "0" * 12 in env  # node, Python, commit_info id


def test_nightly_commits_share_one_environment_row(tmp_path):
    from _synthetic_results import write_run

    for night, commit in enumerate(("a" * 40, "b" * 40, "c" * 40)):
        write_run(tmp_path / f"n{night}.jsonl", run_id=f"n{night}", backend="cuda", torch_version="2.8.0", accel_version="0.2.0",
                  records=[rec(f"n{night}", "test_ok", "cuda", "passed")], start_time=f"2025-06-0{3 - night}T00:00:00.000+00:00",
                  git_commit=commit)
    html = render_html(build_report(load_results([tmp_path])))
    env = html[html.index('id="env-table"'):]
    env = env[:env.index("</table>")]
    assert env.count("<tr>") == 2  # heading + one environment
    assert 'title="' + "a" * 40 + '">aaaaaaaaaaaa (latest of 3)<' in env  # night 0 started last
    assert "2025-06-01 00:00" in env and "2025-06-03 00:00" in env


def test_trend_keeps_the_newest_runs(tmp_path, monkeypatch):
    from accel_reports.render import text as render_text

    monkeypatch.setattr(render_text, "TREND_POINTS", 3)
    report = _nightly(tmp_path)
    html = render_html(report)
    assert html.count('aria-label="trend over 3 runs"') == len(report.bench_table) and "trend over 4 runs" not in html


def test_environment_prefers_the_runs_frame_and_survives_missing_files(tmp_path):
    """A report from the history store: the results files may be gone; the run rows carry the fields."""
    path = run_file(tmp_path, "r1", "xpu", [rec("r1", "test_ok", "xpu", "passed")])
    report = build_report(load_results([tmp_path]))
    path.unlink()
    runs = report.loaded.runs.copy()
    runs["os"], runs["kernel"], runs["python"] = "Linux-6.11-x86_64", "6.11.0-1-custom", "3.12.4"
    runs["driver_versions"] = [{"xpu": "1.6.31294"}]
    runs["runtime_versions"] = [{"xpu": "SYCL 2025.2"}]
    report.loaded.runs = runs
    html = render_html(report)
    env = html[html.index('id="env-table"'):]
    env = env[:env.index("</table>")]
    for text in ("Linux-6.11-x86_64", "6.11.0-1-custom", "3.12.4", "1.6.31294", "SYCL 2025.2"):
        assert text in env, text
    runs = runs.drop(columns=["os", "kernel", "python", "driver_versions", "runtime_versions"])
    report.loaded.runs = runs
    env = render_html(report)
    assert 'id="env-table"' in env  # nothing to read: the block still renders what the runs frame has
