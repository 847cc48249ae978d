"""The host CPU: always available, gloo collectives, fork-started workers, host timers.

Memory figures are the process's resident set (psutil), not tensor bytes: the CPU allocator keeps
no statistics. The peak is the kernel's high-water mark (VmHWM), which Linux lets a process reset.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import sys
from typing import Any

import torch
from packaging.version import Version

from .base import Availability, Backend, BackendUnavailableError, Capability, DeviceProperties

_PROC_STATUS = "/proc/self/status"
_PROC_CLEAR_REFS = "/proc/self/clear_refs"

# torch releases from which CPU autocast honours each dtype and GradScaler accepts "cpu"
_AMP_MIN_TORCH = {"bfloat16": "2.0", "float16": "2.4"}
_GRAD_SCALER_MIN_TORCH = "2.4"


class CPUBackend(Backend):
    name = "cpu"
    device_type = "cpu"
    start_method = "fork"
    distributed_type = "MULTI_CPU"
    priority = 1000  # always last: the fallback
    use_host_timers = True
    memory_is_host = True
    oom_messages = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")

    def _probe(self) -> Availability:
        return Availability(True, f"host CPU ({os.cpu_count()} logical cores)")

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        return 1

    def device(self, index: int | None = None) -> torch.device:
        if index not in (None, 0):
            raise ValueError(f"cpu: device index {index} out of range (the CPU backend has one device, index 0)")
        return torch.device("cpu")

    def devices(self) -> list[torch.device]:
        return [torch.device("cpu")]

    def set_device(self, index: int) -> None:
        self.device(index)

    def current_device(self) -> int:
        return 0

    def synchronize(self, index: int | None = None) -> None:
        """CPU kernels complete before returning: nothing to wait for."""

    # ------------------------------------------------------------------ collectives
    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        if not dist.is_available():
            return None
        wanted = os.environ.get("ACCEL_CPU_COMM_BACKEND", "gloo").strip().lower() or "gloo"
        if wanted == "ccl" and importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
            raise BackendUnavailableError("ACCEL_CPU_COMM_BACKEND=ccl needs the oneccl_bindings_for_pytorch package, which is not installed")
        if wanted not in ("gloo", "ccl", "mpi"):
            raise ValueError(f"ACCEL_CPU_COMM_BACKEND must be gloo, ccl or mpi, got {wanted!r}")
        return wanted

    def comm_backend_reason(self) -> str:
        return "torch.distributed is not available in this build"

    # ------------------------------------------------------------------ RNG
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        self.device(index)
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self.device(index)
        torch.set_rng_state(state)

    # ------------------------------------------------------------------ memory (process RSS)
    @property
    def memory_stats_capability(self) -> Capability:
        return Capability(True, "process resident set size (psutil); peak from /proc VmHWM where available")

    def memory_allocated(self, index: int | None = None) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)

    def memory_reserved(self, index: int | None = None) -> int:
        return self.memory_allocated(index)

    def max_memory_allocated(self, index: int | None = None) -> int:
        peak = _read_vm_hwm()
        if peak is None:
            if sys.platform == "win32":
                import psutil

                return int(psutil.Process().memory_info().peak_wset)
            import resource

            scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)
        return peak

    def reset_peak_memory_stats(self, index: int | None = None) -> None:
        try:
            with open(_PROC_CLEAR_REFS, "w") as fh:
                fh.write("5")  # "5": reset the peak RSS (VmHWM) to the current RSS
        except OSError as exc:
            raise self.unsupported("reset_peak_memory_stats", f"cannot reset the process peak RSS here ({exc})") from exc

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    # ------------------------------------------------------------------ streams and events
    def stream(self) -> Any:
        return torch.cpu.Stream()

    def current_stream(self) -> Any:
        return torch.cpu.current_stream()

    def stream_context(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cpu.stream(stream)

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        key = str(dtype).removeprefix("torch.")
        need = _AMP_MIN_TORCH.get(key)
        if need is None:
            return Capability(False, f"CPU autocast does not support {dtype}")
        if self.torch_version < Version(need):
            return Capability(False, f"CPU {key} autocast needs torch >= {need} (installed {self.torch_version})")
        if self._torch_version is not None:  # answering for another torch release: table only
            return Capability(True, f"CPU {key} autocast (torch >= {need})")
        return _probe_cpu_autocast(dtype)

    @property
    def grad_scaler_capability(self) -> Capability:
        if self.torch_version < Version(_GRAD_SCALER_MIN_TORCH):
            return Capability(False, f"torch.amp.GradScaler('cpu') needs torch >= {_GRAD_SCALER_MIN_TORCH} (installed {self.torch_version})")
        fp16 = self.amp_capability(torch.float16)
        if not fp16:
            return Capability(False, f"no fp16 autocast on CPU: {fp16.reason}")
        return Capability(True, "torch.amp.GradScaler('cpu')")

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        import psutil

        self.device(index)
        caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
        name = caps.get("cpu_name") or platform.processor() or platform.machine()
        isa = [k for k in ("avx2", "avx512_f", "avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16") if caps.get(k)]
        return DeviceProperties(
            index=0,
            name=str(name),
            total_memory=int(psutil.virtual_memory().total),
            extra={
                "architecture": platform.machine(),
                "logical_cores": os.cpu_count(),
                "physical_cores": psutil.cpu_count(logical=False),
                "torch_threads": torch.get_num_threads(),
                "isa": isa,
            },
        )


def _read_vm_hwm() -> int | None:
    try:
        with open(_PROC_STATUS) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _probe_cpu_autocast(dtype: torch.dtype) -> Capability:
    """Run a Linear under CPU autocast and check the output really is ``dtype``."""
    import warnings

    layer = torch.nn.Linear(4, 4)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast("cpu", dtype=dtype):
                out = layer(torch.ones(2, 4))
    except Exception as exc:
        return Capability(False, f"CPU autocast with {dtype} failed: {type(exc).__name__}: {exc}")
    if out.dtype != dtype:
        detail = f" ({caught[0].message})" if caught else ""
        return Capability(False, f"CPU autocast with {dtype} ran the Linear in {out.dtype}{detail}")
    return Capability(True, f"CPU autocast runs Linear in {dtype}")
