"""The Accelerator's context-parallel block, over ``accel.strategies.sequence_parallel``.

:func:`maybe_context_parallel` shards buffers along their sequence dimension over the ``cp`` mesh
dimension when the ParallelismConfig enables torch context parallelism, and otherwise warns once
and does nothing. The Accelerator passes its ParallelismConfig and its mesh (as a callable: the
mesh is built on first use) as values.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from ..logging import get_logger

__all__ = ["maybe_context_parallel"]

# the warning is the Accelerator's (Accelerate logs it from its accelerator module too)
logger = get_logger("accel.accelerator")


@contextlib.contextmanager
def maybe_context_parallel(parallelism_config: Any, device_mesh: Callable[[], Any],
                           buffers: list[torch.Tensor] | None = None, buffer_seq_dims: list[int] | None = None,
                           no_restore_buffers: set[torch.Tensor] | None = None) -> Iterator[None]:
    """Run the block with ``buffers`` sharded along ``buffer_seq_dims`` over ``device_mesh()["cp"]`` when
    ``parallelism_config`` enables torch context parallelism (``cp_size`` > 1); else warn once and run it as is.

    Refused (``UnsupportedFeatureError`` naming the kernel) where torch cannot shard the device's attention.
    """
    config = parallelism_config
    if config is None or config.cp_backend != "torch" or not config.cp_enabled:
        logger.warning_once("Context parallel training is not enabled: maybe_context_parallel has no effect. "
                            "Set parallelism_config.cp_size > 1 in the Accelerator to enable it.")
        yield
        return
    from ..strategies.sequence_parallel import context_parallel

    with context_parallel(device_mesh()["cp"], buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                          no_restore_buffers=no_restore_buffers, comm_strategy=config.cp_handler.cp_comm_strategy):
        yield

