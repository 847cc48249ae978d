"""How long the tests wait on what they drive (subprocesses, forked ranks, inner pytest runs): one setting.

A test's own wait on a subprocess is a safety net, not what the test proves: it only has to end a
run that hangs. On a 2-core CI machine running the suite with ``-n 2`` next to other jobs, a
start-up that takes five seconds alone can take minutes, so the net is generous. A test that
proves a timeout fires gives its subject a short timeout of its own and keeps this one on its wait.
``ACCEL_TEST_SAFETY_NET_S`` raises (or lowers) it for a slower (or faster) machine.
"""

from __future__ import annotations

import os


def _safety_net() -> float:
    """The wait in seconds, from ``ACCEL_TEST_SAFETY_NET_S`` (default 300); a clear error for a bad value."""
    raw = os.environ.get("ACCEL_TEST_SAFETY_NET_S", "300")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"ACCEL_TEST_SAFETY_NET_S must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"ACCEL_TEST_SAFETY_NET_S must be positive, got {raw!r}")
    return value


#: the most a test waits for a subprocess, a pool of ranks or an inner pytest run to finish
SAFETY_NET_S = _safety_net()
