"""Process-aware logging with Accelerate's API (``accelerate.logging``).

``get_logger(__name__)`` returns a :class:`MultiProcessAdapter`: each call logs on the main process
only unless ``main_process_only=False``; ``in_order=True`` logs on every process, one rank after the
other. Messages are prefixed with ``[RANK i]``. The call site (file, line, function) in a record is
the caller's, and a ``stacklevel`` passed by a wrapping logger is respected.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

__all__ = ["MultiProcessAdapter", "get_logger"]

_NOT_INITIALIZED = (
    "You must initialize the accelerate state by calling either `PartialState()` or `Accelerator()` "
    "before using the logging utility."
)


def _state() -> Any:
    from .state import PartialState, is_initialized

    if not is_initialized():
        raise RuntimeError(_NOT_INITIALIZED)
    return PartialState()


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` that knows which process it runs in.

    Extra keywords of every logging call: ``main_process_only`` (default True: only rank 0 logs)
    and ``in_order`` (every rank logs, rank 0 first, with a barrier between ranks; overrides
    ``main_process_only``). Logging before ``PartialState()``/``Accelerator()`` exists raises a
    RuntimeError, as in Accelerate, since the rank is unknown.
    """

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        """Whether this process logs a message with the given ``main_process_only``."""
        return not main_process_only or _state().is_main_process

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        """Prefix ``msg`` with ``[RANK i]`` and point the record at the caller (``stacklevel`` 2 by default)."""
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {_state().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` on the processes ``main_process_only``/``in_order`` select."""
        state = _state()
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **kwargs)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **kwargs)

    @functools.lru_cache(None)
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that emits each distinct message (same arguments) once per adapter."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A :class:`MultiProcessAdapter` around ``logging.getLogger(name)``.

    ``log_level`` (else ``ACCEL_LOG_LEVEL``, else Accelerate's ``ACCELERATE_LOG_LEVEL``) sets the level of
    this logger and of the root logger; with none of them, levels are left as they are.
    """
    if log_level is None:
        log_level = os.environ.get("ACCEL_LOG_LEVEL") or os.environ.get("ACCELERATE_LOG_LEVEL") or None
    logger = logging.getLogger(name)
    if log_level is not None:
        level = str(log_level).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ValueError(f"unknown log level {log_level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        logger.setLevel(level)
        logger.root.setLevel(level)
    return MultiProcessAdapter(logger, {})
