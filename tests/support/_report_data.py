"""Small, exact result sets for the report tests (tests/support/_synthetic_results.py makes the big realistic ones)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accel_harness.records import TestRecord, make_record
from _synthetic_results import bench_entry, longrepr, write_benchmarks, write_run

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(1)>'
XSS_MARKER = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"

KNOWN_YAML = """\
issues:
  - id: pytorch-135550
    url: https://github.com/pytorch/pytorch/issues/135550
    title: all_gather_into_tensor fails on xccl
    backends: [xpu]
    tests: ["suites/test_collectives.py::test_all_gather*"]
  - id: accel-9
    url: https://github.com/example/accel/issues/9
    title: broadcast of an empty tensor
    tests: ["suites/test_collectives.py::test_broadcast_empty*"]
"""


def rec(run_id: str, name: str, backend: str, outcome: str, text: Any = None, *, ws: int = 1, issue: str | None = None,
        module: str = "suites/test_core.py", tracked: list[str] | None = None, message: str | None = None) -> TestRecord:
    """A record for ``module::name[backend-wsN]``, derived fields filled in as the harness does."""
    record = make_record(run_id=run_id, nodeid=f"{module}::{name}[{backend}-ws{ws}]", backend=backend, outcome=outcome,
                         duration=0.5, world_size=ws, text=text, known_issue=issue, message=message)
    if tracked:
        record.extra["tracked_pass"] = tracked
    return record


def run_file(folder: Path, name: str, backend: str, records: list[TestRecord], *, torch: str = "2.8.0",
             accel: str = "0.2.0", start: str = "2025-06-01T00:00:00.000+00:00", run_id: str | None = None,
             interrupted: bool = False) -> Path:
    run_id = run_id or (records[0].run_id if records else name)
    return write_run(folder / f"{name}.jsonl", run_id=run_id, backend=backend, torch_version=torch, accel_version=accel,
                     records=records, start_time=start, interrupted=interrupted)


def oom(size: str) -> str:
    return longrepr([f"torch.OutOfMemoryError: XPU out of memory. Tried to allocate {size} (xpu:1)"], "suites/test_mem.py", 12)


def clustered(folder: Path) -> list[Path]:
    """Two xpu runs with 19 failures: 16 are known issue pytorch-135550 (recorded by the harness),
    2 are one out-of-memory signature (different sizes), 1 an assertion; plus passes and skips."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, torch in enumerate(("2.7.1", "2.8.0")):
        run_id = f"run-xpu-{torch}"
        records = []
        for i in range(8):
            records.append(rec(run_id, f"test_all_gather_{i}", "xpu", "failed",
                               longrepr([f"RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY ({i + 1} MiB)"], "suites/test_collectives.py"),
                               module="suites/test_collectives.py", issue="pytorch-135550", ws=2))
        if index == 0:
            records.append(rec(run_id, "test_big_alloc", "xpu", "failed", oom("2.00 GiB")))
            records.append(rec(run_id, "test_assert", "xpu", "failed", longrepr(["AssertionError: loss is nan", "assert nan == 0.5"])))
        else:
            records.append(rec(run_id, "test_big_alloc", "xpu", "failed", oom("512.00 MiB")))
        for i in range(10):
            records.append(rec(run_id, f"test_ok_{i}", "xpu", "passed"))
        records.append(rec(run_id, "test_four_ranks", "xpu", "skipped", "Skipped: [needs-devices] needs 4 xpu devices, found 2", ws=4))
        records.append(rec(run_id, "test_deepspeed", "xpu", "skipped", "Skipped: [needs-package] deepspeed is not installed"))
        records.append(rec(run_id, "test_zero3", "xpu", "skipped", "Skipped: [needs-package] deepspeed is not installed"))
        records.append(rec(run_id, "test_plain_skip", "xpu", "skipped", "Skipped: flaky on CI"))
        records.append(rec(run_id, "test_expected", "xpu", "xfailed", message="known limitation"))
        paths.append(run_file(folder, run_id, "xpu", records, torch=torch, start=f"2025-06-0{index + 1}T00:00:00.000+00:00"))
    return paths


def bench_file(folder: Path, name: str, backend: str, times_by_bench: dict[str, list[float]], *, torch: str = "2.8.0",
               when: str = "2025-06-01T00:00:00", work: float | None = 128.0,
               host: tuple[str, float] | None = None) -> Path:
    entries = [bench_entry(b, backend, times, work_size=work, torch_version=torch,
                           metric="throughput" if work else "time", unit="samples/s" if work else "s", host=host)
               for b, times in times_by_bench.items()]
    return write_benchmarks(folder / f"{name}.json", entries, when=when)
