"""The handles of ``register_save_state_pre_hook`` / ``register_load_state_pre_hook``."""

from __future__ import annotations

from typing import Any, Callable


class HookHandle:
    """Returned by ``register_*_state_pre_hook``: ``remove()`` unregisters the hook (also usable as a context)."""

    _next_id = 0

    def __init__(self, hooks: dict[int, Callable[..., None]]):
        self._hooks = hooks
        self.id = HookHandle._next_id
        HookHandle._next_id += 1

    def remove(self) -> None:
        """Unregister the hook (a no-op when it is already gone)."""
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "HookHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register_hook(hook_dict: dict[int, Callable[..., None]], hook: Callable[..., None]) -> HookHandle:
    """Add ``hook`` to ``hook_dict``; the returned handle's ``remove()`` takes it out again."""
    if not callable(hook):
        raise TypeError(f"a state hook must be callable, got {type(hook).__name__}")
    handle = HookHandle(hook_dict)
    hook_dict[handle.id] = hook
    return handle
