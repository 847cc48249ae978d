"""The base of accel's loaders: a real ``DataLoader`` subclass, optionally torchdata's ``StatefulDataLoader`` too."""

from __future__ import annotations

import inspect
from typing import Any, Iterator

from torch.utils.data import BatchSampler, DataLoader

from ..state import GradientState, PartialState
from .samplers import get_sampler


class _LoaderItself:
    """``loader.base_dataloader``: the loader itself (accel's loaders *are* the ``DataLoader``, or the
    ``StatefulDataLoader``, that Accelerate keeps in an attribute). Read on the class it raises
    AttributeError, as Accelerate's instance attribute does."""

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            raise AttributeError(f"'base_dataloader' is an attribute of {owner.__name__} instances, not of the class")
        return instance

    def __set__(self, instance: Any, value: Any) -> None:
        raise AttributeError("base_dataloader cannot be replaced: accel's loaders are the underlying loader")


def _stateful_dataloader_class() -> type:
    """torchdata's ``StatefulDataLoader``; ImportError naming the package when torchdata is missing."""
    from ..utils.imports import is_torchdata_stateful_dataloader_available

    if not is_torchdata_stateful_dataloader_available():
        raise ImportError(
            "StatefulDataLoader is not available. Please install torchdata version 0.8.0 or higher to use it "
            "(pip install 'torchdata>=0.8.0')."
        )
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader


class _StatefulLoader:
    """What the stateful variant of an accel loader adds: a checkpointable position.

    ``state_dict()`` describes the batches handed to the caller so far (the loaders read one batch
    ahead; the state is taken before that read, so a restored loader continues with the next batch
    the caller has not seen). ``load_state_dict`` restores it before the next iteration.
    """

    _plain_class: type

    def state_dict(self) -> dict[str, Any]:
        """torchdata's state of this loader at the last batch handed out (the live state before any)."""
        snapshot = self.__dict__.get("_position")
        return dict(snapshot) if snapshot is not None else super().state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` (from :meth:`state_dict`) at the next iteration."""
        self.__dict__["_position"] = None
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def __reduce_ex__(self, protocol: Any) -> Any:
        # the combined class is built at run time: pickle the plain accel class and rebuild it on load
        return (_rebuild_stateful, (self._plain_class,), self.__getstate__())


_STATEFUL_CLASSES: dict[type, type] = {}


def _stateful_variant(cls: type) -> type:
    """``cls`` combined with torchdata's ``StatefulDataLoader`` (one class per ``cls``, cached)."""
    variant = _STATEFUL_CLASSES.get(cls)
    if variant is None:
        base = _stateful_dataloader_class()
        variant = type(cls.__name__, (_StatefulLoader, cls, base), {"_plain_class": cls, "__module__": cls.__module__,
                                                                       "__qualname__": cls.__qualname__,
                                                                       "__doc__": cls.__doc__})
        _STATEFUL_CLASSES[cls] = variant
    return variant


def _rebuild_stateful(cls: type) -> Any:
    return object.__new__(_stateful_variant(cls))


class _PicksStatefulVariant:
    """Creates the torchdata-backed variant of an accel loader when ``use_stateful_dataloader=True``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # the stateful variant is chosen at creation (an instance's class cannot be swapped later:
        # torchdata's loader has a different memory layout)
        stateful = kwargs.get("use_stateful_dataloader", False)
        if "use_stateful_dataloader" not in kwargs and args:
            try:
                stateful = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments.get(
                    "use_stateful_dataloader", False)
            except TypeError:  # wrong arguments: let __init__ report them
                stateful = False
        if stateful and not issubclass(cls, _StatefulLoader):
            cls = _stateful_variant(cls)
        return super().__new__(cls)


class DataLoaderAdapter(_PicksStatefulVariant, DataLoader):
    """Base of the accel loaders: a real ``DataLoader`` subclass, so ``isinstance(dl, DataLoader)`` holds.

    With ``use_stateful_dataloader=True`` (needs torchdata >= 0.8) the loader is also a torchdata
    ``StatefulDataLoader`` (``isinstance`` holds for both and for the accel class) and has
    ``state_dict()``/``load_state_dict()``, which checkpoints save and restore. ``base_dataloader``
    is the loader itself.
    """

    base_dataloader = _LoaderItself()

    def __init__(self, dataset: Any, use_stateful_dataloader: bool = False, batch_sampler: Any = None, **kwargs: Any):
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        self._position: dict[str, Any] | None = None

    def _remember_position(self, finished: bool = False) -> None:
        """Stateful loaders: keep the state that resumes after the batches handed out so far."""
        if self.use_stateful_dataloader:
            position = super().state_dict()  # type: ignore[misc]
            if finished:
                position["_iterator_finished"] = True
            self._position = position

    def __getstate__(self) -> dict:
        # the shared process/gradient states are re-attached on load, never copied (a copy would detach
        # the loader from the GradientState that gather_for_metrics reads)
        state = self.__dict__.copy()
        for key in ("gradient_state", "state"):
            if key in state:
                state[key] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "gradient_state" in state:
            self.__dict__["gradient_state"] = GradientState()
        if "state" in state:
            self.__dict__["state"] = PartialState()

    def _plain_iter(self) -> Iterator[Any]:
        # the next class in the MRO: DataLoader, or torchdata's StatefulDataLoader for stateful loaders
        return super().__iter__()

    def _plain_len(self) -> int:
        return super().__len__()

    def get_sampler(self) -> Any:
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        """Replace the index sampler under the (possibly sharded) batch sampler."""
        holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
        holder.sampler = sampler
        inner = getattr(holder, "batch_sampler", None)
        if inner is not None:
            inner.sampler = sampler
