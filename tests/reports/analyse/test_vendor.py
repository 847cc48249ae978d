"""accel_reports.analyse.vendor: the vendor table and the compatibility comparison of upstream-suite runs, through
the existing loaders, analysis and renderers."""

from __future__ import annotations

from accel_harness.records import RecordWriter, RunHeader, make_record
from accel_reports.analyse.analysis import build_report, cell_label
from accel_reports.load.loaders import load_results
from accel_reports.render.report import render_html, render_markdown
from accel_reports.analyse.vendor import subject_label, vendor_lines


def _run(folder, name, against, records, *, status="completed", torch="2.13.0", backend="cpu", version="1.15.0",
         start="2026-01-01T00:00:00+00:00"):
    block = {"project": "accelerate", "version": version, "against": against,
             "against_version": "1.15.0" if against == "accelerate" else "0.1.0", "status": status,
             "exit_code": 1, "collection_errors": 0, "install": {"failed": {"bitsandbytes": "no wheel"}} if against == "accel" else None}
    header = RunHeader(run_id=f"run-{name}", start_time=start, torch_version=torch,
                       accel_version="0.1.0", backends=[backend], extra={"upstream": block})
    with RecordWriter(folder / f"{name}.jsonl", header) as writer:
        for nodeid, outcome, text in records:
            rec = make_record(run_id=f"run-{name}", nodeid=nodeid, backend=backend, outcome=outcome, text=text).to_dict()
            if outcome == "skipped" and rec["reason_code"] == "unspecified":
                rec["reason_code"] = "needs-devices"
            writer.write(rec)


REFERENCE = [
    ("tests/test_a.py::T::test_1", "passed", None),
    ("tests/test_a.py::T::test_2", "passed", None),
    ("tests/test_b.py::test_3", "passed", None),
    ("tests/test_b.py::test_4", "passed", None),
    ("tests/test_b.py::test_gpu", "skipped", "Skipped: test requires multiple GPUs"),
    ("tests/test_c.py::test_5", "failed", "E   OSError: We couldn't connect to 'https://huggingface.co'"),
]
ACCEL = [
    ("tests/test_a.py::T::test_1", "passed", None),
    ("tests/test_a.py::T::test_2", "failed", "E   AssertionError: assert 1 == 2"),
    ("tests/test_b.py", "error", "E   ImportError: cannot import name 'patch_environment' from 'accel.utils' (/x/accel/utils/__init__.py)"),
    ("tests/test_c.py::test_5", "failed", "E   OSError: We couldn't connect to 'https://huggingface.co'"),
]


def _report(tmp_path):
    _run(tmp_path, "ref", "accelerate", REFERENCE)
    _run(tmp_path, "acc", "accel", ACCEL)
    return build_report(load_results([tmp_path]))


def test_upstream_runs_are_separate_cells_named_by_their_subject(tmp_path):
    report = _report(tmp_path)
    labels = sorted(report.matrix["accel_version"])
    assert labels == ["accelerate 1.15.0 tests → accel 0.1.0", "accelerate 1.15.0 tests → accelerate 1.15.0"]
    assert cell_label("cpu", "2.13.0", labels[0]) == "cpu · torch 2.13.0 · accelerate 1.15.0 tests → accel 0.1.0"
    assert cell_label("cpu", "2.13.0", "0.1.0") == "cpu · torch 2.13.0 · accel 0.1.0"  # unchanged for accel's own suites
    assert subject_label({"project": "x", "version": None, "against": "x"}) == "x tests → x"


def test_vendor_table_counts_clusters_and_skip_reasons(tmp_path):
    vendor = _report(tmp_path).vendor
    assert list(vendor["reference"]) == [True, False]  # the project itself first, then what it is compared with
    table = vendor.set_index("against")
    ref, acc = table.loc["accelerate 1.15.0"], table.loc["accel 0.1.0"]
    assert (ref["passed"], ref["failed"], ref["error"], ref["skipped"]) == (4, 1, 0, 1)
    assert ref["pass_rate"] == 0.8 and ref["reference"] and not acc["reference"]
    assert ref["skip_reasons"] == [{"code": "needs-devices", "count": 1, "needs": "more devices",
                                    "message": "test requires multiple GPUs"}]
    assert (acc["passed"], acc["failed"], acc["error"], acc["import_errors"]) == (1, 2, 1, 1)
    assert acc["not_installed"] == ["bitsandbytes (no wheel)"]  # with the reason pip gave
    assert sum(c["count"] for c in acc["clusters"]) == 3
    assert "accelerate 1.15.0 against accel 0.1.0 on PyTorch 2.13.0, cpu: 2 failed, 1 passed, 0 skipped, 1 error (25.0%)" in acc["headline"]
    assert "1 test module(s) fail to import" in acc["headline"]


def test_compatibility_counts_reference_passes_and_groups_the_rest_by_cause(tmp_path):
    report = _report(tmp_path)
    row = report.compat.iloc[0]
    assert (row["reference_passed"], row["also_passed"], row["differences"]) == (4, 1, 3)
    causes = {c["cause"]: c["count"] for c in row["causes"]}
    assert causes == {
        "module does not import: ImportError: cannot import name 'patch_environment' from 'accel.utils' (<PATH>)": 2,
        "failed: AssertionError: assert <N> == <N>": 1,
    }
    files = {f["file"]: (f["reference"], f["other"], f["both_passed"], f["reference_passed"]) for f in row["files"]}
    assert files["tests/test_a.py"] == ({"passed": 2, "failed": 0, "error": 0, "skipped": 0},
                                        {"passed": 1, "failed": 1, "error": 0, "skipped": 0}, 1, 2)
    assert files["tests/test_b.py"] == ({"passed": 2, "failed": 0, "error": 0, "skipped": 1},
                                        {"passed": 0, "failed": 0, "error": 1, "skipped": 0}, 0, 2)
    lines = vendor_lines(report.vendor, report.compat)
    assert lines[-1] == ("accelerate 1.15.0 tests on cpu, torch 2.13.0: 1 of the 4 tests that pass against accelerate 1.15.0 "
                         "also pass against accel 0.1.0 (25.0%).")


def test_a_collection_failure_is_reported_as_such_not_as_zero_tests(tmp_path):
    _run(tmp_path, "xpu", "accelerate", [("tests/test_a.py", "error", "E   AttributeError: module 'torch.xpu' has no attribute 'mem_get_info'")],
         status="collection-failed", torch="2.4.0", backend="xpu")
    report = build_report(load_results([tmp_path]))
    row = report.vendor.iloc[0]
    assert row["status"] == "collection-failed"
    assert "the suite fails at collection" in row["headline"] and "mem_get_info" in row["headline"]
    md = render_markdown(report)
    assert "| collection-failed |" in md


def test_renderers_show_the_vendor_table_and_leave_other_reports_alone(tmp_path):
    report = _report(tmp_path)
    md = render_markdown(report)
    assert "## Upstream suites" in md
    assert "| accelerate 1.15.0 | accel 0.1.0 | 2.13.0 | cpu | completed | 1 | 2 | 1 | 0 | 25.0% | 1 |" in md
    assert "1 of the 4 tests that pass on the reference also pass (25.0%); 3 differ" in md
    assert "Not installed for accelerate 1.15.0 (accel 0.1.0): bitsandbytes (no wheel)" in md
    assert "| tests/test\\_b.py | 2 / 0 / 0 / 1 | 0 / 0 / 1 / 0 | 0 / 2 |" in md
    html = render_html(report)
    assert '<section id="upstream">' in html and "accelerate 1.15.0 tests → accel 0.1.0" in html
    # a report of accel's own suites has no such section
    plain = tmp_path / "plain"
    plain.mkdir()
    with RecordWriter(plain / "r.jsonl", RunHeader(run_id="p", start_time="2026-01-01T00:00:00+00:00", torch_version="2.13.0",
                                                   accel_version="0.1.0", backends=["cpu"])) as writer:
        writer.write(make_record(run_id="p", nodeid="suites/t.py::test_x[cpu]", backend="cpu", outcome="passed"))
    other = build_report(load_results([plain]))
    assert other.vendor.empty and other.compat.empty
    assert "Upstream suites" not in render_markdown(other) and 'id="upstream"' not in render_html(other)
    assert other.loaded.runs["upstream"].isna().all()


def test_vendor_clusters_link_known_issues_and_escape_what_they_show(tmp_path):
    from accel_harness.known_issues import KnownIssues

    _run(tmp_path, "ref", "accelerate", REFERENCE)
    _run(tmp_path, "acc", "accel", ACCEL + [("tests/test_d.py::test_<script>alert(1)</script>", "failed", "E   ValueError: <img src=x onerror=alert(1)>")])
    known = KnownIssues.from_data({"issues": [{"id": "hub-offline", "url": "https://example.org/hub-offline", "title": "hub offline",
                                               "error": "couldn't connect"}]}, "known.yaml")
    report = build_report(load_results([tmp_path]), known=known)
    ref = report.vendor[report.vendor["reference"]].iloc[0]
    assert ref["clusters"][0] == {"count": 1, "kind": "known issue", "key": "hub-offline", "url": "https://example.org/hub-offline",
                                  "title": "hub offline", "example": "tests/test_c.py::test_5"}
    assert "All" not in ref["headline"] and "failures are" not in ref["headline"]  # one failure: no "N of M" sentence
    md = render_markdown(report)
    assert "1 × [hub-offline](<https://example.org/hub-offline>)" in md
    html = render_html(report)
    section = html[html.index('<section id="upstream">'):]
    section = section[:section.index("</section>")]
    assert '<a href="https://example.org/hub-offline"' in section
    assert "<img src=x" not in section and "&lt;img src=x onerror=alert(" in section


def test_a_side_measured_again_counts_each_test_once_from_its_latest_run(tmp_path):
    _run(tmp_path, "ref", "accelerate", REFERENCE)
    _run(tmp_path, "acc-new", "accel", [(t, "passed", None) for t, *_ in REFERENCE[:4]], start="2026-01-02T00:00:00+00:00")
    _run(tmp_path, "acc-old", "accel", ACCEL)
    report = build_report(load_results([tmp_path]))
    acc = report.vendor[~report.vendor["reference"]].iloc[0]
    assert acc["runs"] == 2 and (acc["passed"], acc["failed"], acc["error"]) == (4, 1, 1)  # test_c and test_b.py only in the old run
    row = report.compat.iloc[0]
    assert (row["reference_passed"], row["also_passed"]) == (4, 4)


def test_compatibility_names_a_known_issue_as_the_cause(tmp_path):
    from accel_harness.known_issues import KnownIssues

    _run(tmp_path, "ref", "accelerate", REFERENCE)
    _run(tmp_path, "acc", "accel", [("tests/test_a.py::T::test_1", "failed", "E   Failed: Timeout (>180.0s) from pytest-timeout.")])
    known = KnownIssues.from_data({"issues": [{"id": "slow-box", "error": "Timeout"}]}, "known.yaml")
    row = build_report(load_results([tmp_path]), known=known).compat.iloc[0]
    assert {"cause": "failed: known issue slow-box", "count": 1, "examples": ["tests/test_a.py::T::test_1"]} in row["causes"]


def test_pass_rate_tables_name_each_subject(tmp_path):
    _run(tmp_path, "ref", "accelerate", REFERENCE)
    _run(tmp_path, "acc", "accel", ACCEL)
    _run(tmp_path, "acc-xpu", "accel", ACCEL, backend="xpu", torch="2.9.0")
    html = render_html(build_report(load_results([tmp_path])))
    section = html[html.index('id="pass-rates"'):html.index('id="environment"')]
    heads = [h.split("</th>")[0].split(">")[-1] for h in section.split("<thead><tr><th>")[1:]]
    assert heads == ["accelerate 1.15.0 tests → accel 0.1.0", "accelerate 1.15.0 tests → accelerate 1.15.0"]
    accel_table = section[:section.index("</table>")]
    # cpu ran with torch 2.13.0 only, xpu with 2.9.0 only: a backend × torch table with "not run" holes
    assert accel_table.count("not run") == 2 and "torch 2.9.0" in accel_table and "torch 2.13.0" in accel_table
    assert accel_table.index("torch 2.9.0") < accel_table.index("torch 2.13.0")  # versions sort as versions
