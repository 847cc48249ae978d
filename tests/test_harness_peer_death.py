"""A rank's failure that echoes a peer's death is reported as that death, even when the peer is slow to go."""

import os
import textwrap

import pytest

from accel_harness import distributed

pytest_plugins = ["pytester"]

SUITE_TIMEOUT_S = 600  # a safety net for the inner pytest on a loaded host, not what the tests prove


def _run(pytester, *args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--backend", "cpu", "-m", "cpu", *args,
                                         timeout=SUITE_TIMEOUT_S)


def test_the_echo_grace_is_generous_and_one_setting():
    # a loaded host can take seconds to reap a dying rank; the grace is only waited after a failure
    assert distributed.PEER_DEATH_ECHO_GRACE_S == distributed.RANK_EXIT_GRACE_S >= 30
    assert distributed.PEER_DEATH_GRACE_S < distributed.PEER_DEATH_ECHO_GRACE_S


def test_a_peer_that_dies_after_the_echo_is_reported_as_the_crash(pytester):
    # rank 0 fails with a lost-connection error while rank 1 is still alive; rank 1 exits only once
    # rank 0's failure has been sent (it waits for rank 0 to have written its marker file)
    pytester.makepyfile(test_echo=textwrap.dedent(
        """
        import os, time
        import pytest

        @pytest.mark.world_size(2)
        def test_peer_goes_late(backend, rank):
            marker = os.path.join(os.environ["ECHO_DIR"], "rank0-failed")
            if rank == 0:
                open(marker, "w").close()
                raise RuntimeError("[gloo/transport/tcp/pair.cc] Connection closed by peer (simulated)")
            deadline = time.monotonic() + 300
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(1.0)  # the slow death under test: longer than the plain grace, shorter than the echo's
            os._exit(3)
        """))
    os.environ["ECHO_DIR"] = str(pytester.path)
    try:
        result = _run(pytester)
    finally:
        del os.environ["ECHO_DIR"]
    result.assert_outcomes(failed=1)
    assert "rank 1 died with exit code 3" in result.stdout.str()


def test_a_plain_failure_with_a_live_peer_stays_that_failure(pytester):
    # no lost-connection words: the short grace applies and the failure is the rank's own
    pytester.makepyfile(test_plain=textwrap.dedent(
        """
        import time
        import pytest

        @pytest.mark.world_size(2)
        def test_rank_0_fails(backend, rank):
            if rank == 0:
                raise ValueError("plain failure of rank zero")
            time.sleep(120)  # alive until the pool kills it
        """))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "rank 0 of 2 failed: ValueError: plain failure of rank zero" in out
    assert "died with exit code" not in out
