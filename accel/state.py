"""Process state shared by everything in a run: ranks, device, process group, precision, gradients.

``PartialState``, ``AcceleratorState`` and ``GradientState`` behave like Accelerate's: every
instance of a class shares one state (so any module can call ``PartialState()`` and see the same
ranks), and ``_reset_state()`` forgets it (tests). The process group is set up from whatever
launcher started the process (``accel launch``/torchrun, SLURM, Open MPI, MPICH/Intel MPI), on the
collective backend the active hardware backend names; single-node CPU groups bind gloo to the
loopback interface.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch

from ._state_gradient import GradientState
from ._state_setup import destroy_if_initialized as _destroy_if_initialized
from ._state_setup import elastic_attempt_store as _elastic_attempt_store
from ._state_setup import is_loopback as _is_loopback
from ._state_setup import loopback_interface as _loopback_interface
from ._state_setup import parallelism_from_tp_plugin as _parallelism_from_tp_plugin
from ._state_setup import split_inputs as _split
from .backends import Backend, is_host_device
from .facts.environment import env_flag, env_text
from .facts.network import DEFAULT_PORT
from .resolve import launched_for_deepspeed, plugin_dict, resolve, resolve_backend
from .utils.dataclasses import DistributedType, GradientAccumulationPlugin

GradientState.__module__ = __name__  # where Accelerate's lives and users import it from (repr, pickling by reference)

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "ProcessLayout", "is_initialized"]

@dataclass(frozen=True)
class ProcessLayout:
    """Rank numbers of this process as a launcher described them."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    source: str = "single process"

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> "ProcessLayout":
        """Read the layout set by torchrun/``accel launch``, SLURM, Open MPI or MPICH/Intel MPI."""
        env = os.environ if environ is None else environ
        schemes = (
            ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
            ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
            ("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
            ("SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
        )
        for source, rank_var, size_var, local_var, local_size_var in schemes:
            if rank_var in env and size_var in env:
                try:
                    rank, world = int(env[rank_var]), int(env[size_var])
                    local = int(env.get(local_var, rank))
                    local_size_text = env.get(local_size_var, "").split("(")[0]  # SLURM writes "2(x3)"
                    local_size = int(local_size_text) if local_size_text else world
                except ValueError as exc:
                    raise ValueError(f"{source} environment has a non-integer rank variable: {exc}") from None
                if not 0 <= rank < world:
                    raise ValueError(f"{source} environment is inconsistent: {rank_var}={rank} with {size_var}={world}")
                return cls(rank, world, local, local_size, source)
        return cls()

    @property
    def single_node(self) -> bool:
        """Whether every rank runs on this node."""
        return self.local_world_size >= self.world_size



#: attributes a live PartialState holds (after ``_reset_state()`` reading one names the reset)
_PARTIAL_FIELDS = frozenset({
    "hardware_backend", "backend_reason", "debug", "fork_launched", "layout", "num_processes", "process_index", "local_process_index",
    "backend", "distributed_type", "device", "_initialized", "_cpu",
})
#: the same for AcceleratorState's own attributes
_ACCELERATOR_FIELDS = frozenset({
    "dynamo_plugin", "deepspeed_plugins", "fsdp_plugin", "parallelism_config", "run_plan",
    "megatron_lm_plugin", "torch_tp_plugin",
})


def _refuse_cpu_after_device(cpu: bool, device: torch.device) -> None:
    """Accelerate's rule for a state that already exists: asking for the CPU while it runs on another
    device is an error (a process cannot move its state); ``cpu=False`` keeps whatever the state has."""
    if cpu and not is_host_device(device):
        raise ValueError(
            "AcceleratorState has already been initialized and cannot be changed, restart your runtime completely "
            f"and pass `cpu=True` to `Accelerator()` (this process already runs on {device})."
        )


def _reset_message(cls: str, name: str) -> str:
    return (f"`{cls}` object has no attribute `{name}`. This happens if `{cls}._reset_state()` was called and "
            f"an `Accelerator` or `PartialState` was not reinitialized.")


#: the class-level dict every instance of a state class shares (Accelerate's name). A plain ``dict``,
#: as in Accelerate: attribute reads on a state are only fast (specialised by the interpreter) when the
#: instance dict is exactly a ``dict``.
SharedDict = dict


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything and return None: the stand-in for ``on_*_process`` functions on the other processes."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A descriptor holding a dict per thread: shared state for runtimes that run one rank per thread (XLA PJRT).

    ``instance._shared_state`` and ``Class._shared_state`` both give the current thread's dict.
    """

    def __init__(self, thread_local: bool = False):
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


class PartialState:
    """Ranks, device and process group of this process; no precision or plug-in knowledge.

    ``cpu=True`` forces the CPU backend. Extra keyword arguments go to
    ``torch.distributed.init_process_group`` (``backend``, ``timeout``, ``init_method``).
    """

    _shared_state: dict[str, Any] = SharedDict()

    def __init__(self, cpu: bool = False, **kwargs: Any):
        self.__dict__ = self._shared_state
        if self.initialized:
            _refuse_cpu_after_device(cpu, self.device)
            return
        self._shared_state["_cpu"] = bool(cpu)
        backend, self.backend_reason = resolve_backend(cpu)
        self.hardware_backend: Backend = backend
        self.debug = env_flag("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE")
        self.fork_launched = env_flag("FORK_LAUNCHED")

        import torch.distributed as dist

        layout = ProcessLayout.from_environment()
        if dist.is_available() and dist.is_initialized():
            # adopt a group someone else created (a test harness, a notebook launcher)
            layout = ProcessLayout(dist.get_rank(), dist.get_world_size(), layout.local_rank, layout.local_world_size, "existing process group")
        self.layout = layout
        self.num_processes = layout.world_size
        self.process_index = layout.rank
        self.local_process_index = layout.local_rank

        self.backend: str | None = None
        if layout.world_size > 1:
            adopted = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
            self.backend = adopted or kwargs.pop("backend", None) or backend.comm_backend
            kwargs.pop("backend", None)
            if self.backend is None:
                raise RuntimeError(
                    f"{layout.world_size} processes were launched on backend {backend.name!r}, "
                    f"which cannot run several processes: {backend.comm_backend_reason()}"
                )
            self.distributed_type = DistributedType(backend.distributed_type)
            if not cpu and launched_for_deepspeed():
                # as Accelerate's process state: a DeepSpeed launch is a DeepSpeed run from the first state on
                self.distributed_type = DistributedType.DEEPSPEED
        else:
            kwargs.pop("backend", None)
            self.distributed_type = DistributedType.NO

        count = backend.device_count()
        self.device = backend.device(self.local_process_index % count if count else None)
        forced = env_text("ACCEL_TORCH_DEVICE", "ACCELERATE_TORCH_DEVICE")
        if forced is not None:  # Accelerate's override of the device this process uses
            self.device = torch.device(forced)
        if not backend.is_host:
            backend.set_device(self.device.index or 0)

        unknown = set(kwargs) - {"timeout", "init_method"}
        if unknown:
            raise TypeError(f"PartialState got unexpected process-group argument(s): {', '.join(sorted(unknown))}")
        if layout.world_size > 1 and not dist.is_initialized():
            self._init_process_group(**kwargs)
        self._shared_state["_initialized"] = True

    def _init_process_group(self, timeout: timedelta | None = None, init_method: str | None = None) -> None:
        import torch.distributed as dist

        layout = self.layout
        if not os.environ.get("MASTER_ADDR"):
            if not layout.single_node:
                raise RuntimeError(f"MASTER_ADDR must be set for a multi-node run started by {layout.source}")
            os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ.setdefault("MASTER_PORT", str(DEFAULT_PORT))
        if self.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
            if layout.single_node or _is_loopback(os.environ["MASTER_ADDR"]):
                iface = _loopback_interface()
                if iface:
                    os.environ["GLOO_SOCKET_IFNAME"] = iface  # full-mesh connects flake on other NICs
        options: dict[str, Any] = {"backend": self.backend, "rank": layout.rank, "world_size": layout.world_size}
        store = None if init_method else _elastic_attempt_store(layout.world_size, timeout)
        if store is not None:
            options["store"] = store
        else:
            options["init_method"] = init_method or "env://"
        if timeout is not None:
            options["timeout"] = timeout
        dist.init_process_group(**options)
        # a process that exits with a live gloo group can abort (SIGABRT) in torch 2.13: close it
        atexit.register(_destroy_if_initialized)

    def __getattr__(self, name: str) -> Any:
        # only reached for missing attributes: after _reset_state() the shared fields are gone
        if name in _PARTIAL_FIELDS and not name.startswith("__"):
            raise AttributeError(_reset_message("PartialState", name))
        raise AttributeError(f"'PartialState' object has no attribute '{name}'")

    # ------------------------------------------------------------------ identity
    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{'  Backend: ' + self.backend if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        PartialState._shared_state.clear()

    @property
    def initialized(self) -> bool:
        """Whether the shared state was set up in this process."""
        return self._shared_state.get("_initialized", False)

    @property
    def use_distributed(self) -> bool:
        """Whether several processes run with a process group."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is rank 0 on its node."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest rank."""
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        """Device 0 of the backend (the host without devices)."""
        return self.hardware_backend.device(0) if self.hardware_backend.device_count() else torch.device("cpu")

    # ------------------------------------------------------------------ synchronisation
    def wait_for_everyone(self) -> None:
        """Barrier: wait until every process reaches this point."""
        if self.use_distributed:
            import torch.distributed as dist

            from .launch import heartbeat

            heartbeat.beat()  # a progress point for accel launch's hang watchdog
            dist.barrier()

    @contextlib.contextmanager
    def _goes_first(self, is_main: bool) -> Iterator[None]:
        if not is_main:
            self.wait_for_everyone()
        yield
        if is_main:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager:
        """The main process runs the block first, then the others (e.g. download or preprocess once)."""
        return self._goes_first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager:
        """The local main process runs the block first, then the others on its node."""
        return self._goes_first(self.is_local_main_process)

    # ------------------------------------------------------------------ splitting work
    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, tensor or dict of them).

        Shares differ by at most one item; the first ``len % num_processes`` processes get the extra.
        With ``apply_padding`` every share is padded with the last item to the longest share, so a
        later ``gather`` sees equal shapes (drop the padding afterwards).
        """
        if self.num_processes == 1:
            yield inputs
            return
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    # ------------------------------------------------------------------ running on some processes
    def on_main_process(self, function: Callable[..., Any] | None = None):
        return self._only_where(lambda: self.is_main_process, function, "on_main_process")

    def on_local_main_process(self, function: Callable[..., Any] | None = None):
        return self._only_where(lambda: self.is_local_main_process, function, "on_local_main_process")

    def on_last_process(self, function: Callable[..., Any]):
        return self._only_where(lambda: self.is_last_process, function, "on_last_process")

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None):
        if process_index is None:
            raise ValueError("on_process needs a process_index")
        return self._only_where(lambda: self.process_index == process_index, function, "on_process")

    def on_local_process(self, function: Callable[..., Any] | None = None, local_process_index: int | None = None):
        if local_process_index is None:
            raise ValueError("on_local_process needs a local_process_index")
        return self._only_where(lambda: self.local_process_index == local_process_index, function, "on_local_process")

    @staticmethod
    def _only_where(condition: Callable[[], bool], function: Callable[..., Any] | None, name: str):
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise TypeError(f"{name} decorates a function, got {type(fn).__name__}")

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs) if condition() else None

            return wrapper

        return decorate if function is None else decorate(function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ teardown
    def set_device(self) -> None:
        if not is_host_device(self.device):
            self.hardware_backend.set_device(self.device.index or 0)

    def destroy_process_group(self, group: Any = None) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group(group)



class AcceleratorState:
    """PartialState plus precision and plug-ins; shares PartialState's ranks and device."""

    _shared_state: dict[str, Any] = SharedDict()

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        _precision_handlers: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        self.__dict__ = self._shared_state
        handlers = dict(_precision_handlers or {})
        if self.initialized and not PartialState._shared_state.get("_initialized", False):
            # PartialState alone was reset (a test, a notebook): bring the ranks and device back
            self._partial = PartialState(cpu, **kwargs)
        if self.initialized:
            _refuse_cpu_after_device(cpu, self._partial.device)
            plan = self.run_plan
            given = {"deepspeed_plugin": deepspeed_plugin, "fsdp_plugin": fsdp_plugin, "parallelism_config": parallelism_config}
            current = {"deepspeed_plugin": plan.deepspeed_plugins, "fsdp_plugin": plan.fsdp_plugin,
                       "parallelism_config": self.parallelism_config}
            for name, value in given.items():
                if value is None:
                    continue
                same = (plugin_dict(value) == current[name]) if name == "deepspeed_plugin" else value is current[name]
                if not same:
                    raise ValueError(
                        f"AcceleratorState is already initialised for this process; {name} cannot change now "
                        "(reset the state first: AcceleratorState._reset_state(True))"
                    )
            # as in Accelerate: only an explicitly passed, different precision is an error (DeepSpeed's
            # config owns the precision, so there it is not); leaving it out keeps the state's precision
            explicit = None if mixed_precision is None else str(mixed_precision).lower()
            if explicit is not None and explicit != plan.requested_precision and self.distributed_type != DistributedType.DEEPSPEED:
                raise ValueError(
                    f"AcceleratorState was already initialised with mixed_precision={plan.requested_precision!r}; "
                    f"it cannot change to {explicit!r} in the same process (reset the state first)"
                )
            if _from_accelerator:
                # each Accelerator makes its own resolution (its grad scaler, its handlers) on the state's choices
                self.run_plan = resolve(self._partial.num_processes, self._partial.hardware_backend,
                                        backend_reason=self._partial.backend_reason,
                                        mixed_precision=plan.requested_precision,
                                        deepspeed_plugins=plan.deepspeed_plugins, fsdp_plugin=plan.fsdp_plugin,
                                        parallelism_config=self.parallelism_config, **handlers)
            return
        self._partial = PartialState(cpu, **kwargs)
        self.dynamo_plugin = dynamo_plugin
        if megatron_lm_plugin is not None:
            from .utils.megatron_lm import megatron_lm_refusal  # only here: the module is costly to import

            raise megatron_lm_refusal("megatron_lm_plugin")
        parallelism_config = _parallelism_from_tp_plugin(torch_tp_plugin, parallelism_config)
        self.megatron_lm_plugin = None
        self.torch_tp_plugin = torch_tp_plugin
        #: backend, strategy, precision and parallelism config with their reasons (accel.resolve), plus the
        #: plugins the run uses
        self.run_plan = resolve(self._partial.num_processes, self._partial.hardware_backend,
                                backend_reason=self._partial.backend_reason, mixed_precision=mixed_precision,
                                deepspeed_plugins=deepspeed_plugin, fsdp_plugin=fsdp_plugin,
                                parallelism_config=parallelism_config, **handlers)
        self.parallelism_config = self.run_plan.parallelism_config
        self.deepspeed_plugins = self.run_plan.deepspeed_plugins
        self.fsdp_plugin = self.run_plan.fsdp_plugin
        self.distributed_type = self.run_plan.distributed_type
        if self.deepspeed_plugins:
            next(iter(self.deepspeed_plugins.values())).select(_from_accelerator_state=True)
        self._shared_state["_initialized"] = True

    # ------------------------------------------------------------------ DeepSpeed plugins
    @property
    def deepspeed_plugin(self) -> Any:
        """The selected DeepSpeedPlugin, or None without DeepSpeed."""
        plugins = self.__dict__.get("deepspeed_plugins")
        if not plugins:
            return None
        return next((p for p in plugins.values() if p.selected), next(iter(plugins.values())))

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin registered under ``name`` the active one (several models, several configs)."""
        plugins = self.__dict__.get("deepspeed_plugins") or {}
        if name not in plugins:
            raise ValueError(f"no DeepSpeedPlugin named {name!r}; the Accelerator has {sorted(plugins) or 'none'}")
        for key, plugin in plugins.items():
            if key != name:
                plugin._unselect()
        plugins[name].select(_from_accelerator_state=True)

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeedPlugin registered under ``name``."""
        plugins = self.__dict__.get("deepspeed_plugins") or {}
        if name not in plugins:
            raise ValueError(f"no DeepSpeedPlugin named {name!r}; the Accelerator has {sorted(plugins) or 'none'}")
        return plugins[name]

    enable_deepspeed_plugin = select_deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        """Whether this run shards with FSDP2 (``fully_shard``): the resolved plan's answer, which its strategy gives."""
        plan = self.__dict__.get("run_plan")
        return plan is not None and plan.is_fsdp2

    @property
    def device_mesh(self) -> Any:
        """The ParallelismConfig's DeviceMesh once built, else None."""
        config = self.__dict__.get("parallelism_config")
        return getattr(config, "device_mesh", None)

    def __getattr__(self, name: str) -> Any:
        # ranks, device and process control come from the shared PartialState
        if name.startswith("__") or name in ("_partial", "_shared_state"):
            raise AttributeError(name)
        partial = self.__dict__.get("_partial")
        if partial is None:
            if name in _PARTIAL_FIELDS or name in _ACCELERATOR_FIELDS:
                raise AttributeError(_reset_message("AcceleratorState", name))
            raise AttributeError(f"'AcceleratorState' object has no attribute '{name}'")
        if name not in _PARTIAL_FIELDS and name not in partial.__dict__ and not hasattr(type(partial), name):
            raise AttributeError(f"'AcceleratorState' object has no attribute '{name}'")
        return getattr(partial, name)

    def __repr__(self) -> str:
        text = repr(self._partial).replace(f"Distributed environment: {self._partial.distributed_type}",
                                            f"Distributed environment: {self.distributed_type}", 1)
        plan = self.run_plan
        text += f"Mixed precision type: {plan.precision_label}\n"
        text += f"Strategy: {plan.strategy} ({plan.describe()})\n"
        if self.deepspeed_plugin is not None:
            text += f"ds_config: {self.deepspeed_plugin.deepspeed_config}\n"
        return text

    @property
    def initialized(self) -> bool:
        """Whether the shared state was set up in this process."""
        return self._shared_state.get("_initialized", False)

    @property
    def mixed_precision(self) -> str:
        """The precision that runs (after any fallback the resolution warned about)."""
        return self.run_plan.mixed_precision

    @property
    def mixed_precision_label(self) -> str:
        """The precision as people read it: "fp8 (emulated)" where torchao emulates fp8."""
        return self.run_plan.precision_label

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()

    # explicit so `AcceleratorState.is_main_process` etc. are discoverable, as in Accelerate; like Accelerate's,
    # they go through the process state, made afresh when ``_reset_state()`` cleared it (an AcceleratorState
    # kept across a reset still destroys the process group or waits for everyone)
    def _process_state(self) -> PartialState:
        return self.__dict__.get("_partial") or PartialState()

    use_distributed = property(lambda self: self._process_state().use_distributed)
    is_main_process = property(lambda self: self._process_state().is_main_process)
    is_local_main_process = property(lambda self: self._process_state().is_local_main_process)
    is_last_process = property(lambda self: self._process_state().is_last_process)

    def wait_for_everyone(self) -> None:
        """Barrier: wait until every process reaches this point."""
        self._process_state().wait_for_everyone()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """This process's share of ``inputs`` (see ``PartialState.split_between_processes``)."""
        return self._process_state().split_between_processes(inputs, apply_padding=apply_padding)

    def main_process_first(self):
        """The main process runs the block first, then the others."""
        return self._process_state().main_process_first()

    def local_main_process_first(self):
        """The local main process runs the block first, then the others on its node."""
        return self._process_state().local_main_process_first()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self._process_state().print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy the process group (``group`` or the default one)."""
        self._process_state().destroy_process_group(group)


class _PartialField:
    """An ``AcceleratorState`` attribute that lives on the shared ``PartialState`` (ranks, device).

    A class-level descriptor, so ``state.device`` is one call instead of a failed lookup, an exception
    and ``__getattr__``. It has no ``__set__``: a value stored on the state itself still wins.
    """

    def __init__(self, name: str):
        self.name = name

    def __get__(self, state: Any, owner: Any = None) -> Any:
        if state is None:
            return self
        partial = state.__dict__.get("_partial")
        if partial is None:
            raise AttributeError(_reset_message("AcceleratorState", self.name))
        return getattr(partial, self.name)


for _name in sorted(_PARTIAL_FIELDS):
    if not _name.startswith("_") and _name not in AcceleratorState.__dict__:
        setattr(AcceleratorState, _name, _PartialField(_name))
del _name



def is_initialized() -> bool:
    """Whether a PartialState exists in this process."""
    return PartialState._shared_state.get("_initialized", False)
