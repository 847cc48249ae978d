"""A progress bar shown by one process per node (``accelerate.utils.tqdm``)."""

from __future__ import annotations

from typing import Any

__all__ = ["tqdm"]


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but the first of each node when
    ``main_process_only`` (so N processes draw one bar, not N)."""
    from .imports import is_tqdm_available

    if not is_tqdm_available():
        raise ImportError("accel's tqdm needs the tqdm package, which is not installed (pip install tqdm)")
    if args and isinstance(args[0], bool):
        raise ValueError("tqdm's first argument is the iterable; pass main_process_only=True/False by keyword")
    from tqdm.auto import tqdm as progress_bar

    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        from ..state import PartialState

        disable = PartialState().local_process_index != 0
    return progress_bar(*args, disable=disable, **kwargs)
