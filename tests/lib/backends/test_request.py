"""Opt-in backends: a backend asked for by name is told so (``Backend.request``) before probing.

An out-of-tree device that takes the process's single PrivateUse1 slot (accel-emu) must not load
itself while the registry merely enumerates backends; it loads when asked for by name through
``ACCEL_DEVICE``, a ``--backend`` flag or the harness's ``--backend``/``-m``.
"""

from __future__ import annotations

import pytest

from accel.backends import OVERRIDE_ENV, Availability, BackendRegistry, BackendUnavailableError
from accel.backends.cpu import CPUBackend


class _OptIn(CPUBackend):
    name = "optin"
    priority = 5

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def request(self) -> None:
        self.requests += 1
        self.__dict__.pop("availability", None)

    def _probe(self) -> Availability:
        if not self.requests:
            return Availability(False, "loaded only when asked for")
        return Availability(True, "asked for")


@pytest.fixture
def registry(monkeypatch) -> BackendRegistry:
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    return BackendRegistry([_OptIn, CPUBackend], load_plugins=False)


def test_enumeration_does_not_request(registry):
    assert [b.name for b in registry.available()] == ["cpu"]
    assert registry.select().name == "cpu"
    assert registry.get("optin").requests == 0


def test_select_by_name_requests(registry):
    backend = registry.select("optin")
    assert backend.requests == 1 and backend.is_available()


def test_select_by_environment_requests(registry, monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "optin")
    assert registry.select().name == "optin"


def test_builtin_request_is_a_no_op():
    cpu = CPUBackend()
    cpu.request()
    assert cpu.is_available()


def test_unavailable_after_request_still_says_why(registry):
    class Broken(_OptIn):
        name = "broken"

        def _probe(self) -> Availability:
            return Availability(False, "no driver")

    registry.register(Broken)
    with pytest.raises(BackendUnavailableError, match="no driver"):
        registry.select("broken")
