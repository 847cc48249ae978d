"""notebook_launcher situations, run with pytest in a fresh interpreter (``python -m pytest test_notebook.py``).

``ACCEL_NUM_PROCESSES`` (or Accelerate's ``ACCELERATE_NUM_PROCESSES``) sets the number of processes
(default 1); ``ACCEL_TEST_PORT`` the rendezvous port (default notebook_launcher's own), so that
runs side by side (parallel test workers, another job on the host) do not meet in one store.
Checked: a plain launch sees the world size it asked for, a worker's failure reaches the caller,
and the static and c10d rendezvous work.
"""

from __future__ import annotations

import os

import pytest

from accel import PartialState, notebook_launcher
from accel.facts.network import DEFAULT_PORT

NUM_PROCESSES = int(os.environ.get("ACCEL_NUM_PROCESSES") or os.environ.get("ACCELERATE_NUM_PROCESSES") or 1)
PORT = os.environ.get("ACCEL_TEST_PORT") or str(DEFAULT_PORT)
require_multi_process = pytest.mark.skipif(NUM_PROCESSES < 2, reason="needs at least 2 processes (ACCEL_NUM_PROCESSES)")


def world_size_function(expected: int) -> None:
    state = PartialState()
    if state.num_processes != expected:
        raise RuntimeError(f"launched {expected} processes, PartialState sees {state.num_processes}")


def failing_function() -> None:
    if PartialState().process_index == 0:
        raise RuntimeError("rank 0 fails on purpose")


def test_can_initialize():
    notebook_launcher(world_size_function, (NUM_PROCESSES,), num_processes=NUM_PROCESSES, use_port=PORT)


def test_a_failing_worker_reaches_the_caller():
    with pytest.raises(Exception, match="fails on purpose|failed"):
        notebook_launcher(failing_function, (), num_processes=NUM_PROCESSES, use_port=PORT)


@require_multi_process
@pytest.mark.parametrize("rdzv_backend", ["static", "c10d"])
def test_rendezvous_backends(rdzv_backend):
    notebook_launcher(world_size_function, (NUM_PROCESSES,), num_processes=NUM_PROCESSES, rdzv_backend=rdzv_backend,
                      use_port=PORT)


def main() -> None:
    """Run this file's tests with pytest; exit with pytest's status."""
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))


if __name__ == "__main__":
    main()
