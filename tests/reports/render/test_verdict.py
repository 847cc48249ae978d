"""The report's verdict: a title naming what was qualified, one verdict line, a per-area table, no
empty columns, no local absolute paths, readable problem sizes and the benchmarks' own notes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from accel_reports.analyse import noise
from accel_reports.analyse.analysis import build_report
from accel_reports.analyse.areas import AREA_ORDER, OTHER, SUITE_AREAS, area_of
from accel_reports.load.loaders import load_results
from accel_reports.render.report import render_html, render_markdown, write_report
from _synthetic_results import DEVICE_MODEL, bench_entry, write_benchmarks

from _report_data import rec, run_file

REPO = Path(__file__).resolve().parents[3]
QUIET = [0.100, 0.101, 0.099, 0.100, 0.100, 0.101, 0.099, 0.100]
NOISY = [0.1, 0.2, 0.4, 0.1, 0.3, 0.15, 0.35, 0.12]


def _records(run_id: str = "r1") -> list:
    return [
        rec(run_id, "test_wrap", "cpu", "passed", module="suites/test_fsdp.py", ws=2),
        rec(run_id, "test_shard", "cpu", "passed", module="suites/test_fsdp.py", ws=2),
        rec(run_id, "test_four", "cpu", "skipped", "Skipped: [needs-devices] needs 4 cpu devices, found 2",
            module="suites/test_fsdp.py", ws=4),
        rec(run_id, "test_zero3", "cpu", "skipped", "Skipped: [needs-package] deepspeed is not installed",
            module="suites/test_deepspeed.py"),
        rec(run_id, "test_zero2", "cpu", "skipped", "Skipped: [needs-package] deepspeed is not installed",
            module="suites/test_deepspeed.py"),
        rec(run_id, "test_engine", "cpu", "passed", module="suites/test_deepspeed.py"),
        rec(run_id, "test_mine", "cpu", "passed", module="tests/test_project.py"),
    ]


def _bench(folder: Path, name: str, *, noisy_too: bool = True, slower: float = 1.0, **kw) -> Path:
    entries = [bench_entry("test_step", "cpu", [t * slower for t in QUIET], work_size=64.0, torch_version="2.8.0",
                           dtype="float32", **kw),
               bench_entry("test_copy", "cpu", QUIET, work_size=64.0, torch_version="2.8.0", dtype="float32", **kw)]
    if noisy_too:
        entries.append(bench_entry("test_jitter", "cpu", NOISY, work_size=64.0, torch_version="2.8.0", dtype="float32"))
    return write_benchmarks(folder / f"{name}.json", entries)


def _report(tmp_path: Path, *, title: str = "accel qualify", baseline: Path | None = None, records=None, **bench_kw):
    folder = tmp_path / "results"
    run_file(folder, "run", "cpu", records if records is not None else _records())
    _bench(folder, "bench", **bench_kw)
    base = load_results([baseline]) if baseline is not None else None
    return build_report(load_results([folder]), base, title=title)


# ---------------------------------------------------------------------------- title
def test_title_names_backend_device_torch_and_accel_after_the_callers_title(tmp_path):
    report = _report(tmp_path, title="accel qualify — PARTIAL: interrupted during benchmarks")
    expected = (f"accel qualify — PARTIAL: interrupted during benchmarks — cpu ({DEVICE_MODEL['cpu']}), "
                "torch 2.8.0, accel 0.2.0")
    html = render_html(report)
    assert f"<title>{expected}</title>" in html
    assert f"<h1>{expected}" in html
    assert render_markdown(report).splitlines()[0] == f"# {expected}"


# ---------------------------------------------------------------------------- verdict
def test_the_noise_measure_calls_only_the_jittery_benchmark_too_noisy():
    quiet = bench_entry("q", "cpu", QUIET, work_size=64.0)
    jitter = bench_entry("j", "cpu", NOISY, work_size=64.0)
    assert not noise.is_too_noisy(noise.spread_of(quiet))
    assert noise.is_too_noisy(noise.spread_of(jitter))


def test_a_first_run_says_no_baseline_never_no_regressions(tmp_path):
    report = _report(tmp_path)
    # nothing failed: qualified, in green, though no benchmark had a baseline (said, not a failure)
    line = "qualified on cpu — cpu: 4/7 pass, 3 skip; 3 benchmarks, 1 too noisy to judge; no baseline"
    md = render_markdown(report)
    assert md.splitlines()[2] == f"**:white_check_mark: {line}**"
    assert ":warning:" not in md.split("## ")[0]
    assert "No benchmark regressions" not in md and "No benchmark baseline" in md
    html = render_html(report)
    assert f'<p class="verdict ok" id="verdict">{line}</p>' in html
    assert "⚠" not in html
    badge = re.search(r'<div class="badge[^"]*" id="gate-regressions"[^>]*>(.*?)</div>', html)
    assert badge and "no baseline" in badge.group(1) and 'class="badge ok" id="gate-regressions"' not in html
    # the verdict comes before any table
    assert html.index('id="verdict"') < html.index("<table")


def test_against_a_baseline_the_verdict_counts_regressions(tmp_path):
    base = _bench(tmp_path / "base", "base")
    same = _report(tmp_path / "same", baseline=base)
    assert "3 benchmarks, 1 too noisy to judge; no regressions" in render_markdown(same)
    assert 'class="badge ok" id="gate-regressions"' in render_html(same)
    slower = _report(tmp_path / "slow", baseline=base, slower=1.5)
    md = render_markdown(slower)
    assert "**:x: not qualified on cpu — cpu: 4/7 pass, 3 skip; 3 benchmarks, 1 too noisy to judge; 1 regression**" in md
    assert '<p class="verdict bad" id="verdict">' in render_html(slower)


def test_against_a_test_baseline_the_verdict_counts_new_failures(tmp_path):
    base = tmp_path / "base"
    run_file(base, "base", "cpu", _records("b1"))
    _bench(base, "base-bench")
    same = render_markdown(_report(tmp_path / "same", baseline=base))
    assert "**:white_check_mark: qualified on cpu — cpu: 4/7 pass, 3 skip; no new failures against the baseline; 3 benchmarks" in same
    records = _records() + [rec("r1", "test_new", "cpu", "failed", "AssertionError: x", module="suites/test_launch.py")]
    worse = render_markdown(_report(tmp_path / "worse", baseline=base, records=records))
    assert ("**:x: not qualified on cpu — cpu: 4/8 pass, 1 fail, 3 skip; 1 new failure not covered by a known issue; "
            "3 benchmarks") in worse


def test_failures_make_the_verdict_bad_and_are_counted(tmp_path):
    records = _records() + [rec("r1", "test_broken", "cpu", "failed", "AssertionError: loss is nan",
                                module="suites/test_mixed_precision.py")]
    report = _report(tmp_path, records=records)
    md = render_markdown(report)
    assert "**:x: not qualified on cpu — cpu: 4/8 pass, 1 fail, 3 skip; 1 failure not covered by a known issue; 3 benchmarks" in md
    html = render_html(report)
    assert "untracked" not in html.split('id="areas"')[0]  # plain words at the top, no jargon
    assert '<b>1</b>failure not covered by a known issue</div>' in html


# ---------------------------------------------------------------------------- areas
def test_area_of_maps_suite_files_and_puts_the_rest_in_other():
    assert area_of("suites/test_fsdp.py::test_x[ws2]") == "FSDP"
    assert area_of("suites/test_state_and_process.py::TestState::test_y") == "state"
    assert area_of("tests/test_accelerator.py::test_z") == OTHER and area_of("") == OTHER
    assert set(SUITE_AREAS.values()) | {OTHER} == set(AREA_ORDER)
    suites = {p.stem for p in (REPO / "suites").glob("test_*.py")} | {p.stem for p in (REPO / "suites" / "benchmarks").glob("test_*.py")}
    assert suites <= set(SUITE_AREAS), f"suite files with no area: {sorted(suites - set(SUITE_AREAS))}"


def test_per_area_table_counts_outcomes_and_top_skip_reasons(tmp_path):
    report = _report(tmp_path)
    md = render_markdown(report)
    section = md[md.index("## By area"):md.index("## Pass rate")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| area")]
    assert rows == [
        "| FSDP | 3 | 2 | 0 | 1 | 100.0% | needs-devices × 1 |",
        "| DeepSpeed | 3 | 1 | 0 | 2 | 100.0% | needs-package × 2 |",
        "| other | 1 | 1 | 0 | 0 | 100.0% |  |",
    ]
    html = render_html(report)
    assert '<section id="areas">' in html and "<code>needs-package</code> × 2" in html
    assert html.index('id="areas"') < html.index('id="pass-rates"') < html.index('id="grid"')


# ---------------------------------------------------------------------------- empty columns
def test_columns_without_data_are_left_out(tmp_path):
    first = render_markdown(_report(tmp_path / "first"))
    header = next(line for line in first.splitlines() if line.startswith("| benchmark |"))
    assert "reference" not in header and "change" not in header and "note" not in header
    env = next(line for line in first.splitlines() if line.startswith("| host |"))
    assert "driver" not in env and "runtime" not in env  # the cpu runs record neither
    html = render_html(_report(tmp_path / "first-html"))
    bench_head = html[html.index('<table class="sortable bench-table">'):]
    bench_head = bench_head[:bench_head.index("</thead>")]
    assert ">reference<" not in bench_head and ">change<" not in bench_head and ">speedup<" not in bench_head
    assert ">now vs reference<" not in bench_head  # no reference: the bar would show the figure alone
    compared = render_markdown(_report(tmp_path / "second", baseline=_bench(tmp_path / "base", "base")))
    header = next(line for line in compared.splitlines() if line.startswith("| benchmark |"))
    assert "| reference |" in header and "| change |" in header


# ---------------------------------------------------------------------------- paths
def test_report_holds_no_local_absolute_path(tmp_path, monkeypatch):
    work = tmp_path / "checkout"
    results = work / "out" / "results"
    where = work / "suites" / "test_training.py"
    failing = rec("r1", "test_loss", "cpu", "failed",
                  f"    def test_loss():\n>       assert loss == 1\n\n{where}:12: AssertionError\nE       AssertionError: loss at {where}",
                  module="suites/test_training.py")
    run_file(results, "run", "cpu", _records() + [failing])
    _bench(results, "bench")
    (results / "broken.jsonl").write_text("{not json\n")  # an input problem names its file
    monkeypatch.chdir(work)  # where the suites ran
    report = build_report(load_results([results]), load_results([_bench(work / "base", "base")]))
    written = write_report(report, work / "out" / "report")
    html, md = written["html"].read_text(), written["md"].read_text()
    for text in (html, md):
        assert str(tmp_path) not in text
    assert "../results/run.jsonl" in html and "../results/broken.jsonl" in html and "../results/broken.jsonl" in md
    assert "suites/test_training.py:12: AssertionError" in html  # the traceback's file, relative to the checkout


# ---------------------------------------------------------------------------- sizes and notes
def test_list_sizes_are_written_out_not_as_python_reprs(tmp_path):
    folder = tmp_path / "results"
    run_file(folder, "run", "cpu", _records())
    write_benchmarks(folder / "bench.json", [bench_entry(
        "test_checkpoint", "cpu", QUIET, work_size=64.0, dtype="float32",
        sizes={"files": ["model.safetensors", "optimizer.bin"], "shard_bytes": [2**20] * 4,
               "names": [f"f{i}" for i in range(7)]})])
    html = render_html(build_report(load_results([folder])))
    assert "files=[model.safetensors, optimizer.bin]" in html
    assert "shard_bytes=4 × 1 MiB" in html
    assert "names=[f0, f1, f2, f3, … (7 in all)]" in html
    assert "[&#39;" not in html and "['" not in html


def test_a_benchmarks_note_is_shown_beside_its_figure(tmp_path):
    note = "float16 matmul is 160× slower than float32 here: the device has no fast float16 matmul kernels"
    folder = tmp_path / "results"
    run_file(folder, "run", "cpu", _records())
    slow = bench_entry("test_matmul", "cpu", QUIET, work_size=64.0, dtype="float16")
    slow["extra_info"]["note"] = note
    write_benchmarks(folder / "bench.json", [slow, bench_entry("test_matmul", "cpu", QUIET, work_size=64.0, dtype="float32")])
    report = build_report(load_results([folder]))
    assert f'<div class="note">{note}</div>' in render_html(report)
    md = render_markdown(report)
    assert "| note |" in md and note.replace("_", "\\_") in md


def _matmul_suite():
    path = REPO / "suites" / "benchmarks" / "test_bench_matmul.py"
    spec = importlib.util.spec_from_file_location("accel_bench_matmul_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matmul_benchmark_notes_a_dtype_far_slower_than_float32(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "suites" / "benchmarks"))  # the suite imports its timing helpers
    suite = _matmul_suite()
    note = suite.slow_dtype_note("float16", 1.6, 0.01, 0.02, 0.03)
    assert note and "160×" in note and "float16" in note and "no fast float16 matmul kernels" in note
    # figures too noisy (or of unknown spread) make no claim about the kernels
    for spreads in ((0.02, 1.69), (1.69, 0.02), (None, 0.02)):
        noisy = suite.slow_dtype_note("float16", 1.6, 0.01, *spreads)
        assert "too noisy to conclude" in noisy and "no fast" not in noisy
    assert suite.slow_dtype_note("float16", 0.01 * suite.SLOW_FACTOR * 0.9, 0.01, 0.02, 0.02) is None
    assert suite.slow_dtype_note("float32", 1.6, 0.01, 0.02, 0.02) is None
    assert suite.slow_dtype_note("bfloat16", 1.6, 0.0, 0.02, 0.02) is None


@pytest.mark.parametrize("bad", [None, 3, "", "   "])
def test_only_a_text_note_is_kept(tmp_path, bad):
    folder = tmp_path / "results"
    entry = bench_entry("test_matmul", "cpu", QUIET, work_size=64.0, dtype="float16")
    entry["extra_info"]["note"] = bad
    write_benchmarks(folder / "bench.json", [entry])
    loaded = load_results([folder])
    assert loaded.benchmarks["note"].isna().all()
    assert 'class="note"' not in render_html(build_report(loaded))
