"""``--flake-runs N``: run each failing test N more times and record how often it fails.

The test's outcome stays what its first run gave (a failure is a failure); its record gains
``extra["flake"]``: ``{"runs": N + 1, "failed": k, "flake_rate": k / (N + 1), "outcomes": [...]}``.
A rate of 1.0 is a test that fails every time; anything lower is a flaky test, which a report can
tell apart from a regression. Only failures of the test body are re-run (not setup errors). Each
re-run is a whole setup / call / teardown with fresh function-scoped fixtures, not reported to
pytest's terminal or to other plugins' log hooks.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["FlakeRuns"]


class FlakeRuns:
    """A pytest plugin object that re-runs failing tests ``runs`` more times (see the module docstring)."""

    def __init__(self, runs: int):
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
            raise ValueError(f"--flake-runs takes a number of re-runs (0 or more), got {runs!r}")
        self.runs = runs

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if self.runs == 0 or not isinstance(item, pytest.Function):
            return None
        from _pytest.runner import runtestprotocol  # the protocol pytest itself runs, without logging

        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        if any(r.when == "call" and r.failed for r in reports):
            outcomes = ["failed"]
            for _ in range(self.runs):
                _fresh_fixtures(item)
                again = runtestprotocol(item, nextitem=nextitem, log=False)
                outcomes.append(_outcome(again))
            failed = outcomes.count("failed")
            flake = {"runs": len(outcomes), "failed": failed, "flake_rate": round(failed / len(outcomes), 4),
                     "outcomes": outcomes}
            for report in reports:
                report.user_properties.append(("accel_record_extra", {"flake": flake}))
        for report in reports:
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True


def _outcome(reports: list[Any]) -> str:
    for report in reports:
        if report.failed:
            return "failed" if report.when == "call" else "error"
    for report in reports:
        if report.skipped:
            return "skipped"
    return "passed"


def _fresh_fixtures(item: pytest.Function) -> None:
    """Forget the function-scoped fixture values of the last run, so the next one sets them up anew."""
    init = getattr(item, "_initrequest", None)
    if not callable(init):
        raise RuntimeError(f"--flake-runs: this pytest ({pytest.__version__}) has no Function._initrequest to reset fixtures with")
    init()
