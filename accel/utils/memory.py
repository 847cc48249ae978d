"""Memory helpers with Accelerate's names: retry on out-of-memory, release objects, empty caches.

Out-of-memory errors are recognised by the active backend (``Backend.is_oom_error``), which knows
its own messages ("CUDA out of memory", "XPU out of memory", ...). Host allocations can fail on
any machine, so the CPU backend's messages ("DefaultCPUAllocator: can't allocate memory") are
recognised everywhere too.
"""

from __future__ import annotations

import functools
import gc
import inspect
import numbers
from typing import Any, Callable

__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]


def _active_backend():
    """The backend this process runs on: the one ``PartialState`` chose, else the registry's pick."""
    from ..state import PartialState

    backend = PartialState._shared_state.get("hardware_backend")
    if backend is not None:
        return backend
    from ..backends import get_backend

    return get_backend()


def _oom_backends() -> list[Any]:
    """Backends whose out-of-memory messages count: the active one plus the host CPU."""
    from ..backends import BackendError, get_registry

    found: list[Any] = []
    try:
        found.append(_active_backend())
    except BackendError:  # e.g. ACCEL_DEVICE names an unavailable backend: still judge host OOMs
        pass
    try:
        cpu = get_registry().get("cpu")
    except BackendError:
        cpu = None
    if cpu is not None and all(cpu is not b for b in found):
        found.append(cpu)
    return found


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the active backend's allocator cache; with ``garbage_collection`` run ``gc.collect()`` first.

    Garbage collection is slow: use it sparingly.
    """
    if garbage_collection:
        gc.collect()
    _active_backend().empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop this call's references to ``objects``, collect garbage and empty the device cache.

    Returns one ``None`` per object: assign it back (``a, b = release_memory(a, b)``) so the caller's
    references go too.
    """
    released: list[Any] = list(objects)
    for i in range(len(released)):
        released[i] = None
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def _device_oom_wording(backend: Any) -> tuple[str, ...]:
    """``"<DEVICE> out of memory."``: the form torch's allocators and device extensions use ("CUDA out of
    memory.", "XPU out of memory.", "CPU out of memory."), for this backend's device type and name."""
    names = {str(getattr(backend, "device_type", "") or ""), str(getattr(backend, "name", "") or "")} - {""}
    return tuple(f"{name.upper()} out of memory." for name in sorted(names))


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True if ``exception`` is an out-of-memory error of the active backend (or of the host).

    Each backend's own messages count, and a RuntimeError saying ``"<DEVICE> out of memory."`` for
    the active backend's device or the host (as Accelerate matches it); another device's wording does
    not, since no such device runs in this process.
    """
    backends = _oom_backends()
    if isinstance(exception, RuntimeError) and exception.args:
        text = str(exception.args[0])
        if any(w in text for b in backends for w in _device_oom_wording(b)):
            return True
    return any(backend.is_oom_error(exception) for backend in backends)


def _check_call(function: Callable[..., Any], args: tuple) -> None:
    """The decorator passes the batch size itself: catch callers who pass it too."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(args) + 1 > len(positional):
        name = getattr(function, "__name__", repr(function))
        shown = ", ".join(f"{p.name}={value!r}" for p, value in zip(positional[1:], args[1:]))
        raise TypeError(
            f"`{name}` was called with the batch size as its first argument, but "
            f"find_executable_batch_size already passes it. Call `{name}({shown})` instead."
        )


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
):
    """Run ``function(batch_size, *args, **kwargs)``, lowering the batch size after each out-of-memory error.

    ``function`` takes the batch size as its first parameter; callers leave it out. After an
    out-of-memory error (as judged by :func:`should_reduce_batch_size`) memory is released and the
    batch size becomes ``int(batch_size * 0.9)`` (128, 115, 103, 92, ...), or whatever
    ``reduce_batch_size_fn()`` returns, which must be an int smaller than the current size. At zero
    a ``RuntimeError("No executable batch size found, reached zero.")`` is raised. Any other error
    propagates unchanged. As in Accelerate, the batch size that worked is kept for later calls.

    Usable bare (``@find_executable_batch_size``) or with arguments
    (``@find_executable_batch_size(starting_batch_size=64)``).
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )

    batch_size = starting_batch_size

    def shrink() -> int:
        if reduce_batch_size_fn is not None:
            return reduce_batch_size_fn()
        return int(batch_size * 0.9)

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        _check_call(function, args)
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            out_of_memory = False
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                out_of_memory = True
            # outside the except block: the failed attempt's frames (and their tensors) are gone
            if out_of_memory:
                clear_device_cache(garbage_collection=True)
                new_size = shrink()
                if (
                    not isinstance(new_size, numbers.Integral)
                    or isinstance(new_size, bool)
                    or not 0 <= new_size < batch_size
                ):
                    raise ValueError(
                        f"reduce_batch_size_fn returned {new_size!r} after batch size {batch_size} ran out of "
                        f"memory; it must return an int from 0 to {batch_size - 1}"
                    )
                batch_size = int(new_size)

    return decorator
