"""Experiment trackers with Accelerate's interface: json, csv and TensorBoard files, and Accelerate's
third-party trackers, each importing its package only when started.

``Accelerator(log_with=...)`` names them; :func:`init_trackers` builds them on the main process only.
"""

from __future__ import annotations

from .base import GeneralTracker, on_main_process
from .local import CSVTracker, JSONTracker, TensorBoardTracker
from .registry import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    get_tracker,
    init_trackers,
    register_tracker_class,
)
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

__all__ = [
    "AimTracker",
    "CSVTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONTracker",
    "LOGGER_TYPE_TO_CLASS",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "get_tracker",
    "init_trackers",
    "on_main_process",
    "register_tracker_class",
]
