"""A verdict a vendor can trust: a claim about the hardware only from figures whose noise allows it,
one noise computation that the console and the report both show, a green "qualified on B" with
nothing failed, the run's exact command line, versions and fingerprint at the top, and benchmark
variants that differ visibly, not only in a tooltip."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accel.commands import bench as bench_command
from accel.commands.qualify import _tally
from accel_harness.fingerprint import COMMAND_LINE_ENV, command_line
from accel_reports.analyse import claims, noise
from accel_reports.analyse.analysis import build_report
from accel_reports.load.loaders import load_results
from accel_reports.render.report import render_html, render_markdown
from _report_data import rec, run_file
from _synthetic_results import bench_entry, write_benchmarks
from _waits import SAFETY_NET_S

QUIET = [0.100, 0.101, 0.099, 0.100, 0.100, 0.101, 0.099, 0.100]
#: rounds whose times spread 169 % of their median (the float32 figure of the report that said "10× slower")
WILD = [0.05, 0.06, 0.1, 0.1, 0.1, 0.25, 0.286, 0.35]
#: times that spread 30 % while the throughputs computed from them spread 23 %: a measure taken over
#: throughputs calls this benchmark steady, the one over round times (the console's) calls it noisy
EDGE = [1.0, 1.0, 1.0, 1.0, 1.0, 1.3, 1.3, 1.3]
OLD_CLAIM = ("bfloat16 matmul is 10× slower than float32 here: the device has no fast bfloat16 matmul kernels, "
             "so this figure measures a fallback path")


def _matmul(dtype: str, times: list[float], **extra) -> dict:
    entry = bench_entry("test_matmul", "cpu", times, work_size=64.0, dtype=dtype, torch_version="2.8.0")
    entry["extra_info"].update(extra)
    return entry


def _report(folder: Path, entries: list[dict], records=None):
    run_file(folder, "run", "cpu", records if records is not None else
             [rec("r1", "test_ok", "cpu", "passed"), rec("r1", "test_other", "cpu", "passed")])
    write_benchmarks(folder / "bench.json", entries)
    return build_report(load_results([folder]), title="accel qualify")


def _bench_html(html: str) -> str:
    return html[html.index('id="benchmarks"'):]


# ---------------------------------------------------------------------------- claims gated on noise
def test_the_noise_measure_of_the_reference_is_what_the_example_says():
    assert noise.spread_text(noise.relative_iqr(WILD)) == "169%"
    assert noise.is_too_noisy(noise.relative_iqr(EDGE))
    assert not noise.is_too_noisy(noise.relative_iqr([1 / t for t in EDGE]))


def test_a_noisy_float32_figure_yields_no_claim_about_the_kernels(tmp_path):
    # the note claims no fast kernels, beside a float32 figure that spread 169 %
    slow = _matmul("bfloat16", [t * 10 for t in QUIET], note=OLD_CLAIM, float32_ratio=10.0)
    report = _report(tmp_path, [slow, _matmul("float32", WILD)])
    html, md = _bench_html(render_html(report)), render_markdown(report)
    for text in (html, md):
        assert "no fast" not in text and "slower than float32" not in text
        assert "too noisy to conclude" in text and "169%" in text


def test_a_noisy_figure_of_its_own_yields_no_claim(tmp_path):
    slow = _matmul("bfloat16", WILD, note=claims.slow_kernel_note("bfloat16", 12.0, 0.02, 0.02), float32_ratio=12.0)
    html = _bench_html(render_html(_report(tmp_path, [slow, _matmul("float32", QUIET)])))
    assert "no fast" not in html and "too noisy to conclude (spread 169%, float32 reference 1%" in html


def test_two_steady_figures_keep_the_claim(tmp_path):
    slow = _matmul("bfloat16", [t * 12 for t in QUIET], note=claims.slow_kernel_note("bfloat16", 12.0, 0.02, 0.02))
    html = _bench_html(render_html(_report(tmp_path, [slow, _matmul("float32", QUIET)])))
    assert "bfloat16 matmul is 12× slower than float32 here: the device has no fast bfloat16 matmul kernels" in html
    assert "too noisy to conclude" not in html


def test_a_claim_without_a_float32_figure_to_check_it_against_is_not_made(tmp_path):
    html = _bench_html(render_html(_report(tmp_path, [_matmul("float16", QUIET, note=OLD_CLAIM.replace("bfloat16", "float16"))])))
    assert "no fast" not in html and "too noisy to conclude (spread 1%, float32 reference –" in html


def test_the_claim_is_made_once_for_the_suite_and_the_report():
    assert claims.slow_kernel_note("float16", 20.0, 0.02, 0.03).startswith("float16 matmul is 20× slower")
    assert "too noisy to conclude" in claims.slow_kernel_note("float16", 20.0, 0.02, noise.NOISY_SPREAD * 1.01)
    assert "too noisy to conclude" in claims.slow_kernel_note("float16", 20.0, None, 0.02)  # unknown is not steady
    assert claims.slow_kernel_note("float16", claims.SLOW_FACTOR * 0.9, 0.02, 0.02) is None
    assert claims.slow_kernel_note("float32", 20.0, 0.02, 0.02) is None
    assert claims.claimed_ratio(claims.slow_kernel_note("float16", 20.0, 0.02, 0.03)) == 20.0
    assert claims.claimed_ratio(OLD_CLAIM) == 10.0 and claims.claimed_ratio("fused kernel") is None


# ---------------------------------------------------------------------------- one noise computation
def test_console_and_report_give_the_same_noisy_count_and_spreads(tmp_path):
    entries = [_matmul("float32", QUIET), _matmul("float16", EDGE), _matmul("bfloat16", WILD)]
    console = bench_command.too_noisy(entries)
    assert sorted((name, noise.spread_text(s)) for name, s in console) == [
        ("test_matmul[bfloat16-cpu-ws1]", "169%"), ("test_matmul[float16-cpu-ws1]", "30%")]
    table = bench_command.summary_table([entries])
    warning = bench_command.noise_warning([entries])
    assert "2 of 3 benchmarks" in warning and "(169%)" in warning and "(30%)" in warning
    report = _report(tmp_path / "report", entries)
    html, md = render_html(report), render_markdown(report)
    assert "3 benchmarks, 2 too noisy to judge" in html and "3 benchmarks, 2 too noisy to judge" in md
    bench = _bench_html(html)
    for name, spread in console:
        text = noise.spread_text(spread)
        assert re.search(rf"{re.escape(name)}\s.*?\s{re.escape(text)}!", table)  # the console's row
        row = next(r for r in bench.split("<tr>") if f'title="{name}"' in r)
        assert f">{text} too noisy</td>" in row  # the report's row, the same figure
    calm = next(r for r in bench.split("<tr>") if 'title="test_matmul[float32-cpu-ws1]"' in r)
    assert "too noisy" not in calm
    # accel qualify's closing tally counts the same way
    write_benchmarks(tmp_path / "bench" / "b.json", entries)
    assert "3 benchmarks measured, 2 too noisy to judge" in _tally(tmp_path / "none", tmp_path / "bench")


# ---------------------------------------------------------------------------- the verdict
def test_a_run_with_no_failure_is_qualified_in_green(tmp_path):
    report = _report(tmp_path, [_matmul("float32", QUIET), _matmul("float16", WILD)])
    html, md = render_html(report), render_markdown(report)
    verdict = re.search(r'<p class="verdict (\w+)" id="verdict">(.*?)</p>', html)
    assert verdict.group(1) == "ok" and verdict.group(2).startswith("qualified on cpu — ")
    assert "⚠" not in html and ":warning:" not in md.split("## ")[0]
    assert md.splitlines()[2].startswith("**:white_check_mark: qualified on cpu — ")
    top = html[:html.index("</header>")]
    assert "untracked" not in top and "untracked" not in html[:html.index('id="gate-failures"') + 200]


def test_a_failure_is_not_qualified_and_named_in_plain_words(tmp_path):
    records = [rec("r1", "test_ok", "cpu", "passed"), rec("r1", "test_bad", "cpu", "failed", "AssertionError: x")]
    html = render_html(_report(tmp_path, [_matmul("float32", QUIET)], records=records))
    verdict = re.search(r'<p class="verdict (\w+)" id="verdict">(.*?)</p>', html)
    assert verdict.group(1) == "bad" and verdict.group(2).startswith("not qualified on cpu — ")
    assert "1 failure not covered by a known issue" in verdict.group(2)


def test_benchmarks_alone_are_not_a_qualification(tmp_path):
    write_benchmarks(tmp_path / "bench.json", [_matmul("float32", QUIET)])
    html = render_html(build_report(load_results([tmp_path])))
    verdict = re.search(r'<p class="verdict (\w+)" id="verdict">(.*?)</p>', html)
    assert verdict.group(1) == "warn" and verdict.group(2).startswith("not concluded on cpu — ")
    assert "no test results" in verdict.group(2)


# ---------------------------------------------------------------------------- the command line
def test_command_line_is_argv_as_a_shell_takes_it_back():
    assert command_line(["/venv/bin/accel", "qualify", "--backend", "cpu", "-o", "my out"], {}) == \
        "accel qualify --backend cpu -o 'my out'"
    assert command_line(["/venv/lib/python3.11/site-packages/pytest/__main__.py", "-q"], {}) == "python -m pytest -q"
    assert command_line(["pytest"], {COMMAND_LINE_ENV: "accel qualify --backend emu"}) == "accel qualify --backend emu"


def test_accel_qualify_hands_its_command_line_to_the_runs_it_starts(monkeypatch):
    from accel.commands.qualify import child_environment

    monkeypatch.delenv(COMMAND_LINE_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/accel", "qualify", "--backend", "emu", "--quick"])
    assert child_environment()[COMMAND_LINE_ENV] == "accel qualify --backend emu --quick"


def test_the_harness_records_the_command_line_and_the_report_shows_it_at_the_top(tmp_path):
    (tmp_path / "test_tiny.py").write_text("def test_one():\n    assert True\n", encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONSAFEPATH": "1", COMMAND_LINE_ENV: ""}
    env.pop("PYTEST_ADDOPTS", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py", "--accel-backend", "cpu",
            "--accel-results-dir", "res"]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = build_report(load_results([tmp_path / "res"]))
    shown = "python -m pytest -q -p no:cacheprovider test_tiny.py --accel-backend cpu --accel-results-dir res"
    html = render_html(report)
    top = html[:html.index("</header>")]
    facts = top[top.index('id="run-facts"'):]
    assert f'<code class="cmd">{shown}</code>' in facts
    assert top.index('id="verdict"') < top.index('id="run-facts"')
    assert re.search(r"versions: torch [^·]+, accel [^·]+, Python 3\.", facts)
    assert re.search(r"fingerprint: environment [0-9a-f]{12}; 1 tests selected \([0-9a-f]{12}\)", facts)
    assert f"command line: `{shown}`" in render_markdown(report).split("## ")[0]


def test_an_older_file_without_a_command_line_says_not_recorded(tmp_path):
    report = _report(tmp_path, [_matmul("float32", QUIET)])
    html = render_html(report)
    assert "command line: <i>not recorded</i>" in html[:html.index("</header>")]
    assert "command line: _not recorded_" in render_markdown(report)


# ---------------------------------------------------------------------------- variants
def _train_step(variant: str, times: list[float]) -> dict:
    entry = bench_entry("test_train_step", "cpu", times, work_size=64.0, dtype="float32", torch_version="2.8.0",
                        sizes={"batch": 64, "hidden": 256})
    entry = copy.deepcopy(entry)
    entry["name"] = f"test_train_step[cpu-mlp-{variant}]"
    entry["fullname"] = f"suites/benchmarks/test_bench_train_step.py::{entry['name']}"
    entry["extra_info"]["variant"] = variant
    return entry


def test_variant_rows_differ_in_their_visible_text(tmp_path):
    report = _report(tmp_path, [_train_step("torch", QUIET), _train_step("accel", [t * 1.1 for t in QUIET])])
    bench = _bench_html(render_html(report))
    rows = [r for r in bench.split("<tr>") if 'title="test_train_step[' in r]
    assert len(rows) == 2

    def visible(row: str) -> str:  # the text a reader sees, without attributes (tooltips)
        return re.sub(r"<[^>]*>", " ", row.split("</td>")[0])

    assert visible(rows[0]) != visible(rows[1])
    assert {"mlp · torch", "mlp · accel"} == {re.search(r"mlp · \w+", visible(r)).group(0) for r in rows}
