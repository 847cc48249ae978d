"""accel_reports.render: everything escaped (HTML and Markdown), self-contained HTML, Markdown tables intact."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from accel_harness.known_issues import KnownIssues
from accel_reports.analysis import build_report
from accel_reports.loaders import load_results
from accel_reports.render import md_escape, render_html, render_markdown, safe_url, write_report

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
    assert ":x: **3 untracked failures**" in md


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
    assert ">host</th>" in html and ">vs host</th>" in html and 'class="st-host-drift">host drift<' in html
