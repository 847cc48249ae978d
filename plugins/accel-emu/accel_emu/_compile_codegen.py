"""Inductor's code generator for emu: host C++ kernels, and a Python wrapper that runs them on emu memory.

Imported only once Inductor is (see :mod:`accel_emu.compiler`). The kernels are Inductor's own CPU
kernels (``CppScheduling``), which read and write tensors through their data pointers; emu memory is
host memory, so they compute on it directly. The wrapper differs from the CPU's in two places:

- buffers are allocated on the emu device the graph runs on (``device='emu:N'``, not the CPU nor
  whichever emu device happens to be current);
- every kernel is called as ``emu_launch(kernel, *args)`` (:func:`accel_emu.compiler.kernel_launcher`),
  which waits for the current stream and hands the kernel host tensors over the operands' host
  windows, as emu's host fallback does for an eager kernel. Operators Inductor leaves to ATen (``extern_kernels.mm``
  and other fallbacks) dispatch to emu as in eager mode.
"""

from __future__ import annotations

import sys
from textwrap import dedent
from typing import Any

from torch._inductor.codegen.common import DeviceOpOverrides, register_backend_for_device, register_device_op_overrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.virtualized import V

from . import DEVICE_TYPE

__all__ = ["EmuCacheKey", "EmuDeviceOpOverrides", "EmuSubgraphWrapperCodegen", "EmuWrapperCodegen", "register_codegen"]

#: the name the generated wrapper calls kernels through
LAUNCH = "emu_launch"


class EmuDeviceOpOverrides(DeviceOpOverrides):
    """The device calls the generated wrapper writes for emu (guards, synchronisation, streams)."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(
            f"""
            def {name}(index):
                return torch.{DEVICE_TYPE}.current_stream(index).stream_id
            """
        )

    def set_device(self, device_idx: int) -> str:
        return f"torch.{DEVICE_TYPE}.set_device({device_idx})"

    def synchronize(self) -> str:
        return f"torch.{DEVICE_TYPE}.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.{DEVICE_TYPE}.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class _EmuCalls:
    """Kernel calls and allocations on emu, shared by the graph's wrapper and its subgraphs'."""

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     triton: bool = True, **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type == DEVICE_TYPE and not triton:
            self.writeline(f"{LAUNCH}({', '.join([kernel_name, *map(str, call_args)])})")  # type: ignore[attr-defined]
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)  # type: ignore[misc]

    def make_allocation(self, name: str, device: Any, dtype: Any, shape: Any, stride: Any, *args: Any,
                        **kwargs: Any) -> str:
        line = super().make_allocation(name, device, dtype, shape, stride, *args, **kwargs)  # type: ignore[misc]
        if device.type == DEVICE_TYPE and device.index is not None:
            generic = f"device='{DEVICE_TYPE}'"
            if generic not in line:
                raise RuntimeError(f"Inductor's allocation for {device} has an unexpected form: {line}")
            line = line.replace(generic, f"device='{device}'", 1)
        return line


class EmuWrapperCodegen(_EmuCalls, PythonWrapperCodegen):
    """Inductor's Python wrapper for a graph on emu."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: PythonWrapperCodegen | None,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        """The wrapper for a graph, or for one of its subgraphs."""
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return EmuSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return EmuWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from accel_emu.compiler import kernel_launcher")
        self.header.writeline(f"{LAUNCH} = kernel_launcher()")


class EmuSubgraphWrapperCodegen(_EmuCalls, SubgraphPythonWrapperCodegen):
    """Inductor's wrapper for a subgraph on emu (its header is its parent's)."""


class EmuCacheKey(CustomGraphModulePass):
    """A pass that changes nothing; its ``uuid`` puts this code generator's version into Inductor's
    cache key, so a graph compiled by an older emu code generator is never reused by this one."""

    def __call__(self, gm: Any) -> None:
        return None

    def uuid(self) -> bytes:
        from . import compiler

        return get_hash_for_files((__file__, compiler.__file__))


#: Inductor's fusion passes that only GPU code generators take: the scheduler skips them for CPU nodes
#: by device type, and emu's kernels are the CPU's C++ kernels, which they break (the scheduler's
#: groups of a C++ reduction are not a GPU kernel's numel and rnumel). CPU graphs skip them anyway.
GPU_ONLY_PASSES = (
    ("loop_index_inversion_in_fusion",),
    ("loop_ordering_after_fusion",),
    ("loop_reindexing_after_fusion",),
    ("triton", "mix_order_reduction"),
)


def _turn_off_gpu_only_passes() -> None:
    import torch._inductor.config as config

    for path in GPU_ONLY_PASSES:
        holder = config
        for part in path[:-1]:
            holder = getattr(holder, part)
        setattr(holder, path[-1], False)
    # Random operators run as ATen operators (emu's, drawing from the device's generator), so a compiled
    # graph gives eager's numbers for the same seed; otherwise Inductor would generate random kernels
    # of its own off the CPU.
    config.fallback_random = True


#: what Inductor's ``get_current_backend`` answers for emu: its kernels come from the C++ generator
BACKEND = "cpp"


def _answer_cpp_for_emu() -> None:
    """Make Inductor's ``get_current_backend`` answer ``cpp`` for emu.

    Inductor asks it which generator writes the current device's kernels, and answers
    ``config.cuda_backend`` (Triton) for any device it does not know. Code shared by the generators
    then takes Triton's branch inside emu's C++ kernels: the CSE proxy reads a Triton variable's
    ``dtype`` from the C++ generator's string result of ``masked`` (a padded or masked load), and
    C++ variables are left without the dtype the vectorised ``arange`` asserts (an index expression
    in a batch norm's or a pooling's kernel). The answer for every other device is unchanged. Modules
    that imported the function by name get the new one too; those imported later take it from
    ``torch._inductor.utils``.
    """
    import torch._inductor.utils as inductor_utils

    original = inductor_utils.get_current_backend
    if getattr(original, "emu_routes", False):
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        return BACKEND if device_type == DEVICE_TYPE else original(device_type)

    get_current_backend.emu_routes = True  # type: ignore[attr-defined]
    get_current_backend.__doc__ = original.__doc__
    for name, module in list(sys.modules.items()):
        if name.startswith("torch._inductor") and getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend  # type: ignore[attr-defined]


def register_codegen() -> None:
    """Register emu's code generator with Inductor (host C++ kernels, the emu Python wrapper)."""
    from torch._inductor.codegen.cpp import CppScheduling

    _answer_cpp_for_emu()
    _turn_off_gpu_only_passes()

    register_device_op_overrides(DEVICE_TYPE, EmuDeviceOpOverrides())
    register_backend_for_device(DEVICE_TYPE, CppScheduling, EmuWrapperCodegen, device_custom_pass=EmuCacheKey())
