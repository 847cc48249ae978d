"""The child side of a device profile's hook check (run by :mod:`accel.backends.hook_check`, never imported).

Started as ``python -c`` with one JSON argument: the parent's ``sys.path``, the profile's hooks
(``name -> "module:function"``) or a device spec file to execute, and the descriptor of a pipe to
report on. It imports nothing of accel and nothing the hooks do not import themselves. For every
step it writes ``{"step": ...}`` before and ``{"done": ...}`` after on the pipe, so that when this
process dies, exits or hangs the parent knows which hook did it. A hook that raises is reported,
not fatal; ``SystemExit`` and ``KeyboardInterrupt`` are left to end the process, as they would end
accel's own.
"""

import importlib
import importlib.util
import inspect
import json
import os
import signal
import sys
import threading

# device hooks called with a device index where their signature takes one, as the backend calls them
DEVICE_HOOKS = ("seed", "get_rng_state", "set_rng_state", "synchronize", "memory_allocated",
                "max_memory_allocated", "reset_peak_memory_stats", "empty_cache")
_INDEXED = {"get_rng_state", "set_rng_state", "synchronize", "memory_allocated", "max_memory_allocated",
            "reset_peak_memory_stats"}


def main() -> None:
    """Check every hook of one profile and report each step on the pipe."""
    payload = json.loads(sys.argv[1])
    sys.path[:] = payload["sys_path"]
    report = os.fdopen(payload["fd"], "w", buffering=1)
    _watch_parent()

    def send(**message) -> None:
        report.write(json.dumps(message) + "\n")

    hooks = {}
    if payload.get("spec_file"):
        send(step="spec", what="executing the device spec")
        try:
            hooks = _spec_hooks(payload["spec_file"])
        except Exception as exc:  # reported; the parent's own import reports it with its message
            send(raised="spec", error=f"{type(exc).__name__}: {exc}")
            send(end=True)
            return
        send(done="spec")
    else:
        for name, target in payload["hooks"].items():
            send(step=name, what="import")
            try:
                hooks[name] = _resolve(target)
            except _Unresolved as exc:
                send(unresolved=name, error=str(exc))
                continue
            except Exception as exc:
                send(raised=name, phase="import", error=f"{type(exc).__name__}: {exc}")
                continue
            send(done=name)
    _call_all(hooks, send)
    send(end=True)


class _Unresolved(Exception):
    """The name cannot be imported or has no such attribute (the parent words the error)."""


def _resolve(target: str):
    module_name, sep, attr_path = target.strip().partition(":")
    if not sep:
        module_name, _, attr_path = target.strip().rpartition(".")
    if not module_name or not attr_path:
        raise _Unresolved(target)
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise _Unresolved(str(exc)) from None
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise _Unresolved(f"{module_name} has no {attr_path!r}")
        obj = getattr(obj, part)
    return obj


def _spec_hooks(path: str) -> dict:
    names = {"MANUAL_SEED_FN": "seed", "EMPTY_CACHE_FN": "empty_cache", "DEVICE_COUNT_FN": "device_count",
             "SYNCHRONIZE_FN": "synchronize", "MEMORY_ALLOCATED_FN": "memory_allocated",
             "MAX_MEMORY_ALLOCATED_FN": "max_memory_allocated",
             "RESET_PEAK_MEMORY_STATS_FN": "reset_peak_memory_stats",
             "RESET_MAX_MEMORY_ALLOCATED_FN": "reset_peak_memory_stats"}
    spec = importlib.util.spec_from_file_location("_accel_device_spec_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {hook: getattr(module, key) for key, hook in names.items() if callable(getattr(module, key, None))}


def _call_all(hooks: dict, send) -> None:
    """Call the hooks in the order a run does: availability first, device hooks only on a device that is there."""
    available = None
    for name in ("is_available", "device_count"):
        fn = hooks.get(name)
        if not callable(fn) or available is False:
            continue
        ok, value = _call(name, fn, (), None, send)
        if name == "is_available":
            available = bool(value) if ok else False
        else:
            available = ok and _as_int(value) >= 1
    if not available:
        return  # the run would find the device missing and call nothing else
    state = None
    for name in DEVICE_HOOKS:
        fn = hooks.get(name)
        if not callable(fn):
            continue
        args = (0,) if name == "seed" else ()
        if name == "set_rng_state":
            if state is None:
                continue  # nothing to set it to
            args = (state,)
        ok, value = _call(name, fn, args, 0 if name in _INDEXED else None, send)
        if name == "get_rng_state" and ok:
            state = value


def _call(name: str, fn, args: tuple, index, send):
    send(step=name, what="call")
    try:
        if index is not None and _takes(fn, len(args) + 1):
            value = fn(*args, index)
        else:
            value = fn(*args)
    except Exception as exc:  # the run reports it where the hook is used; only its way of ending matters here
        send(raised=name, phase="call", error=f"{type(exc).__name__}: {exc}")
        return False, None
    send(done=name)
    return True, value


def _takes(fn, count: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def _as_int(value) -> int:
    try:
        return int(value)
    except Exception:
        return 0


def _watch_parent() -> None:
    """End this process group when the parent goes away (its end of stdin closes), so nothing is left hanging."""

    def watch() -> None:
        try:
            while os.read(0, 4096):  # the raw descriptor: a buffered read would block interpreter shutdown
                pass
        except OSError:
            pass
        try:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        except Exception:
            os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


if __name__ == "__main__":  # run by hook_check as `python -c`; importing it does nothing
    main()
