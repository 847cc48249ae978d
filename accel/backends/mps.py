"""Apple silicon GPUs (Metal Performance Shaders): single process, host timers."""

from __future__ import annotations

import platform
from typing import Any

import torch
from packaging.version import Version

from .base import Availability, Capability, DeviceProperties
from .device_module import DeviceModuleBackend


class MPSBackend(DeviceModuleBackend):
    name = "mps"
    device_type = "mps"
    start_method = "spawn"
    distributed_type = "NO"  # single process only
    priority = 40
    use_host_timers = True  # MPS events are unreliable for timing
    amp_min_torch = {"float16": "2.8", "bfloat16": "2.6"}
    oom_messages = ("MPS backend out of memory",)

    def _probe(self) -> Availability:
        mps = torch.backends.mps
        if not mps.is_built():
            return Availability(False, f"torch {torch.__version__} is built without MPS support")
        if not mps.is_available():
            return Availability(False, f"MPS is built but unavailable: needs macOS 12.3+ on Apple silicon (this is {platform.system()} {platform.machine()})")
        return Availability(True, "Apple GPU via Metal")

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def set_device(self, index: int) -> None:
        self.device(index)

    def current_device(self) -> int:
        return 0

    def synchronize(self, index: int | None = None) -> None:
        self.module.synchronize()

    @property
    def comm_backend(self) -> str | None:
        return None

    def comm_backend_reason(self) -> str:
        return "MPS has no collective backend: single process only"

    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return self.module.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self.module.set_rng_state(state)

    # torch.mps exposes current/driver allocations but no peak tracking
    def memory_allocated(self, index: int | None = None) -> int:
        return int(self.module.current_allocated_memory())

    def memory_reserved(self, index: int | None = None) -> int:
        return int(self.module.driver_allocated_memory())

    def max_memory_allocated(self, index: int | None = None) -> int:
        raise self.unsupported("max_memory_allocated", "torch.mps has no peak-memory tracking")

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        raise self.unsupported("reset_peak_memory_stats", "torch.mps has no peak-memory tracking")

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        total = int(self.module.recommended_max_memory())
        return max(total - self.memory_reserved(), 0), total

    @property
    def memory_stats_capability(self) -> Capability:
        return Capability(True, "current and driver allocations only (no peak tracking)")

    def empty_cache(self) -> None:
        if self.is_available():
            self.module.empty_cache()

    def stream(self) -> Any:
        raise self.unsupported("streams", "torch.mps has no user streams")

    def current_stream(self) -> Any:
        raise self.unsupported("streams", "torch.mps has no user streams")

    def stream_context(self, stream: Any):
        raise self.unsupported("streams", "torch.mps has no user streams")

    def event(self, enable_timing: bool = False) -> Any:
        return self.module.event.Event(enable_timing=enable_timing)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor  # unified memory: nothing to pin

    @property
    def grad_scaler_capability(self) -> Capability:
        if self.torch_version < Version("2.8"):
            return Capability(False, f"GradScaler on MPS needs torch >= 2.8 (installed {self.torch_version})")
        return super().grad_scaler_capability

    def device_properties(self, index: int = 0) -> DeviceProperties:
        return DeviceProperties(
            index=0,
            name=f"Apple {platform.machine()} GPU",
            total_memory=int(self.module.recommended_max_memory()),
            runtime_version=f"macOS {platform.mac_ver()[0]}",
        )
