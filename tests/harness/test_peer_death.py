"""A rank's failure that echoes a peer's death is reported as that death, even when the peer is slow to go."""

import pytest

import _inner_session as inner
from accel_harness import distributed

SUITE_TIMEOUT_S = 600  # a safety net for the inner pytest on a loaded host, not what the tests prove


def test_the_echo_grace_is_generous_and_one_setting():
    # a loaded host can take seconds to reap a dying rank; the grace is only waited after a failure
    assert distributed.PEER_DEATH_ECHO_GRACE_S == distributed.RANK_EXIT_GRACE_S >= 30
    assert distributed.PEER_DEATH_GRACE_S < distributed.PEER_DEATH_ECHO_GRACE_S


SCENARIOS = {
    # rank 0 fails with a lost-connection error while rank 1 is still alive; rank 1 exits only once
    # rank 0's failure has been sent (it waits for rank 0 to have written its marker file)
    "test_echo": """
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
        """,
    # no lost-connection words: the short grace applies and the failure is the rank's own
    "test_plain": """
        import time
        import pytest

        @pytest.mark.world_size(2)
        def test_rank_0_fails(backend, rank):
            if rank == 0:
                raise ValueError("plain failure of rank zero")
            time.sleep(120)  # alive until the pool kills it
        """,
}


def test_an_echo_is_reported_as_the_peers_death_and_a_plain_failure_stays_itself(tmp_path):
    """Both scenarios in one session (one check each): a failure that echoes a peer's death is that death,
    a plain failure with a live peer is the rank's own."""
    inner.write(tmp_path, **SCENARIOS)
    result = inner.run(tmp_path, "--backend", "cpu", "-m", "cpu", env={"ECHO_DIR": str(tmp_path)}, timeout=SUITE_TIMEOUT_S)
    inner.check_all({
        "a peer that dies after the echo is reported as the crash": lambda: _echo(result),
        "a plain failure with a live peer stays that failure": lambda: _plain(result),
    }, result)


def _echo(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_echo.py") == {"failed": 1}
    assert "rank 1 died with exit code 3" in inner.section(result, "test_peer_goes_late")


def _plain(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_plain.py") == {"failed": 1}
    failure = inner.section(result, "test_rank_0_fails")
    assert "rank 0 of 2 failed: ValueError: plain failure of rank zero" in failure
    assert "died with exit code" not in failure
