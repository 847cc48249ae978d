"""Which trackers exist, which ``log_with`` selects, and building them for an Accelerator."""

from __future__ import annotations

import importlib.util
import os
import warnings
from enum import Enum
from typing import Any

from ..utils.dataclasses import LoggerType
from .base import GeneralTracker
from .local import CSVTracker, JSONTracker, TensorBoardTracker, _summary_writer_class, _tensorboard_available
from .services import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    MLflowTracker,
    SwanLabTracker,
    TrackioTracker,
    WandBTracker,
)
from .values import _check_mapping


LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    "json": JSONTracker,
    "csv": CSVTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandBTracker,
    "trackio": TrackioTracker,
    "swanlab": SwanLabTracker,
    "comet_ml": CometMLTracker,
    "aim": AimTracker,
    "mlflow": MLflowTracker,
    "clearml": ClearMLTracker,
    "dvclive": DVCLiveTracker,
}

#: tracker name -> the module its package provides (what "all" and the availability check look for)
_TRACKER_MODULES = {"tensorboard": None, "wandb": "wandb", "trackio": "trackio", "swanlab": "swanlab",
                    "comet_ml": "comet_ml", "aim": "aim", "mlflow": "mlflow", "clearml": "clearml",
                    "dvclive": "dvclive"}


def get_available_trackers() -> list[str]:
    """Names of the trackers usable here (what ``log_with="all"`` selects)."""
    found = []
    for name, cls in LOGGER_TYPE_TO_CLASS.items():
        if not _tracker_available(name, cls):
            continue
        found.append(LoggerType(name) if name in LoggerType.list() else name)
    return found


def _tracker_available(name: str, cls: type) -> bool:
    if cls is TensorBoardTracker:
        return _tensorboard_available()
    module = _TRACKER_MODULES.get(name)
    if module is None or LOGGER_TYPE_TO_CLASS.get(name) is not cls:
        return True  # json, csv and registered classes need no package
    return importlib.util.find_spec(module) is not None


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make a :class:`GeneralTracker` subclass selectable by its ``name`` in ``log_with``.

    It is built as ``cls(project_name, logging_dir, **init_kwargs)`` when
    ``requires_logging_directory`` is true, else ``cls(project_name, **init_kwargs)``.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class takes a GeneralTracker subclass, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{tracker_class.__name__} must define a non-empty string `name`")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(f"{tracker_class.__name__} must define `requires_logging_directory` (True or False)")
    if name in ("all",):
        raise ValueError("'all' is reserved and cannot name a tracker")
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"tracker {name!r} ({LOGGER_TYPE_TO_CLASS[name].__name__}) is replaced by {tracker_class.__name__}",
                      stacklevel=2)
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _supported() -> str:
    return ", ".join(["all", *LOGGER_TYPE_TO_CLASS])


def _normalise_name(entry: Any) -> str:
    if isinstance(entry, Enum):
        entry = entry.value
    if not isinstance(entry, str):
        raise TypeError(
            f"log_with entries are tracker names or GeneralTracker instances, got {entry!r} ({type(entry).__name__}); "
            f"supported names: {_supported()}"
        )
    return entry.strip().lower()


def filter_trackers(log_with: Any, logging_dir: str | os.PathLike | None = None) -> list[Any]:
    """Check ``log_with`` and return its trackers: names (``LoggerType`` for built-ins) and instances.

    Duplicates are dropped; ``"all"`` expands to :func:`get_available_trackers` (plus any instances
    given). Raises ``ValueError`` for unknown names and for a tracker that needs a logging
    directory when there is none, ``NotImplementedError`` for trackers accel does not implement,
    and ``ImportError`` for a tracker whose package is missing.
    """
    if log_with is None:
        return []
    entries = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    instances = [e for e in entries if isinstance(e, GeneralTracker)]
    names: list[str] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            continue
        name = _normalise_name(entry)
        if name == "all":
            names.extend(str(n) for n in get_available_trackers())
            continue
        if name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"unsupported tracker {entry!r} in log_with; supported: {_supported()}")
        cls = LOGGER_TYPE_TO_CLASS[name]
        if cls is TensorBoardTracker and not _tensorboard_available():
            _summary_writer_class()  # raises the ImportError naming the package
        if not _tracker_available(name, cls):
            raise ImportError(f"the {name!r} tracker needs the {_TRACKER_MODULES[name]} package, which is not "
                              f"installed (pip install {_TRACKER_MODULES[name]})")
        names.append(name)

    selected: list[Any] = []
    for name in dict.fromkeys(names):  # keep order, drop repeats
        cls = LOGGER_TYPE_TO_CLASS[name]
        if cls.requires_logging_directory and logging_dir is None:
            raise ValueError(
                f"Logging with `{name}` requires a `logging_dir` to be passed in: pass "
                "Accelerator(project_dir=...) or project_config=ProjectConfiguration(logging_dir=...)"
            )
        selected.append(LoggerType(name) if name in LoggerType.list() else name)
    seen: set[int] = set()
    for tracker in instances:
        if id(tracker) not in seen:
            seen.add(id(tracker))
            selected.append(tracker)
    return selected


def init_trackers(accelerator: Any, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
    """Build ``accelerator.log_with``'s trackers on the main process, start them and store ``config``.

    ``log_with`` is checked on every process (so a mistake fails everywhere alike); trackers exist
    on the main process only. ``init_kwargs`` maps tracker names to constructor keyword arguments.
    """
    init_kwargs = init_kwargs or {}
    if not isinstance(init_kwargs, dict):
        raise TypeError(f"init_kwargs must be a dict of tracker name -> dict, got {type(init_kwargs).__name__}")
    if config is not None:
        _check_mapping(config, "init_trackers config")
    selected = filter_trackers(accelerator.log_with, accelerator.logging_dir)
    if not accelerator.is_main_process:
        return
    built: list[GeneralTracker] = []
    for entry in selected:
        if isinstance(entry, GeneralTracker):
            built.append(entry)
            continue
        name = str(entry)
        cls = LOGGER_TYPE_TO_CLASS[name]
        kwargs = init_kwargs.get(name, {})
        if cls.requires_logging_directory:
            built.append(cls(project_name, accelerator.logging_dir, **kwargs))
        else:
            built.append(cls(project_name, **kwargs))
    for tracker in built:
        tracker.start()
    if config is not None:
        for tracker in built:
            tracker.store_init_configuration(config)
    accelerator.trackers.extend(built)


def get_tracker(accelerator: Any, name: str, unwrap: bool = False) -> Any:
    """The tracker called ``name`` (its underlying object with ``unwrap``).

    Where no tracker exists (every process but the main one) a blank :class:`GeneralTracker`
    whose methods do nothing is returned, so code can call it on every process.
    """
    trackers = accelerator.trackers
    if not trackers:
        return GeneralTracker(_blank=True)
    name = str(name.value if isinstance(name, Enum) else name)
    for tracker in trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    raise ValueError(
        f"{name!r} is not a tracker of this Accelerator; it has: {', '.join(repr(t.name) for t in trackers)}"
    )
