"""Google TPUs (and XLA on GPUs) through ``torch_xla`` (collectives: xla; distributed type: XLA).

XLA has no ``torch.<device>`` module: devices, seeds, synchronisation and memory figures come from
``torch_xla.core.xla_model`` and ``torch_xla.runtime``. Each process drives one XLA device.
``USE_TORCH_XLA=0`` turns the backend off where torch_xla is installed but a plain torch run is wanted.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace
from typing import Any

import torch

from ..facts.environment import env_flag
from .base import Availability, Backend, Capability, DeviceProperties


class XLABackend(Backend):
    """XLA devices via torch_xla; ``module`` (tests) is a namespace with ``xla_model`` and ``runtime``."""

    name = "xla"
    device_type = "xla"
    visible_devices_env = None  # PJRT chooses the chips (TPU_VISIBLE_CHIPS is the runtime's own business)
    start_method = "spawn"
    distributed_type = "XLA"
    priority = 2  # as in Accelerate: an installed, enabled torch_xla takes precedence
    compile_backend = "openxla"
    oom_messages = ("RESOURCE_EXHAUSTED", "Out of memory allocating")
    #: Accelerate keeps XLA's RNG state (one integer seed) under this key of ``random_states_<rank>.pkl``
    accelerate_rng_key = "xm_seed"

    def __init__(self, torch_version: Any = None, module: Any = None):
        super().__init__(torch_version)
        self._module = module

    # ------------------------------------------------------------------ module and probing
    @property
    def module(self) -> Any:
        """Namespace with torch_xla's ``xla_model`` and ``runtime`` modules (None without torch_xla)."""
        if self._module is None and importlib.util.find_spec("torch_xla") is not None:
            self._module = SimpleNamespace(
                xla_model=importlib.import_module("torch_xla.core.xla_model"),
                runtime=importlib.import_module("torch_xla.runtime"),
            )
            importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" process-group backend
        return self._module

    def _probe(self) -> Availability:
        if not env_flag("USE_TORCH_XLA", default=True):
            return Availability(False, "USE_TORCH_XLA is false: torch_xla is switched off for this run")
        if self._module is None and importlib.util.find_spec("torch_xla") is None:
            return Availability(False, "torch_xla is not installed (pip install torch_xla, on a TPU VM)")
        runtime = self.module.runtime
        kind = runtime.device_type()
        if not kind:
            return Availability(False, "torch_xla found no XLA device (PJRT_DEVICE unset or no TPU/GPU)")
        return Availability(True, f"XLA device type {kind}")

    @property
    def _xm(self) -> Any:
        return self.module.xla_model

    @property
    def xla_device_type(self) -> str:
        """The runtime's device kind: "TPU", "CUDA"/"GPU", "NEURON" or "CPU"."""
        return str(self.module.runtime.device_type())

    # ------------------------------------------------------------------ devices
    def device_count(self) -> int:
        if not self.is_available():
            return 0
        runtime = self.module.runtime
        count = getattr(runtime, "addressable_runtime_device_count", None)
        return int(count()) if count is not None else 1

    def set_device(self, index: int) -> None:
        self.device(index)  # range check; the XLA runtime binds one device per process itself

    def current_device(self) -> int:
        return 0

    def synchronize(self, index: int | None = None) -> None:
        self._xm.mark_step()
        self._xm.wait_device_ops()

    # ------------------------------------------------------------------ collectives
    @property
    def comm_backend(self) -> str | None:
        import torch.distributed as dist

        return "xla" if dist.is_available() else None

    def comm_backend_reason(self) -> str:
        return "torch.distributed is not available in this build"

    # ------------------------------------------------------------------ RNG: XLA's generator state is one integer seed
    def manual_seed(self, seed: int) -> None:
        self._xm.set_rng_state(int(seed))

    def get_rng_state(self, index: int | None = None) -> torch.Tensor:
        return torch.tensor([int(self._xm.get_rng_state())], dtype=torch.int64)

    def set_rng_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self._xm.set_rng_state(int(state.reshape(-1)[0].item()))

    # ------------------------------------------------------------------ memory
    @property
    def memory_stats_capability(self) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        return Capability(True, "torch_xla.core.xla_model.get_memory_info")

    def _memory_info(self, feature: str) -> dict[str, int]:
        self._require_memory_stats(feature)
        return dict(self._xm.get_memory_info(self.device(0)))

    def memory_allocated(self, index: int | None = None) -> int:
        return int(self._memory_info("memory_allocated")["bytes_used"])

    def max_memory_allocated(self, index: int | None = None) -> int:
        info = self._memory_info("max_memory_allocated")
        if "peak_bytes_used" not in info:
            raise self.unsupported("max_memory_allocated", "this torch_xla reports no peak memory")
        return int(info["peak_bytes_used"])

    def mem_get_info(self, index: int | None = None) -> tuple[int, int]:
        info = self._memory_info("mem_get_info")
        return int(info["bytes_limit"] - info["bytes_used"]), int(info["bytes_limit"])

    # ------------------------------------------------------------------ AMP
    def amp_capability(self, dtype: torch.dtype) -> Capability:
        if not self.is_available():
            return Capability(False, f"backend unavailable: {self.availability.reason}")
        if dtype == torch.float16 and self.xla_device_type == "TPU":
            return Capability(False, "TPUs have no fp16 autocast (use bf16)")
        return Capability(True, f"{dtype} autocast on XLA {self.xla_device_type}")

    @property
    def grad_scaler_capability(self) -> Capability:
        cap = self.amp_capability(torch.float16)
        if not cap:
            return Capability(False, f"no fp16 autocast, so no GradScaler: {cap.reason}")
        return Capability(True, "torch.amp.GradScaler on XLA GPUs")

    # ------------------------------------------------------------------ description
    def device_properties(self, index: int = 0) -> DeviceProperties:
        return DeviceProperties(index=index, name=f"XLA {self.xla_device_type}", runtime_version=self.runtime_version())

    def runtime_version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"torch_xla {version('torch_xla')}"
        except PackageNotFoundError:
            return None
