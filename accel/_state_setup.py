"""Process-group plumbing that ``PartialState`` and ``AcceleratorState`` call while they set up.

The elastic rendezvous store, loopback detection for single-node gloo, the exit-time teardown, the
per-process share of ``split_between_processes`` and the deprecated ``torch_tp_plugin`` translation:
functions with no state of their own, kept apart from the state classes that use them.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch

__all__ = [
    "destroy_if_initialized", "elastic_attempt_store", "is_loopback", "loopback_interface",
    "parallelism_from_tp_plugin", "split_inputs",
]


def destroy_if_initialized() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def elastic_attempt_store(world_size: int, timeout: timedelta | None) -> Any:
    """The elastic agent's store under a key prefix of this attempt's own; None where that does not apply.

    A torch elastic worker (torchrun, ``accel launch``, ``notebook_launcher``) that joins through env://
    uses the agent's TCPStore. The static rendezvous keeps one store for the whole run, and torch 2.13 no
    longer puts the restart count in the keys (it did once; pytorch/pytorch#135712 is why it stopped), so
    after a failure the restarted workers can read the gloo addresses the dead attempt left there and
    fail or hang connecting to them. With one agent (one node) the restart count is the same in every
    worker, so each attempt gets its own key space. Runs of several agents keep torch's own behaviour:
    their agents count restarts each on its own.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True) or os.environ.get("GROUP_WORLD_SIZE") != "1":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or not os.environ.get("MASTER_PORT"):
        return None
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
        timeout=timeout if timeout is not None else default_pg_timeout,
    )
    return dist.PrefixStore(f"accel/attempt_{attempt}/default_pg", client)


def loopback_interface() -> str | None:
    """Name of the interface carrying 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
                return name
    except Exception:
        return None
    return None


def is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def split_inputs(inputs: Any, parts: int, index: int, pad: bool) -> Any:
    if isinstance(inputs, dict):
        lengths = {k: len(v) for k, v in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes needs dict values of one length, got {lengths}")
        return {k: split_inputs(v, parts, index, pad) for k, v in inputs.items()}
    if type(inputs).__module__.startswith("datasets") and hasattr(inputs, "select"):
        # a Hugging Face datasets.Dataset: the same contiguous share, as rows (padded with the last row)
        total = len(inputs)
        base, extra = divmod(total, parts)
        start = index * base + min(index, extra)
        rows = list(range(start, start + base + (1 if index < extra else 0)))
        if pad and total:
            rows += [total - 1] * (base + (1 if extra else 0) - len(rows))
        return inputs.select(rows)
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        raise TypeError(f"split_between_processes splits lists, tuples, tensors, datasets.Dataset or dicts of them, "
                        f"not {type(inputs).__name__}")
    total = len(inputs)
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    end = start + base + (1 if index < extra else 0)
    share = inputs[start:end]
    longest = base + (1 if extra else 0)
    if not pad or len(share) >= longest or total == 0:
        return share
    missing = longest - len(share)
    if isinstance(share, torch.Tensor):
        filler = (share[-1:] if len(share) else inputs[-1:]).expand(missing, *inputs.shape[1:])
        return torch.cat([share, filler])
    last = share[-1] if len(share) else inputs[-1]
    return share + type(share)([last] * missing)


def parallelism_from_tp_plugin(torch_tp_plugin: Any, parallelism_config: Any) -> Any:
    """Accelerate's handling of the deprecated ``torch_tp_plugin``: a FutureWarning in its words, and without a
    ``parallelism_config`` a ``ParallelismConfig(tp_size=torch_tp_plugin.tp_size)`` in its place (a given config
    wins, as in Accelerate)."""
    if torch_tp_plugin is None:
        return parallelism_config
    import warnings

    tp_size = getattr(torch_tp_plugin, "tp_size", None)
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"torch_tp_plugin: tp_size must be a positive integer, got {tp_size!r} "
                         f"(from {type(torch_tp_plugin).__name__})")
    warnings.warn(
        "`TorchTensorParallelPlugin` is deprecated and will be removed in a future version of Accelerate. "
        "Please use the `ParallelismConfig` with `tp_size` instead.",
        FutureWarning,
        stacklevel=4,
    )
    if parallelism_config is not None:
        return parallelism_config
    from .parallelism_config import ParallelismConfig

    return ParallelismConfig(tp_size=tp_size)
