"""Run a function in several processes from Python: ``notebook_launcher`` and ``debug_launcher``.

Same names, signatures and behaviour as Accelerate's:

* ``notebook_launcher(function, args, num_processes, ...)`` starts ``num_processes`` workers through
  torch elastic (``elastic_launch``) with the active backend's start method (fork on cpu, spawn
  for device backends, whose runtimes do not survive a fork). Each worker calls ``function(*args)``
  with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/... set, so ``Accelerator()`` or ``PartialState()``
  inside it joins the group. One process runs the function here, in this process.
* ``debug_launcher(function, args, num_processes=2)`` forks ``num_processes`` CPU workers, gives each
  a gloo process group over a private file store (no ports), and calls ``function(*args)``: a quick
  way to exercise multi-process code on any machine.

A failing worker stops the others; the error names the rank and carries its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from typing import Any, Callable

from accel.facts.network import DEFAULT_PORT, is_port_in_use
from accel.facts.precision import PRECISIONS
from accel.launch.forking import garbage_frozen_for_fork

__all__ = ["debug_launcher", "notebook_launcher"]


def _check_parent_is_clean(launcher: str) -> None:
    """A multi-process launch needs a parent without accel state or a process group."""
    import torch.distributed as dist

    from accel.state import AcceleratorState, PartialState

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            f"{launcher}: this process already has a torch.distributed process group; the workers need a "
            "fresh one each. Call torch.distributed.destroy_process_group() first, or launch from a new process."
        )
    if AcceleratorState._shared_state or PartialState._shared_state:
        raise ValueError(
            f"To launch a multi-process run with {launcher}, the Accelerator (or PartialState) must only be "
            "created inside your training function. Restart the notebook/interpreter and make sure no cell "
            "creates one before the launch."
        )


class _ElasticWorker:
    """What each elastic worker runs: mark the process as launched, then call the function."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        functools.update_wrapper(self, function)  # elastic logs the entry point's __name__/__qualname__
        if not hasattr(self, "__qualname__"):
            self.__name__ = self.__qualname__ = type(function).__name__

    def __call__(self, *args: Any) -> Any:
        os.environ["FORK_LAUNCHED"] = "1"
        try:
            return self.function(*args)
        finally:
            _close_process_group()


def _close_process_group() -> None:
    """A worker that exits with a live gloo group can abort in torch's teardown: close it first."""
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = str(DEFAULT_PORT),
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Launch ``function(*args)`` in ``num_processes`` processes per node (torch elastic underneath).

    ``mixed_precision`` reaches the workers as ``ACCEL_MIXED_PRECISION``. ``use_port``/``master_addr``
    are the static rendezvous address (``rdzv_endpoint`` overrides them); ``node_rank``/``num_nodes``
    describe a multi-node launch. Nothing may have created an ``Accelerator`` or a process group in
    this process before a multi-process launch. ``max_restarts`` restarts the whole group after a
    failure; a group formed through ``Accelerator``/``PartialState`` joins each attempt afresh (one that
    calls ``torch.distributed.init_process_group`` itself can meet the failed attempt's addresses).
    """
    precision = str(mixed_precision).lower()
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown mixed_precision mode: {mixed_precision!r}. Choose between {list(PRECISIONS)}.")
    if num_processes is None:
        raise ValueError("You have to specify the number of processes you would like to use: add `num_processes=...` to your call.")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a whole number of at least 1, got {num_processes!r}")
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a whole number of at least 1, got {num_nodes!r}")
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"The node_rank must be less than the number of nodes (node_rank={node_rank}, num_nodes={num_nodes}).")

    from accel.backends import get_backend
    from accel.launch.execution import patched_environ
    from accel.launch.network import loopback_interface

    backend = get_backend()
    env = {"ACCEL_MIXED_PRECISION": precision}
    if num_processes == 1 and num_nodes == 1:
        print(f"Launching training on one {backend.name.upper()}." if not backend.is_host else "Launching training on CPU.")
        with patched_environ(env):
            function(*args)
        return None

    _check_parent_is_clean("notebook_launcher")
    if backend.comm_backend is None:
        raise ValueError(
            f"notebook_launcher: backend {backend.name!r} cannot run several processes: {backend.comm_backend_reason()}"
        )
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if backend.is_host:
        env["ACCEL_USE_CPU"] = "true"
        if num_nodes == 1 and "GLOO_SOCKET_IFNAME" not in os.environ and str(master_addr).startswith("127."):
            iface = loopback_interface()
            if iface:
                env["GLOO_SOCKET_IFNAME"] = iface
    if not os.environ.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(max((os.cpu_count() or 1) // num_processes, 1))
    rdzv_configs = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_configs["rank"] = node_rank
    endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    if rdzv_backend == "static" and node_rank == 0 and not rdzv_endpoint and is_port_in_use(int(use_port), master_addr):
        # this node serves the store there; a client that reached another program's listener would wait forever
        raise ConnectionError(f"notebook_launcher: port {use_port} on {master_addr} is already taken by another process, "
                              "and this node must serve the rendezvous store on it: pass another use_port")

    print(f"Launching training on {num_processes} {backend.name.upper()}s.")
    with tempfile.TemporaryDirectory(prefix="accel_notebook_") as log_dir, patched_environ(env):
        config = LaunchConfig(
            min_nodes=num_nodes,
            max_nodes=num_nodes,
            nproc_per_node=num_processes,
            run_id=rdzv_id,
            rdzv_endpoint=endpoint,
            rdzv_backend=rdzv_backend,
            rdzv_configs=rdzv_configs,
            max_restarts=max_restarts,
            monitor_interval=monitor_interval,
            start_method=backend.start_method,
            log_line_prefix_template=log_line_prefix_template,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        )
        forking = garbage_frozen_for_fork() if backend.start_method == "fork" else contextlib.nullcontext()
        with forking:  # a forked worker must not collect this notebook's garbage (accel.launch.forking)
            elastic_launch(config=config, entrypoint=_ElasticWorker(function))(*args)
    return None


class _DebugWorker:
    """One forked debug rank: launcher environment, fresh accel state, gloo group over a file store."""

    def __init__(self, function: Callable[..., Any], world_size: int, store_path: str, iface: str | None):
        self.function = function
        self.world_size = world_size
        self.store_path = store_path
        self.iface = iface

    def __call__(self, index: int, *args: Any) -> None:
        import torch.distributed as dist

        from accel.backends import reset_registry
        from accel.state import AcceleratorState, GradientState

        env = {
            "RANK": str(index),
            "LOCAL_RANK": str(index),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(DEFAULT_PORT),
            "ACCEL_USE_CPU": "true",
            "ACCEL_DEVICE": "cpu",
            "ACCEL_MIXED_PRECISION": "no",
            "FORK_LAUNCHED": "1",
        }
        if self.iface and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = self.iface
        os.environ.update(env)
        # the fork copied the parent's state objects; this rank starts its own
        reset_registry()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        store = dist.FileStore(self.store_path, self.world_size)
        dist.init_process_group("gloo", store=store, rank=index, world_size=self.world_size)
        try:
            self.function(*args)
        finally:
            _close_process_group()


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` in ``num_processes`` forked CPU processes with a gloo process group.

    For debugging and tests of multi-process code, not for training: it always uses the CPU.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a whole number of at least 1, got {num_processes!r}")
    import torch.distributed as dist
    from torch.multiprocessing import start_processes

    from accel.launch.network import loopback_interface

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "debug_launcher: this process already has a torch.distributed process group; the workers need a "
            "fresh one each. Call torch.distributed.destroy_process_group() first."
        )
    with tempfile.TemporaryDirectory(prefix="accel_debug_") as tmp:
        worker = _DebugWorker(function, num_processes, os.path.join(tmp, "store"), loopback_interface())
        with garbage_frozen_for_fork():  # the workers must not collect this process's garbage (see the module)
            start_processes(worker, args=tuple(args), nprocs=num_processes, start_method="fork")


def test_launch() -> None:
    """Build a PartialState: the smallest check that a launched process can join its process group."""
    from accel.state import PartialState

    PartialState()
