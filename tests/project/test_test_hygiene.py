"""The project's own test fixtures: what one test changes in the process does not reach the next."""

import os
import signal

from tests.conftest import HANDLED_SIGNALS, restore_environment, restore_signal_handlers


def test_variables_a_test_set_changed_or_removed_are_put_back(monkeypatch):
    monkeypatch.setenv("HYGIENE_PROBE_KEPT", "before")
    monkeypatch.setenv("HYGIENE_PROBE_REMOVED", "there")
    saved = dict(os.environ)
    os.environ["HYGIENE_PROBE_KEPT"] = "after"
    os.environ["HYGIENE_PROBE_NEW"] = "leaked"
    del os.environ["HYGIENE_PROBE_REMOVED"]
    restore_environment(saved)
    assert os.environ["HYGIENE_PROBE_KEPT"] == "before"
    assert os.environ["HYGIENE_PROBE_REMOVED"] == "there"
    assert "HYGIENE_PROBE_NEW" not in os.environ
    assert dict(os.environ) == saved


def test_signal_handlers_a_test_installed_are_put_back():
    saved = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}

    def handler(signum, frame):
        raise RuntimeError("a leaked handler")

    try:
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        restore_signal_handlers(saved)
        assert {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS} == saved
        assert signal.getsignal(signal.SIGINT) is not handler
    finally:
        for sig, before in saved.items():
            if before is not None:
                signal.signal(sig, before)


def test_test_ports_are_free_and_outside_the_ephemeral_range():
    """A port checked free must not be one the kernel hands to other processes' connections meanwhile."""
    import socket

    from dist_utils import TEST_PORTS, free_port

    port = int(free_port())
    assert port in TEST_PORTS and port < 32768
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
