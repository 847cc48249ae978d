"""A mixin for test fakes of :class:`accel.backends.base.Backend`: the part of the contract a fake has no
device for.

``Backend`` is an abstract class; a fake that only answers what its test asks (availability, a device
count, a collective library, dtype capabilities) lists :class:`NoDevice` before ``Backend`` and defines
those itself. Everything else answers as a real backend does for a feature it lacks: no devices, no
collectives, and an ``UnsupportedFeatureError`` naming the feature for device calls.
"""

from __future__ import annotations

from typing import Any

from accel.backends.base import Capability

_WHY = "a test fake drives no device"


class NoDevice:
    """Device calls of a test fake: none is supported (each raises ``UnsupportedFeatureError`` with the reason)."""

    def device_count(self) -> int:
        """No devices unless the fake says otherwise."""
        return 0

    @property
    def comm_backend(self) -> str | None:
        """No collective library unless the fake names one."""
        return None

    def set_device(self, index: int) -> None:
        """Unsupported: there is no device to make current."""
        raise self.unsupported("set_device", _WHY)

    def current_device(self) -> int:
        """Unsupported: there is no current device."""
        raise self.unsupported("current_device", _WHY)

    def synchronize(self, index: int | None = None) -> None:
        """Unsupported: no device queues work."""
        raise self.unsupported("synchronize", _WHY)

    def manual_seed(self, seed: int) -> None:
        """Unsupported: no device generator to seed."""
        raise self.unsupported("manual_seed", _WHY)

    def get_rng_state(self, index: int | None = None) -> Any:
        """Unsupported: no device generator."""
        raise self.unsupported("get_rng_state", _WHY)

    def set_rng_state(self, state: Any, index: int | None = None) -> None:
        """Unsupported: no device generator."""
        raise self.unsupported("set_rng_state", _WHY)

    @property
    def grad_scaler_capability(self) -> Capability:
        """No GradScaler."""
        return Capability(False, _WHY)

    def device_properties(self, index: int = 0) -> Any:
        """Unsupported: no device to describe."""
        raise self.unsupported("device_properties", _WHY)
