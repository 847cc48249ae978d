"""accel_reports.analyse.analysis: summary matrix, clustering, skips, per-test grid, baseline diff, known issues."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from accel_harness.known_issues import KnownIssues
from accel_reports.analyse.analysis import (
    apply_known_issues,
    build_report,
    diff_runs,
    failure_clusters,
    headline,
    known_issues_passing,
    per_test_grid,
    skip_groups,
    summary_matrix,
)
from accel_reports.load.loaders import load_results

from _report_data import KNOWN_YAML, bench_file, clustered, oom, rec, run_file


@pytest.fixture
def known():
    return KnownIssues.from_data(yaml.safe_load(KNOWN_YAML), "known.yaml")


@pytest.fixture
def loaded(tmp_path):
    return load_results(clustered(tmp_path))


def test_summary_matrix_counts_and_pass_rate(loaded):
    matrix = summary_matrix(loaded.tests).set_index("torch_version")
    first, second = matrix.loc["2.7.1"], matrix.loc["2.8.0"]
    assert (first["passed"], first["failed"], first["error"], first["skipped"], first["xfailed"]) == (10, 10, 0, 4, 1)
    assert first["tests"] == 25 and first["runs"] == 1
    assert first["pass_rate"] == pytest.approx(10 / 20)  # skipped and xfailed do not count
    assert (second["failed"], second["tracked"], second["untracked"]) == (9, 8, 1)
    assert second["pass_rate"] == pytest.approx(10 / 19)
    assert list(matrix.reset_index()["backend"]) == ["xpu", "xpu"]


def test_16_of_19_failures_are_one_known_issue(loaded, known):
    clusters = failure_clusters(loaded.tests, known)
    assert list(clusters["count"]) == [16, 2, 1]
    top = clusters.iloc[0]
    assert (top["kind"], top["key"], top["tests"]) == ("known issue", "pytorch-135550", 8)
    assert top["url"] == "https://github.com/pytorch/pytorch/issues/135550"
    assert len(top["examples"]) == 3 and top["cells"] == ["xpu · torch 2.7.1 · accel 0.2.0", "xpu · torch 2.8.0 · accel 0.2.0"]
    # the two out-of-memory failures differ in size only: one signature
    second = clusters.iloc[1]
    assert second["kind"] == "signature" and "<SIZE>" in second["key"] and second["tests"] == 1
    assert headline(clusters) == "16 of the 19 failures are known issue pytorch-135550 (all_gather_into_tensor fails on xccl)"


def test_clusters_by_signature_list_the_issues_inside(loaded):
    clusters = failure_clusters(loaded.tests, by="signature")
    top = clusters.iloc[0]
    assert top["count"] == 16 and top["issues"] == ["pytorch-135550"]
    assert "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY" in top["key"]


def test_known_issues_file_tracks_failures_the_harness_did_not(tmp_path, known):
    path = run_file(tmp_path, "r", "xpu", [
        rec("r", "test_all_gather_big", "xpu", "failed", "RuntimeError: boom", module="suites/test_collectives.py"),
        rec("r", "test_all_gather_big", "cuda", "failed", "RuntimeError: boom", module="suites/test_collectives.py"),
        rec("r", "test_broadcast_empty", "xpu", "passed", module="suites/test_collectives.py"),
    ])
    tests = apply_known_issues(load_results([path]).tests, known)
    by_backend = tests.set_index(["backend", "outcome"])["known_issue"]
    assert by_backend.loc[("xpu", "failed")] == "pytorch-135550"
    assert pd.isna(by_backend.loc[("cuda", "failed")])  # the issue is xpu-only
    passing = tests[tests["outcome"] == "passed"].iloc[0]
    assert passing["tracked_pass"] == ("accel-9",)
    table = known_issues_passing(tests, known)
    assert list(table["issue"]) == ["accel-9"] and bool(table.iloc[0]["consider_closing"])


def test_skips_grouped_by_reason_code_with_what_they_need(loaded):
    skips = skip_groups(loaded.tests).set_index("reason_code")
    assert skips.loc["needs-package", "count"] == 4 and skips.loc["needs-package", "tests"] == 2
    assert skips.loc["needs-devices", "count"] == 2
    assert skips.loc["unspecified", "count"] == 2
    assert "library" in skips.loc["needs-package", "needs"] and "devices" in skips.loc["needs-devices", "needs"]
    assert skips.loc["needs-package", "messages"] == [("deepspeed is not installed", 4)]
    assert list(skips.index)[0] == "needs-package"  # largest first


def test_grid_lines_up_one_test_across_backends_and_marks_flaky(tmp_path):
    paths = [
        run_file(tmp_path, "cuda", "cuda", [rec("cuda", "test_a", "cuda", "passed"), rec("cuda", "test_b", "cuda", "failed", "AssertionError: x")]),
        run_file(tmp_path, "xpu1", "xpu", [rec("xpu1", "test_a", "xpu", "passed")], start="2025-06-01T00:00:00.000+00:00"),
        run_file(tmp_path, "xpu2", "xpu", [rec("xpu2", "test_a", "xpu", "failed", "AssertionError: y")], start="2025-06-02T00:00:00.000+00:00"),
    ]
    cells, grid = per_test_grid(load_results(paths).tests)
    assert [c[0] for c in cells] == ["cuda", "xpu"]
    assert list(grid.index) == ["suites/test_core.py::test_a[ws1]", "suites/test_core.py::test_b[ws1]"]
    row = grid.loc["suites/test_core.py::test_a[ws1]"]
    assert row[0] == "passed" and row[1] == "failed"  # latest record in the xpu cell wins
    assert row["flaky"] == [1]
    assert pd.isna(grid.loc["suites/test_core.py::test_b[ws1]"][1])  # did not run on xpu


def _baseline_and_current(tmp_path):
    base = run_file(tmp_path / "base", "base", "xpu", [
        rec("base", "test_stays_green", "xpu", "passed"),
        rec("base", "test_breaks", "xpu", "passed"),
        rec("base", "test_breaks_known", "xpu", "passed", module="suites/test_collectives.py"),
        rec("base", "test_gets_fixed", "xpu", "failed", "AssertionError: old bug"),
        rec("base", "test_all_gather_x", "xpu", "failed", "RuntimeError: UR", module="suites/test_collectives.py", issue="pytorch-135550"),
        rec("base", "test_still_red", "xpu", "failed", "AssertionError: still"),
        rec("base", "test_goes_away", "xpu", "passed"),
        rec("base", "test_goes_away_too", "xpu", "skipped", "Skipped: [opt-in] slow"),
    ])
    current = run_file(tmp_path / "cur", "cur", "xpu", [
        rec("cur", "test_stays_green", "xpu", "passed"),
        rec("cur", "test_breaks", "xpu", "failed", oom("1.00 GiB")),
        rec("cur", "test_breaks_known", "xpu", "failed", "RuntimeError: UR", module="suites/test_collectives.py", issue="pytorch-135550"),
        rec("cur", "test_gets_fixed", "xpu", "passed"),
        rec("cur", "test_all_gather_x", "xpu", "passed", module="suites/test_collectives.py"),
        rec("cur", "test_still_red", "xpu", "failed", "AssertionError: still"),
        rec("cur", "test_brand_new", "xpu", "failed", "AssertionError: new"),
    ], torch="2.9.0")  # another torch version: compared with the same backend's newest baseline cell
    return load_results([base]), load_results([current])


def test_diff_against_baseline(tmp_path, known):
    base, cur = _baseline_and_current(tmp_path)
    diff = diff_runs(cur.tests, base.tests)
    new = diff.new_failures.set_index("test_id")
    assert set(new.index) == {"suites/test_core.py::test_breaks[ws1]", "suites/test_collectives.py::test_breaks_known[ws1]",
                              "suites/test_core.py::test_brand_new[ws1]"}
    assert new.loc["suites/test_core.py::test_brand_new[ws1]", "was"] == "absent"
    assert set(diff.new_untracked["test_id"]) == {"suites/test_core.py::test_breaks[ws1]", "suites/test_core.py::test_brand_new[ws1]"}
    assert set(diff.fixed["test_id"]) == {"suites/test_core.py::test_gets_fixed[ws1]", "suites/test_collectives.py::test_all_gather_x[ws1]"}
    assert list(diff.still_failing["test_id"]) == ["suites/test_core.py::test_still_red[ws1]"]
    assert set(diff.disappeared["test_id"]) == {"suites/test_core.py::test_goes_away[ws1]", "suites/test_core.py::test_goes_away_too[ws1]"}
    collection = diff.collection.iloc[0]
    assert (collection["baseline"], collection["current"], collection["delta"]) == (8, 7, -1)
    assert bool(collection["dropped"]) and collection["baseline_cell"] == "xpu · torch 2.8.0"
    assert len(diff.collection_drops) == 1
    # a test that failed with a known issue in the baseline passes now: the issue may be fixed
    passing = known_issues_passing(cur.tests, known, diff).set_index("issue")
    assert passing.loc["pytorch-135550", "passing"] == 1
    assert passing.loc["pytorch-135550", "still_failing"] == 1  # test_breaks_known still carries it
    assert not bool(passing.loc["pytorch-135550", "consider_closing"])


def test_report_gate_counts_new_untracked_only_against_a_baseline(tmp_path, known):
    base, cur = _baseline_and_current(tmp_path)
    with_baseline = build_report(cur, base, known)
    assert set(with_baseline.untracked_failures["test_id"]) == {"suites/test_core.py::test_breaks[ws1]", "suites/test_core.py::test_brand_new[ws1]"}
    without = build_report(cur, None, known)
    # with no baseline every untracked failure counts, the old one included
    assert len(without.untracked_failures) == 3


def test_cells_without_baseline_are_listed_not_compared(tmp_path):
    base = load_results([run_file(tmp_path / "b", "b", "cuda", [rec("b", "test_a", "cuda", "passed")])])
    cur = load_results([run_file(tmp_path / "c", "c", "xpu", [rec("c", "test_a", "xpu", "failed", "AssertionError: z")])])
    diff = diff_runs(cur.tests, base.tests)
    assert diff.disappeared.empty and diff.fixed.empty
    assert diff.unmatched_cells == ["xpu · torch 2.8.0 · accel 0.2.0"]
    # its failures are new against the baseline: a new backend cannot slip through the gate
    assert list(diff.new_untracked["was"]) == ["no baseline cell"]
    # a baseline without test records gives no diff at all: every untracked failure counts
    benchmarks_only = load_results([bench_file(tmp_path / "bo", "bo", "xpu", {"test_step": [0.5] * 5})])
    report = build_report(cur, benchmarks_only)
    assert report.diff is None and len(report.untracked_failures) == 1


# ---------------------------------------------------------------------------- known-issue ids the file does not define
def test_an_id_in_the_results_counts_only_when_the_known_issues_file_defines_it(tmp_path, known):
    from accel_reports.analyse.analysis import undefined_known_issues

    path = run_file(tmp_path, "u", "xpu", [
        rec("u", "test_all_gather_a", "xpu", "failed", "RuntimeError: UR", module="suites/test_collectives.py", issue="pytorch-135550"),
        rec("u", "test_x", "xpu", "failed", "RuntimeError: a", issue="made-up-1"),
        rec("u", "test_y", "xpu", "failed", "RuntimeError: b", issue="made-up-1"),
        rec("u", "test_broadcast_empty_z", "xpu", "failed", "RuntimeError: c", module="suites/test_collectives.py", issue="made-up-2"),
        rec("u", "test_ok", "xpu", "passed", tracked=["accel-9", "made-up-3"]),
    ])
    tests = load_results([path]).tests
    notes: list = []
    with_file = apply_known_issues(tests, known, notes).set_index("test_id")
    assert with_file.loc["suites/test_collectives.py::test_all_gather_a[ws1]", "known_issue"] == "pytorch-135550"
    assert pd.isna(with_file.loc["suites/test_core.py::test_x[ws1]", "known_issue"])  # made-up-1: untracked
    # an undefined id is cleared, then the failure is matched like any other (accel-9 names broadcast_empty tests)
    assert with_file.loc["suites/test_collectives.py::test_broadcast_empty_z[ws1]", "known_issue"] == "accel-9"
    assert with_file.loc["suites/test_core.py::test_ok[ws1]", "tracked_pass"] == ("accel-9",)
    assert sorted(n.message.split(":")[0] for n in notes) == ["undefined known issue 'made-up-1'", "undefined known issue 'made-up-2'"]
    assert all(n.kind == "note" and n.path == str(path) for n in notes)
    assert "recorded for 2 failures (2 records), but the known-issues file in use does not define it" in \
        next(n.message for n in notes if "made-up-1" in n.message)
    # no known-issues file: no id counts
    notes = []
    without = undefined_known_issues(tests, None, notes)
    assert without["known_issue"].isna().all() and without["tracked_pass"].isna().all()
    assert len(notes) == 3 and all("no known-issues file is in use" in n.message for n in notes)
    assert tests["known_issue"].notna().sum() == 4  # the input frame is left as it was


def test_the_gate_sees_undefined_ids_as_untracked_and_the_report_lists_them(tmp_path, known):
    path = run_file(tmp_path, "g", "xpu", [rec("g", "test_x", "xpu", "failed", "RuntimeError: a", issue="made-up")])
    report = build_report(load_results([path]), known=known)
    assert len(report.untracked_failures) == 1
    assert any(p.kind == "note" and "undefined known issue 'made-up'" in p.message for p in report.problems)
    assert report.clusters.iloc[0]["kind"] == "signature"
