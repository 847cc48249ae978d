"""Which share of the data a rank reads when a device mesh splits the processes.

Ranks that differ only along dimensions that replicate the model's input (tensor parallelism, context
parallelism) must read the same batches; the data is sharded over the rest. The strategy says which rule
its run follows (``Strategy.data_layout``); ``prepare_data_loader`` called directly applies Accelerate's
rule for the process state's distributed type.
"""

from __future__ import annotations

from typing import Any

__all__ = ["data_parallel_layout", "tensor_parallel_layout"]


def _size(mesh: Any, name: str) -> int:
    """The size of mesh dimension ``name``, 1 where the mesh has no such dimension."""
    names = tuple(mesh.mesh_dim_names or ())
    return mesh[name].size() if name in names else 1


def data_parallel_layout(mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
    """(shards, this rank's shard) for a ParallelismConfig mesh: ``dp_replicate`` × ``dp_shard`` shards; ranks
    that share tp and cp coordinates read the same data."""
    replicated = _size(mesh, "tp") * _size(mesh, "cp")
    return _size(mesh, "dp_replicate") * _size(mesh, "dp_shard"), process_index // replicated


def tensor_parallel_layout(mesh: Any, num_processes: int, process_index: int) -> tuple[int, int]:
    """(shards, this rank's shard) when only tensor parallelism replicates the input (DeepSpeed: its config,
    not the mesh, decides how the data-parallel ranks share the optimizer)."""
    tp = _size(mesh, "tp")
    return num_processes // tp, process_index // tp
