"""The project's own test fixtures: what one test changes in the process does not reach the next."""

import os

from conftest import restore_environment


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
