"""The report's torch.compile section: per cell, the compile suite's graphs and graph breaks from its records."""

from __future__ import annotations

from _report_data import XSS_SCRIPT, run_file

from accel_harness.records import make_record
from accel_reports.analyse.analysis import build_report
from accel_reports.render.compile_view import compile_view
from accel_reports.load.compile_records import COMPILE_TEST, compile_detail
from accel_reports.load.loaders import load_results
from accel_reports.render.report import render_html, render_markdown


def _report(tmp_path, cells):
    for backend, outcome, block in cells:
        record = make_record(run_id=f"r-{backend}", nodeid=f"{COMPILE_TEST}[{backend}-ws1]", backend=backend,
                             outcome=outcome, duration=1.0, world_size=1, extra={"compile": block} if block else None)
        other = make_record(run_id=f"r-{backend}", nodeid=f"suites/test_training.py::test_step[{backend}-ws1]",
                            backend=backend, outcome="passed", duration=0.1, world_size=1)
        run_file(tmp_path / backend, f"r-{backend}", backend, [record, other])
    return build_report(load_results([tmp_path / backend for backend, _, _ in cells]))


def test_each_cell_shows_its_graphs_breaks_and_reasons(tmp_path):
    report = _report(tmp_path, [
        ("cpu", "passed", {"backend": "inductor", "graphs": 1, "graph_breaks": 0, "break_reasons": {}}),
        ("emu", "failed", {"backend": "inductor", "graphs": 2, "graph_breaks": 1,
                           "break_reasons": {f"data-dependent branch {XSS_SCRIPT}": 1}}),
    ])
    rows = {row["cell"].split(" ")[0]: row for row in compile_view(report.tests)}
    assert rows["cpu"]["status"] == "passed" and rows["cpu"]["breaks"] == "0" and rows["cpu"]["reasons"] == "none"
    assert rows["emu"]["status"] == "failed" and rows["emu"]["graphs"] == "2" and rows["emu"]["breaks"] == "1"
    assert rows["emu"]["reasons"].startswith("data-dependent branch") and rows["emu"]["reasons"].endswith("(×1)")
    md, html = render_markdown(report), render_html(report)
    assert "## torch.compile" in md and "| inductor | 1 | 0 | none |" in md
    assert 'id="compile"' in html and 'href="#compile"' in html and "data-dependent branch" in html
    assert XSS_SCRIPT not in html and XSS_SCRIPT not in md


def test_a_record_without_figures_shows_its_status_only(tmp_path):
    (row,) = compile_view(_report(tmp_path, [("cpu", "skipped", None)]).tests)
    assert row["status"] == "not run" and row["graphs"] == "–" and row["breaks"] == "–"


def test_malformed_blocks_are_not_guessed_at():
    assert compile_detail({"compile": "inductor"}) is None
    detail = compile_detail({"compile": {"backend": 3, "graphs": -1, "graph_breaks": True,
                                         "break_reasons": {"ok": 2, "bad": "x"}}})
    assert detail == {"backend": None, "graphs": None, "graph_breaks": None, "break_reasons": {"ok": 2}}


def test_no_compile_records_no_section(tmp_path):
    record = make_record(run_id="r1", nodeid="suites/test_training.py::test_step[cpu-ws1]", backend="cpu",
                         outcome="passed", duration=0.1, world_size=1)
    run_file(tmp_path, "r1", "cpu", [record])
    report = build_report(load_results([tmp_path]))
    assert compile_view(report.tests) is None and "## torch.compile" not in render_markdown(report)
