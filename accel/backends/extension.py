"""Backends whose device module comes from a vendor's torch extension (``torch_npu`` -> ``torch.npu``).

The extension is imported only when the backend is probed, never when accel is imported; a
machine without it is told which package is missing. Probing first asks ``importlib`` whether the
package exists, so listing backends stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .base import Availability
from .device_module import DeviceModuleBackend


class ExtensionBackend(DeviceModuleBackend):
    """A :class:`DeviceModuleBackend` whose ``torch.<device_type>`` appears once ``extension_package`` is imported."""

    #: the package that registers the device module with torch
    extension_package: str = ""
    #: what to ``pip install`` (or the vendor's stack) when the package is missing
    install_hint: str = ""
    #: the collective backend torch.distributed gets from the extension
    collective_backend: str = ""
    #: key of this device type's RNG states in Accelerate's ``random_states_<rank>.pkl``
    accelerate_rng_key: str = ""

    def _probe(self) -> Availability:
        if self._module is None and importlib.util.find_spec(self.extension_package) is None:
            return Availability(False, f"{self.extension_package} is not installed ({self.install_hint})")
        return super()._probe()

    def _load_module(self) -> Any:
        if importlib.util.find_spec(self.extension_package) is None:
            return None
        importlib.import_module(self.extension_package)  # registers torch.<device_type> and its collectives
        return super()._load_module()

    def _why_no_module(self) -> str:
        return f"{self.extension_package} is installed but did not register torch.{self.device_type}"

    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        return self.collective_backend if dist.is_available() else None

    def comm_backend_reason(self) -> str:
        return "torch.distributed is not available in this build"

    def runtime_version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{self.extension_package} {version(self.extension_package.replace('_', '-'))}"
        except PackageNotFoundError:
            return None
