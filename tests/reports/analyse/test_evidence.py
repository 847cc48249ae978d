"""The report's evidence: flaky failures shown as "flaky (rate)" and never as new failures, expired
known issues counted as untracked, the profile's applicable coverage and the fingerprint, the
collection-drop threshold and the fairness of a comparison, and the history's flake rate per test."""

from __future__ import annotations

import pytest

from accel.commands import report as report_command
from accel.commands.cli import main
from accel_harness.known_issues import KnownIssues
from accel_reports.analyse.analysis import build_report
from accel_reports.history.store import History
from accel_reports.load.loaders import load_results
from accel_reports.render.report import render_html, render_markdown

from _report_data import rec, run_file

PROFILE = {"name": "mycpu", "device_type": "cpu", "format": "yaml", "version": "1.0", "path": "/abs/mycpu.yaml",
           "sha256": "a" * 64, "declared": {"bf16": True, "collectives": True, "fp8": False},
           "disagreements": {"device_count": "declared 2 devices; the backend sees 1"}, "expired_known_issues": []}
COVERAGE = {"areas": {"bf16": {"applicable": 4, "ran": 3, "passed": 2, "failed": 1, "skipped": 1,
                               "contradicted": ["suites/test_mp.py::test_bf16[mycpu-ws1]"]},
                      "general": {"applicable": 10, "ran": 10, "passed": 10, "failed": 0, "skipped": 0, "contradicted": []}},
            "not_claimed": {"fp8": 2}}


def _fingerprint(profile_sha: str | None = "a" * 64) -> dict:
    profile = {"name": "mycpu", "version": "1.0", "sha256": profile_sha} if profile_sha else None
    return {"torch": "2.8.0", "accel": "0.2.0", "plugins": {"accel-emu": "0.1.0"}, "profile": profile, "sha256": "f" * 64}


def _flaky(run_id: str, name: str, rate: float):
    record = rec(run_id, name, "cpu", "failed", "AssertionError: sometimes")
    record.extra["flake"] = {"runs": 4, "failed": round(rate * 4), "flake_rate": rate, "outcomes": ["failed"] * 4}
    return record


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)


def test_a_flaky_failure_is_shown_with_its_rate_and_is_no_new_failure(tmp_path):
    base = run_file(tmp_path / "base", "base", "cpu", [rec("base", "test_a", "cpu", "passed"), rec("base", "test_b", "cpu", "passed")])
    cur = run_file(tmp_path / "cur", "cur", "cpu", [_flaky("cur", "test_a", 0.5), _flaky("cur", "test_b", 1.0)])
    report = build_report(load_results([cur]), load_results([base]))
    assert list(report.flaky["test_id"]) == ["suites/test_core.py::test_a[ws1]"]
    assert report.flaky.iloc[0]["flake_rate"] == 0.5
    # test_b fails every re-run: a new failure; test_a passed some re-runs: flaky, not new
    assert list(report.untracked_failures["test_id"]) == ["suites/test_core.py::test_b[ws1]"]
    html, md = render_html(report), render_markdown(report)
    assert "flaky (50%)" in html and 'id="flaky"' in html and "flaky (50%)" in md
    assert "1 flaky (not counted as new failures)" in md
    # the gate: only the steady failure counts
    assert main(["report", str(cur), "-o", str(tmp_path / "o"), "--baseline", str(base)]) == report_command.EXIT_NEW_FAILURES
    only_flaky = run_file(tmp_path / "cur2", "cur2", "cpu", [_flaky("cur2", "test_a", 0.25)])
    assert main(["report", str(only_flaky), "-o", str(tmp_path / "o2"), "--baseline", str(base)]) == report_command.EXIT_OK


def test_expired_known_issues_are_listed_and_their_failures_untracked(tmp_path):
    failing = rec("r1", "test_x", "cpu", "failed", "RuntimeError: old bug")
    failing.extra["expired_known_issue"] = "old-bug"
    header = {"expired_known_issues": [{"id": "old-bug", "expires": "2020-01-01", "issue": "https://example.com/i/1",
                                        "source": "/abs/known.yaml, entry #1"}]}
    from _synthetic_results import write_run

    path = write_run(tmp_path / "r1.jsonl", run_id="r1", backend="cpu", torch_version="2.8.0", accel_version="0.2.0",
                     records=[failing, rec("r1", "test_ok", "cpu", "passed")], header_extra=header)
    report = build_report(load_results([path]))
    row = report.expired.iloc[0]
    assert (row["id"], row["expires"], row["failures"]) == ("old-bug", "2020-01-01", 1)
    assert len(report.untracked_failures) == 1
    md = render_markdown(report)
    assert "## Expired known issues" in md and "old-bug" in md and "1 expired known issue" in md
    assert "known issue old-bug expired" in render_html(report)


def test_an_expired_entry_of_the_known_issues_in_use_names_the_failures_it_covered(tmp_path):
    path = run_file(tmp_path, "r2", "cpu", [rec("r2", "test_y", "cpu", "failed", "RuntimeError: y broke")])
    known = KnownIssues.from_data([{"id": "y-bug", "tests": ["*test_y*"], "expires": "2020-06-30"},
                                   {"id": "live", "tests": ["*test_nothing*"], "expires": "2999-01-01"}])
    report = build_report(load_results([path]), known=known)
    assert list(report.expired["id"]) == ["y-bug"] and report.expired.iloc[0]["failures"] == 1
    assert report.tests["known_issue"].isna().all()  # an expired entry tracks nothing


def test_profile_coverage_and_fingerprint_are_rendered(tmp_path):
    from _synthetic_results import write_run

    path = write_run(tmp_path / "p.jsonl", run_id="p1", backend="mycpu", torch_version="2.8.0", accel_version="0.2.0",
                     records=[rec("p1", "test_a", "mycpu", "passed")],
                     header_extra={"profile": PROFILE, "fingerprint": _fingerprint()},
                     end_extra={"profile_coverage": COVERAGE, "fingerprint_tests": {"count": 14, "sha256": "b" * 64}})
    loaded = load_results([path])
    assert loaded.runs.iloc[0]["profile"]["name"] == "mycpu" and "path" not in loaded.runs.iloc[0]["profile"]
    report = build_report(loaded)
    html, md = render_html(report, out_dir=tmp_path), render_markdown(report, out_dir=tmp_path)
    assert "## Device profile mycpu 1.0: applicable coverage" in md
    assert "| bf16 | 4 | 3 | 2 | 1 | 1 | 75.0% | suites/test\\_mp.py::test\\_bf16\\[mycpu-ws1\\] |" in md
    assert "| general | 10 | 10 | 10 | 0 | 0 | 100.0% |  |" in md
    assert "declared 2 devices; the backend sees 1" in md and "does not claim: fp8 (2)." in md
    assert 'id="coverage-table"' in html and 'id="fingerprint-table"' in html and "/abs/mycpu.yaml" not in html
    assert "mycpu 1.0 (aaaaaaaaaaaa)" in md and "| 14 | `bbbbbbbbbbbb` |" in md and "accel-emu 0.1.0" in md


def _run(folder, run_id, names, *, profile_sha="a" * 64, selection="b" * 64, torch="2.8.0"):
    from _synthetic_results import write_run

    fingerprint = _fingerprint(profile_sha)
    fingerprint["torch"] = torch
    return write_run(folder / f"{run_id}.jsonl", run_id=run_id, backend="cpu", torch_version=torch, accel_version="0.2.0",
                     records=[rec(run_id, n, "cpu", "passed") for n in names], header_extra={"fingerprint": fingerprint},
                     end_extra={"fingerprint_tests": {"count": len(names), "sha256": selection}})


def test_collection_drop_threshold_default_five_percent(tmp_path):
    names = [f"test_{i}" for i in range(100)]
    base = load_results([_run(tmp_path / "b", "base", names)])
    for kept, dropped, threshold in ((96, False, None), (94, True, None), (99, True, 0.0), (94, False, 0.1)):
        cur = load_results([_run(tmp_path / f"c{kept}{threshold}", f"cur{kept}", names[:kept])])
        report = build_report(cur, base, collection_threshold=threshold)
        row = report.diff.collection.iloc[0]
        assert bool(row["dropped"]) is dropped, (kept, threshold)
        assert row["drop_share"] == pytest.approx((100 - kept) / 100)
    cur = _run(tmp_path / "c94cli", "cur94", names[:94])
    args = [str(cur), "-o", str(tmp_path / "o"), "--baseline", str(tmp_path / "b"), "--fail-on", "collection-drop"]
    assert main(["report", *args]) == report_command.EXIT_COLLECTION_DROP
    assert main(["report", *args, "--collection-threshold", "10%"]) == report_command.EXIT_OK


def test_a_comparison_says_when_fingerprints_make_it_unfair(tmp_path, capsys):
    names = ["test_a", "test_b"]
    base = _run(tmp_path / "b", "base", names)
    same = build_report(load_results([_run(tmp_path / "s", "same", names)]), load_results([base]))
    assert [n for n in same.comparison if not n["fair"]] == []
    other = _run(tmp_path / "o", "other", names, profile_sha="c" * 64, selection="d" * 64, torch="2.9.0")
    report = build_report(load_results([other]), load_results([base]))
    unfair = [n["what"] for n in report.comparison if not n["fair"]]
    assert unfair == ["different device profiles", "different test selections"]
    assert [n["text"] for n in report.comparison if n["fair"]] == ["torch 2.8.0 in the baseline, 2.9.0 now"]
    md = render_markdown(report)
    assert "Baseline not like for like" in md and "different device profiles" in md
    assert "not like for like (cpu: different device profiles; cpu: different test selections)" in md
    main(["report", str(other), "-o", str(tmp_path / "out"), "--baseline", str(base)])
    assert "accel report: baseline: not like for like: cpu: different device profiles" in capsys.readouterr().err


def test_the_history_keeps_flake_rates_and_a_later_report_uses_them(tmp_path):
    db = tmp_path / "h.db"
    runs = [run_file(tmp_path / "r", f"n{i}", "cpu", [_flaky(f"n{i}", "test_f", rate), rec(f"n{i}", "test_ok", "cpu", "passed")],
                     start=f"2025-06-0{i + 1}T00:00:00.000+00:00") for i, rate in enumerate((0.5, 0.25))]
    with History(db) as history:
        history.ingest(load_results(runs))
        flakiness = history.flakiness().set_index("test_id")
        row = flakiness.loc["suites/test_core.py::test_f[ws1]"]
        assert bool(row["flaky"]) and row["flake_rate"] == pytest.approx(0.375) and row["measured"] == 2
        assert flakiness.loc["suites/test_core.py::test_ok[ws1]"]["flake_rate"] is None
        # a failure without re-runs in a later run: the history says it is flaky
        later = run_file(tmp_path / "later", "n9", "cpu", [rec("n9", "test_f", "cpu", "failed", "AssertionError: again")],
                         start="2025-06-09T00:00:00.000+00:00")
        history.ingest(load_results([later]))
        report = build_report(load_results([later]), history=history)
    assert list(report.flaky["evidence"]) == ["history"] and report.flaky.iloc[0]["flake_rate"] == pytest.approx(0.375)
    assert report.untracked_failures.empty
    assert "flaky (38%)" in render_markdown(report)


def test_is_flaky_rate_bounds():
    from accel_reports.analyse.evidence import is_flaky_rate

    assert [is_flaky_rate(v) for v in (0, 0.1, 0.99, 1, 1.0, None, True, "0.5")] == [False, True, True, False, False,
                                                                                    False, False, False]
