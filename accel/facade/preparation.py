"""What ``Accelerator.prepare`` does with each object it is given, and the record of what it prepared.

:func:`kind_of` sorts an object into data loader, model, optimizer or scheduler (anything else passes
through); :class:`PreparedRegistry` keeps every prepared object in the order it was prepared, plus the
objects registered for checkpointing, and hands the strategy and checkpointing a frozen
:class:`~accel.strategies.context.PreparedObjects` snapshot; :func:`prepare_objects` is the body of
``prepare``: loaders first, then the strategy prepares the call's models, optimizers and schedulers
together. Everything the Accelerator owns comes in as an explicit value.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

if TYPE_CHECKING:
    from ..strategies.context import PreparedObjects

__all__ = ["KINDS", "PreparedRegistry", "check_checkpointable", "kind_of", "prepare_objects"]

#: the kinds of object ``prepare`` handles, in the order the strategy receives them
KINDS = ("model", "optimizer", "scheduler", "dataloader")


def kind_of(obj: Any) -> str | None:
    """What ``prepare`` does with ``obj``: "dataloader", "model", "optimizer", "scheduler", or None (passed through)."""
    from ..utils.deepspeed import DummyOptim, DummyScheduler

    if isinstance(obj, torch.utils.data.DataLoader):
        return "dataloader"
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, (torch.optim.Optimizer, DummyOptim)):
        return "optimizer"
    if isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, DummyScheduler)):
        return "scheduler"
    return None


def check_checkpointable(objects: Sequence[Any]) -> None:
    """Refuse, listing each one, objects without callable ``state_dict`` and ``load_state_dict`` (Accelerate's message)."""
    invalid = [f"- Item at index {i}, `{type(obj).__name__}`" for i, obj in enumerate(objects)
               if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)))]
    if invalid:
        raise ValueError(
            "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. The following "
            "inputs are invalid:\n" + "\n".join(invalid)
        )


class PreparedRegistry:
    """The objects one Accelerator prepared, each kind in preparation order, and those registered for checkpointing.

    The lists are public and kept for the Accelerator's lifetime (it exposes them under Accelerate's
    ``_models``/``_optimizers``/... names); :meth:`clear` empties the prepared ones, not the registered.
    """

    __slots__ = ("models", "optimizers", "schedulers", "dataloaders", "custom_objects")

    def __init__(self) -> None:
        self.models: list[Any] = []
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.dataloaders: list[Any] = []
        self.custom_objects: list[Any] = []

    def store(self, kind: str) -> list[Any]:
        """The list that keeps objects of ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind of prepared object {kind!r}; expected one of {', '.join(KINDS)}")
        return getattr(self, f"{kind}s")

    def add(self, kind: str, obj: Any) -> Any:
        """Record ``obj`` as prepared, mark it with Accelerate's ``_is_accelerate_prepared`` and return it."""
        self.store(kind).append(obj)
        obj._is_accelerate_prepared = True
        return obj

    def register(self, obj: Any) -> None:
        """Record an object that was prepared already (by this or another Accelerator) unless it is recorded."""
        kind = kind_of(obj)
        if kind is not None and not self.holds(obj, kind):
            self.store(kind).append(obj)

    def holds(self, obj: Any, kind: str | None = None) -> bool:
        """Whether ``obj`` itself (not an equal object) is recorded, among ``kind`` or among every kind."""
        stores = (self.store(kind),) if kind is not None else (self.models, self.optimizers, self.schedulers,
                                                                 self.dataloaders)
        return any(obj is other for store in stores for other in store)

    def register_for_checkpointing(self, objects: Sequence[Any]) -> None:
        """Keep ``objects`` to save and restore with the state (each needs ``state_dict``/``load_state_dict``)."""
        check_checkpointable(objects)
        self.custom_objects.extend(objects)

    def snapshot(self, scaler: Any) -> PreparedObjects:
        """A frozen :class:`~accel.strategies.context.PreparedObjects` of what is recorded now, with ``scaler``."""
        from ..strategies.context import PreparedObjects

        return PreparedObjects(tuple(self.models), tuple(self.optimizers), tuple(self.schedulers),
                               tuple(self.dataloaders), tuple(self.custom_objects), scaler)

    def clear(self) -> None:
        """Forget the prepared models, optimizers, schedulers and loaders (``free_memory``)."""
        for kind in KINDS:
            self.store(kind).clear()


def prepare_objects(args: Sequence[Any], device_placement: Sequence[bool | None] | None, *, default_placement: bool,
                    registry: PreparedRegistry, strategy: Any, scaler: Any,
                    prepare_loader: Callable[..., Any],
                    place_model: Callable[[Any], bool], compile_model: Callable[[Any], Any]) -> list[Any]:
    """``Accelerator.prepare``'s work: each of ``args`` prepared (or passed through), in the order given.

    Data loaders go through ``prepare_loader(loader, device_placement=...)`` first; the call's models, optimizers
    and schedulers then go to ``strategy.prepare`` together (DeepSpeed and FSDP set them up jointly),
    models are compiled by ``compile_model`` and the call's loaders adapted by the strategy. An object
    prepared before is returned as it is and recorded. ``place_model(model)`` says whether a model that
    placement asks to move may move (quantized models stay where they are).
    """
    if device_placement is None:
        device_placement = [None] * len(args)
    elif len(device_placement) != len(args):
        raise ValueError(f"device_placement has {len(device_placement)} entries for {len(args)} objects")
    result = list(args)
    indices: dict[str, list[int]] = {kind: [] for kind in KINDS}
    loaders = []
    for i, obj in enumerate(args):
        if getattr(obj, "_is_accelerate_prepared", False):
            registry.register(obj)
            continue
        kind = kind_of(obj)
        if kind == "dataloader":
            loaders.append(obj)
            result[i] = prepare_loader(obj, device_placement=device_placement[i])
        if kind is not None:
            indices[kind].append(i)
    placement = [default_placement if flag is None else flag for flag in device_placement]
    for i in indices["model"]:
        placement[i] = placement[i] and place_model(args[i])
    models, optimizers, schedulers = strategy.prepare(
        [args[i] for i in indices["model"]], [args[i] for i in indices["optimizer"]],
        [args[i] for i in indices["scheduler"]],
        model_placement=[placement[i] for i in indices["model"]],
        optimizer_placement=[placement[i] for i in indices["optimizer"]],
        dataloaders=loaders, prepared=registry.snapshot(scaler),
    )
    models = list(models)
    for i, model in enumerate(models):  # a loop, not a comprehension: compile_model's warning counts frames
        models[i] = compile_model(model)
    for i in indices["dataloader"] if models else ():
        result[i] = strategy.adapt_dataloader(result[i])
    for kind, prepared in (("model", models), ("optimizer", optimizers), ("scheduler", schedulers)):
        for i, obj in zip(indices[kind], prepared):
            result[i] = obj
            registry.store(kind).append(obj)
    for obj in result:
        if obj is not None and registry.holds(obj):
            with contextlib.suppress(AttributeError, TypeError):
                obj._is_accelerate_prepared = True
    return result
