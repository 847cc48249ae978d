"""The tracker interface every tracker implements, and the decorator that keeps a method to the main process."""

from __future__ import annotations

import functools
from typing import Any, Callable


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run a tracker method on the main process only when the tracker's ``main_process_only`` is true.

    The process is checked when the method runs, not when the tracker is built.
    """

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False):
            from ..state import PartialState

            if not PartialState().is_main_process:
                return None
        return function(self, *args, **kwargs)

    return wrapper


class GeneralTracker:
    """Base class of every tracker.

    A subclass defines ``name`` (str), ``requires_logging_directory`` (bool) and a ``tracker``
    property (the underlying object: a writer, a run, a file), and overrides ``start``,
    ``store_init_configuration``, ``log`` and ``finish`` as needed. Methods decorated with
    :func:`on_main_process` run on the main process only while ``main_process_only`` is true (the
    default). Built-in trackers are constructed as ``cls(project_name, logging_dir, **init_kwargs)``
    when they need a directory, else ``cls(project_name, **init_kwargs)``; ``start()`` then opens
    files or connections.
    """

    main_process_only = True

    def __init__(self, _blank: bool = False):
        if _blank:
            return
        missing = [attr for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if "tracker" not in dir(self):  # a property: only its presence on the class can be checked
            missing.append("tracker")
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} is missing the tracker attribute(s) "
                f"{', '.join('`' + m + '`' for m in missing)}; define them in the class"
            )

    def start(self) -> None:
        """Open files or connections; called by ``init_trackers`` once the process group exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Record the run's hyperparameters ``values``."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (metric name -> value), optionally at ``step``."""

    def finish(self) -> None:
        """Flush and close whatever the tracker holds."""
