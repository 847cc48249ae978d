"""The dispatching loader: the main process reads every batch and each process receives its slice by broadcast."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from torch.utils.data import BatchSampler

from ..state import GradientState, PartialState
from .adapter import DataLoaderAdapter
from .progress import DataLoaderStateMixin
from .samplers import SkipBatchSampler, _unskipped


def _ops():
    """accel's collectives, imported on first use (plain imports of the data loader should not pay for them)."""
    from ..utils import operations

    return operations


class DataLoaderDispatcher(DataLoaderAdapter, DataLoaderStateMixin):
    """The main process reads every batch; each process receives its slice by broadcast.

    Without ``split_batches`` the main process reads ``num_processes`` batches per step and concatenates
    them; with it, one batch that is cut in ``num_processes`` slices. A last batch that does not divide
    evenly is completed with the first samples of the first batch (unless ``drop_last``).
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ):
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.split_batches = split_batches
        self.gradient_state = GradientState()
        self.state = PartialState()
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.skip_batches = skip_batches
        self.torch_device_mesh = torch_device_mesh
        self.slice_fn = slice_fn
        self.iteration = iteration
        # tensor parallelism alone: every rank gets the same whole batch
        self._replicate = False
        names = tuple(getattr(torch_device_mesh, "mesh_dim_names", None) or ())
        if "tp" in names:
            if "dp" in names or "fsdp" in names:
                raise ValueError("DataLoaderDispatcher does not support tensor parallelism combined with dp/fsdp yet")
            self._replicate = True

    @property
    def batches_per_step(self) -> int:
        """How many batches of the wrapped loader one step reads: one with ``split_batches`` or when
        every rank gets the whole batch, otherwise one per process."""
        return 1 if self.split_batches or self._replicate else self.state.num_processes

    def wrapper_kwargs(self) -> dict[str, Any]:
        """This class's own constructor arguments (beyond ``DataLoader``'s) that rebuild a loader with
        these settings; ``skip_first_batches`` builds its copy from them."""
        return {
            "split_batches": self.split_batches,
            "_drop_last": self._drop_last,
            "_non_blocking": self._non_blocking,
            "slice_fn": self.slice_fn,
            "torch_device_mesh": self.torch_device_mesh,
            "iteration": self.iteration,
            "use_stateful_dataloader": self.use_stateful_dataloader,
        }

    # ---- main process only
    def _read_step(self, batches: Iterator[Any]) -> tuple[Any, bool]:
        """Next global batch (or ``None``) and whether the underlying loader is now exhausted."""
        if self.split_batches or self._replicate:
            try:
                return next(batches), False
            except StopIteration:
                return None, True
        parts = []
        exhausted = False
        for _ in range(self.state.num_processes):
            try:
                parts.append(next(batches))
            except StopIteration:
                exhausted = True
                break
        if not parts or (exhausted and self._drop_last):
            return None, True
        try:
            return _ops().concatenate(parts, dim=0), exhausted
        except RuntimeError as exc:
            raise RuntimeError(
                "DataLoaderDispatcher could not concatenate batches of different shapes; batches dispatched "
                "without split_batches must stack. Pass dispatch_batches=False so each process reads its own "
                "batches, or split_batches=True so the main process reads one batch and slices it."
            ) from exc

    def _resumed_sampler(self) -> "SkipBatchSampler | None":
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        if isinstance(holder, SkipBatchSampler) and holder.skip_batches > 0:
            return holder
        return None

    def _rows_at(self, indices: list) -> Any:
        """Load the samples at ``indices`` the way this loader's fetcher would (main process)."""
        if self._auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            items = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
            return self.collate_fn(items)
        return self.collate_fn(self.dataset[indices])

    def __iter__(self) -> Iterator[Any]:
        ops = _ops()
        state = self.state
        num, rank = state.num_processes, state.process_index
        is_main = rank == 0
        slice_fn = self.slice_fn or ops.slice_tensors
        # a short last step is completed with the first rows of the epoch's first step (unless drop_last)
        complete_last = not self._drop_last and not self._replicate
        resumed = self._resumed_sampler() if is_main and complete_last else None
        if resumed is not None:
            resumed.keep_head = self.batches_per_step  # remember the skipped first step's indices
        self.begin()
        try:
            self.set_epoch(self.iteration)
            # every rank builds the iterator (RNG draws and DataPipe seed sharing stay in step); only
            # the main process advances it
            batches = self._plain_iter()
            upcoming, exhausted = self._read_step(batches) if is_main else (None, True)
            first_rows = None
            index = 0
            while True:
                info: list[Any] = [None, True, 0]
                if is_main and upcoming is not None:
                    # main: read one step ahead so every rank learns together that this step is the last
                    batch, upcoming = upcoming, None
                    if not exhausted:
                        self._remember_position()
                        upcoming, exhausted = self._read_step(batches)
                    if upcoming is None:
                        self._remember_position(finished=True)
                    last = upcoming is None
                    observed = ops.find_batch_size(batch)
                    if complete_last:
                        if first_rows is None and resumed is None:
                            first_rows = slice_fn(batch, slice(0, num), process_index=0, num_processes=num)
                        if last and observed % num:
                            if first_rows is None:  # resumed: the first step was skipped, load its head
                                head = [i for b in resumed.head_batches for i in b][:num]
                                first_rows = self._rows_at(head) if head else batch
                            batch = ops.concatenate([batch, first_rows], dim=0)
                    info = [ops.get_data_structure(batch), last, observed]
                ops.broadcast_object_list(info)
                structure, last, observed = info
                if structure is None:
                    break
                batch = ops.initialize_tensors(structure) if not is_main else batch
                batch = ops.send_to_device(batch, state.device, non_blocking=self._non_blocking)
                batch = ops.broadcast(batch, from_process=0)
                if self._replicate:
                    mine = batch
                else:
                    per_process = observed // num + (1 if last and complete_last and observed % num else 0)
                    mine = slice_fn(
                        batch, slice(rank * per_process, (rank + 1) * per_process), process_index=rank, num_processes=num
                    )
                if last:
                    self.end_of_dataloader = True
                    self.remainder = observed
                if index >= self.skip_batches:
                    yield mine
                index += 1
                if last:
                    break
            self._advance_epoch()
        finally:
            self.end()

    def __len__(self) -> int:
        whole, per_step = self._plain_len(), self.batches_per_step
        return whole // per_step if self._drop_last else math.ceil(whole / per_step)

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes."""
        size = self.batch_size
        if size is None:
            holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
            size = getattr(_unskipped(holder), "batch_size", None)
        if size is None:
            raise AttributeError("DataLoaderDispatcher: the wrapped loader has no batch size")
        return size * self.batches_per_step

    @property
    def total_dataset_length(self) -> int:
        """Length of the wrapped dataset (all processes together), for ``remainder``."""
        return len(self.dataset)
