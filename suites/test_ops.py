"""Operator conformance on the backend: the quick sweep of torch's OpInfo database against the host.

The same sweep as ``accel ops --quick`` (every operator entry, float32 and bfloat16 where the
device claims them, forward, three samples), in crash-isolated worker processes: the test fails on
a crash or a hang and on any failed row that the run's known issues (``--known-issues``, entries with
``ops`` patterns) do not cover, naming each. ``-k ops`` selects it; ``accel ops`` gives the whole table.
"""

from __future__ import annotations

import pytest

from accel_harness.ops.plan import QUICK
from accel_harness.ops.runner import sweep_fork_server_modules

pytest.importorskip("expecttest", reason="[needs-package] torch's OpInfo database imports expecttest (pip install expecttest)")


def _known_issues(config: pytest.Config):
    from accel_harness.known_issues import load_known_issues

    path = config.getoption("accel_known_issues", default=None)
    return load_known_issues(path) if path else None


# the workers fork from the session's fork server: its databases are imported there once, while other tests run
@pytest.mark.fork_server_imports(*sweep_fork_server_modules(QUICK))
def test_quick_operator_sweep_has_no_crash_and_no_unexplained_failure(backend, request):
    from accel_harness.ops.output import apply_known_issues
    from accel_harness.ops.runner import run_sweep

    result = run_sweep(backend.name, QUICK, workers=2, timeout=120, census=False)
    apply_known_issues(result.rows, _known_issues(request.config), backend.name, result.torch.split("+")[0])
    compared = [row for row in result.rows if row.outcome != "skipped"]
    assert len(compared) >= 500, f"only {len(compared)} operator rows were compared on {backend.name}"
    failed = [row for row in result.rows if row.outcome == "failed"]
    assert not failed, f"{len(failed)} operator rows failed on {backend.name} outside the known issues:\n" + "\n".join(
        f"  {row.op} {row.dtype} {row.variant} {row.direction}: {row.reason_code}: {(row.message or '')[:200]}" for row in failed[:40])
