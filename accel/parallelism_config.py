"""``ParallelismConfig``: how the ranks split into data-parallel replicas, shards, tensor and context parallel groups.

As in Accelerate, the sizes (``dp_replicate_size``, ``dp_shard_size``, ``tp_size``, ``cp_size``,
``sp_size``) default to the ``PARALLELISM_CONFIG_*`` variables ``accel launch --use_parallelism_config``
sets, then to 1; their product must equal the number of processes. ``build_device_mesh`` makes a
torch ``DeviceMesh`` with dimensions in the canonical order (dp_replicate, dp_shard, cp, sp, tp) plus
the joint dimensions ``dp``, ``dp_shard_cp`` and ``dp_cp``. With FSDP2, ``dp_replicate x dp_shard`` is
HSDP: parameters are sharded inside a group and replicated across groups.

The mesh is built on the device type of the active accel backend (``accel.backends.get_backend()``).
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

from .utils.dataclasses import DistributedType
from .utils.dataclasses import DeepSpeedSequenceParallelConfig, TorchContextParallelConfig, TorchTensorParallelConfig

__all__ = ["ParallelismConfig"]


class _RunView(Protocol):
    """What the validation reads of the Accelerator: its state, process layout and whether its strategy shards
    with FSDP2 (a Protocol, not an import, so this module stays below the Accelerator in the import graph)."""

    state: Any
    num_processes: int
    is_main_process: bool
    is_fsdp2: bool


_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")


def _env_int(name: str, default: int = 1) -> int:
    raw = os.environ.get(f"PARALLELISM_CONFIG_{name}")
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"PARALLELISM_CONFIG_{name} must be an integer, got {raw!r}") from None


@dataclass
class ParallelismConfig:
    """Sizes of the parallel dimensions (Accelerate's ParallelismConfig, inspired by torchtitan's ParallelDims).

    ``dp_replicate_size`` > 1 with ``dp_shard_size`` > 1 is HSDP; ``dp_shard_size`` alone is FSDP;
    ``tp_size`` / ``cp_size`` add tensor / context parallel dimensions that see the same batch.
    """

    dp_replicate_size: Optional[int] = None
    dp_shard_size: Optional[int] = None
    tp_size: Optional[int] = None
    cp_size: Optional[int] = None
    cp_backend: Optional[str] = None
    sp_size: Optional[int] = None
    sp_backend: Optional[str] = None
    tp_handler: Union[None, TorchTensorParallelConfig] = None
    cp_handler: Union[None, TorchContextParallelConfig] = None
    sp_handler: Union[None, DeepSpeedSequenceParallelConfig] = None

    #: the DeviceMesh once built (get_device_mesh); class default None, as in Accelerate
    device_mesh = None

    def __repr__(self) -> str:
        return (f"ParallelismConfig(\n \tdp_replicate_size={self.dp_replicate_size},\n\tdp_shard_size={self.dp_shard_size},\n"
                f"\ttp_size={self.tp_size},\n\tcp_size={self.cp_size},\n\tcp_backend={self.cp_backend},\n"
                f"\tsp_size={self.sp_size},\n\tsp_backend={self.sp_backend},\n\ttotal_size={self.total_size}\n"
                f"\ttp_handler={self.tp_handler},\n\tcp_handler={self.cp_handler})\n")

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain data (handlers as their fields; the mesh left out)."""
        return copy.deepcopy({k: (dict(v.__dict__) if hasattr(v, "__dict__") else v)
                              for k, v in self.__dict__.items() if k not in ("device_mesh", "_sizes")})

    # ------------------------------------------------------------------ dimension names
    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions across which data parallelism is applied."""
        return [n for n, on in (("dp_replicate", self.dp_replicate_enabled), ("dp_shard", self.dp_shard_enabled)) if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks receive the same batch."""
        return [n for n, on in (("tp", self.tp_enabled), ("cp", self.cp_enabled), ("sp", self.sp_enabled)) if on]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into the one FSDP shards the model across."""
        return [n for n, on in (("dp_shard", self.dp_shard_enabled), ("cp", self.cp_enabled)) if on]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions across which the loss is averaged."""
        return self.dp_dim_names + (["cp"] if self.cp_enabled else [])

    @property
    def fsdp_dim_names(self) -> list[str]:
        """Mesh dimensions FSDP runs over: replication (HSDP) then the joint shard dimension."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    # ------------------------------------------------------------------ sizes
    @property
    def total_size(self) -> int:
        """The product of all sizes: the number of processes this configuration needs."""
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size

    @property
    def non_data_parallel_size(self) -> int:
        """tp x cp x sp: ranks that share one batch."""
        return self.tp_size * self.cp_size * self.sp_size

    @property
    def data_parallel_size(self) -> int:
        """dp_replicate x dp_shard: how many different batches one step sees."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    @property
    def active_mesh_dims(self) -> list[str]:
        """Every enabled mesh dimension."""
        return self.dp_dim_names + self.non_dp_dim_names

    # ------------------------------------------------------------------ mesh
    def _get_mesh(self) -> tuple:
        """``(dim_names, shape)`` of the enabled dimensions in canonical order (``()`` when none is enabled)."""
        dims = sorted(self.active_mesh_dims, key=_ORDER.index)
        if not dims:
            return ()
        return tuple(dims), tuple(self._sizes[d] for d in dims)

    def build_device_mesh(self, device_type: str | None = None) -> Any:
        """A DeviceMesh over the enabled dimensions on ``device_type`` (default: the active backend's), with
        the joint dimensions ``dp``, ``dp_shard_cp`` and ``dp_cp`` flattened in; None when nothing is enabled
        or DeepSpeed runs sequence parallelism (it makes its own groups)."""
        if self.sp_backend == "deepspeed" and self.sp_size > 1:
            return None
        from torch.distributed import device_mesh as device_mesh_module

        mesh = self._get_mesh()
        if not mesh:
            return None
        if device_type is None:
            from .backends import get_backend

            device_type = get_backend().device_type
        names, shape = mesh
        built = device_mesh_module.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for joint, name in ((self.dp_dim_names, "dp"), (self.dp_shard_cp_dim_names, "dp_shard_cp"),
                            (self.dp_cp_dim_names, "dp_cp")):
            if joint:
                built[joint]._flatten(name)
        return built

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh, built on first use on ``device_type`` (default: the active backend's device type)."""
        if self.device_mesh is None:
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device_mesh is already created with device type {self.device_mesh.device_type}. However, you are trying "
                f"to get a device mesh with device_type {device_type}. Please check if you correctly initialized your device_mesh")
        return self.device_mesh

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        if self.dp_replicate_size is None:
            self.dp_replicate_size = _env_int("DP_REPLICATE_SIZE")
        if self.dp_shard_size is None:
            self.dp_shard_size = _env_int("DP_SHARD_SIZE")
        if self.tp_size is None:
            self.tp_size = _env_int("TP_SIZE")
        if self.cp_size is None:
            self.cp_size = _env_int("CP_SIZE")
        if self.cp_backend is None:
            self.cp_backend = os.environ.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.sp_size is None:
            self.sp_size = _env_int("SP_SIZE")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")

        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif self.cp_backend == "torch" and not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(f"ParallelismConfig's cp_backend={self.cp_backend} requires {TorchContextParallelConfig}, "
                                 f"but cp_handler was set to {type(self.cp_handler)}")
        if self.sp_size > 1 and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, but got {getattr(self, name)}")
        if self.cp_backend not in ("torch",):
            raise ValueError(f"cp_backend must be one of ['torch'], but got {self.cp_backend}")
        if self.sp_size < 1:
            raise ValueError(f"sp_size must be at least 1, but got {self.sp_size}")
        if self.sp_backend not in ("deepspeed",):
            raise ValueError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend}")
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError(
                "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or sp_size=1.")
        if (self.tp_size > 1 or self.cp_size > 1) and self.dp_replicate_size > 1 and self.dp_shard_size == 1:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism (dp_replicate_size > 1 "
                "and dp_shard_size == 1). Please set dp_shard_size > 1 and dp_replicate_size == 1 to compose FSDP + TP/CP for "
                "2D parallel, or set dp_replicate_size == 1 and dp_shard_size > 1 to compose HSDP + TP/CP for 3D parallel.")
        self._sizes = {"dp_replicate": self.dp_replicate_size, "dp_shard": self.dp_shard_size, "tp": self.tp_size,
                       "cp": self.cp_size, "sp": self.sp_size}

    def _set_size(self, parallelism: str, size: int) -> None:
        if parallelism not in self._sizes:
            raise ValueError(f"Parallelism must be one of {self._sizes.keys()}, got {parallelism!r}")
        self._sizes[parallelism] = size
        setattr(self, f"{parallelism}_size", size)

    def _validate_accelerator(self, accelerator: _RunView) -> None:
        """Check the configuration against the run: sizes multiply to the process count, FSDP has a shard dimension."""
        state = accelerator.state
        distributed_type = state.distributed_type
        is_fsdp2 = accelerator.is_fsdp2  # the strategy's answer
        multi = accelerator.num_processes > 1 and distributed_type not in (DistributedType.NO, DistributedType.FSDP,
                                                                          DistributedType.DEEPSPEED)
        if accelerator.num_processes == 1 and self.total_size == 1:
            return
        if self.total_size == 1:  # nothing asked: every rank is a data-parallel replica
            self._set_size("dp_replicate", accelerator.num_processes)
        if not (self.sp_backend == "deepspeed" and self.sp_size > 1) and self.total_size != accelerator.num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({self.total_size}) does not match num_processes ({accelerator.num_processes}). "
                "Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/sp_size.")
        if is_fsdp2 and not self.dp_shard_enabled and not self.cp_enabled:
            raise ValueError(
                "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both `dp_shard_size` "
                "and `cp_size` are 1); set dp_shard_size > 1 (HSDP: dp_replicate_size x dp_shard_size), or run without FSDP.")
        if self.total_size > 1 and not (is_fsdp2 or multi or distributed_type == DistributedType.DEEPSPEED):
            raise ValueError(
                "ParallelismConfig is only compatible DistributedType.FSDP (version 2) or DistributedType.Multi{Device} or "
                f"DistributedType.DEEPSPEED, but got {distributed_type}.")
        notes = {f"ParallelismConfig.{p}_handler is set, but {p}_size is set to 1. This handler will be ignored."
                 for p, size in self._sizes.items() if size == 1 and getattr(self, f"{p}_handler", None) is not None}
        if notes and accelerator.is_main_process:
            warnings.warn("ParallelismConfig has the following warnings:\n" + "\n".join(sorted(notes)), UserWarning)
