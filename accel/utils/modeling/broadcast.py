"""Checkpoint tensors read by rank 0 alone and received by every other rank through broadcasts.

The ranks walk the checkpoint together: per file, rank 0 sends the list of tensors (name, shape,
dtype), then each tensor in turn. Only rank 0 touches the filesystem, and no rank holds more than one
tensor of the checkpoint at a time.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, Iterator, Optional, Union

import torch


def require_process_group(device_map: Any) -> None:
    """Refuse ``broadcast_from_rank0`` where it cannot work, before any rank starts waiting for another."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ValueError(
            "broadcast_from_rank0=True needs an initialised torch.distributed process group (rank 0 reads the "
            "checkpoint and broadcasts it); start the processes with `accel launch` or create the Accelerator first"
        )
    if device_map is not None:
        raise ValueError(
            "broadcast_from_rank0=True loads a model without a device_map (every rank receives every tensor); "
            "with a device_map each rank reads its own share of the checkpoint: pass broadcast_from_rank0=False"
        )


def _transport_device() -> torch.device:
    """Where the broadcast buffers live: the host for gloo, the rank's accelerator for other backends."""
    if "gloo" in str(torch.distributed.get_backend()):
        return torch.device("cpu")
    from accel.backends import get_backend

    backend = get_backend()
    return backend.device(backend.current_device())


def _share(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _raise_everywhere(error: Optional[BaseException]) -> None:
    """Raise rank 0's ``error`` (shared by :func:`_share`) on every rank."""
    if error is not None:
        raise error


class RankZeroStream:
    """Iterate ``(file, name, tensor)`` over a checkpoint on every rank, rank 0 reading it.

    ``open_file(path)`` gives rank 0 an object with ``keys()``, ``describe(key) -> (shape, dtype)`` and
    ``get(key)``; ``list_files(checkpoint)`` the files of the checkpoint. Names rank 0 does not ``want``
    come with ``None`` (nothing is sent for them). Errors on rank 0 while listing or opening a file are
    raised on every rank; any other error of any rank is raised everywhere by :meth:`finish`.
    """

    def __init__(self, checkpoint: Union[str, os.PathLike], wanted: set[str], list_files: Callable[[Any], list[str]],
                 open_file: Callable[[str], Any]):
        self.checkpoint = checkpoint
        self.wanted = wanted
        self.list_files = list_files
        self.open_file = open_file
        self.rank = torch.distributed.get_rank()
        self.device = _transport_device()
        self.failure: Optional[BaseException] = None

    def _on_rank0(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` on rank 0 and share its result (or its error, raised on every rank)."""
        result, error = None, None
        if self.rank == 0:
            try:
                result = step()
            except Exception as exc:  # every rank must learn of it, or the others wait forever
                error = exc
                try:
                    pickle.dumps(exc)
                except Exception:  # an error that cannot travel is sent as its text
                    error = RuntimeError(f"{type(exc).__name__}: {exc}")
        result, error = _share((result, error))
        _raise_everywhere(error)
        return result

    def __iter__(self) -> Iterator[tuple[str, str, Optional[torch.Tensor]]]:
        files = self._on_rank0(lambda: self.list_files(self.checkpoint))
        for path in files:
            source = None

            def manifest() -> list[tuple[str, Optional[tuple[int, ...]], Optional[torch.dtype]]]:
                nonlocal source
                source = self.open_file(path)
                return [(key, *source.describe(key)) if key in self.wanted else (key, None, None)
                        for key in source.keys() if "SCB" not in key]

            try:
                for key, shape, dtype in self._on_rank0(manifest):
                    if shape is None:
                        yield path, key, None
                        continue
                    tensor = self._receive(source, key, shape, dtype)
                    if tensor is not None:
                        yield path, key, tensor
            finally:
                if source is not None:
                    source.close()

    def _receive(self, source: Any, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Broadcast one tensor from rank 0; ``None`` on rank 0 where it could not read it (kept as the failure)."""
        read = None
        if self.rank == 0:
            try:
                read = source.get(key).to(self.device).contiguous()
            except Exception as exc:  # the others still wait for this tensor: send a placeholder, fail at the end
                self.failure = self.failure or exc
        buffer = read if read is not None else torch.empty(shape, dtype=dtype, device=self.device)
        torch.distributed.broadcast(buffer, src=0)
        return None if self.rank == 0 and read is None else buffer

    def finish(self, failure: Optional[BaseException]) -> None:
        """After the walk: every rank learns whether any rank failed, and each raises (its own error, or one
        naming the ranks that failed)."""
        failure = failure or self.failure
        reports: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(reports, None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        failed = {rank: report for rank, report in enumerate(reports) if report is not None}
        if failed:
            raise RuntimeError("load_checkpoint_in_model(broadcast_from_rank0=True) failed on rank(s) "
                               + "; ".join(f"{rank}: {report}" for rank, report in failed.items()))
