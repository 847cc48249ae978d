"""``GradientState``: the shared record of gradient synchronisation and the data loaders being iterated.

It is independent of the process state (no ranks, no device), so it lives apart from ``accel.state``,
which re-exports it under its Accelerate name.
"""

from __future__ import annotations

from typing import Any

from .utils.dataclasses import GradientAccumulationPlugin

__all__ = ["GradientState"]


class GradientState:
    """Whether gradients synchronise this step, and where the active data loader stands."""

    _shared_state: dict[str, Any] = {}  # a plain dict, as accel.state.SharedDict

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None):
        self.__dict__ = self._shared_state
        if not self.initialized:
            self.sync_gradients = True
            self._dataloader_references: list[Any] = [None]
            self.plugin_kwargs = (gradient_accumulation_plugin or GradientAccumulationPlugin()).to_dict()
            self._shared_state["_initialized"] = True
        elif gradient_accumulation_plugin is not None:
            self.plugin_kwargs = gradient_accumulation_plugin.to_dict()

    @property
    def initialized(self) -> bool:
        """Whether the shared gradient state was set up in this process."""
        return self._shared_state.get("_initialized", False)

    @property
    def num_steps(self) -> int:
        """Batches whose gradients add up before one optimizer step."""
        return self.plugin_kwargs.get("num_steps") or 1

    @property
    def adjust_scheduler(self) -> bool:
        """Whether the scheduler's step count advances while gradients accumulate."""
        return self.plugin_kwargs.get("adjust_scheduler", True)

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the end of a data loader forces a synchronising step."""
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients synchronise on every batch even while accumulating (saves memory)."""
        return self.plugin_kwargs.get("sync_each_batch", False)

    @property
    def active_dataloader(self) -> Any:
        """The prepared data loader being iterated now, or None."""
        return self._dataloader_references[-1]

    @property
    def dataloader_references(self) -> list[Any]:
        """The loaders being iterated, innermost last (None first)."""
        return self._dataloader_references

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared data loader is being iterated."""
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active loader has yielded its last batch."""
        loader = self.active_dataloader
        return bool(getattr(loader, "end_of_dataloader", False)) if loader is not None else False

    @property
    def remainder(self) -> int:
        """Samples the active loader added to even out its last batch (-1 when unknown)."""
        loader = self.active_dataloader
        return getattr(loader, "remainder", -1) if loader is not None else -1

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = bool(sync_gradients)

    def _add_dataloader(self, dataloader: Any) -> None:
        self._dataloader_references.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        if dataloader in self._dataloader_references[1:]:
            # remove the most recent reference (nested iteration of the same loader)
            idx = len(self._dataloader_references) - 1 - self._dataloader_references[::-1].index(dataloader)
            del self._dataloader_references[idx]

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()
