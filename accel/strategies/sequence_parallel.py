"""Sequence parallelism (DeepSpeed Ulysses/ALST) and context parallelism (torch), at Accelerate's semantics.

**DeepSpeed Ulysses** (``ParallelismConfig(sp_backend="deepspeed", sp_size=N, sp_handler=
DeepSpeedSequenceParallelConfig(...))``): DeepSpeed's ``UlyssesSPAttentionHF`` replaces a Hugging
Face Transformers model's attention function (``sdpa``, flash or flex) with one that all-to-alls the
heads across the ``N`` ranks of a sequence-parallel group, so each rank holds ``1/N`` of every
sequence; ``UlyssesSPDataLoaderAdapter`` hands each rank its sequence shard of every rank's batch
in turn. The pieces the Accelerator and the DeepSpeed strategy call are here:
:func:`register_deepspeed_ulysses` (returns the ``mpu`` for ``deepspeed.initialize``),
:func:`ulysses_dataloader`, :func:`sequence_parallel_train_batch_size` and
:func:`sequence_parallel_loss` (the token-weighted loss over the group). It runs wherever
DeepSpeed's collectives do: gloo has ``all_to_all``, so the host runs it on several processes.

**Torch context parallelism** (``cp_size``): :func:`context_parallel` shards the given buffers along
their sequence dimension over the ``cp`` mesh dimension and runs ring attention, as Accelerate's
``maybe_context_parallel``. torch rewrites only the CUDA SDPA kernels (flash, memory-efficient,
cuDNN); :func:`context_parallel_support` asks the device which kernel its SDPA runs and refuses
before training when torch cannot shard it (on the host, SDPA runs
``aten._scaled_dot_product_flash_attention_for_cpu``, which has no sharding strategy).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator, Optional

import torch

from ..facts.versions import DEEPSPEED_SP
from ..utils.imports import is_deepspeed_available, is_transformers_available

__all__ = [
    "DEEPSPEED_ULYSSES_MIN_VERSION", "context_parallel", "context_parallel_support", "deepspeed_ulysses_dl_adapter",
    "register_deepspeed_ulysses", "release_deepspeed_ulysses", "sdpa_kernel_op", "sequence_parallel_loss", "sequence_parallel_train_batch_size",
    "ulysses_dataloader",
]

#: the first DeepSpeed release with ALST/Ulysses for Hugging Face models (the floor accel.facts.versions.DEEPSPEED_SP)
DEEPSPEED_ULYSSES_MIN_VERSION = DEEPSPEED_SP

#: transformers' attention functions replaced by Ulysses in this process, to put back on release
_REPLACED_ATTENTION: dict[str, Any] = {}


# ------------------------------------------------------------------------------------ DeepSpeed Ulysses
def _deepspeed_sp_enabled(parallelism_config: Any) -> bool:
    return parallelism_config is not None and getattr(parallelism_config, "sp_size", 1) > 1


def _check_deepspeed_ulysses(parallelism_config: Any) -> None:
    if parallelism_config.sp_backend != "deepspeed":
        raise ValueError(f"sequence parallelism with sp_size={parallelism_config.sp_size} needs sp_backend='deepspeed', "
                         f"got sp_backend={parallelism_config.sp_backend!r}")
    if not is_deepspeed_available():
        raise ImportError("DeepSpeed Ulysses sequence parallelism needs deepspeed: pip install deepspeed")
    from packaging.version import Version

    import deepspeed

    if Version(Version(deepspeed.__version__).base_version) < Version(DEEPSPEED_ULYSSES_MIN_VERSION):
        raise ImportError(f"DeepSpeed ALST/Ulysses needs deepspeed>={DEEPSPEED_ULYSSES_MIN_VERSION}, "
                          f"{deepspeed.__version__} is installed: pip install -U deepspeed")
    if not is_transformers_available():
        raise ImportError("DeepSpeed's Ulysses attention (UlyssesSPAttentionHF) patches Hugging Face Transformers' "
                          "attention functions: pip install transformers")


def _ensure_deepspeed_comm() -> None:
    """DeepSpeed's communication layer over the existing process group (its groups are made through it), with
    the accelerator of a device DeepSpeed does not know installed first (its groups and engine use it)."""
    from ..backends import get_backend
    from ..backends.deepspeed_agreement import install_deepspeed_accelerator

    install_deepspeed_accelerator(get_backend())
    import deepspeed
    import deepspeed.comm as ds_comm
    import torch.distributed as dist

    if not ds_comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend() if dist.is_initialized() else None)


def register_deepspeed_ulysses(model: torch.nn.Module, parallelism_config: Any, micro_batch_size: Optional[int]) -> Any:
    """Switch ``model``'s attention to DeepSpeed's Ulysses and return the ``mpu`` for ``deepspeed.initialize``.

    None when ``sp_size`` is 1. The model must be a Hugging Face Transformers model (DeepSpeed reads
    its ``config``: heads, head size, layers) whose ``attn_implementation`` is the handler's
    ``sp_attn_implementation`` (default ``sdpa``); recurrent layers are refused (a sequence shard
    cannot carry their state). Creates the sequence-parallel process groups: every rank calls it.
    """
    if not _deepspeed_sp_enabled(parallelism_config):
        return None
    _check_deepspeed_ulysses(parallelism_config)
    if not hasattr(model, "config"):
        raise ValueError("DeepSpeed's UlyssesSPAttentionHF works with Hugging Face Transformers models and reads the "
                         f"model's `config`; {type(model).__name__} has none")
    from ..big_modeling import _refuse_recurrent_layers_under_sequence_parallelism

    _refuse_recurrent_layers_under_sequence_parallelism(model)
    _ensure_deepspeed_comm()
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    handler = parallelism_config.sp_handler
    implementation = getattr(handler, "sp_attn_implementation", None) or "sdpa"
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation in ALL_ATTENTION_FUNCTIONS:
        _REPLACED_ATTENTION.setdefault(implementation, ALL_ATTENTION_FUNCTIONS[implementation])
    extra = {}
    if "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters:
        extra["disable_in_eval"] = True
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, sequence_parallel_size=parallelism_config.sp_size,
        seq_length=getattr(handler, "sp_seq_length", None),
        seq_length_is_variable=getattr(handler, "sp_seq_length_is_variable", True),
        core_attn_implementation=implementation, micro_batch_size=micro_batch_size, **extra)


def release_deepspeed_ulysses() -> None:
    """Undo :func:`register_deepspeed_ulysses` in this process: transformers' attention functions come back,
    DeepSpeed's sequence-parallel groups are released, and the ``mpu`` an engine left in
    ``deepspeed.utils.groups`` is dropped (a later engine without sequence parallelism would ask it for the
    released groups); another run may register again."""
    if _REPLACED_ATTENTION:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        for name, function in _REPLACED_ATTENTION.items():
            ALL_ATTENTION_FUNCTIONS[name] = function
        _REPLACED_ATTENTION.clear()
    try:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp
    except ImportError:
        return
    release = getattr(parallel_state_sp, "_release_sequence_parallel_groups", None)
    if release is not None:
        release()
    from deepspeed.utils import groups

    if getattr(groups, "mpu", None) is parallel_state_sp:
        groups.mpu = None


def ulysses_dataloader(dataloader: Any, mpu: Any, device: Any) -> Any:
    """``dataloader`` wrapped so each rank gets its sequence shard of each batch of its group (DeepSpeed's adapter).

    Batches must be dicts with ``input_ids``, ``position_ids`` and ``labels`` of shape
    ``[batch, seq, ...]``, the sequence divisible by ``sp_size``; ``labels`` come back shifted as
    ``shift_labels`` (the loss is computed outside the model, see :func:`sequence_parallel_loss`).
    """
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    return UlyssesSPDataLoaderAdapter(dataloader, sp_rank=mpu.get_sequence_parallel_rank(),
                                      sp_group=mpu.get_sequence_parallel_group(),
                                      sp_world_size=mpu.get_sequence_parallel_world_size(), device=device)


def deepspeed_ulysses_dl_adapter(dataloader: Any, parallelism_config: Any, device: Any) -> Any:
    """Accelerate's ``Accelerator.deepspeed_ulysses_dl_adapter``: wrap a loader prepared apart from the model
    (after the model's ``prepare`` made the groups); unchanged when ``sp_size`` is 1."""
    if not _deepspeed_sp_enabled(parallelism_config):
        return dataloader
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu

    return ulysses_dataloader(dataloader, mpu, device)


def sequence_parallel_train_batch_size(micro_batch_size: int, gradient_accumulation_steps: int, num_processes: int,
                                       sp_size: int) -> int:
    """DeepSpeed's ``train_batch_size`` under sequence parallelism: the ``sp_size`` ranks of a group share samples."""
    if sp_size < 1 or num_processes % sp_size:
        raise ValueError(f"sp_size ({sp_size}) must divide the number of processes ({num_processes})")
    return micro_batch_size * gradient_accumulation_steps * num_processes // sp_size


def sequence_parallel_loss(loss: torch.Tensor, shift_labels: torch.Tensor, group: Any = None,
                           ignore_index: int = -100) -> torch.Tensor:
    """The mean loss of the whole sequences from each rank's mean loss over its shard.

    Each rank's mean is weighted by its count of labelled tokens (``shift_labels != ignore_index``);
    shards without labels count for nothing. ``group`` is the sequence-parallel group (the mpu's
    ``get_sequence_parallel_group()``). Every rank gets the same value, but each differentiates only
    its own shard's term (the others' arrive detached), so the ranks' gradients *add up* to the
    whole sequence's gradient: what DeepSpeed's engine does with them (it sums over the
    sequence-parallel ranks). Differentiating the gathered losses instead would count every term
    once per rank, ``sp_size`` times the gradient.
    """
    import torch.distributed as dist

    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    tokens = (shift_labels != ignore_index).sum().to(loss.dtype).reshape(1)
    local = loss.detach().reshape(1).to(loss.dtype)
    losses = [torch.zeros_like(local) for _ in range(size)]
    counts = [torch.zeros_like(tokens) for _ in range(size)]
    dist.all_gather(losses, local, group=group)
    dist.all_gather(counts, tokens, group=group)
    others = sum(part * count for index, (part, count) in enumerate(zip(losses, counts)) if index != rank)
    total_tokens = torch.clamp(sum(counts), min=1).reshape(())
    mine = loss.reshape(()) * tokens.reshape(()) if tokens.item() > 0 else loss.reshape(()) * 0.0
    return (mine + torch.as_tensor(others, dtype=loss.dtype, device=loss.device).reshape(())) / total_tokens


# ------------------------------------------------------------------------------------ torch context parallelism
def sdpa_kernel_op(device: Any, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """The aten kernel ``scaled_dot_product_attention`` runs on ``device`` for a small causal call (None if none).

    Found by running it under a dispatch mode: the kernel torch's context parallelism must be able
    to shard.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket.__name__)
            if "scaled_dot_product" in name:
                seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q = torch.zeros(1, 2, 8, 8, device=device, dtype=dtype)
    with _Record():
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    return seen[0] if seen else None


def context_parallel_support(device: Any, dtype: torch.dtype = torch.float32) -> tuple[bool, str]:
    """Whether torch's context parallelism can shard attention on ``device``, and why not."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError as exc:
        return False, f"this torch has no context parallelism (torch.distributed.tensor.experimental): {exc}"
    handled = {str(op) for op in getattr(_attention, "custom_ops", {})}
    op = sdpa_kernel_op(device, dtype)
    if op is None:
        return False, f"scaled_dot_product_attention on {device} runs no fused SDPA kernel torch could shard"
    if op not in handled:
        return False, (f"torch's context parallelism shards only {sorted(h for h in handled if 'backward' not in h)}; "
                       f"scaled_dot_product_attention on {torch.device(device).type} runs {op}, which it does not handle")
    return True, f"scaled_dot_product_attention runs {op}"


@contextlib.contextmanager
def context_parallel(mesh: Any, buffers: Optional[list[torch.Tensor]] = None, buffer_seq_dims: Optional[list[int]] = None,
                     no_restore_buffers: Optional[set] = None, comm_strategy: str = "allgather") -> Iterator[None]:
    """Run the block with ``buffers`` sharded along ``buffer_seq_dims`` over ``mesh`` (the ``cp`` dimension) and
    SDPA replaced by ring attention (Accelerate's ``maybe_context_parallel`` with ``cp_size`` > 1).

    ``comm_strategy`` is the handler's ``cp_comm_strategy`` (``"allgather"`` or ``"alltoall"``).
    Refused up front, naming the kernel, where torch cannot shard the device's SDPA kernel.
    """
    if comm_strategy not in ("allgather", "alltoall"):
        raise ValueError(f"cp_comm_strategy must be 'allgather' or 'alltoall', got {comm_strategy!r}")
    supported, why = context_parallel_support(torch.device(mesh.device_type))
    if not supported:
        from ..backends import UnsupportedFeatureError

        raise UnsupportedFeatureError(mesh.device_type, "context parallelism (cp_size > 1)", why)
    from torch.distributed.tensor.experimental import context_parallel as torch_context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(comm_strategy)
    with torch_context_parallel(mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                no_restore_buffers=no_restore_buffers):
        yield
