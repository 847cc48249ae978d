"""NVIDIA CUDA and AMD ROCm (HIP builds expose the same ``torch.cuda`` module)."""

from __future__ import annotations

import torch

from .base import Capability
from .device_module import DeviceModuleBackend


class CUDABackend(DeviceModuleBackend):
    name = "cuda"
    device_type = "cuda"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    start_method = "spawn"  # fork after CUDA initialisation breaks the child
    fork_server_ranks = True  # torch.multiprocessing's docs name spawn and forkserver as the CUDA-safe methods
    priority = 10
    oom_messages = ("CUDA out of memory", "HIP out of memory", "CUBLAS_STATUS_ALLOC_FAILED")

    def _why_no_module(self) -> str:
        return f"torch {self.torch_version} has no torch.cuda module"

    def _why_not_available(self) -> str:
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return f"torch {torch.__version__} is built without CUDA/ROCm support"
        return super()._why_not_available()

    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_nccl_available():
            return "nccl"
        return "gloo" if dist.is_available() else None

    def comm_backend_reason(self) -> str:
        return "torch.distributed is not available in this build"

    def dtype_capability(self, dtype: torch.dtype) -> Capability:
        if dtype == torch.bfloat16 and self.is_available() and not self.module.is_bf16_supported():
            return Capability(False, "this GPU has no bf16 support")
        return super().dtype_capability(dtype)

    def _fp8_capability(self) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        major, minor = self.module.get_device_capability(0)
        if (major, minor) >= (8, 9):
            return Capability(True, f"compute capability {major}.{minor} >= 8.9")
        return Capability(False, f"fp8 needs compute capability >= 8.9 (device has {major}.{minor})")

    def runtime_version(self) -> str | None:
        hip = getattr(torch.version, "hip", None)
        if hip:
            return f"HIP {hip}"
        return f"CUDA {torch.version.cuda}" if torch.version.cuda else None
