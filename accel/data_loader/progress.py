"""Where an iteration stands (epoch, last batch, remainder) and the loader's place in ``GradientState``."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader


def _set_epoch_everywhere(loader: DataLoader, epoch: int) -> None:
    """Pass ``epoch`` to every sampler in the wrapper chain that has ``set_epoch``, and to the dataset."""
    seen: set[int] = set()
    todo = [loader.batch_sampler if loader.batch_sampler is not None else loader.sampler]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
        todo.append(getattr(obj, "batch_sampler", None))
        todo.append(getattr(obj, "sampler", None))
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)


class DataLoaderStateMixin:
    """Tracks where an iteration stands and registers the loader with ``GradientState`` while it runs.

    ``end_of_dataloader`` is true while the last batch is in use; ``remainder`` is the number of real
    samples in the last global batch (``-1`` when unknown), so ``gather_for_metrics`` can cut the repeats.
    Classes using it set ``self.gradient_state = GradientState()``.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    _drop_last: bool = False

    def reset(self) -> None:
        """Forget the last iteration's flags: not at the end, remainder unknown."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Start of an iteration: reset the flags and become the active loader of ``GradientState``."""
        self.reset()
        if not self._drop_last:
            try:
                length = getattr(self.dataset, "total_dataset_length", None)
                if length is None:
                    length = self.total_dataset_length
                self.remainder = length % self.total_batch_size
            except Exception:  # unsized dataset or unknown batch size: remainder stays unknown
                pass
        self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        """End of an iteration (also after a ``break``): stop being the active loader."""
        self.gradient_state._remove_dataloader(self)

    #: The loader this one stands in for (``skip_first_batches`` sets it on the copy it returns, to the
    #: original or to what the original stands in for): an epoch finished here is counted there too.
    #: ``None``: the loader counts its epochs only for itself.
    epoch_owner: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Epoch for samplers / datasets that reshuffle per epoch (``set_epoch`` anywhere in the chain)."""
        self.iteration = epoch
        _set_epoch_everywhere(self, epoch)

    def _advance_epoch(self) -> None:
        """An epoch finished: count it here and in the loader this one stands in for, so the
        next epoch of the original reshuffles instead of replaying this epoch's order."""
        self.iteration += 1
        owner = self.epoch_owner
        if owner is not None:
            owner.iteration = max(owner.iteration, self.iteration)
