"""The Accelerator's thin delegating methods: collectives, model unwrapping and memory, trackers, saving and checkpoints.

Kept apart so ``accel.accelerator`` holds construction, preparation and the training step; each method here
forwards to the module that does the work (``utils.operations``, ``tracking``, ``checkpointing``...).
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from ..checkpointing.context import CheckpointContext
    from ..strategies.context import PreparedObjects

__all__ = ["AcceleratorIOMixin"]


class AcceleratorIOMixin:
    """Methods of :class:`accel.accelerator.Accelerator` that delegate to the collective, model, tracking and
    checkpointing modules; they read the Accelerator's state, strategy and prepared objects."""

    # ------------------------------------------------------------------ collectives
    def gather(self, tensor: Any) -> Any:
        """Concatenate ``tensor`` (or a nest of tensors) from every process along dim 0."""
        from ..utils.operations import gather

        return gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather across processes and drop the samples duplicated to even out the last batch."""
        from .uneven_inputs import gather_for_metrics

        return gather_for_metrics(input_data, self.gradient_state, use_gather_object=use_gather_object)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum (or average with ``reduction='mean'``) ``tensor`` over all processes, times ``scale``."""
        from ..utils.operations import reduce

        return reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pad ``tensor`` on ``dim`` to the largest size over all processes, so it can be gathered."""
        from ..utils.operations import pad_across_processes

        return pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` sees on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (a collective; resets the flag)."""
        from ..utils.operations import reduce

        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        flag = reduce(self.flag_tensor, reduction="sum")
        if int(flag.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> contextlib.AbstractContextManager:
        """Let DDP processes with fewer batches join early instead of hanging (``torch.distributed.algorithms.Join``).

        ``even_batches`` overrides the prepared map-style loaders' setting for the block (iterable
        loaders cannot change it: a warning says so). The distributed type is read from the state
        when called: under any type but a multi-process ``MULTI_*`` one it warns (except for a single
        process, ``NO``) and runs the block as it is.
        """
        from .uneven_inputs import join_uneven_inputs

        return join_uneven_inputs(joinables, self.state.distributed_type, self.use_distributed, self._dataloaders,
                                  even_batches=even_batches)

    # ------------------------------------------------------------------ models and memory
    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> torch.nn.Module:
        """The user's model inside the strategy's wrappers (DDP, DataParallel, DeepSpeed, FSDP).

        A ``torch.compile``'d model stays compiled around the unwrapped module unless
        ``keep_torch_compile=False``; ``keep_fp32_wrapper=False`` restores the forward that mixed
        precision replaced.
        """
        from .model_wrappers import unwrap_model

        return unwrap_model(model, self.strategy.unwrap_model, keep_fp32_wrapper=keep_fp32_wrapper,
                            keep_torch_compile=keep_torch_compile)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict; under ZeRO-3/FSDP a collective that every process must call."""
        return self.strategy.get_state_dict(model, unwrap=unwrap, prepared=self.prepared_objects())

    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop references to prepared objects, collect garbage and empty the device cache."""
        self.strategy.release()
        self._prepared.clear()
        self.step = 0
        released = [None] * len(objects)
        del objects
        gc.collect()
        self.backend.empty_cache()
        return released

    def clear(self, *objects: Any) -> list[Any]:
        """Alias of ``free_memory`` (Accelerate's older name)."""
        return self.free_memory(*objects)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that skips the first ``num_batches`` batches (resume mid-epoch)."""
        from ..data_loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    # ------------------------------------------------------------------ trackers
    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start the trackers named in ``log_with`` on the main process, with the run's ``config``."""
        from ..tracking import init_trackers

        init_trackers(self, project_name, config=config, init_kwargs=init_kwargs or {})

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker named ``name`` (its underlying run object with ``unwrap=True``)."""
        from ..tracking import get_tracker

        return get_tracker(self, name, unwrap=unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log ``values`` to every tracker at ``step`` (main process only)."""
        if not self.is_main_process:
            return
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker, then wait for all processes."""
        for tracker in self.trackers:
            tracker.finish()
        self.wait_for_everyone()

    # ------------------------------------------------------------------ saving and checkpoints
    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """Save ``obj`` to ``f`` once per node (main process), through a temporary file (safetensors with ``safe_serialization``)."""
        from ..checkpointing import save

        save(self._checkpoint_context(), obj, f, safe_serialization=safe_serialization)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write the unwrapped model's weights (sharded with an index above ``max_shard_size``); collective under ZeRO-3/FSDP."""
        from ..checkpointing import save_model

        save_model(self._checkpoint_context(), model, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with ``state_dict``/``load_state_dict``) with ``save_state``."""
        self._prepared.register_for_checkpointing(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]):
        """Call ``hook(models, weights, output_dir)`` before ``save_state`` writes models; returns a removable handle."""
        from ..checkpointing import register_hook

        return register_hook(self._save_model_state_pre_hook, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]):
        """Call ``hook(models, input_dir)`` before ``load_state`` loads models; returns a removable handle."""
        from ..checkpointing import register_hook

        return register_hook(self._load_model_state_pre_hook, hook)

    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True, **save_model_func_kwargs: Any) -> str:
        """Save models, optimizers, schedulers, loaders, scaler, RNG and registered objects atomically; collective."""
        from ..checkpointing import save_state

        saved = save_state(self._checkpoint_context(), self.prepared_objects(), output_dir, safe_serialization=safe_serialization,
                           pre_hooks=list(self._save_model_state_pre_hook.values()), **save_model_func_kwargs)
        self.project_configuration.iteration = saved.iteration
        return saved.path

    def load_state(self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None, **load_model_func_kwargs: Any) -> None:
        """Restore what ``save_state`` wrote (the newest checkpoint with automatic naming); collective.

        Every file is checked against the manifest's sha256 first (a damaged file is named);
        ``verify_checksums=False`` skips that for very large checkpoints, ``ACCEL_CHECKPOINT_CHECKSUMS=0``
        neither writes nor checks them.
        """
        from ..checkpointing import load_state

        loaded = load_state(self._checkpoint_context(), self.prepared_objects(), input_dir, load_kwargs=load_kwargs,
                            pre_hooks=list(self._load_model_state_pre_hook.values()), **load_model_func_kwargs)
        if loaded.step is not None:
            self.step = loaded.step
        if loaded.iteration is not None:
            self.project_configuration.iteration = loaded.iteration

    def _checkpoint_context(self) -> CheckpointContext:
        """What checkpointing reads of this Accelerator, as values of the moment (it never holds the Accelerator)."""
        from ..checkpointing.context import CheckpointContext

        return CheckpointContext(
            project_configuration=self.project_configuration, strategy=self.strategy, backend=self.backend,
            device=self.device, process_index=self.process_index, num_processes=self.num_processes,
            is_main_process=self.is_main_process, is_local_main_process=self.is_local_main_process,
            use_distributed=self.use_distributed, step=int(self.step), wait_for_everyone=self.wait_for_everyone,
            get_state_dict=self.get_state_dict, unwrap_model=self.unwrap_model,
        )

    def prepared_objects(self) -> PreparedObjects:
        """A frozen snapshot of what this Accelerator prepared (and registered for checkpointing), with its scaler.

        The strategy and checkpointing get this instead of reading the Accelerator's lists.
        """
        return self._prepared.snapshot(self.scaler)
