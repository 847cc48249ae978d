"""Intel GPUs through torch's native XPU support (torch >= 2.4) and, optionally, oneCCL bindings."""

from __future__ import annotations

import importlib.util

import torch
from packaging.version import Version

from .device_module import DeviceModuleBackend


class XPUBackend(DeviceModuleBackend):
    name = "xpu"
    device_type = "xpu"
    visible_devices_env = "ZE_AFFINITY_MASK"
    start_method = "spawn"
    distributed_type = "MULTI_XPU"
    priority = 20
    memory_stats_min_torch = "2.5"  # torch 2.4's torch.xpu had no allocator statistics
    oom_messages = ("XPU out of memory", "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "PI_ERROR_OUT_OF_RESOURCES")

    def _why_not_available(self) -> str:
        if getattr(torch.version, "xpu", None) is None:
            return f"torch {torch.__version__} is built without XPU support (torch.version.xpu is None)"
        return super()._why_not_available() + " (is the Level Zero driver installed?)"

    @property
    def comm_backend(self) -> str | None:
        if self.torch_version >= Version("2.7") and _xccl_available():
            return "xccl"
        if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
            return "ccl"
        return None

    def comm_backend_reason(self) -> str:
        if self.torch_version < Version("2.7"):
            return f"xccl needs torch >= 2.7 (installed {self.torch_version}) and oneccl_bindings_for_pytorch is not installed"
        return "torch.distributed has no xccl in this build and oneccl_bindings_for_pytorch is not installed"

    def runtime_version(self) -> str | None:
        xpu = getattr(torch.version, "xpu", None)
        return f"SYCL {xpu}" if xpu else None


def _xccl_available() -> bool:
    import torch.distributed as dist

    probe = getattr(dist, "is_xccl_available", None)
    return bool(dist.is_available() and probe is not None and probe())
