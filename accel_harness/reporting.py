"""Turns pytest reports into result records and applies known issues.

Runs in two places under pytest-xdist: ``pytest_runtest_makereport`` where the test ran (it adds
backend, world size and known-issue data to ``report.user_properties``, which xdist forwards),
and ``pytest_runtest_logreport`` in the controller, the only writer of the results file.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from .params import item_backend
from .records import RecordWriter, RunHeader, make_record


def _props(report: Any) -> dict[str, Any]:
    return dict(getattr(report, "user_properties", ()) or ())


class ResultReporter:
    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.config = ctx.config
        self.is_controller = not hasattr(self.config, "workerinput")
        self.results_dir = self.config.getoption("accel_results_dir")
        self.xfail_known = self.config.getoption("accel_known_issues_xfail")
        self.writer: RecordWriter | None = None
        self.path: str | None = None
        self.phases: dict[str, list[Any]] = {}
        self.known = None
        path = self.config.getoption("accel_known_issues")
        if path:
            from .known_issues import KnownIssuesError, load_known_issues

            try:
                self.known = load_known_issues(path)
            except (OSError, KnownIssuesError) as exc:
                raise pytest.UsageError(f"--known-issues: {exc}") from None

    # ------------------------------------------------------------------ where tests run
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        backend, world = item_backend(item)
        if backend is None:
            return
        report.user_properties.append(("accel_backend", backend))
        report.user_properties.append(("accel_world_size", world))
        if self.known is None or report.when != "call" and not report.failed:
            return
        from .records import device_neutral_id

        test_id = device_neutral_id(item.nodeid, backend)
        torch_version = self.ctx.backend(backend).torch_version
        if report.failed:
            issue = self.known.match_failure(test_id, item.nodeid, backend, torch_version, report.longreprtext)
            if issue is not None:
                report.user_properties.append(("accel_known_issue", issue.id))
                if issue.xfail and self.xfail_known and report.when == "call":
                    report.outcome = "skipped"
                    report.wasxfail = f"known issue {issue.id}: {issue.title or issue.url or ''}".strip()
        elif report.passed and report.when == "call":
            tracked = self.known.match_test(test_id, item.nodeid, backend, torch_version)
            if tracked:
                report.user_properties.append(("accel_tracked_pass", [i.id for i in tracked]))

    # ------------------------------------------------------------------ controller only
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not (self.is_controller and self.results_dir):
            return
        os.makedirs(self.results_dir, exist_ok=True)
        backends = [self.ctx.backend(name) for name in self.ctx.selected]
        from .fingerprint import command_line

        extra = {**(getattr(self.ctx, "header_extra", None) or {}), "command_line": command_line()}
        header = RunHeader.collect(backends, run_id=self.ctx.run_id, extra=extra)
        self.path = os.path.join(self.results_dir, f"{self.ctx.run_id}.jsonl")
        self.writer = RecordWriter(self.path, header)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.writer is None:
            return
        phases = self.phases.setdefault(report.nodeid, [])
        phases.append(report)
        if report.when == "teardown":
            self.writer.write(self._record(report.nodeid, self.phases.pop(report.nodeid)))

    def _record(self, nodeid: str, phases: list[Any]) -> Any:
        props: dict[str, Any] = {}
        for rep in phases:
            props.update(_props(rep))
        duration = sum(getattr(rep, "duration", 0.0) for rep in phases)
        outcome, when, text, message = "passed", "call", None, None
        for rep in phases:
            xfail = getattr(rep, "wasxfail", None)
            if rep.when == "call" and xfail is not None:
                outcome, when = ("xfailed", "call") if rep.skipped else ("xpassed", "call")
                text, message = (rep.longreprtext or None), (xfail or None)
                break
            if rep.failed:
                outcome = "failed" if rep.when == "call" else "error"
                when, text = rep.when, rep.longreprtext
                break
            if rep.skipped:
                outcome, when = "skipped", rep.when
                text = rep.longrepr if isinstance(rep.longrepr, tuple) else rep.longreprtext
                break
        extra = {}
        for rep in phases:  # per-test fields other harness parts add (the device profile's capability areas, ...)
            for key, value in getattr(rep, "user_properties", ()) or ():
                if key == "accel_record_extra" and isinstance(value, dict):
                    extra.update(value)
        if props.get("accel_tracked_pass"):
            extra["tracked_pass"] = props["accel_tracked_pass"]
        record = make_record(
            run_id=self.ctx.run_id,
            nodeid=nodeid,
            backend=props.get("accel_backend"),
            world_size=props.get("accel_world_size"),
            outcome=outcome,
            duration=duration,
            when=when,
            text=text,
            message=message,
            known_issue=props.get("accel_known_issue"),
            extra=extra,
        )
        if props.get("accel_reason_code") and outcome in ("failed", "error"):
            record.reason_code = props["accel_reason_code"]  # e.g. claim-contradicted
        return record

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.writer is not None:
            # Ctrl-C ends the session normally (the run_end line is written), so say it was cut short
            interrupted = int(exitstatus) == int(pytest.ExitCode.INTERRUPTED)
            extra = self.ctx.run_end_extra() if hasattr(self.ctx, "run_end_extra") else {}
            self.writer.close(exit_status=int(exitstatus), **extra, **({"interrupted": True} if interrupted else {}))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.path:
            terminalreporter.write_line(f"accel results: {self.path}")
