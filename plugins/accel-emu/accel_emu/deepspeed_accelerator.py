"""emu's DeepSpeed accelerator: DeepSpeed's accelerator interface answered by ``torch.emu``.

DeepSpeed picks its accelerator from a fixed list (``DS_ACCELERATOR`` or its own probe), and emu is not
on it. A device outside that list brings a ``DeepSpeedAccelerator`` subclass and hands an instance to
``deepspeed.accelerator.set_accelerator``; accel does that for emu in every process that runs DeepSpeed
on it (``EmuBackend.deepspeed_accelerator`` names this class).

What DeepSpeed gets: the device name ``emu``, the ``emu_ccl`` collective backend, emu's allocator
statistics, streams, events and generators, pinned host memory, and the host's op builders for the
optimizers DeepSpeed runs on the host (CPU Adam, Adagrad and Lion for offload, async I/O for NVMe);
every other op builder is DeepSpeed's "not implemented" one, as there are no emu kernels to build.
Importing this module imports DeepSpeed; building an instance loads emu.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

from . import COMM_BACKEND, DEVICE_TYPE, load

__all__ = ["EmuAccelerator"]

#: DeepSpeed op builders that run on the host, where an offloaded optimizer or NVMe swap works
_HOST_BUILDERS = ("CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder", "AsyncIOBuilder")
#: where DeepSpeed keeps the host op builders
_HOST_BUILDER_PACKAGE = "deepspeed.ops.op_builder.cpu"


class EmuAccelerator(DeepSpeedAccelerator):
    """DeepSpeed's accelerator interface on the emu device (``torch.emu``)."""

    def __init__(self) -> None:
        super().__init__()
        self._emu = load()  # the accelerator speaks for emu, so emu must be registered in this process
        self._name = DEVICE_TYPE
        self._communication_backend_name = COMM_BACKEND
        self._compile_backend = "inductor"  # host C++ kernels over emu memory (accel_emu.compiler)

    # ------------------------------------------------------------------ how the device behaves
    def is_synchronized_device(self) -> bool:
        """False: emu queues work on streams, so DeepSpeed orders it with events and stream waits."""
        return False

    def use_host_timers(self) -> bool:
        """False: emu's events time regions."""
        return self.is_synchronized_device()

    def resolves_data_dependency(self) -> bool:
        """False: work on two emu streams is ordered only by the waits DeepSpeed records."""
        return self.is_synchronized_device()

    def handles_memory_backpressure(self) -> bool:
        """False: DeepSpeed throttles its own prefetching, as on other asynchronous devices."""
        return self.is_synchronized_device()

    # ------------------------------------------------------------------ devices
    def device_name(self, device_index: int | None = None) -> str:
        """``emu`` or ``emu:<index>``: what ``torch.device`` takes."""
        return DEVICE_TYPE if device_index is None else f"{DEVICE_TYPE}:{device_index}"

    def device(self, device_index: int | None = None) -> Any:
        """A context manager making device ``device_index`` current (``torch.emu.device``)."""
        return self._emu.device(device_index)

    def set_device(self, device_index: int) -> None:
        """Make device ``device_index`` this process's current emu device."""
        self._emu.set_device(device_index)

    def current_device(self) -> int:
        """The index of the current emu device."""
        return self._emu.current_device()

    def current_device_name(self) -> str:
        """``emu:<current index>``."""
        return self.device_name(self.current_device())

    def device_count(self) -> int:
        """How many emu devices this process sees."""
        return self._emu.device_count()

    def synchronize(self, device_index: int | None = None) -> None:
        """Wait for the work queued on an emu device."""
        self._emu.synchronize(device_index)

    # ------------------------------------------------------------------ random numbers
    def random(self) -> Any:
        """torch's random module (the host generator), as DeepSpeed's other accelerators answer."""
        return torch.random

    def set_rng_state(self, new_state: torch.Tensor, device_index: int | None = None) -> None:
        """Restore an emu device's generator state."""
        self._emu.set_rng_state(new_state, DEVICE_TYPE if device_index is None else device_index)

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        """An emu device's generator state (a uint8 host tensor)."""
        return self._emu.get_rng_state(DEVICE_TYPE if device_index is None else device_index)

    def manual_seed(self, seed: int) -> None:
        """Seed the current emu device's generator."""
        self._emu.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed every emu device's generator."""
        self._emu.manual_seed_all(seed)

    def initial_seed(self) -> int:
        """The seed of the current emu device's generator."""
        return self._emu.initial_seed()

    def default_generator(self, device_index: int) -> torch.Generator:
        """The default generator of emu device ``device_index``."""
        return self._emu.default_generators()[device_index]

    # ------------------------------------------------------------------ streams and events
    @property
    def Stream(self) -> Any:  # noqa: N802 - DeepSpeed's name
        """The stream class (``torch.emu.Stream``)."""
        return self._emu.Stream

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        """A context manager making ``stream`` current."""
        return self._emu.stream(stream)

    def current_stream(self, device_index: int | None = None) -> Any:
        """The current stream of an emu device."""
        return self._emu.current_stream(device_index)

    def default_stream(self, device_index: int | None = None) -> Any:
        """The default stream of an emu device."""
        return self._emu.default_stream(device_index)

    @property
    def Event(self) -> Any:  # noqa: N802 - DeepSpeed's name
        """The event class (``torch.emu.Event``)."""
        return self._emu.Event

    # ------------------------------------------------------------------ memory
    def empty_cache(self) -> None:
        """Return emu's cached blocks to the host."""
        self._emu.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        """Bytes held by live tensors on an emu device."""
        return self._emu.memory_allocated(device_index)

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        """Peak of :meth:`memory_allocated`."""
        return self._emu.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index: int | None = None) -> None:
        """Start the allocation peak again from the current value."""
        self._emu.reset_peak_memory_stats(device_index)

    def memory_cached(self, device_index: int | None = None) -> int:
        """Bytes the allocator holds (DeepSpeed's older name for reserved memory)."""
        return self._emu.memory_reserved(device_index)

    def max_memory_cached(self, device_index: int | None = None) -> int:
        """Peak of :meth:`memory_cached`."""
        return self._emu.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index: int | None = None) -> None:
        """Start the peaks again from the current values."""
        self._emu.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index: int | None = None) -> dict[str, int]:
        """emu's allocator statistics, keyed as ``torch.cuda.memory_stats`` (which DeepSpeed reads)."""
        return self._emu.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        """Start every peak again from the current value."""
        self._emu.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index: int | None = None) -> int:
        """Bytes the allocator holds on an emu device (live tensors and its cache)."""
        return self._emu.memory_reserved(device_index)

    def max_memory_reserved(self, device_index: int | None = None) -> int:
        """Peak of :meth:`memory_reserved`."""
        return self._emu.max_memory_reserved(device_index)

    def total_memory(self, device_index: int | None = None) -> int:
        """An emu device's size (``ACCEL_EMU_MEMORY``)."""
        return self._emu.get_device_properties(device_index).total_memory

    def available_memory(self, device_index: int | None = None) -> int:
        """Free bytes on an emu device."""
        return self._emu.mem_get_info(device_index)[0]

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self) -> bool:
        """True: emu computes bfloat16 as the host does."""
        return bool(self._emu.is_bf16_supported())

    def is_fp16_supported(self) -> bool:
        """True: emu computes float16 as the host does."""
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        """The floating dtypes DeepSpeed may train in on emu."""
        return [torch.float, torch.half, torch.bfloat16]

    # ------------------------------------------------------------------ misc
    def is_available(self) -> bool:
        """Whether this process sees an emu device."""
        return bool(self._emu.is_available())

    def range_push(self, msg: str, domain: Any = None, category: Any = None) -> None:
        """No profiler ranges on emu."""

    def range_pop(self, domain: Any = None) -> None:
        """No profiler ranges on emu."""

    def lazy_call(self, callback: Callable[[], Any]) -> Any:
        """emu initializes when loaded, so a deferred call runs now."""
        return callback()

    def communication_backend_name(self) -> str:
        """``emu_ccl``, the torch.distributed backend registered for emu tensors."""
        return self._communication_backend_name

    def is_triton_supported(self) -> bool:
        """False: triton has no emu target."""
        return False

    # ------------------------------------------------------------------ graphs (none on emu)
    def create_graph(self) -> None:
        """No graph capture on emu."""
        return None

    def capture_to_graph(self, graph: Any, pool: Any = None, stream: Any = None) -> contextlib.AbstractContextManager:
        """No graph capture on emu: the region just runs."""
        return contextlib.nullcontext()

    def replay_graph(self, graph: Any) -> None:
        """No graph capture on emu: nothing to replay."""

    # ------------------------------------------------------------------ tensor constructors
    def _tensor(self, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
        return functools.partial(torch.tensor, dtype=dtype, device=DEVICE_TYPE)

    @property
    def BFloat16Tensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds a bfloat16 tensor on emu."""
        return self._tensor(torch.bfloat16)

    @property
    def ByteTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds a uint8 tensor on emu."""
        return self._tensor(torch.uint8)

    @property
    def DoubleTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds a float64 tensor on emu."""
        return self._tensor(torch.double)

    @property
    def FloatTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds a float32 tensor on emu."""
        return self._tensor(torch.float)

    @property
    def HalfTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds a float16 tensor on emu."""
        return self._tensor(torch.half)

    @property
    def IntTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds an int32 tensor on emu."""
        return self._tensor(torch.int)

    @property
    def LongTensor(self) -> Callable[..., torch.Tensor]:  # noqa: N802 - DeepSpeed's name
        """Builds an int64 tensor on emu."""
        return self._tensor(torch.long)

    # ------------------------------------------------------------------ host memory and placement
    # pinning: DeepSpeedAccelerator's default (Tensor.pin_memory), which emu's host allocator serves

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        """True for a tensor on an emu device."""
        return tensor.device.type == DEVICE_TYPE

    # ------------------------------------------------------------------ op builders
    def op_builder_dir(self) -> str:
        """The host op builders' package: the only DeepSpeed ops that run with emu are host ones."""
        return _HOST_BUILDER_PACKAGE

    def create_op_builder(self, class_name: str) -> Any:
        """An instance of :meth:`get_op_builder`'s class, or None."""
        builder = self.get_op_builder(class_name)
        return builder() if builder is not None else None

    def get_op_builder(self, class_name: str) -> Any:
        """The host builder for an optimizer DeepSpeed runs on the host (offload) or async I/O; DeepSpeed's
        "not implemented" builder for every other op (no emu kernels exist to build)."""
        import importlib

        module = importlib.import_module(_HOST_BUILDER_PACKAGE)
        name = class_name if class_name in _HOST_BUILDERS else "NotImplementedBuilder"
        return getattr(module, name, None)

    def build_extension(self) -> Any:
        """torch's C++ extension builder (host ops)."""
        from torch.utils.cpp_extension import BuildExtension

        return BuildExtension

    def export_envs(self) -> list[str]:
        """Variable prefixes DeepSpeed's multi-node launcher forwards: emu's own settings."""
        return ["ACCEL_EMU", "EMU_VISIBLE_DEVICES"]

    def visible_devices_envs(self) -> list[str]:
        """The variable that restricts the emu devices a process sees."""
        return ["EMU_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env: dict[str, str], local_accelerator_ids: list[int]) -> None:
        """Show a launched process only ``local_accelerator_ids``."""
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self) -> str:
        """The torch.compile backend DeepSpeed uses on emu."""
        return self._compile_backend

    def set_compile_backend(self, backend: str) -> None:
        """Choose a torch.compile backend among those torch lists."""
        if backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise ValueError(f"{backend} is not a torch.compile backend here "
                             f"(known: {', '.join(torch._dynamo.list_backends(exclude_tags=()))})")
        self._compile_backend = backend
