"""Intel Gaudi (HPU): ``torch.hpu`` appears once the Habana bridge is imported."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .base import Availability
from .device_module import DeviceModuleBackend


class HPUBackend(DeviceModuleBackend):
    name = "hpu"
    device_type = "hpu"
    visible_devices_env = "HABANA_VISIBLE_MODULES"
    start_method = "spawn"
    distributed_type = "MULTI_HPU"
    priority = 30
    compile_backend = "hpu_backend"
    oom_messages = ("Device out of memory", "HPU out of memory", "PT_DEVMEM Allocation failed", "synStatus=10")

    def _probe(self) -> Availability:
        if self._module is None and importlib.util.find_spec("habana_frameworks") is None:
            return Availability(False, "habana_frameworks is not installed (Intel Gaudi software stack missing)")
        return super()._probe()

    def _load_module(self) -> Any:
        if importlib.util.find_spec("habana_frameworks") is None:
            return None
        importlib.import_module("habana_frameworks.torch.core")  # registers torch.hpu
        return super()._load_module()

    def _why_no_module(self) -> str:
        return "habana_frameworks is installed but did not register torch.hpu"

    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        return "hccl" if dist.is_available() else None

    def comm_backend_reason(self) -> str:
        return "torch.distributed is not available in this build"

    def empty_cache(self) -> None:
        """The HPU allocator has no cache to release (torch.hpu.empty_cache is a no-op)."""

    def runtime_version(self) -> str | None:
        try:
            from importlib.metadata import version

            return f"habana-torch-plugin {version('habana-torch-plugin')}"
        except Exception:
            return None
